"""Where every stored chunk is, for reads from memory (`chunkcache.py`), and when that changes.

- `ChunkIndex`: per series, every chunk's time range, sample count, write order and a content hash
  (DuckDB's `hash(ts, vs)`, stored with the chunk as it is written), read in one statement without
  the blobs; for one generation of the `chunks` table.
- `Generation`: what must hold for an index to be used, with the writer moving chunks underneath.
  The writer brackets every transaction that changes the `chunks` table with `changing()`, which
  counts up once before the transaction and once after it (commit or not), and keeps `active` set in
  between. An index is built for a generation only where that generation was current and nothing was
  active both before and after its statement; a read uses it only if the generation is still the same
  after the read (the head rows it read, the blobs it fetched) is done, and otherwise reads the old way
  (`read.read_samples` without the cache). A store opened read-only has no writer: its generation
  never moves, and the index is built once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np

Key = tuple[int, int, int, int]  # series id, first timestamp, samples, content hash


class Generation:
    """Counts the writer's transactions that change chunks (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0  # +1 when such a transaction starts, +1 when it ends
        self.active = 0  # such transactions under way

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """Bracket a transaction that inserts, deletes or rewrites chunks."""
        with self._lock:
            self.value += 1
            self.active += 1
        try:
            yield
        finally:
            with self._lock:
                self.active -= 1
                self.value += 1

    def stable(self) -> int | None:
        """Return the generation now, or None while a transaction that changes chunks is under way."""
        with self._lock:
            return None if self.active else self.value


class ChunkIndex:
    """Every chunk's place, for one generation: arrays sorted by (series, first timestamp, write order).

    36 bytes a chunk (first and last timestamp, write order and hash as 8 bytes, the sample count as 4),
    plus 8 a series: a chunk's series is where its position falls in `_bounds`, not stored with it (a
    month of a lab's series is millions of chunks)."""

    def __init__(self, rows: dict[str, Any], generation: int) -> None:
        self.generation = generation
        sid = np.asarray(rows["series_id"], np.int64)
        t_min = np.asarray(rows["t_min_ms"], np.int64)
        seq = np.asarray(rows["seq"], np.int64)
        order = np.lexsort((seq, t_min, sid))
        sid = sid[order]
        self.t_min = t_min[order]
        self.t_max = np.asarray(rows["t_max_ms"], np.int64)[order]
        self.n = np.asarray(rows["n"], np.int32)[order]
        self.seq = seq[order]
        self.hash = np.asarray(rows["h"], np.uint64)[order]
        top = int(sid[-1]) + 1 if sid.size else 0
        self._bounds = np.searchsorted(sid, np.arange(top + 1))  # series s: rows bounds[s]:bounds[s+1]

    @classmethod
    def load(cls, cur: duckdb.DuckDBPyConnection, generation: int) -> ChunkIndex:
        rows = cur.execute("SELECT series_id, seq, n, t_min_ms, t_max_ms, h FROM chunks").fetchnumpy()
        return cls(rows, generation)

    @property
    def size(self) -> int:
        return int(self.t_min.size)

    @property
    def nbytes(self) -> int:
        """The memory its arrays hold."""
        parts = (self.t_min, self.t_max, self.n, self.seq, self.hash, self._bounds)
        return sum(int(a.nbytes) for a in parts)

    def sids(self, rows: np.ndarray) -> np.ndarray:
        """The series of the chunks at positions `rows`."""
        return np.searchsorted(self._bounds, rows, side="right") - 1

    def sid_at(self, row: int) -> int:
        """The series of the chunk at position `row`."""
        return int(np.searchsorted(self._bounds, row, side="right")) - 1

    def rows_of(self, ids: np.ndarray, start_ms: int, end_ms: int) -> np.ndarray:
        """Positions of the chunks of series `ids` (sorted, unique) that reach into [start_ms, end_ms]."""
        ids = ids[ids < self._bounds.size - 1]
        lo, hi = self._bounds[ids], self._bounds[ids + 1]
        counts = hi - lo
        total = int(counts.sum())
        if not total:
            return np.zeros(0, np.int64)
        rows = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(total)
        return rows[(self.t_max[rows] >= start_ms) & (self.t_min[rows] <= end_ms)]

    def rows_of_series(self, sid: int) -> tuple[int, int]:
        """Positions [lo, hi) of all chunks of series `sid`."""
        if sid + 1 >= self._bounds.size or sid < 0:
            return 0, 0
        return int(self._bounds[sid]), int(self._bounds[sid + 1])

    def keys(self, rows: np.ndarray) -> list[Key]:
        return list(
            zip(
                self.sids(rows).tolist(),
                self.t_min[rows].tolist(),
                self.n[rows].tolist(),
                self.hash[rows].tolist(),
                strict=True,
            )
        )

    def holds(self, keys: list[Key]) -> np.ndarray:
        """Which of `keys` are chunks of this index: a binary search per key within its series' chunks,
        all keys at once, so the cost follows the keys asked about, not the chunks stored."""
        m = len(keys)
        sid = np.fromiter((k[0] for k in keys), np.int64, m)
        t_min = np.fromiter((k[1] for k in keys), np.int64, m)
        n = np.fromiter((k[2] for k in keys), np.int64, m)
        h = np.fromiter((k[3] for k in keys), np.uint64, m)
        found = np.zeros(m, bool)
        known = (sid >= 0) & (sid + 1 < self._bounds.size)
        lo = np.where(known, self._bounds[np.where(known, sid, 0)], 0)
        hi = np.where(known, self._bounds[np.where(known, sid + 1, 0)], 0)
        end = hi.copy()
        while True:  # lo: the series' first chunk starting at t_min or later
            open_ = lo < hi
            if not open_.any():
                break
            mid = (lo + hi) // 2
            before = open_ & (self.t_min[np.minimum(mid, self.size - 1)] < t_min)
            lo = np.where(before, mid + 1, lo)
            hi = np.where(open_ & ~before, mid, hi)
        pos, pending = lo, np.arange(m)
        while pending.size:  # chunks sharing a (series, first timestamp): the next one, and so on
            at = pos[pending]
            inside = at < end[pending]
            pending, at = pending[inside], at[inside]
            same = self.t_min[at] == t_min[pending]
            pending, at = pending[same], at[same]
            hit = (self.n[at] == n[pending]) & (self.hash[at] == h[pending])
            found[pending[hit]] = True
            pending = pending[~hit]
            pos[pending] += 1
        return found
