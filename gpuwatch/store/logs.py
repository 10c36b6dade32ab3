"""Tailed log lines (`log_lines`) and how far each file was read (`log_offsets`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import duckdb
import numpy as np

from gpuwatch.core.model import LogLine, LogOffset


def write(cur: duckdb.DuckDBPyConnection, lines: Sequence[LogLine], offsets: Sequence[LogOffset]) -> None:
    """Store lines and the offsets after them in one transaction (on the writer's cursor)."""
    cur.execute("BEGIN TRANSACTION")
    try:
        if lines:
            rows = {
                "t_ms": np.fromiter((x.time_ms for x in lines), np.int64, len(lines)),
                "file": np.array([x.file for x in lines], dtype=object),
                "run": np.array([x.run for x in lines], dtype=object),
                "level": np.array([x.level for x in lines], dtype=object),
                "text": np.array([x.text for x in lines], dtype=object),
            }
            cur.register("gpuwatch_log_rows", rows)
            try:
                cur.execute(
                    "INSERT INTO log_lines SELECT t_ms, nextval('log_line_seq'), file, run, level, text "
                    "FROM gpuwatch_log_rows"
                )
            finally:
                cur.unregister("gpuwatch_log_rows")
        for o in offsets:
            cur.execute(
                "INSERT OR REPLACE INTO log_offsets (path, inode, offset_bytes) VALUES (?, ?, ?)",
                [o.path, o.inode, o.offset],
            )
        cur.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):  # the transaction is gone; the first error matters
            cur.execute("ROLLBACK")
        raise


def delete_before(cur: duckdb.DuckDBPyConnection, cutoff_ms: int) -> None:
    """Delete lines older than `cutoff_ms` (on the writer's cursor)."""
    cur.execute("DELETE FROM log_lines WHERE t_ms < ?", [cutoff_ms])


def read_offsets(cur: duckdb.DuckDBPyConnection) -> list[LogOffset]:
    """Return every file's stored offset."""
    rows = cur.execute("SELECT path, inode, offset_bytes FROM log_offsets ORDER BY path").fetchall()
    return [LogOffset(str(p), int(i), int(o)) for p, i, o in rows]


def read_lines(
    cur: duckdb.DuckDBPyConnection,
    *,
    run: str | None,
    text: str | None,
    level: str | None,
    start_ms: int | None,
    end_ms: int | None,
    limit: int,
) -> list[LogLine]:
    """Return stored lines matching every given filter, newest first; `text` matches case-insensitively."""
    where: list[str] = []
    params: list[object] = []
    if run:
        where.append("run = ?")
        params.append(run)
    if text:
        where.append("strpos(lower(text), lower(?)) > 0")
        params.append(text)
    if level is not None:
        where.append("level = ?")
        params.append(level)
    if start_ms is not None:
        where.append("t_ms >= ?")
        params.append(start_ms)
    if end_ms is not None:
        where.append("t_ms <= ?")
        params.append(end_ms)
    sql = "SELECT t_ms, file, run, level, text FROM log_lines"
    if where:
        sql += " WHERE " + " AND ".join(where)
    sql += " ORDER BY t_ms DESC, seq DESC LIMIT ?"
    rows = cur.execute(sql, [*params, limit]).fetchall()
    return [LogLine(int(t), str(f), str(r), str(lv), str(x)) for t, f, r, lv, x in rows]
