"""Read samples of known series ids from chunks and head, on the calling thread's own cursor."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import duckdb
import numpy as np

from gpuwatch.store.chunking import decode_row, dedupe_last
from gpuwatch.store.codec import decode_times


@contextlib.contextmanager
def _snapshot(cur: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """Run the enclosed queries in one read transaction, so they see one consistent state."""
    cur.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        cur.execute("ROLLBACK")
        raise
    cur.execute("COMMIT")


def _id_filter(ids: Sequence[int]) -> str:
    return f"series_id IN ({','.join(str(int(i)) for i in ids)})"


def read_samples(
    cur: duckdb.DuckDBPyConnection, ids: Sequence[int], start_ms: int, end_ms: int
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Return {series id: (timestamps, values)} with start_ms <= t <= end_ms; empty series left out."""
    if not ids:
        return {}
    where = _id_filter(ids)
    with _snapshot(cur):  # a compaction may move head rows into chunks between the two queries
        chunks, head = _fetch(cur, where, start_ms, end_ms)
    parts: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray | int]]] = {}
    for sid, seq, n, t_min, t_max, ts, vs in chunks:
        t, v = decode_row(n, ts, vs)
        if t_min < start_ms or t_max > end_ms:
            lo, hi = np.searchsorted(t, [start_ms, end_ms + 1])
            t, v = t[lo:hi], v[lo:hi]
        if t.size:
            parts.setdefault(sid, []).append((t, v, seq))
    h_ids = np.asarray(head["series_id"])
    if h_ids.size:
        h_t, h_seq = np.asarray(head["t_ms"]), np.asarray(head["seq"])
        h_v = np.asarray(head["v_bits"]).view(np.float64)
        cuts = np.flatnonzero(h_ids[1:] != h_ids[:-1]) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, h_ids.size], strict=True):
            t, v = dedupe_last(h_t[lo:hi], h_v[lo:hi], h_seq[lo:hi])
            parts.setdefault(int(h_ids[lo]), []).append((t, v, int(h_seq[lo:hi].max())))
    return {sid: _combine(p) for sid, p in parts.items()}


def _fetch(cur: duckdb.DuckDBPyConnection, where: str, start_ms: int, end_ms: int) -> tuple[list[Any], Any]:
    chunks = cur.execute(
        f"SELECT series_id, seq, n, t_min_ms, t_max_ms, ts, vs FROM chunks WHERE {where} "
        "AND t_max_ms >= ? AND t_min_ms <= ? ORDER BY series_id, t_min_ms, seq",
        [start_ms, end_ms],
    ).fetchall()
    head = cur.execute(
        f"SELECT series_id, t_ms, v_bits, seq FROM head WHERE {where} AND t_ms >= ? AND t_ms <= ? "
        "ORDER BY series_id, t_ms, seq",
        [start_ms, end_ms],
    ).fetchnumpy()
    return chunks, head


def _combine(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | int]]) -> tuple[np.ndarray, np.ndarray]:
    if len(parts) == 1:
        t, v, _ = parts[0]
        return t, v
    t = np.concatenate([p[0] for p in parts])
    v = np.concatenate([p[1] for p in parts])
    if np.all(t[1:] > t[:-1]):
        return t, v
    order = np.concatenate([np.broadcast_to(np.asarray(p[2], np.int64), p[0].shape) for p in parts])
    return dedupe_last(t, v, order)


def ids_with_samples(
    cur: duckdb.DuckDBPyConnection, ids: Sequence[int], start_ms: int, end_ms: int
) -> set[int]:
    """Return the subset of `ids` having at least one sample with start_ms <= t <= end_ms."""
    if not ids:
        return set()
    with _snapshot(cur):
        return _ids_with_samples(cur, ids, start_ms, end_ms)


def _ids_with_samples(
    cur: duckdb.DuckDBPyConnection, ids: Sequence[int], start_ms: int, end_ms: int
) -> set[int]:
    where = _id_filter(ids)
    found = {
        r[0]
        for r in cur.execute(
            f"SELECT DISTINCT series_id FROM head WHERE {where} AND t_ms >= ? AND t_ms <= ? UNION "
            f"SELECT DISTINCT series_id FROM chunks WHERE {where} AND "
            "((t_min_ms >= ? AND t_min_ms <= ?) OR (t_max_ms >= ? AND t_max_ms <= ?))",
            [start_ms, end_ms] * 3,
        ).fetchall()
    }
    # A chunk may span the range without a sample inside it (a gap); look at its timestamps.
    rest = [i for i in ids if i not in found]
    if rest:
        for sid, n, ts in cur.execute(
            f"SELECT series_id, n, ts FROM chunks WHERE {_id_filter(rest)} AND t_min_ms < ? AND t_max_ms > ?",
            [start_ms, end_ms],
        ).fetchall():
            if sid not in found:
                t = decode_times(ts, n)
                lo, hi = np.searchsorted(t, [start_ms, end_ms + 1])
                if hi > lo:
                    found.add(sid)
    return found
