"""Silences in the `silences` table, so they outlive a restart as Alertmanager's snapshot file does."""

from __future__ import annotations

import json
from collections.abc import Sequence

import duckdb

from gpuwatch.core.model import SilenceRecord


def _matchers(text: str) -> tuple[tuple[str, str, bool, bool], ...]:
    return tuple((str(n), str(v), bool(r), bool(e)) for n, v, r, e in json.loads(text))


def upsert(cur: duckdb.DuckDBPyConnection, silences: Sequence[SilenceRecord]) -> None:
    """Write `silences`, replacing those with the same id, in one transaction (on the writer's cursor)."""
    cur.execute("BEGIN TRANSACTION")
    try:
        cur.executemany("DELETE FROM silences WHERE id = ?", [[s.id] for s in silences])
        cur.executemany(
            "INSERT INTO silences VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                [
                    s.id,
                    json.dumps(s.matchers),
                    s.starts_at_ms,
                    s.ends_at_ms,
                    s.created_by,
                    s.comment,
                    s.updated_at_ms,
                ]
                for s in silences
            ],
        )
        cur.execute("COMMIT")
    except duckdb.Error:
        cur.execute("ROLLBACK")
        raise


def delete(cur: duckdb.DuckDBPyConnection, ids: Sequence[str]) -> None:
    """Delete the silences with these ids (garbage collection of long-expired ones)."""
    if ids:
        cur.executemany("DELETE FROM silences WHERE id = ?", [[i] for i in ids])


def read_all(cur: duckdb.DuckDBPyConnection) -> list[SilenceRecord]:
    """Return every stored silence."""
    rows = cur.execute(
        "SELECT id, matchers, starts_at_ms, ends_at_ms, created_by, comment, updated_at_ms "
        "FROM silences ORDER BY id"
    ).fetchall()
    return [SilenceRecord(r[0], _matchers(r[1]), int(r[2]), int(r[3]), r[4], r[5], int(r[6])) for r in rows]
