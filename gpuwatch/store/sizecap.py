"""Retention by size (`retention_size`): when the database file grows past 90 % of the cap, how far back
to delete.

DuckDB does not give deleted space back to the file system, and its count of used blocks does not
drop when rows are deleted: it reuses the space for the rows written next (measured: 1,000 rows of 5 KB
deleted, 1,000 written, the same blocks). So what is capped is the file's growth. Once the file (and
its WAL) passes `KEEP` of the cap, the oldest data worth the excess and `HEADROOM` of the cap more is
deleted (counted by its samples and points, at the bytes each takes in the oldest rows), and the
file's size then is remembered: more is deleted only once the file has grown `HEADROOM` of the cap
past it (the deletes themselves rewrite a few blocks), which it does once the freed space is written
again. What goes first: raw samples, oldest day first, of days whose tier points are built; then the
oldest 1-minute points; then the oldest 1-hour points. Never the newest day of raw samples. A file
already past the cap stays that size.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import duckdb

from gpuwatch.core.tiers import HOUR_MS, MINUTE_MS
from gpuwatch.store.tierrows import DAY_MS, TABLE

KEEP = 0.9  # of the cap: past this, data is deleted ...
HEADROOM = 0.05  # ... the excess and this much of the cap more
_ROW_BYTES = 48  # a chunk or tier row's columns besides its blobs, about
_SAMPLE_ROWS = 500  # rows whose blobs give the bytes a sample takes


@dataclass(frozen=True)
class Cutoffs:
    """Delete raw samples before `raw_ms` and tier points before `tiers[res]`; `over` bytes were
    over the mark (0: nothing to do)."""

    raw_ms: int
    tiers: dict[int, int]
    over: int


def file_bytes(path: Path) -> int:
    """The database file's size and its WAL's."""
    total = 0
    for p in (path, path.with_name(path.name + ".wal")):
        with contextlib.suppress(OSError):
            total += p.stat().st_size
    return total


def _bytes_each(cur: duckdb.DuckDBPyConnection, size: str, table: str) -> float:
    """The blob bytes a sample (or point) of `table` takes, from its first rows: a sum over every
    blob would bring them all into DuckDB's 64 MB."""
    row = cur.execute(
        f"SELECT sum({size}), sum(n) FROM (SELECT * FROM {table} LIMIT {_SAMPLE_ROWS})"
    ).fetchone()
    return float(row[0]) / float(row[1]) if row and row[0] and row[1] else 0.0


def cutoffs(
    cur: duckdb.DuckDBPyConnection, cap_bytes: int, size: int, mark: int, built_ms: int | None, newest_ms: int
) -> Cutoffs:
    """Where to delete, with the file at `size` bytes and `mark` the size after the last deletion by
    size (module docstring)."""
    none = Cutoffs(0, {}, 0)
    if cap_bytes <= 0 or size <= KEEP * cap_bytes or size <= mark + HEADROOM * cap_bytes:
        return none
    over = size - int(KEEP * cap_bytes)
    need = over + int(HEADROOM * cap_bytes)
    raw_ms = 0
    last_raw_day = min(built_ms or 0, newest_ms // DAY_MS * DAY_MS - DAY_MS)
    per_sample = _bytes_each(
        cur, "octet_length(ts) + octet_length(vs) + coalesce(octet_length(seqs), 0)", "chunks"
    )
    for day, n, rows in cur.execute(
        f"SELECT t_min_ms // {DAY_MS} AS d, sum(n), count(*) FROM chunks GROUP BY d ORDER BY d"
    ).fetchall():
        end = (int(day) + 1) * DAY_MS
        if need <= 0 or end > last_raw_day:
            break
        raw_ms, need = end, need - int(n * per_sample) - _ROW_BYTES * int(rows)
    tiers: dict[int, int] = {}
    for res in (MINUTE_MS, HOUR_MS):
        if need <= 0:
            break
        per_point = _bytes_each(cur, "octet_length(data)", TABLE[res])
        for t_max, n in cur.execute(f"SELECT t_max_ms, n FROM {TABLE[res]} ORDER BY t_max_ms").fetchall():
            if need <= 0:
                break
            tiers[res], need = int(t_max) + 1, need - int(n * per_point) - _ROW_BYTES
    return Cutoffs(raw_ms, tiers, over)
