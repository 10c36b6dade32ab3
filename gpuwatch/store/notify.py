"""The notification queue, the delivery log and the per-group notification state (tables `notify_*`).

The queue holds each notification until a receiver took it (or it was given up); every outcome is one
row of the delivery log. `notify_state` is Alertmanager's notification log: for each alert group and
receiver, the fingerprints of the firing and resolved alerts last notified, so a restart does not notify
them again. A notification and the state it implies are written in one transaction.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import NamedTuple

import duckdb


class NewNotification(NamedTuple):
    """A notification to queue for one integration of a receiver; `payload` is JSON text."""

    receiver: str
    integration: str
    group_key: str
    status: str
    payload: str
    created_ms: int


class QueuedNotification(NamedTuple):
    """A notification waiting in the queue."""

    id: int
    receiver: str
    integration: str
    group_key: str
    status: str
    payload: str
    created_ms: int
    attempts: int
    next_attempt_ms: int
    last_error: str


class Delivery(NamedTuple):
    """One row of the delivery log: how a queued notification ended."""

    id: int
    receiver: str
    integration: str
    group_key: str
    status: str
    alerts: int
    created_ms: int
    finished_ms: int
    attempts: int
    result: str  # "success" or "failed" (given up)
    error: str


class NotifyEntry(NamedTuple):
    """What an alert group last notified a receiver: alert fingerprints, and when."""

    group_key: str
    receiver: str
    firing: tuple[str, ...]
    resolved: tuple[str, ...]
    notified_ms: int


def _rollback(cur: duckdb.DuckDBPyConnection) -> None:
    with contextlib.suppress(duckdb.Error):  # the transaction is gone; the first error matters
        cur.execute("ROLLBACK")


def enqueue(
    cur: duckdb.DuckDBPyConnection, items: Sequence[NewNotification], states: Sequence[NotifyEntry]
) -> None:
    """Queue notifications and record the notification state they imply, in one transaction."""
    cur.execute("BEGIN TRANSACTION")
    try:
        for n in items:
            cur.execute(
                "INSERT INTO notify_queue VALUES (nextval('notify_seq'), ?, ?, ?, ?, ?, ?, 0, ?, '')",
                [n.receiver, n.integration, n.group_key, n.status, n.payload, n.created_ms, n.created_ms],
            )
        for e in states:
            cur.execute(
                "INSERT OR REPLACE INTO notify_state VALUES (?, ?, ?, ?, ?)",
                [e.group_key, e.receiver, json.dumps(e.firing), json.dumps(e.resolved), e.notified_ms],
            )
        cur.execute("COMMIT")
    except BaseException:
        _rollback(cur)
        raise


def queued(cur: duckdb.DuckDBPyConnection) -> list[QueuedNotification]:
    """Return every queued notification, oldest first."""
    rows = cur.execute(
        "SELECT id, receiver, integration, group_key, status, payload, created_ms, attempts, "
        "next_attempt_ms, last_error FROM notify_queue ORDER BY id"
    ).fetchall()
    return [QueuedNotification(*r) for r in rows]


def retry_later(cur: duckdb.DuckDBPyConnection, id_: int, attempts: int, next_ms: int, error: str) -> None:
    """Record a failed attempt and when to try again."""
    cur.execute(
        "UPDATE notify_queue SET attempts = ?, next_attempt_ms = ?, last_error = ? WHERE id = ?",
        [attempts, next_ms, error, id_],
    )


def finish(cur: duckdb.DuckDBPyConnection, delivery: Delivery) -> None:
    """Take a notification off the queue and log how it ended, in one transaction."""
    cur.execute("BEGIN TRANSACTION")
    try:
        cur.execute("DELETE FROM notify_queue WHERE id = ?", [delivery.id])
        cur.execute("INSERT INTO notify_log VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", list(delivery))
        cur.execute("COMMIT")
    except BaseException:
        _rollback(cur)
        raise


def log_rows(
    cur: duckdb.DuckDBPyConnection, *, receiver: str | None = None, limit: int = 200
) -> list[Delivery]:
    """Return delivery log rows, newest first."""
    where, params = ("WHERE receiver = ?", [receiver]) if receiver else ("", [])
    rows = cur.execute(
        f"SELECT * FROM notify_log {where} ORDER BY finished_ms DESC, id DESC LIMIT ?", [*params, limit]
    ).fetchall()
    return [Delivery(*r) for r in rows]


def states(cur: duckdb.DuckDBPyConnection) -> list[NotifyEntry]:
    """Return the notification state of every alert group and receiver."""
    rows = cur.execute(
        "SELECT group_key, receiver, firing, resolved, notified_ms FROM notify_state"
    ).fetchall()
    return [NotifyEntry(g, r, tuple(json.loads(f)), tuple(json.loads(s)), int(t)) for g, r, f, s, t in rows]


def prune(cur: duckdb.DuckDBPyConnection, log_before_ms: int, state_before_ms: int) -> None:
    """Delete delivery log rows and notification states older than the cutoffs."""
    cur.execute("DELETE FROM notify_log WHERE finished_ms < ?", [log_before_ms])
    cur.execute("DELETE FROM notify_state WHERE notified_ms < ?", [state_before_ms])
