"""Chunks kept in memory for reads: where each series' chunks are, and a bounded cache of decoded ones.

A range read costs a DuckDB statement (~0.6 ms at least) and decoding every chunk it touches, each
time the same dashboard panel or query runs. Prometheus and VictoriaMetrics keep their block indexes
and hot data in memory; so does this, below the query layer (answers are computed afresh each time):

- `ChunkIndex`: per series, every chunk's time range, sample count, write order and a content hash
  (DuckDB's `hash(ts, vs)`), read in one statement without the blobs;
- `ChunkCache`: decoded chunks (timestamps and values), keyed by (series, first timestamp, samples,
  content hash), least recently used first out once over `max_bytes`. Keyed by content, an entry is
  never stale: a rewritten chunk (compaction merging a window, retention trimming one) has another key.

What must hold for the index to be used, with the writer moving chunks underneath (`Generation`):
the writer brackets every transaction that changes the `chunks` table with `changing()`, which
counts up once before the transaction and once after it (commit or not), and keeps `active` set in
between. An index is built for a generation only where that generation was current and nothing was
active both before and after its statement; a read uses it only if the generation is still the same
after the read (the head rows it read, the blobs it fetched) is done, and otherwise reads the old way
(`read.read_samples` without the cache). A store opened read-only has no writer: its generation never
moves, and the index is built once.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np

from gpuwatch.store.codec import decode_chunks

Key = tuple[int, int, int, int]  # series id, first timestamp, samples, content hash
_ENTRY_OVERHEAD = 200  # bytes of Python objects per cached chunk besides its arrays


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
    """Every chunk's place, for one generation: arrays sorted by (series, first timestamp, write order)."""

    def __init__(self, rows: dict[str, Any], generation: int) -> None:
        self.generation = generation
        sid = np.asarray(rows["series_id"], np.int64)
        t_min = np.asarray(rows["t_min_ms"], np.int64)
        seq = np.asarray(rows["seq"], np.int64)
        order = np.lexsort((seq, t_min, sid))
        self.sid = sid[order]
        self.t_min = t_min[order]
        self.t_max = np.asarray(rows["t_max_ms"], np.int64)[order]
        self.n = np.asarray(rows["n"], np.int64)[order]
        self.seq = seq[order]
        self.hash = np.asarray(rows["h"], np.uint64)[order]
        top = int(self.sid[-1]) + 1 if self.sid.size else 0
        self._bounds = np.searchsorted(self.sid, np.arange(top + 1))  # series s: rows bounds[s]:bounds[s+1]

    @classmethod
    def load(cls, cur: duckdb.DuckDBPyConnection, generation: int) -> ChunkIndex:
        rows = cur.execute(
            "SELECT series_id, seq, n, t_min_ms, t_max_ms, hash(ts, vs) AS h FROM chunks"
        ).fetchnumpy()
        return cls(rows, generation)

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

    def keys(self, rows: np.ndarray) -> list[Key]:
        return list(
            zip(
                self.sid[rows].tolist(),
                self.t_min[rows].tolist(),
                self.n[rows].tolist(),
                self.hash[rows].tolist(),
                strict=True,
            )
        )


class ChunkCache:
    """The chunk index of the current generation and decoded chunks, at most `max_bytes` of them."""

    def __init__(self, generation: Generation, max_bytes: int) -> None:
        self.generation = generation
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._index: ChunkIndex | None = None
        self._entries: collections.OrderedDict[Key, tuple[np.ndarray, np.ndarray]] = collections.OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def index(self, cur: duckdb.DuckDBPyConnection, generation: int) -> ChunkIndex | None:
        """Return the index of `generation` (building it if need be), or None where it cannot be built
        consistently now (the writer changed chunks meanwhile)."""
        index = self._index
        if index is not None and index.generation == generation:
            return index
        built = ChunkIndex.load(cur, generation)
        if self.generation.stable() != generation:
            return None
        self._index = built
        return built

    def get(self, keys: list[Key]) -> tuple[list[tuple[np.ndarray, np.ndarray] | None], list[int]]:
        """Return the decoded chunk of each key (None where not cached) and the positions not cached."""
        found: list[tuple[np.ndarray, np.ndarray] | None] = []
        missing: list[int] = []
        entries = self._entries
        with self._lock:
            for i, key in enumerate(keys):
                hit = entries.get(key)
                if hit is None:
                    missing.append(i)
                else:
                    entries.move_to_end(key)
                found.append(hit)
            self.hits += len(keys) - len(missing)
            self.misses += len(missing)
        return found, missing

    def fetch(
        self, cur: duckdb.DuckDBPyConnection, index: ChunkIndex, rows: np.ndarray
    ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Read and decode the chunks at index positions `rows` (one statement), keep them if they fit,
        and return them in the order of `rows`; None if one is gone (rewritten since the index was read).
        The caller checks the generation afterwards."""
        keys = index.keys(rows)
        ids = sorted(set(index.sid[rows].tolist()))
        got = cur.execute(
            f"SELECT series_id, t_min_ms, n, hash(ts, vs) AS h, ts, vs FROM chunks "
            f"WHERE series_id IN ({','.join(map(str, ids))}) AND t_min_ms >= $1 AND t_min_ms <= $2",
            [int(index.t_min[rows].min()), int(index.t_min[rows].max())],
        ).fetchnumpy()
        wanted = set(keys)
        found_keys = list(
            zip(
                np.asarray(got["series_id"], np.int64).tolist(),
                np.asarray(got["t_min_ms"], np.int64).tolist(),
                np.asarray(got["n"], np.int64).tolist(),
                np.asarray(got["h"], np.uint64).tolist(),
                strict=True,
            )
        )
        take = [i for i, k in enumerate(found_keys) if k in wanted]
        ns = np.asarray(got["n"], np.int64)[take]
        t, v = decode_chunks(ns, [got["ts"][i] for i in take], [got["vs"][i] for i in take])
        first = np.zeros(ns.size + 1, np.int64)
        np.cumsum(ns, out=first[1:])
        decoded: dict[Key, tuple[np.ndarray, np.ndarray]] = {}
        for j, i in enumerate(take):
            a, b = int(first[j]), int(first[j + 1])
            decoded[found_keys[i]] = (t[a:b], v[a:b])
        if not wanted.issubset(decoded.keys()):
            return None
        out = [decoded[k] for k in keys]
        size = 16 * int(ns.sum()) + _ENTRY_OVERHEAD * ns.size
        if size <= self.max_bytes // 2:  # a read bigger than that would only push out everything else
            with self._lock:
                for key, (kt, kv) in decoded.items():
                    if key not in self._entries:
                        self._entries[key] = (kt.copy(), kv.copy())
                        self.bytes += 16 * kt.size + _ENTRY_OVERHEAD
                while self.bytes > self.max_bytes and self._entries:
                    _, (et, _ev) = self._entries.popitem(last=False)
                    self.bytes -= 16 * et.size + _ENTRY_OVERHEAD
        return out
