"""A query's answer as one long table: a row per sample, with its time, its labels as columns and its value.

This is the shape pandas, DuckDB and spreadsheets take (`gpuwatch export`, `/api/export`): a matrix's
series one after another, a vector's samples, a scalar as one row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import promql_parser as pp

from gpuwatch.query.errors import PromQLParseError
from gpuwatch.query.parse import parse
from gpuwatch.query.values import Matrix, Result, Scalar, String, Vector

RESERVED = ("timestamp", "value")  # the table's own columns; a label of that name becomes `<name>_label`


@dataclass(frozen=True)
class LongTable:
    """Rows of samples: `times_ms` (int64), `values` (float64) and one column of label values a label
    name (None where a row's series lacks that label), columns in sorted order, `__name__` first."""

    times_ms: np.ndarray
    values: np.ndarray
    labels: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.times_ms)


def column_name(label: str) -> str:
    """The column a label's values go to."""
    return f"{label}_label" if label in RESERVED else label


def long_table(result: Result) -> LongTable:
    """Flatten a query's result into a LongTable (a string result is refused: it has no value)."""
    if isinstance(result, String):
        raise TypeError("a string result has no samples to export")
    if isinstance(result, Scalar):
        return LongTable(np.array([result.time_ms], np.int64), np.array([result.value], np.float64), {})
    if isinstance(result, Vector):
        rows = [(s.labels, np.array([s.time_ms], np.int64), np.array([s.value], np.float64)) for s in result]
    else:
        assert isinstance(result, Matrix)
        rows = [(s.labels, s.timestamps_ms, s.values) for s in result]
    sizes = np.array([len(t) for _, t, _ in rows], np.int64)
    total = int(sizes.sum())
    names = sorted({k for labels, _, _ in rows for k in labels}, key=lambda k: (k != "__name__", k))
    to_column: dict[str, str] = {}
    for k in names:
        col = column_name(k)
        while col in to_column.values() or (col != k and col in names):  # `value` next to `value_label`
            col += "_"
        to_column[k] = col
    columns = {to_column[k]: np.full(total, None, dtype=object) for k in names}
    at = 0
    for (labels, _, _), n in zip(rows, sizes.tolist(), strict=True):
        for k, v in labels.items():
            columns[to_column[k]][at : at + n] = v
        at += n
    if not rows:
        return LongTable(np.empty(0, np.int64), np.empty(0, np.float64), columns)
    times = np.concatenate([np.asarray(t, np.int64) for _, t, _ in rows])
    values = np.concatenate([np.asarray(v, np.float64) for _, _, v in rows])
    return LongTable(times, values, columns)


def raw_samples_query(text: str, start_ms: int, end_ms: int) -> str:
    """The instant query at `end_ms` whose answer is every raw sample of selector `text` from `start_ms`
    to `end_ms`, both included: `text[<end - start + 1>ms]`. PromQLParseError where `text` is not a
    plain series selector (an expression needs a step; `offset` and `@` would move the window)."""
    expr = parse(text).expr
    if not isinstance(expr, pp.VectorSelector) or expr.offset is not None or expr.at is not None:
        raise PromQLParseError(
            f"{text.strip()!r} is not a series selector: raw samples are exported for a selector such as "
            'DCGM_FI_DEV_GPU_UTIL{Hostname="node-1"}; give a step to export any expression'
        )
    return f"{text.strip()}[{end_ms - start_ms + 1}ms]"
