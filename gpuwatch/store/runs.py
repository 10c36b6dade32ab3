"""Training-run metadata in the `runs` table: written on the writer's cursor, read on any cursor."""

from __future__ import annotations

import json
from typing import Any

import duckdb

from gpuwatch.core.model import RunRecord, RunUpdate

_COLUMNS = (
    "name, status, start_ms, end_ms, total_steps, config, host, gpus, last_step, last_seen_ms, updated_ms, "
    "process"
)


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), allow_nan=False)


def upsert(cur: duckdb.DuckDBPyConnection, u: RunUpdate) -> None:
    """Apply one update (on the writer's cursor)."""
    row = cur.execute("SELECT start_ms FROM runs WHERE name = ?", [u.name]).fetchone()
    if row is None:
        cur.execute(
            f"INSERT INTO runs ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                u.name,
                u.status if u.action == "finish" and u.status else "running",
                u.time_ms,
                u.time_ms if u.action == "finish" else None,
                u.total_steps,
                _json(u.config),
                u.host,
                _json(u.gpus),
                u.last_step,
                u.time_ms,
                u.time_ms,
                _json(u.process),
            ],
        )
        return
    if u.action == "init":
        cur.execute(
            "UPDATE runs SET status = 'running', end_ms = NULL, total_steps = coalesce(?, total_steps), "
            "config = coalesce(?, config), host = coalesce(?, host), gpus = coalesce(?, gpus), "
            "process = coalesce(?, process), "
            "last_seen_ms = greatest(coalesce(last_seen_ms, 0), ?), updated_ms = ? WHERE name = ?",
            [
                u.total_steps,
                _json(u.config),
                u.host,
                _json(u.gpus),
                _json(u.process),
                u.time_ms,
                u.time_ms,
                u.name,
            ],
        )
    elif u.action == "finish":
        cur.execute(
            "UPDATE runs SET status = ?, end_ms = ?, total_steps = coalesce(?, total_steps), "
            "last_step = coalesce(?, last_step), last_seen_ms = greatest(coalesce(last_seen_ms, 0), ?), "
            "updated_ms = ? WHERE name = ?",
            [u.status or "ok", u.time_ms, u.total_steps, u.last_step, u.time_ms, u.time_ms, u.name],
        )
    else:
        # Pushes may arrive late or be retried: only a newer sighting moves the last step.
        cur.execute(
            "UPDATE runs SET last_step = CASE WHEN ? >= coalesce(last_seen_ms, 0) THEN coalesce(?, last_step) "
            "ELSE last_step END, last_seen_ms = greatest(coalesce(last_seen_ms, 0), ?), updated_ms = ? "
            "WHERE name = ?",
            [u.time_ms, u.last_step, u.time_ms, u.time_ms, u.name],
        )


def read_all(cur: duckdb.DuckDBPyConnection) -> list[RunRecord]:
    """Return every run, the most recently started first."""
    rows = cur.execute(
        "SELECT name, status, start_ms, end_ms, total_steps, config, host, gpus, last_step, last_seen_ms, "
        "process "
        "FROM runs ORDER BY start_ms DESC NULLS LAST, name"
    ).fetchall()
    return [
        RunRecord(
            name=r[0],
            status=r[1],
            start_ms=r[2],
            end_ms=r[3],
            total_steps=r[4],
            config=json.loads(r[5]) if r[5] is not None else None,
            host=r[6],
            gpus=json.loads(r[7]) if r[7] is not None else None,
            last_step=r[8],
            last_seen_ms=r[9],
            process=json.loads(r[10]) if r[10] is not None else None,
        )
        for r in rows
    ]
