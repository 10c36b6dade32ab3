"""Build the 1-minute and 1-hour tiers from the raw samples on the writer's thread in short steps: a
closed UTC day at a time while behind, then today's closed hours, each hour.

- A span (the rest of a day, or today's hours up to the last closed one) is built once its end has
  been over for `GRACE_MS` (late scrapes and flushes land first), every series with samples in it, in
  batches of about `BATCH_SAMPLES` raw samples, each batch one transaction that also records how far
  the build got (`tier_state`): a restart resumes there. A series' row of the day is rewritten each
  hour until the day closes (~0.3 ms a series), so a query reads at most the last hour from raw. The
  first build after an upgrade starts at the oldest raw day, so a store written before tiers existed
  is backfilled in the background, a few batches a step.
- A sample written later for a day already built (an import, a node's backlog arriving by remote
  write, a late push) is in a chunk whose write seq is past the seq the day's 1-minute row was built
  at: each step looks for such chunks among those written since it last looked, and rebuilds those
  series' days, 1-minute and 1-hour points alike.
- Until a span is built, reads build its points from the raw samples as they go
  (`Store.select_tiers`), so an answer never depends on how far the build got.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import duckdb
import numpy as np

from gpuwatch.core.tiers import HOUR_MS, MINUTE_MS, TierPoints, build, combine
from gpuwatch.store import sqlrows
from gpuwatch.store.headindex import HeadIndex
from gpuwatch.store.read import read_samples
from gpuwatch.store.tierrows import DAY_MS, replace_span

log = logging.getLogger(__name__)

GRACE_MS = 10 * 60_000
# Raw samples read, decoded and summed up in one transaction: the build's peak grows by ~185 bytes a
# sample of the batch (the demo's week of 64 GPUs: +443 MiB at 2 M, +175 at 500 k, +121 at 250 k, in
# about the same time; bench/README.md, "Tiers") ...
BATCH_SAMPLES = 250_000
BATCH_SERIES = 2_000  # ... of at most this many series (their 1-hour rows, ~11 KB each, are rewritten)


@dataclass
class TierState:
    """How far the tiers are built: every bucket ending at or before `built_ms` (None: nothing stored
    yet), then, of the span up to `span_end_ms` under way, the series from `next_sid` on; and
    `checked_seq`, the write seq up to which chunks were looked at for late samples."""

    built_ms: int | None
    next_sid: int
    checked_seq: int
    span_end_ms: int = 0


def load_state(cur: duckdb.DuckDBPyConnection) -> TierState:
    row = cur.execute("SELECT built_ms, next_sid, checked_seq, span_end_ms FROM tier_state").fetchone()
    if row is None:
        return TierState(None, 0, 0)
    return TierState(row[0], int(row[1]), int(row[2]), int(row[3]))


def _save_state(cur: duckdb.DuckDBPyConnection, state: TierState) -> None:
    cur.execute("DELETE FROM tier_state")
    cur.execute(
        "INSERT INTO tier_state VALUES (?, ?, ?, ?)",
        [state.built_ms, state.next_sid, state.checked_seq, state.span_end_ms],
    )


def _oldest_day(cur: duckdb.DuckDBPyConnection) -> int | None:
    row = cur.execute(
        "SELECT least((SELECT min(t_min_ms) FROM chunks), (SELECT min(t_ms) FROM head))"
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return (int(row[0]) - 1) // DAY_MS * DAY_MS  # the day holding it: samples in (lo, lo + DAY]


def _day_sizes(
    cur: duckdb.DuckDBPyConnection, lo: int, hi: int, first_sid: int
) -> tuple[np.ndarray, np.ndarray]:
    """(series ids from `first_sid` on with samples in (lo, hi], about how many each), by id."""
    found = cur.execute(
        "SELECT series_id, sum(n) AS n FROM (SELECT series_id, n FROM chunks WHERE t_max_ms > ? AND t_min_ms <= ? "
        "AND series_id >= ? UNION ALL SELECT series_id, 1 FROM head WHERE t_ms > ? AND t_ms <= ? AND series_id >= ?) "
        "GROUP BY series_id ORDER BY series_id",
        [lo, hi, first_sid, lo, hi, first_sid],
    ).fetchnumpy()
    return np.asarray(found["series_id"], np.int64), np.asarray(found["n"], np.int64)


def _batches(ids: np.ndarray, sizes: np.ndarray) -> Iterator[list[int]]:
    start, total = 0, 0
    for i, n in enumerate(sizes.tolist()):
        total += n
        if total >= BATCH_SAMPLES or i + 1 - start >= BATCH_SERIES or i + 1 == ids.size:
            yield ids[start : i + 1].tolist()
            start, total = i + 1, 0


def build_span(
    cur: duckdb.DuckDBPyConnection, ids: list[int], lo: int, hi: int, head_index: HeadIndex | None
) -> dict[int, TierPoints]:
    """The 1-minute points of series `ids` in (lo, hi] (hours of one day), from their raw samples."""
    found = read_samples(cur, ids, lo + 1, hi, head_index)
    return {sid: build(t, v, MINUTE_MS) for sid, (t, v) in found.items() if t.size}


def write_span(
    cur: duckdb.DuckDBPyConnection, ids: list[int], lo: int, hi: int, minute: dict[int, TierPoints], seq: int
) -> None:
    """Replace series `ids`' points of (lo, hi] by `minute` and the hours made from it."""
    hour = {sid: combine(p, HOUR_MS) for sid, p in minute.items()}
    replace_span(cur, MINUTE_MS, lo, hi, ids, minute, seq)
    replace_span(cur, HOUR_MS, lo, hi, ids, hour, seq)


