"""The samples appended after a watermark, for remote write: "the queue is the store".

A sender (one per destination) asks `Store.appended_since(watermark, max_samples)` for what was
written after its watermark, sends it, and once the receiver said 2xx commits the new watermark with
`Store.save_watermark`. A receiver outage or a restart of gpuwatch (clean, or kill -9) then loses
nothing and resends at most what was sent after the last commit.

What a watermark is. Every write is numbered by the writer (`seq`, writer.py): a head row has a seq of
its own, a bulk chunk (an `append_series` of >= 1024 samples, an import's series) one seq for all its
samples. The samples are sent in that order, (seq, t_ms), and a `Watermark(seq, t_ms)` says: every
sample whose (write seq, time) is at most this has been returned. `t_ms` is the time within one seq,
so that a bulk chunk bigger than `max_samples` can be sent in pieces; it is `ALL` where the whole seq
was returned. One pair, whatever the number of series.

Why that is right across compaction. Compaction writes each series' head rows as one chunk row per
window, and merging closed windows joins rows again; either gives the row the newest of its samples'
seqs. That number alone cannot tell, in a row mixing samples sent before the watermark and new ones
(the usual case: a sender a second behind, a compaction every 5 minutes), which are which: by it, all
of the row is new (sent again) or none (lost). A per-series "newest sent time" would tell them apart
only while every series is written in time order: a late sample or an overwrite of a sent time would
be lost. So chunk rows keep each sample's own write seq (`chunks.seqs`, NULL where all samples have
the row's, as in bulk chunks; `seq_lo` the lowest), carried through compaction, merges and
retention's trims (chunking.py, rewrite.py). Samples are then selected by their own seq wherever
they lie; what compaction does no longer matters. The cost: the seqs of head-written rows, which
rise in steps and compress like timestamps (figure in the commit that added them).

Duplicates (the same series and time written again): the newer write has the higher seq, so it
comes after the watermark and is sent again: the receiver gets the newer value too. Where the older
write is still stored and both are past the watermark, only the newest of those returned together
is sent.

Why it is right across restarts and retention. A watermark only ever points at committed writes:
imports and bulk chunks reserve their seqs before they commit, and flushes after them may commit
first, so the writer keeps `visible_seq`, below which every seq is committed (or never will be) with
its series in the catalogue, and a watermark never passes it. After kill -9 what was committed is
there (DuckDB's WAL), so no watermark points past what is stored. The writer numbers on from past the
highest stored seq, the highest saved watermark and the highest seq given out when retention last
deleted samples (`seq_floor`, written in retention's transaction; compaction and merges keep each
series' highest seq, a crash loses only uncommitted writes): nothing that removes the highest seqs can
make new samples numbered at or below a watermark, saved or not, which would never be sent. Samples retention deleted before they were sent are
gone (they are not sent).

Gaps. A sender with `live_first` moves its watermark past what is stored when it is behind, and sends
the stretch it skipped behind the live samples: a gap, from its own watermark up to an end that is a
`newest_appended()` of then (`until`), saved in `remote_gaps` in the same transaction as the move.

Cost. Rows are found by seq: head rows with a seq past the watermark (the head is in write order, so
DuckDB's zone maps skip the rest), and chunk rows whose seqs reach past it: their `seqs` blobs first
(small), taken by lowest seq until the next begins past their `max_samples`-th new seq, then only
those rows' samples decoded. A caught-up sender reads the last flushes' head rows (2,000 new samples over 2,000
series in a store of 1 M: ~5 ms); after a compaction, once, the rows it wrote for the series written
since the watermark (~40 ms there). Catching up after a long outage, each call also decodes the
`seqs` of the rows straddling the watermark (about one window's per series, a day's in a closed day)
again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from gpuwatch.core.model import Labels
from gpuwatch.store.catalog import Snapshot
from gpuwatch.store.codec import decode_times
from gpuwatch.store.decodemany import decode_chunks
from gpuwatch.store.readgate import ReadGate, turn

ALL = 2**63 - 1  # Watermark.t_ms when every sample of its seq was returned


@dataclass(frozen=True, order=True)
class Watermark:
    """Every sample written with a lower seq than `seq`, or with `seq` at a time <= `t_ms`, was
    returned (and, once committed, delivered)."""

    seq: int
    t_ms: int = ALL


START = Watermark(0, ALL)  # nothing returned yet (seqs start at 1)


@dataclass(frozen=True)
class AppendedSeries:
    """One series' samples, in ascending time; values bit for bit (staleness markers included)."""

    name: str
    labels: Labels
    timestamps_ms: np.ndarray  # int64
    values: np.ndarray  # float64


