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
- an import's rows take their `seq` numbers when its transaction begins, and flushes committed while
  it is written come later: at an equal time theirs stays the newest (`note(newer=...)`);
- retention deletes samples before a cutoff: a series whose newest sample is older has none left;
- staleness markers (STALE_NAN) are samples like any other: the newest may be one, and the query
  engine hides the series as it would after a window read.

A series with no known value, or whose newest sample lies after the read's end (a sample with a
future timestamp), is not vouched for: `Store.select_last` reads it the normal way.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import duckdb
import numpy as np

from gpuwatch.store.chunking import ChunkRow, decode_row


class Latest:
    """Per series id: the newest stored timestamp, and its value where known (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._t = np.zeros(0, np.int64)  # newest stored timestamp, where `_has`
        self._v = np.zeros(0, np.float64)  # the value stored at `_t`, where `_known`
        self._has = np.zeros(0, bool)  # the series has stored samples and `_t` is the newest's time
        self._known = np.zeros(0, bool)

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

    def note(
        self,
        chunks: Sequence[ChunkRow],
        ids: np.ndarray,
        t_ms: np.ndarray,
        values: np.ndarray,
        *,
        newer: np.ndarray | None = None,
    ) -> None:
        """Take in one committed flush: bulk `chunks`, then head rows (ids, t_ms, values) in write order.

        `newer`: series ids with samples written later than these (`seq`) though committed before them
        (flushes while an import was written): at an equal time, theirs stays the newest."""
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
            later = ~self._has[u_ids] | (u_t >= self._t[u_ids])
            if newer is not None and newer.size:
                later &= ~self._has[u_ids] | (u_t != self._t[u_ids]) | ~np.isin(u_ids, newer)
            u_ids, u_t, u_v = u_ids[later], u_t[later], u_v[later]
            self._t[u_ids] = u_t
            self._v[u_ids] = u_v
            self._has[u_ids] = True
            self._known[u_ids] = True

    def drop_before(self, cutoff_ms: int) -> None:
        """Retention deleted every sample before `cutoff_ms`."""
        with self._lock:
            gone = self._has & (self._t < cutoff_ms)
            self._has[gone] = False
            self._known[gone] = False

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
