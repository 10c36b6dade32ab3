"""How the store's rows go into DuckDB: columns registered as one relation and inserted in one
statement (`executemany` took ~0.1 ms a row), chunk rows with their content hash, and the small
statements around a transaction."""

from __future__ import annotations

import contextlib
from typing import Any

import duckdb
import numpy as np

from gpuwatch.store.chunking import ChunkRow


def scalar(cur: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> int:
    row = cur.execute(sql, params).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def insert_columns(
    cur: duckdb.DuckDBPyConnection, table: str, columns: dict[str, Any], computed: str = ""
) -> None:
    """Insert `columns` into `table`, followed by the `computed` SQL expressions (over those columns)."""
    cur.register("gpuwatch_rows", columns)
    try:
        cur.execute(f"INSERT INTO {table} SELECT *{computed} FROM gpuwatch_rows")
    finally:
        # a failed INSERT aborted the transaction, which refuses this too: its error is the one to raise
        with contextlib.suppress(duckdb.Error):
            cur.unregister("gpuwatch_rows")


def insert_chunks(cur: duckdb.DuckDBPyConnection, rows: list[ChunkRow]) -> None:
    if not rows:
        return
    cur.register(
        "gpuwatch_rows",
        {
            "series_id": np.fromiter((r.series_id for r in rows), np.int32, len(rows)),
            "t_min_ms": np.fromiter((r.t_min_ms for r in rows), np.int64, len(rows)),
            "t_max_ms": np.fromiter((r.t_max_ms for r in rows), np.int64, len(rows)),
            "n": np.fromiter((r.n for r in rows), np.int32, len(rows)),
            "seq": np.fromiter((r.seq for r in rows), np.int64, len(rows)),
            "ts": np.array([r.ts for r in rows], dtype=object),
            "vs": np.array([r.vs for r in rows], dtype=object),
            "seqs": np.array([r.seqs for r in rows], dtype=object),
            "seq_lo": np.array([r.seq if r.seq_lo is None else r.seq_lo for r in rows], np.int64),
        },
    )
    try:
        # h: the content key of chunks kept in memory (chunkcache.py), hashed once here
        cur.execute(
            "INSERT INTO chunks (series_id, t_min_ms, t_max_ms, n, seq, ts, vs, h, seqs, seq_lo) "
            "SELECT series_id, t_min_ms, t_max_ms, n, seq, ts, vs, hash(ts, vs), seqs, seq_lo "
            "FROM gpuwatch_rows"
        )
    finally:
        with contextlib.suppress(duckdb.Error):
            cur.unregister("gpuwatch_rows")


def rollback(cur: duckdb.DuckDBPyConnection) -> None:
    with contextlib.suppress(duckdb.Error):  # the transaction is gone; the first error matters
        cur.execute("ROLLBACK")