class Appended:
    """What `Store.appended_since` returns: samples in write order and the watermark to commit after
    them; `series` groups them by series, each in ascending time, in order of first appearance."""

    def __init__(
        self,
        snap: Snapshot | None,
        rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
        watermark: Watermark,
    ) -> None:
        self._snap = snap
        self._rows = rows  # series ids, times, values, write seqs: in write order
        self.watermark = watermark
        self._series: tuple[AppendedSeries, ...] | None = None

    @classmethod
    def empty(cls, watermark: Watermark) -> Appended:
        i = np.zeros(0, np.int64)
        return cls(None, (i, i, np.zeros(0), i), watermark)

    @property
    def samples(self) -> int:
        return int(self._rows[0].size)

    @property
    def series(self) -> tuple[AppendedSeries, ...]:
        if self._series is None:
            sid, t, v, _ = self._rows
            self._series = _by_series(self._snap, sid, t, v) if self._snap is not None else ()
        return self._series

    def first(self, k: int) -> tuple[Appended, Appended]:
        """The first `k` samples (or a few more: a write's samples at one time are not split), with
        the watermark just past them, and the rest, with this one's. A sender reads ahead once and
        sends the pieces (remote/backlog.py)."""
        sid, t, v, seq = self._rows
        if k >= sid.size:
            return self, Appended.empty(self.watermark)
        while k < sid.size and seq[k] == seq[k - 1] and t[k] == t[k - 1]:
            k += 1
        if k >= sid.size:
            return self, Appended.empty(self.watermark)
        cut = Watermark(int(seq[k - 1]), int(t[k - 1]))
        head = Appended(self._snap, (sid[:k], t[:k], v[:k], seq[:k]), cut)
        return head, Appended(self._snap, (sid[k:], t[k:], v[k:], seq[k:]), self.watermark)


@dataclass(frozen=True)
class Lag:
    """How far a watermark is behind: `samples` still to send (an upper bound: a chunk row holding
    both sent and new samples counts whole), and `lag_ms`, the age of the oldest of them by its
    timestamp (0 when caught up)."""

    samples: int
    lag_ms: int


def _after(seqs: np.ndarray, t: np.ndarray, mark: Watermark) -> np.ndarray:
    return (seqs > mark.seq) | ((seqs == mark.seq) & (t > mark.t_ms))


