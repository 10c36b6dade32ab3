"""Write a long table of samples to a Parquet or CSV file with DuckDB's own writers.

Columns: `timestamp` (TIMESTAMP WITH TIME ZONE, UTC, millisecond precision), one text column per label
name, `value` (DOUBLE: NaN and +-Inf kept). pandas reads either file with one call
(`pd.read_parquet(path)`, `pd.read_csv(path, parse_dates=["timestamp"])`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

import duckdb
import numpy as np

from gpuwatch.core.errors import StoreError

Format = Literal["parquet", "csv"]
FORMATS: tuple[Format, ...] = ("parquet", "csv")


class Table(Protocol):
    """Rows of samples, as the query layer's LongTable holds them: `times_ms` (int64), `values`
    (float64) and one object column of label values per column name."""

    @property
    def times_ms(self) -> np.ndarray: ...
    @property
    def values(self) -> np.ndarray: ...
    @property
    def labels(self) -> dict[str, np.ndarray]: ...


def format_of(path: Path | str) -> Format | None:
    """The format a file name asks for by its suffix (`.parquet`, `.csv`), None for any other."""
    suffix = Path(path).suffix.lower()
    return "parquet" if suffix == ".parquet" else "csv" if suffix == ".csv" else None


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def write_table(table: Table, path: Path, fmt: Format) -> None:
    """Write `table` to `path` (replaced if it exists) as `fmt`."""
    values = table.values
    is_nan = np.isnan(values)
    # DuckDB reads a NaN of a numpy column as NULL; mark them and write NaN back in SQL.
    data: dict[str, np.ndarray] = {
        "t_ms": table.times_ms,
        "v": np.where(is_nan, 0.0, values),
        "v_nan": is_nan,
    }
    label_columns = list(table.labels)
    data.update({f"l{i}": table.labels[name] for i, name in enumerate(label_columns)})
    select = ", ".join(
        [
            "make_timestamp_ms(t_ms)::TIMESTAMPTZ AS timestamp",
            *(f"l{i}::VARCHAR AS {_quoted(name)}" for i, name in enumerate(label_columns)),
            "CASE WHEN v_nan THEN 'NaN'::DOUBLE ELSE v END AS value",
        ]
    )
    options = "FORMAT parquet, COMPRESSION zstd" if fmt == "parquet" else "FORMAT csv, HEADER true"
    con = duckdb.connect(config={"threads": 1, "memory_limit": "256MB"})
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("samples", data)
        con.execute(f"COPY (SELECT {select} FROM samples) TO '{_path_literal(path)}' ({options})")
    except duckdb.Error as exc:
        raise StoreError(f"cannot write {path}: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()


def _path_literal(path: Path) -> str:
    return str(path).replace("'", "''")