class TierBuilder:
    """The writer's tier builds (module docstring); `step` does a bounded share of what is due."""

    def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
        self._cur = cur
        self.state = load_state(cur)
        self.raw_floor_ms = 0  # retention's last cutoff: days before it are no longer whole in raw

    def step(self, now_ms: int, seq: int, head_index: HeadIndex | None, max_batches: int = 4) -> bool:
        """Build up to `max_batches` batches of what is due at `now_ms`, rows marked with write seq
        `seq` (every write up to it is committed); return whether more is due."""
        cur = self._cur
        done = self._rebuild_late(seq, head_index, max_batches)
        state = self.state
        if state.next_sid == 0:  # at a day's start: skip to the oldest day raw samples are left of
            oldest = _oldest_day(cur)
            if oldest is None:
                return False
            if state.built_ms is None or state.built_ms < oldest:
                self.state = state = TierState(oldest, 0, state.checked_seq)  # (a day's start)
        built = state.built_ms
        assert built is not None
        closed = (now_ms - GRACE_MS) // HOUR_MS * HOUR_MS
        while done < max_batches and built < closed:
            lo = built
            # To the next midnight, or the last closed hour of today: a series' day row is rewritten
            # each hour until the day closes. A span under way keeps the end it began with.
            hi = state.span_end_ms if state.next_sid else min((lo // DAY_MS + 1) * DAY_MS, closed)
            ids, sizes = _day_sizes(cur, lo, hi, state.next_sid)
            batch = next(_batches(ids, sizes), [])
            minute = build_span(cur, batch, lo, hi, head_index) if batch else {}
            last = not batch or batch[-1] == int(ids[-1])
            after = (
                TierState(hi, 0, state.checked_seq)
                if last
                else TierState(lo, batch[-1] + 1, state.checked_seq, hi)
            )

            def write(
                batch: list[int] = batch, lo: int = lo, hi: int = hi, minute: dict[int, TierPoints] = minute
            ) -> None:
                write_span(cur, batch, lo, hi, minute, seq)

            self._commit(write, after)
            state, built = after, hi if last else lo
            done += 1
        return built < closed

    def _rebuild_late(self, seq: int, head_index: HeadIndex | None, max_batches: int) -> int:
        """Rebuild the days that chunks written since the last look hold samples of, where their
        1-minute row was built before them (the day under way too, for the series done in it); return
        the batches written. Only a chunk whose first sample is at or before where its series' points
        are built is late: the live stream's chunks, all after it, are for the next hour's build (taking
        them for late rebuilt every sampled series' day so far after each compaction)."""
        cur, state = self._cur, self.state
        if state.built_ms is None or seq <= state.checked_seq:
            return 0
        # Head rows move to chunks with the seqs they have: look again from the oldest one still there.
        head_lo = sqlrows.scalar(cur, "SELECT coalesce(min(seq), 0) FROM head")
        upto = min(seq, head_lo - 1) if head_lo else seq
        late = cur.execute(
            f"""
            SELECT c.series_id, c.d, max(c.seq) FROM (
                SELECT series_id, seq,
                       unnest(range((t_min_ms - 1) // {DAY_MS}, (t_max_ms - 1) // {DAY_MS} + 1)) AS d
                FROM chunks WHERE seq > ? AND seq <= ?
                    AND t_min_ms <= CASE WHEN series_id < ? THEN ? ELSE ? END) c
            LEFT JOIN tier_1m t ON t.series_id = c.series_id AND (t.t_min_ms - 1) // {DAY_MS} = c.d
            WHERE (c.d * {DAY_MS} < ? OR (c.d * {DAY_MS} = ? AND c.series_id < ?)) AND c.d * {DAY_MS} >= ?
            GROUP BY c.series_id, c.d, t.seq HAVING t.seq IS NULL OR max(c.seq) > t.seq
            ORDER BY c.d, c.series_id
            """,
            [
                state.checked_seq,
                upto,
                state.next_sid,
                max(state.span_end_ms, state.built_ms),
                state.built_ms,
                state.built_ms,
                state.built_ms,
                state.next_sid,
                self.raw_floor_ms,
            ],
        ).fetchall()
        by_day: dict[int, list[int]] = {}
        for sid, d, _ in late:
            by_day.setdefault(int(d) * DAY_MS, []).append(int(sid))
        done = 0
        for lo, wanted in by_day.items():
            ids, sizes = _day_sizes(cur, lo, lo + DAY_MS, 0)
            keep = np.isin(ids, wanted)
            for batch in _batches(ids[keep], sizes[keep]):
                if done >= max_batches:  # the rest at the next step: the look is not moved on
                    return done
                minute = build_span(cur, batch, lo, lo + DAY_MS, head_index)
                self._commit(lambda: write_span(cur, batch, lo, lo + DAY_MS, minute, seq), state)  # noqa: B023 - called here
                done += 1
        if late:
            log.info("tiers: rebuilt %d series-days that got late samples", len(late))
        self._commit(lambda: None, TierState(state.built_ms, state.next_sid, upto, state.span_end_ms))
        return done

    def _commit(self, write: Callable[[], None], after: TierState) -> None:
        """Run `write` and record `after` in one transaction; reads see `after` once it committed."""
        cur = self._cur
        cur.execute("BEGIN TRANSACTION")
        try:
            write()
            _save_state(cur, after)
            cur.execute("COMMIT")
        except BaseException:
            sqlrows.rollback(cur)
            raise
        self.state = after