def read_appended(
    cur: duckdb.DuckDBPyConnection,
    gate: ReadGate | None,
    snap: Snapshot,
    mark: Watermark,
    max_samples: int,
    visible: int,
) -> Appended:
    """The first `max_samples` samples in (seq, time) order after `mark`, of those with a seq below
    `visible` (module docstring)."""
    top = visible - 1  # the highest seq that may be returned
    if mark.seq > top or (mark.seq == top and mark.t_ms == ALL) or max_samples <= 0:
        return Appended.empty(mark)
    with turn(gate):
        cur.execute("BEGIN TRANSACTION")
        try:
            head = cur.execute(
                "SELECT series_id, t_ms, v_bits, seq FROM head WHERE seq >= $1 AND seq <= $2 "
                "AND (seq > $1 OR t_ms > $3) ORDER BY seq LIMIT $4",
                [mark.seq, top, mark.t_ms, max_samples + 1],
            ).fetchnumpy()
            h_seq = np.asarray(head["seq"], np.int64)
            bound = int(h_seq[max_samples - 1]) if h_seq.size > max_samples else top
            # Chunk rows holding a seq in (mark, bound]: their own seqs first (small), to choose
            # the rows whose samples to decode.
            meta = cur.execute(
                "SELECT rowid, seq, coalesce(seq_lo, seq) AS lo, n, seqs FROM chunks WHERE seq >= $1 "
                "AND coalesce(seq_lo, seq) <= $2 ORDER BY lo",
                [mark.seq, bound],
            ).fetchall()
            bound, chosen = _choose(meta, mark, bound, max_samples)
            rows = (
                cur.execute(
                    "SELECT series_id, seq, coalesce(seq_lo, seq), n, ts, vs, seqs FROM chunks "
                    f"WHERE rowid IN ({','.join(map(str, chosen))})"
                ).fetchall()
                if chosen
                else []
            )
        finally:
            cur.execute("COMMIT")
    keep = h_seq <= bound
    ids = [np.asarray(head["series_id"], np.int64)[keep]]
    ts = [np.asarray(head["t_ms"], np.int64)[keep]]
    vs = [np.asarray(head["v_bits"], np.int64)[keep].view(np.float64)]
    seqs = [h_seq[keep]]
    if rows:
        ns = np.array([r[3] for r in rows], np.int64)
        t, v = decode_chunks(ns, [r[4] for r in rows], [r[5] for r in rows])
        own = np.concatenate(
            [np.full(r[3], r[1], np.int64) if r[6] is None else decode_times(r[6], r[3]) for r in rows]
        )
        ids.append(np.repeat(np.array([r[0] for r in rows], np.int64), ns))
        ts.append(t)
        vs.append(v)
        seqs.append(own)
    sid, t, v, seq = (np.concatenate(x) for x in (ids, ts, vs, seqs))
    mine = _after(seq, t, mark) & (seq <= bound)
    sid, t, v, seq = sid[mine], t[mine], v[mine], seq[mine]
    # The newest write of a (series, time) returned together wins.
    order = np.lexsort((seq, t, sid))
    last = np.ones(order.size, bool)
    last[:-1] = (sid[order][1:] != sid[order][:-1]) | (t[order][1:] != t[order][:-1])
    winners = order[last]
    sid, t, v, seq = sid[winners], t[winners], v[winners], seq[winners]
    order = np.lexsort((t, seq))  # append order
    if order.size > max_samples:
        order = order[:max_samples]
        last_i = order[-1]
        new_mark = Watermark(int(seq[last_i]), int(t[last_i]))
    else:
        new_mark = max(mark, Watermark(bound, ALL))
    return Appended(snap, (sid[order], t[order], v[order], seq[order]), new_mark)


def _choose(
    meta: list[tuple[Any, ...]], mark: Watermark, bound: int, max_samples: int
) -> tuple[int, list[int]]:
    """From chunk rows (rowid, seq, seq_lo, n, seqs) ordered by seq_lo, the bound (at most `bound`)
    up to which about `max_samples` of their samples come after `mark`, and the rows holding those.

    The bound is the `max_samples`-th lowest new seq of the rows: they are taken in order of their
    lowest seq until the next begins past it, so every seq up to it lies in the rows taken. (Bounding
    by the next row's lowest seq instead gave one sample a call where each series' row begins at its
    own seq of one tick, as after an outage longer than a compaction window.)"""
    taken: list[tuple[int, int]] = []  # (rowid, lowest seq of its samples not yet returned)
    low = np.empty(0, np.int64)  # the lowest `max_samples` new seqs of the rows taken so far
    kth: int | None = None  # the highest of those, once there are `max_samples`
    some_new = mark.t_ms != ALL  # samples of `mark.seq` itself may be new
    for rowid, seq, lo, n, blob in meta:
        if kth is not None and lo > kth:
            break
        own = np.full(min(int(n), max_samples), int(seq), np.int64) if blob is None else decode_times(blob, n)
        new = own[(own > mark.seq) | ((own == mark.seq) & some_new)]
        if not new.size:
            continue
        taken.append((int(rowid), int(new.min())))
        low = np.concatenate([low, new if kth is None else new[new <= kth]])
        if low.size >= max_samples:
            low = np.partition(low, max_samples - 1)[:max_samples]
            kth = int(low[max_samples - 1])
    if kth is not None:
        bound = min(bound, kth)
    return bound, [rowid for rowid, lowest in taken if lowest <= bound]


