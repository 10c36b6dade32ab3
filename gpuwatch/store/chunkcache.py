"""Decoded chunks kept in memory for reads: a bounded cache, and per series a view of its samples.

A range read costs a DuckDB statement (~0.6 ms at least) and decoding every chunk it touches, each
time the same dashboard panel or query runs. Prometheus and VictoriaMetrics keep their block indexes
and hot data in memory; so does this, below the query layer (answers are computed afresh each time),
with the index of where every chunk is (`chunkindex.py`):

- `ChunkCache`: decoded chunks (timestamps and values), keyed by (series, first timestamp, samples,
  content hash), least recently used first out once over `max_bytes`, and let go once no read used
  them for `IDLE_MS` (10 minutes): the dashboard's charts read the same recent chunks at every refresh,
  and without it the chunks that slid out of their range would sit in memory until `max_bytes` of them
  pushed each other out (an hour and a half of a lab's chunks at 128 MB). A block a join copied chunks
  out of goes after `COPIED_IDLE_MS` (2 minutes) without a read: what is left in it is mostly what the
  range slid past. Keyed by content, an entry is never stale: a rewritten chunk (compaction merging a
  window, retention trimming one) has another key.
- `SeriesView`: per series, the last run of its chunks a read joined (consecutive in the index, one
  after another in time, lying one after another in one cached block), so that reading the series
  again costs a few comparisons instead of a lookup per chunk. It is checked against the index of its
  generation; under a newer one it is kept only where the series still has exactly those chunks there.
  Views in one block whose timestamps are equal (series sampled together) share one array, so the
  query engine sees by identity that they line up.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

import duckdb
import numpy as np

from gpuwatch.core.clock import Clock
from gpuwatch.core.model import STALE_NAN_BITS
from gpuwatch.store.chunkindex import ChunkIndex, Generation, Key
from gpuwatch.store.decodemany import decode_chunks
from gpuwatch.store.readgate import ReadGate, turn

_ENTRY_OVERHEAD = 200  # bytes of Python objects per cached chunk besides its arrays
_VIEW_OVERHEAD = 1000  # bytes of Python objects per series view (measured: ~950 + 24 per chunk)
_NONE_BEFORE = -(2**63)  # no chunk before a view
_NONE_AFTER = 2**63 - 1  # no chunk after one
_TIMES_PER_KEY = 4  # distinct timestamp arrays with the same (samples, first, last) kept per block
IDLE_MS = 10 * 60_000  # a block that no read used for this long is let go
COPIED_IDLE_MS = 2 * 60_000  # ... and a block a join copied chunks out of (`ChunkCache.join`)
TRIM_MIN = 256  # a join leaves out the samples of its first chunk before the range from this many on


class _Block:
    """Decoded chunks stored one after another (a series' chunks in time order), read-only."""

    __slots__ = ("keys", "nbytes", "refs", "t", "times", "used_ms", "v", "viewers")

    def __init__(self, t: np.ndarray, v: np.ndarray, keys: list[Key]) -> None:
        t.flags.writeable = False  # handed out as views: nobody may change what the cache holds
        v.flags.writeable = False
        self.t, self.v, self.keys = t, v, keys
        self.refs = 0  # keys that point into it
        self.used_ms = 0  # when a read last used it (ChunkCache's clock)
        self.nbytes = t.nbytes + v.nbytes + _ENTRY_OVERHEAD * len(keys)
        self.viewers: set[int] = set()  # series that may have a view into it (ChunkCache._views)
        # The timestamps of its views, by (samples, first, last): views with equal ones share one
        # array object (`ChunkCache.keep_view`).
        self.times: dict[tuple[int, int, int], list[np.ndarray]] = {}


Piece = tuple[_Block, int, int]  # a chunk's samples: block.t[a:b], block.v[a:b]


class SeriesView:
    """Series `sid`'s samples from positions [r0, r1) of the index of `generation`: chunks that follow
    one another in time, whose samples are `t`, `v` (block.t[a:b], block.v[a:b]), less the first `skip`
    samples of chunk r0 (before a range that needed only the chunk's end: `ChunkCache.join`).

    The series' samples in chunks before r0 (and those left out of r0) are at or before `before`,
    those from r1 on at or after `after`: a read of [start, end] with before < start and end < after
    finds all the series' chunk samples in range here. Never changed once made (readers share it).
    `seq` is the chunks' write order where they all share one (else None); `has_stale` whether a
    value is a staleness marker."""

    __slots__ = (
        "a",
        "after",
        "b",
        "before",
        "block",
        "generation",
        "has_stale",
        "hashes",
        "nbytes",
        "ns",
        "r0",
        "r1",
        "seq",
        "sid",
        "skip",
        "t",
        "t_first",
        "t_last",
        "t_mins",
        "v",
    )

    def __init__(
        self,
        index: ChunkIndex,
        r0: int,
        r1: int,
        piece: Piece,
        has_stale: bool | None = None,
        t: np.ndarray | None = None,
        skip: int = 0,
    ) -> None:
        block, a, b = piece
        self.skip = skip
        self.generation, self.r0, self.r1 = index.generation, r0, r1
        self.sid = index.sid_at(r0)
        self.block, self.a, self.b = block, a, b
        self.t = block.t[a:b] if t is None else t  # `t`: the same timestamps, another view's array
        self.v = block.v[a:b]
        # Copies: slices would keep the whole index (of a generation long gone) alive.
        self.t_mins, self.ns, self.hashes = (x[r0:r1].copy() for x in (index.t_min, index.n, index.hash))
        lo, hi = index.rows_of_series(self.sid)
        self.t_first, self.t_last = int(self.t[0]), int(self.t[-1])
        self.before = int(index.t_max[lo:r0].max()) if r0 > lo else _NONE_BEFORE
        if skip:
            self.before = max(self.before, self.t_first - 1)
        self.after = int(index.t_min[r1]) if r1 < hi else _NONE_AFTER
        seqs = index.seq[r0:r1]
        self.seq = int(seqs[0]) if (seqs == seqs[0]).all() else None
        if has_stale is None:
            has_stale = bool((self.v.view(np.uint64) == np.uint64(STALE_NAN_BITS)).any())
        self.has_stale = has_stale
        self.nbytes = _VIEW_OVERHEAD + 24 * (r1 - r0)

    def moved(self, index: ChunkIndex) -> SeriesView | None:
        """This view in `index` (another generation's), or None where the series' chunks changed."""
        lo, hi = index.rows_of_series(self.sid)
        r0 = lo + int(np.searchsorted(index.t_min[lo:hi], self.t_mins[0]))
        r1 = r0 + self.ns.size
        if r1 > hi or not (
            np.array_equal(index.t_min[r0:r1], self.t_mins)
            and np.array_equal(index.n[r0:r1], self.ns)
            and np.array_equal(index.hash[r0:r1], self.hashes)
        ):
            return None
        return SeriesView(index, r0, r1, (self.block, self.a, self.b), self.has_stale, self.t, self.skip)


class ChunkCache:
    """The chunk index of the current generation and decoded chunks, at most `max_bytes` of them.

    Decoded chunks live in blocks, least recently used first out; a series' chunks that were decoded
    together lie one after another in one block, so a read hands out a view of them without copying.
    Chunks of one series found in several blocks are joined into a new block on first use. Series
    views (`SeriesView`) point into blocks, count in their bytes and go with them. Blocks that no read
    used for `idle_ms` by `clock` go too (at the next read, or the writer's next `refresh`)."""

    def __init__(
        self,
        generation: Generation,
        max_bytes: int,
        clock: Clock | None = None,
        idle_ms: int = IDLE_MS,
        share: Callable[[ChunkIndex], int] | None = None,
    ) -> None:
        self.generation = generation
        self.max_bytes = max_bytes
        # Where the cache's size follows a memory budget (`budget.py`): its share once an index is built.
        self._share = share
        self.idle_ms = idle_ms
        self._now_ms = clock.now_ms if clock is not None else lambda: 0
        self._lock = threading.Lock()
        self._building = threading.Lock()  # held while an index is built (`index`)
        self._index: ChunkIndex | None = None
        self._where: dict[Key, Piece] = {}
        self._blocks: collections.OrderedDict[int, _Block] = collections.OrderedDict()
        self._views: dict[int, SeriesView] = {}  # series id -> its view (counted in its block's bytes)
        self._copied: dict[int, _Block] = {}  # kept blocks a join copied chunks out of, by id
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self.served = 0  # series reads answered by a view

    def index(
        self, cur: duckdb.DuckDBPyConnection, generation: int, gate: ReadGate | None = None
    ) -> ChunkIndex | None:
        """Return the index of `generation` (building it if need be, its statement in one of `gate`'s
        turns), or None where it cannot be built consistently now (the writer changed chunks meanwhile)."""
        index = self._index
        if index is not None and index.generation == generation:
            return index
        # One build at a time: the readers of a page load arrive together, and each would otherwise
        # read the whole index itself (6 at once cost 6x the CPU of one on a cold start).
        with self._building:
            index = self._index
            if index is not None and index.generation == generation:
                return index
            with turn(gate):
                built = ChunkIndex.load(cur, generation)
            if self.generation.stable() != generation:
                return None
            self._index = built
            self._drop_gone(built)
            if self._share is not None:
                self.resize(self._share(built))
            return built

    def refresh(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Build the index of the current generation now, if reads have used an index before (the writer
        calls this after it rewrote chunks, so that the next read finds the index ready; without a turn
        of the read gate, as the writer's own statements), and let go of the blocks no read used lately."""
        with self._lock:
            self._expire(self._now_ms())
        if self._index is None:
            return
        generation = self.generation.stable()
        if generation is not None:
            self.index(cur, generation)

    def _drop_gone(self, index: ChunkIndex) -> None:
        """Forget decoded chunks that are no longer stored (merged by compaction, trimmed or deleted
        by retention): nothing will ask for them again, and a live store rewrites chunks every few
        minutes, so they would otherwise fill the cache until pushed out."""
        if not self._where:
            return
        keys = list(self._where)  # (a copy made without giving up the GIL: writers may add meanwhile)
        gone = [k for k, live in zip(keys, index.holds(keys).tolist(), strict=True) if not live]
        with self._lock:
            for key in gone:
                piece = self._where.pop(key, None)
                if piece is not None:
                    self._release(piece[0])

    def current_index(self) -> ChunkIndex | None:
        """The last index built (None before any read built one)."""
        return self._index

    def resize(self, max_bytes: int) -> None:
        """Hold at most `max_bytes` from now on (pushing out the least recently used blocks now)."""
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def fits(self, samples: int) -> bool:
        """Whether a read that decodes this many samples should keep them (at most half the cache: a
        bigger one would only push out everything else)."""
        return 16 * samples <= self.max_bytes // 2

    def lookup(self, keys: list[Key]) -> tuple[list[Piece | None], list[int]]:
        """Return where each key's chunk is (None where not cached) and the positions not cached."""
        found: list[Piece | None] = []
        missing: list[int] = []
        where, blocks = self._where, self._blocks
        now_ms = self._now_ms()
        with self._lock:
            self._expire(now_ms)
            touched = set()
            for i, key in enumerate(keys):
                piece = where.get(key)
                if piece is None:
                    missing.append(i)
                else:
                    touched.add(id(piece[0]))
                found.append(piece)
            for b in touched:
                blocks[b].used_ms = now_ms
                blocks.move_to_end(b)
            self.hits += len(keys) - len(missing)
            self.misses += len(missing)
        return found, missing

    def fetch(
        self,
        cur: duckdb.DuckDBPyConnection,
        index: ChunkIndex,
        rows: np.ndarray,
        gate: ReadGate | None = None,
    ) -> list[Piece] | None:
        """Read and decode the chunks at index positions `rows` (one statement, in one of `gate`'s
        turns; in index order, so a series' chunks come out one after another), keep them if they fit,
        and return where each is; None if one is gone (rewritten since the index was read). The caller
        checks the generation."""
        keys = index.keys(rows)
        ids = sorted(set(index.sids(rows).tolist()))
        with turn(gate):
            got = cur.execute(
                f"SELECT series_id, t_min_ms, n, h, ts, vs FROM chunks "
                f"WHERE series_id IN ({','.join(map(str, ids))}) AND t_min_ms >= $1 AND t_min_ms <= $2",
                [int(index.t_min[rows].min()), int(index.t_min[rows].max())],
            ).fetchnumpy()
        at = {
            key: i
            for i, key in enumerate(
                zip(
                    np.asarray(got["series_id"], np.int64).tolist(),
                    np.asarray(got["t_min_ms"], np.int64).tolist(),
                    np.asarray(got["n"], np.int64).tolist(),
                    np.asarray(got["h"], np.uint64).tolist(),
                    strict=True,
                )
            )
        }
        take = [at.get(key, -1) for key in keys]
        if -1 in take:
            return None
        ns = np.asarray(got["n"], np.int64)[take]
        t, v = decode_chunks(ns, [got["ts"][i] for i in take], [got["vs"][i] for i in take])
        return self._store(t, v, keys, ns)

    def join(self, keys: list[Key], pieces: list[Piece], start_ms: int | None = None) -> tuple[Piece, int]:
        """Return where the samples of consecutive chunks of one series lie one after another: in the
        block they are in where they already do, else in a new one (kept, if they fit); and how many
        of the first chunk's samples were left out. With `start_ms`, a new block leaves out the first
        chunk's samples before it where they are at least half of that chunk and `TRIM_MIN`: a closed
        window's 2-hour chunk under a 1-hour range is otherwise kept whole."""
        first, a, b = pieces[0]
        skip = 0
        if start_ms is not None and len(pieces) > 1:
            skip = min(int(np.searchsorted(first.t[a:b], start_ms)), b - a - 1)
            if skip < TRIM_MIN or 2 * skip < b - a:
                skip = 0
        if not skip:  # already one after another in one block: nothing to copy
            end = b
            for nxt, na, nb in pieces[1:]:
                if nxt is not first or na != end:
                    break
                end = nb
            else:
                return (first, a, end), 0
        parts = [(first, a + skip, b), *pieces[1:]]
        t = np.concatenate([p[0].t[p[1] : p[2]] for p in parts])
        v = np.concatenate([p[0].v[p[1] : p[2]] for p in parts])
        ns = np.array([p[2] - p[1] for p in parts], np.int64)
        if skip:  # the first chunk is not whole here: its key stays where it was
            joined = self._store(t, v, keys[1:], ns[1:], lead=int(ns[0]))[0][0]
        else:
            joined = self._store(t, v, keys, ns)[0][0]
        # The blocks the chunks came from keep what the join left: for a chart's range sliding on,
        # the chunks it slid past. Kept the usual 10 minutes, each 5-minute compaction's join left
        # another copy of the range behind (4.5 h of samples a series cached for a 1-hour chart,
        # bench/README.md "Chart cache"); a read that still uses them keeps them.
        with self._lock:
            for block, _, _ in pieces if self._blocks.get(id(joined)) is joined else ():
                if block is not joined and self._blocks.get(id(block)) is block:
                    self._copied[id(block)] = block
        return (joined, 0, t.size), skip

    def views(
        self, index: ChunkIndex, ids: list[int], start_ms: int, end_ms: int
    ) -> tuple[list[SeriesView], list[int]]:
        """Return the views of the series of `ids` that hold all their chunk samples in [start_ms,
        end_ms] under `index`, and the ids of the other series."""
        found: list[SeriesView] = []
        rest: list[int] = []
        views, blocks = self._views, self._blocks
        now_ms = self._now_ms()
        with self._lock:
            self._expire(now_ms)
            touched = set()
            for sid in ids:
                view = views.get(sid)
                if view is not None and view.generation != index.generation:
                    view = self._move(view, index)
                if view is None or view.before >= start_ms or view.after <= end_ms:
                    rest.append(sid)
                    continue
                found.append(view)
                touched.add(id(view.block))
            for b in touched:
                blocks[b].used_ms = now_ms
                blocks.move_to_end(b)
            self.served += len(found)
        return found, rest

    def _move(self, view: SeriesView, index: ChunkIndex) -> SeriesView | None:
        """Carry `view` over to `index` (lock held): where the series still has those chunks."""
        moved = view.moved(index)
        self._drop_view(view)
        if moved is not None:
            self._add_view(moved)
        return moved

    def keep_view(
        self, index: ChunkIndex, r0: int, r1: int, piece: Piece, skip: int = 0
    ) -> SeriesView | None:
        """Keep a view of the samples of the chunks at index positions [r0, r1) (one series', following
        one another in time, all of them in `piece` but the first `skip` samples), if its block is
        kept; return it."""
        block, a, b = piece
        if b <= a or self._blocks.get(id(block)) is not block:
            return None
        view = SeriesView(index, r0, r1, piece, skip=skip)
        with self._lock:
            if self._blocks.get(id(block)) is not block:
                return None  # pushed out meanwhile
            # Series sampled together (the GPUs of one exporter) have equal timestamps: their views
            # share one array, which the query engine recognises by identity instead of comparing
            # 8 bytes a sample per series each query. Within one block, so no memory outlives it.
            same = block.times.setdefault((b - a, view.t_first, view.t_last), [])
            shared = next((t for t in same if np.array_equal(t, view.t)), None)
            if shared is not None:
                view.t = shared
            elif len(same) < _TIMES_PER_KEY:
                same.append(view.t)
            old = self._views.get(view.sid)
            if old is not None:
                self._drop_view(old)
            self._add_view(view)
            self._evict()
        return view

    def _add_view(self, view: SeriesView) -> None:
        self._views[view.sid] = view
        view.block.viewers.add(view.sid)
        view.block.nbytes += view.nbytes
        self.bytes += view.nbytes

    def _drop_view(self, view: SeriesView) -> None:
        if self._views.get(view.sid) is view:
            del self._views[view.sid]
            view.block.nbytes -= view.nbytes
            self.bytes -= view.nbytes

    def _forget(self, block: _Block) -> None:
        """Forget the views into `block`, which is no longer kept (its bytes went with it)."""
        self._copied.pop(id(block), None)
        for sid in block.viewers:
            view = self._views.get(sid)
            if view is not None and view.block is block:
                del self._views[sid]

    def _store(
        self, t: np.ndarray, v: np.ndarray, keys: list[Key], ns: np.ndarray, lead: int = 0
    ) -> list[Piece]:
        """Keep `t`, `v` as a block (if they fit) holding the chunks of `keys`, of `ns` samples each,
        one after another from position `lead` on; return where each is."""
        block = _Block(t, v, keys)
        block.used_ms = self._now_ms()
        first = np.zeros(ns.size + 1, np.int64)
        np.cumsum(ns, out=first[1:])
        first += lead
        pieces = [(block, a, b) for a, b in zip(first[:-1].tolist(), first[1:].tolist(), strict=True)]
        if not self.fits(t.size):
            return pieces
        with self._lock:
            for key, piece in zip(keys, pieces, strict=True):
                old = self._where.get(key)
                if old is not None and old[0] is block:
                    continue  # the same chunk twice in one read
                if old is not None:
                    self._release(old[0])
                self._where[key] = piece
                block.refs += 1
            self._blocks[id(block)] = block
            self.bytes += block.nbytes
            self._evict()
        return pieces

    def _evict(self) -> None:
        """Push out the least recently used blocks while over `max_bytes` (lock held)."""
        while self.bytes > self.max_bytes and self._blocks:
            self._drop_oldest()

    def _expire(self, now_ms: int) -> None:
        """Let go of the blocks no read used since `idle_ms` before `now_ms`, and those a join copied
        out of since `COPIED_IDLE_MS` (lock held). Blocks are in the order of their last use, so the
        former are at the front."""
        blocks, limit = self._blocks, now_ms - self.idle_ms
        while blocks and next(iter(blocks.values())).used_ms < limit:
            self._drop_oldest()
        limit = now_ms - min(self.idle_ms, COPIED_IDLE_MS)
        for block in [b for b in self._copied.values() if b.used_ms < limit]:
            self._drop(block)

    def _drop_oldest(self) -> None:
        self._drop(next(iter(self._blocks.values())))

    def _drop(self, gone: _Block) -> None:
        """Let go of a kept block and the keys that point into it (lock held)."""
        del self._blocks[id(gone)]
        self.bytes -= gone.nbytes
        self._forget(gone)
        for key in gone.keys:
            held = self._where.get(key)
            if held is not None and held[0] is gone:
                del self._where[key]

    def _release(self, block: _Block) -> None:
        block.refs -= 1
        if block.refs == 0 and self._blocks.pop(id(block), None) is not None:
            self.bytes -= block.nbytes
            self._forget(block)
