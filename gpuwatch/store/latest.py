"""The newest stored sample of each series, kept in memory so instant selectors need not read a window.

An instant vector selector only uses the last sample in (t - 5m, t] of each series, yet reading that
window from DuckDB decodes every sample in it (a 1 s series: 300 of them). `Latest` remembers, per
series id, the newest timestamp the store holds and, where it knows it, the value stored there. The
writer thread keeps it (`note` after each committed flush, `drop_before` after retention); readers
ask `lookup`. Rules that make it exact:

- at open, the newest stored timestamp of every series is read from the database, but not its value:
  such a series is "unknown" until a sample at or after that time is written (for a sampled series,
  a second after a restart);
- a written sample at or after the newest timestamp becomes the newest (the last write wins at an
  equal timestamp, as in the store); an older one (backfill, import) changes nothing;
- within one flush, bulk chunks (`append_series` of many samples) come before the head rows, as
  their `seq` numbers do;
- retention deletes samples before a cutoff: a series whose newest sample is older has none left;
- staleness markers (STALE_NAN) are samples like any other: the newest may be one, and the query
  engine hides the series as it would after a window read.

A series with no known value, or whose newest sample lies after the read's end (a sample with a
future timestamp), is not vouched for: `Store.select_last` reads it the normal way.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from time import monotonic

import duckdb
import numpy as np

from gpuwatch.store.chunking import ChunkRow, decode_row

_NONE_T, _NONE_V = np.zeros(0, np.int64), np.zeros(0)
ROW_LOG_MAX = 1_000_000  # head rows kept for `written_since` (24 MB; over 7 minutes of 64 GPUs)
ROW_LOG_SECONDS = 600.0  # and no flush older than this: readers come back every evaluation interval


class Latest:
    """Per series id: the newest stored timestamp, and its value where known (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t = np.zeros(0, np.int64)  # newest stored timestamp, where `_has`
        self._v = np.zeros(0, np.float64)  # the value stored at `_t`, where `_known`
        self._has = np.zeros(0, bool)  # the series has stored samples and `_t` is the newest's time
        self._known = np.zeros(0, bool)
        # Write log for readers that keep data between reads (RoundCache): per committed flush, its
        # number and the oldest timestamp it wrote (retention: every timestamp counts as touched).
        self.version = 0
        self._log: collections.deque[tuple[int, int]] = collections.deque(maxlen=4096)
        # The head rows of the most recent flushes, (version, ids, t, v) in write order, for readers
        # that keep data and take in only what was written since (`written_since`). A flush with bulk
        # chunks, or retention, is recorded as (version, None, ...): what it did is not in the log.
        self._rows: collections.deque[tuple[int, np.ndarray | None, np.ndarray, np.ndarray]] = (
            collections.deque()
        )
        self._rows_at: collections.deque[float] = collections.deque()  # monotonic time of each entry
        self._rows_n = 0
        self._rows_from = 0  # the log holds every flush after this version

    @classmethod
    def load(cls, cur: duckdb.DuckDBPyConnection) -> Latest:
        """Return one holding the newest stored timestamp of every series (values unknown)."""
        rows = cur.execute(
            "SELECT series_id, max(t) AS t FROM (SELECT series_id, max(t_max_ms) AS t FROM chunks "
            "GROUP BY series_id UNION ALL SELECT series_id, max(t_ms) AS t FROM head GROUP BY series_id) "
            "GROUP BY series_id"
        ).fetchnumpy()
        latest = cls()
        ids = np.asarray(rows["series_id"], np.int64)
        if ids.size:
            latest._grow(int(ids.max()) + 1)
            latest._t[ids] = np.asarray(rows["t"], np.int64)
            latest._has[ids] = True
        return latest

    def _grow(self, size: int) -> None:
        if size <= self._t.size:
            return
        size = max(size, 2 * self._t.size, 1024)
        pad = size - self._t.size
        self._t = np.concatenate([self._t, np.zeros(pad, np.int64)])
        self._v = np.concatenate([self._v, np.zeros(pad, np.float64)])
        self._has = np.concatenate([self._has, np.zeros(pad, bool)])
        self._known = np.concatenate([self._known, np.zeros(pad, bool)])

    def note(self, chunks: Sequence[ChunkRow], ids: np.ndarray, t_ms: np.ndarray, values: np.ndarray) -> None:
        """Take in one committed flush: bulk `chunks`, then head rows (ids, t_ms, values) in write order."""
        oldest = min((r.t_min_ms for r in chunks), default=2**63 - 1)
        if ids.size:
            oldest = min(oldest, int(t_ms.min()))
        # (A flush with bulk chunks is not in the log: nothing of it is kept.)
        logged = (None, _NONE_T, _NONE_V) if chunks else (np.asarray(ids, np.int64), t_ms, values)
        if chunks:
            # Per series, the chunk holding its newest sample (the later written at an equal time).
            best: dict[int, ChunkRow] = {}
            for row in chunks:
                old = best.get(row.series_id)
                if old is None or row.t_max_ms >= old.t_max_ms:
                    best[row.series_id] = row
            c_ids = np.fromiter(best, np.int64, len(best))
            c_t = np.fromiter((r.t_max_ms for r in best.values()), np.int64, len(best))
            c_v = np.fromiter((_last_value(r) for r in best.values()), np.float64, len(best))
            ids = np.concatenate([c_ids, np.asarray(ids, np.int64)])
            t_ms = np.concatenate([c_t, t_ms])
            values = np.concatenate([c_v, values])
        if not ids.size:
            return
        # The newest sample of each series in this flush: highest time, then last written. Two
        # unbuffered maxima over a table by series id: linear, no sort (a flush can be 500k rows).
        ids = np.asarray(ids, np.int64)
        size = int(ids.max()) + 1
        newest = np.full(size, np.iinfo(np.int64).min)
        np.maximum.at(newest, ids, t_ms)
        at_newest = t_ms == newest[ids]
        last = np.full(size, -1)
        np.maximum.at(last, ids[at_newest], np.flatnonzero(at_newest))
        pick = last[last >= 0]
        u_ids, u_t, u_v = ids[pick], t_ms[pick], values[pick]
        with self._lock:
            self._grow(int(u_ids.max()) + 1)
            newer = ~self._has[u_ids] | (u_t >= self._t[u_ids])
            u_ids, u_t, u_v = u_ids[newer], u_t[newer], u_v[newer]
            self._t[u_ids] = u_t
            self._v[u_ids] = u_v
            self._has[u_ids] = True
            self._known[u_ids] = True
            self.version += 1
            self._log.append((self.version, oldest))
            self._log_rows_locked(*logged)

    def _log_rows_locked(self, ids: np.ndarray | None, t_ms: np.ndarray, values: np.ndarray) -> None:
        now = monotonic()
        self._rows.append((self.version, ids, t_ms, values))
        self._rows_at.append(now)
        self._rows_n += 0 if ids is None else ids.size
        while self._rows and (
            self._rows_n > ROW_LOG_MAX or len(self._rows) > 4096 or self._rows_at[0] < now - ROW_LOG_SECONDS
        ):
            self._rows_at.popleft()
            version, old, _, _ = self._rows.popleft()
            self._rows_n -= 0 if old is None else old.size
            self._rows_from = version

    def written_since(
        self, version: int, ids: np.ndarray, start_ms: int
    ) -> tuple[int, dict[int, tuple[np.ndarray, np.ndarray]], np.ndarray] | None:
        """Return (the version now, {series id: (t, v)}, every series id those flushes wrote): the
        samples at or after `start_ms` that the flushes after `version` wrote to series `ids`, per
        series sorted by time, the last write at a timestamp winning. None where the log cannot tell: it no longer reaches back to `version`,
        or one of those flushes wrote bulk chunks or was retention."""
        with self._lock:
            if version < self._rows_from:
                return None
            parts = [(i, t, v) for ver, i, t, v in self._rows if ver > version]
            now = self.version
        if any(i is None for i, _, _ in parts):
            return None
        if not parts:
            return now, {}, np.zeros(0, np.int64)
        all_ids = np.concatenate([p[0] for p in parts])
        all_t = np.concatenate([p[1] for p in parts])
        # Ids are small dense integers: flag arrays instead of sorting (np.unique, np.isin) the
        # log's rows, ~250 k for a 30 s group on a busy node (27 -> ~3 ms a call).
        top = int(max(all_ids.max(), ids.max() if ids.size else 0)) + 1
        flags = np.zeros(top, bool)
        flags[all_ids] = True
        written = np.flatnonzero(flags)
        flags[:] = False
        flags[ids] = True
        pick = np.flatnonzero(flags[all_ids] & (all_t >= start_ms))
        all_v = np.concatenate([p[2] for p in parts])[pick]
        all_ids, all_t = all_ids[pick], all_t[pick]
        # By series, then time, then write order (lexsort is stable); the last of equal (id, t) wins.
        order = np.lexsort((all_t, all_ids))
        all_ids, all_t, all_v = all_ids[order], all_t[order], all_v[order]
        keep = np.ones(all_ids.size, bool)
        keep[:-1] = (all_ids[1:] != all_ids[:-1]) | (all_t[1:] != all_t[:-1])
        all_ids, all_t, all_v = all_ids[keep], all_t[keep], all_v[keep]
        cuts = np.flatnonzero(all_ids[1:] != all_ids[:-1]) + 1
        out = {}
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, all_ids.size].tolist(), strict=True):
            if hi > lo:
                out[int(all_ids[lo])] = (all_t[lo:hi], all_v[lo:hi])
        return now, out, written

    def drop_before(self, cutoff_ms: int) -> None:
        """Retention deleted every sample before `cutoff_ms`."""
        with self._lock:
            gone = self._has & (self._t < cutoff_ms)
            self._has[gone] = False
            self._known[gone] = False
            self.version += 1
            self._log.append((self.version, 2**63 - 1))
            self._log_rows_locked(None, _NONE_T, _NONE_V)

    def changed_since(self, version: int, t_ms: int) -> bool:
        """Whether a flush after `version` wrote a sample at or before `t_ms`, or retention ran."""
        with self._lock:
            if self.version == version:
                return False
            if not self._log or self._log[0][0] > version + 1:
                return True  # the log no longer reaches back that far
            for v, oldest in reversed(self._log):
                if v <= version:
                    return False
                if oldest <= t_ms:
                    return True
            return False

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Return (known, t, v) for series `ids`: where known, the newest stored sample is (t, v)."""
        ids = np.asarray(ids, np.int64)
        with self._lock:
            inside = ids < self._t.size
            safe = np.where(inside, ids, 0)
            if self._t.size == 0:
                return np.zeros(ids.size, bool), np.zeros(ids.size, np.int64), np.zeros(ids.size)
            known = inside & self._has[safe] & self._known[safe]
            return known, self._t[safe], self._v[safe]


def _last_value(row: ChunkRow) -> float:
    if row.last_value is not None:
        return row.last_value
    return float(decode_row(row.n, row.ts, row.vs)[1][-1])