def _by_series(snap: Snapshot, sid: np.ndarray, t: np.ndarray, v: np.ndarray) -> tuple[AppendedSeries, ...]:
    """Group samples (in append order) by series, each in ascending time, series in order of first
    appearance; series no longer in the catalogue (retention deleted them meanwhile) left out."""
    if not sid.size:
        return ()
    uniq, first = np.unique(sid, return_index=True)
    by_time = np.lexsort((t, sid))
    s_sorted = sid[by_time]
    cuts = np.searchsorted(s_sorted, uniq)
    ends = np.r_[cuts[1:], s_sorted.size]
    out = []
    for k in np.argsort(first, kind="stable").tolist():
        entry = snap.by_id.get(int(uniq[k]))
        if entry is None:
            continue
        part = by_time[cuts[k] : ends[k]]
        out.append(AppendedSeries(entry.name, entry.labels, t[part], v[part]))
    return tuple(out)


def read_lag(cur: duckdb.DuckDBPyConnection, mark: Watermark, visible: int, now_ms: int) -> Lag:
    row = cur.execute(
        "SELECT (SELECT count(*) FROM head WHERE seq > $1 AND seq < $2), "
        "(SELECT min(t_ms) FROM head WHERE seq > $1 AND seq < $2), "
        "(SELECT coalesce(sum(n), 0) FROM chunks WHERE seq > $1 AND coalesce(seq_lo, seq) < $2), "
        "(SELECT min(t_min_ms) FROM chunks WHERE seq > $1 AND coalesce(seq_lo, seq) < $2)",
        [mark.seq, visible],
    ).fetchone()
    if row is None:
        return Lag(0, 0)
    samples = int(row[0]) + int(row[2])
    oldest = [int(x) for x in (row[1], row[3]) if x is not None]
    return Lag(samples, max(0, now_ms - min(oldest)) if oldest else 0)


# -- saved watermarks ----------------------------------------------------------------------------------


def save(cur: duckdb.DuckDBPyConnection, destination: str, mark: Watermark, now_ms: int) -> None:
    cur.execute(
        "INSERT OR REPLACE INTO remote_watermarks VALUES (?, ?, ?, ?)",
        [destination, mark.seq, mark.t_ms, now_ms],
    )


def load(cur: duckdb.DuckDBPyConnection, destination: str) -> Watermark | None:
    row = cur.execute(
        "SELECT seq, t_ms FROM remote_watermarks WHERE destination = ?", [destination]
    ).fetchone()
    return None if row is None else Watermark(int(row[0]), int(row[1]))


@dataclass(frozen=True)
class Gap:
    """A stretch a destination's live lane skipped: the samples after `start` up to `end` (whose
    `t_ms` is ALL), sent behind the live ones (`queue_config.live_first`)."""

    start: Watermark
    end: Watermark


def load_gaps(cur: duckdb.DuckDBPyConnection, destination: str) -> list[Gap]:
    rows = cur.execute(
        "SELECT seq, t_ms, end_seq FROM remote_gaps WHERE destination = ? ORDER BY end_seq", [destination]
    ).fetchall()
    return [Gap(Watermark(int(seq), int(t)), Watermark(int(end), ALL)) for seq, t, end in rows]


def save_gap(cur: duckdb.DuckDBPyConnection, destination: str, gap: Gap, now_ms: int) -> None:
    if gap.start >= gap.end:
        cur.execute(
            "DELETE FROM remote_gaps WHERE destination = ? AND end_seq = ?", [destination, gap.end.seq]
        )
    else:
        cur.execute(
            "INSERT OR REPLACE INTO remote_gaps VALUES (?, ?, ?, ?, ?)",
            [destination, gap.end.seq, gap.start.seq, gap.start.t_ms, now_ms],
        )


