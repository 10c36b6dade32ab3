"""Alert transitions in the `alert_history` table, so the alerts page's history outlives a restart.

Rows are kept up to a cap (the newest `MAX_ROWS`) and no longer than the store's retention.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

import duckdb

MAX_ROWS = 10_000  # transitions kept; the oldest go first (alert floods must not grow the table)


class StoredTransition(NamedTuple):
    """One alert changing state: its group and rule, labels as sorted (name, value) pairs, time in ms."""

    group: str
    rule: str
    labels: tuple[tuple[str, str], ...]
    before: str
    after: str
    at_ms: int


def append(cur: duckdb.DuckDBPyConnection, rows: Sequence[StoredTransition], cap: int = MAX_ROWS) -> None:
    """Add transitions after the stored ones, in order, and drop the oldest beyond `cap` (writer's cursor)."""
    if not rows:
        return
    cur.execute("BEGIN TRANSACTION")
    try:
        found = cur.execute("SELECT coalesce(max(seq), 0) FROM alert_history").fetchone()
        base = int(found[0]) if found else 0
        cur.executemany(
            "INSERT INTO alert_history VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                [base + i + 1, r.at_ms, r.group, r.rule, json.dumps(r.labels), r.before, r.after]
                for i, r in enumerate(rows)
            ],
        )
        cur.execute("DELETE FROM alert_history WHERE seq <= ?", [base + len(rows) - cap])
        cur.execute("COMMIT")
    except duckdb.Error:
        cur.execute("ROLLBACK")
        raise


def delete_before(cur: duckdb.DuckDBPyConnection, cutoff_ms: int) -> None:
    """Delete transitions older than `cutoff_ms` (retention)."""
    cur.execute("DELETE FROM alert_history WHERE at_ms < ?", [cutoff_ms])


def read_latest(cur: duckdb.DuckDBPyConnection, limit: int) -> list[StoredTransition]:
    """Return the newest `limit` transitions, oldest first (the order they happened in)."""
    rows = cur.execute(
        "SELECT group_name, rule, labels, before, after, at_ms FROM alert_history ORDER BY seq DESC LIMIT ?",
        [limit],
    ).fetchall()
    return [
        StoredTransition(
            str(g), str(rule), tuple((str(k), str(v)) for k, v in json.loads(labels)), b, a, int(at)
        )
        for g, rule, labels, b, a, at in reversed(rows)
    ]
