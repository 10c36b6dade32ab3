"""Write a long table of samples, or any named columns, to a Parquet or CSV file with DuckDB's writers.

A long table's columns: `timestamp` (TIMESTAMP WITH TIME ZONE, UTC, millisecond precision), one text
column per label name, `value` (DOUBLE: NaN and +-Inf kept). pandas reads either file with one call
(`pd.read_parquet(path)`, `pd.read_csv(path, parse_dates=["timestamp"])`).
"""

from __future__ import annotations

from collections.abc import Mapping
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
    columns: dict[str, np.ndarray] = {
        "timestamp": np.asarray(table.times_ms, np.int64).astype("datetime64[ms]")
    }
    columns.update(table.labels)
    columns["value"] = table.values
    write_columns(columns, path, fmt)


def write_columns(columns: Mapping[str, np.ndarray], path: Path, fmt: Format) -> None:
    """Write named columns of equal length to `path` (replaced if it exists) as `fmt`, in their order:
    datetime64 as TIMESTAMP WITH TIME ZONE (UTC, milliseconds), floats as DOUBLE (NaN and +-Inf kept),
    integers as BIGINT, anything else as text (None: NULL)."""
    data: dict[str, np.ndarray] = {}
    select = []
    for i, (name, column) in enumerate(columns.items()):
        c, kind = f"c{i}", column.dtype.kind
        if kind == "M":
            data[c] = column.astype("datetime64[ms]").astype(np.int64)
            select.append(f"make_timestamp_ms({c})::TIMESTAMPTZ AS {_quoted(name)}")
        elif kind == "f":
            # DuckDB reads a NaN of a numpy column as NULL; mark them and write NaN back in SQL.
            is_nan = np.isnan(column)
            data[c], data[c + "_nan"] = np.where(is_nan, 0.0, column).astype(np.float64), is_nan
            select.append(f"CASE WHEN {c}_nan THEN 'NaN'::DOUBLE ELSE {c} END AS {_quoted(name)}")
        elif kind in "iu":
            data[c] = column.astype(np.int64)
            select.append(f"{c}::BIGINT AS {_quoted(name)}")
        else:
            data[c] = column.astype(object)
            select.append(f"{c}::VARCHAR AS {_quoted(name)}")
    options = "FORMAT parquet, COMPRESSION zstd" if fmt == "parquet" else "FORMAT csv, HEADER true"
    con = duckdb.connect(config={"threads": 1, "memory_limit": "256MB"})
    try:
        con.execute("SET TimeZone = 'UTC'")
        con.register("samples", data)
        con.execute(f"COPY (SELECT {', '.join(select)} FROM samples) TO '{_path_literal(path)}' ({options})")
    except duckdb.Error as exc:
        raise StoreError(f"cannot write {path}: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()


def _path_literal(path: Path) -> str:
    return str(path).replace("'", "''")