class AppendedReads:
    """Mixed into `Store`, which provides the writer, the cursors, the catalogue and the read gate."""

    _gate: ReadGate
    _writer: Any

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        raise NotImplementedError

    def _snapshot(self) -> Snapshot:
        raise NotImplementedError

    def _ask(self, fn: Callable[[], Any], kind: str = "call") -> Any:
        raise NotImplementedError

    def _need_writer(self) -> Any:
        raise NotImplementedError

    def _visible(self) -> int:
        if self._writer is not None:
            return int(self._writer.visible_seq)
        row = (
            self._cursor()
            .execute("SELECT greatest((SELECT max(seq) FROM head), (SELECT max(seq) FROM chunks))")
            .fetchone()
        )
        return (int(row[0]) if row and row[0] is not None else 0) + 1

    def appended_since(
        self, watermark: Watermark | None, max_samples: int, until: Watermark | None = None
    ) -> Appended:
        """Return at most `max_samples` samples written after `watermark` (None: from the first stored)
        and, given `until` (a `newest_appended()` of earlier), up to it, in write order, grouped by series
        in ascending time, with the watermark to save once they are delivered (`appended.py`)."""
        mark = START if watermark is None else watermark
        visible = self._visible()  # then the catalogue: it holds the series of every seq below it
        snap = self._snapshot()
        if self._writer is not None and mark.seq >= visible:
            # A watermark from before a restart that lost the highest seqs: number new writes past it.
            writer = self._writer
            self._ask(lambda: writer.seq_past(mark.seq), kind="now")
        if until is not None:
            visible = min(visible, until.seq + 1)
        return read_appended(self._cursor(), self._gate, snap, mark, max_samples, visible)

    def newest_appended(self) -> Watermark:
        """The watermark of a sender that has sent everything stored: `appended_since` of it is empty."""
        return Watermark(self._visible() - 1, ALL)

    def appended_lag(self, watermark: Watermark | None, now_ms: int, until: Watermark | None = None) -> Lag:
        """How far `watermark` is behind `newest_appended()` (or `until`): samples to send and the
        oldest one's age."""
        mark = START if watermark is None else watermark
        visible = self._visible() if until is None else min(self._visible(), until.seq + 1)
        with turn(self._gate):
            return read_lag(self._cursor(), mark, visible, now_ms)

    def load_watermark(self, destination: str) -> Watermark | None:
        """The watermark saved for `destination`, or None."""
        return load(self._cursor(), destination)

    def save_watermark(self, destination: str, watermark: Watermark, now_ms: int) -> None:
        """Save `destination`'s watermark, durably once this returns (on the writer thread)."""
        writer = self._need_writer()

        def write() -> None:
            save(writer._cur, destination, watermark, now_ms)
            writer.seq_past(watermark.seq)

        self._ask(write, kind="now")

    def load_gaps(self, destination: str) -> list[Gap]:
        """The stretches `destination`'s live lane skipped and that are not yet sent, oldest first."""
        return load_gaps(self._cursor(), destination)

    def save_gap(
        self, destination: str, start: Watermark, end: Watermark, now_ms: int, live: Watermark | None = None
    ) -> None:
        """Save that the gap up to `end` is sent up to `start` (it goes once `start` reaches `end`) and,
        given `live`, the destination's watermark in the same transaction: a gap is opened by moving
        the live lane past it, and a crash between the two writes would lose the gap."""
        writer = self._need_writer()

        def write() -> None:
            cur = writer._cur
            cur.execute("BEGIN TRANSACTION")
            try:
                save_gap(cur, destination, Gap(start, end), now_ms)
                if live is not None:
                    save(cur, destination, live, now_ms)
                cur.execute("COMMIT")
            except duckdb.Error:
                cur.execute("ROLLBACK")
                raise
            writer.seq_past(max(end.seq, live.seq if live is not None else 0))

        self._ask(write, kind="now")
