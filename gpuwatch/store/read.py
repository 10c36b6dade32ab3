"""Read samples of known series ids from chunks and head, on the calling thread's own cursor."""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import duckdb
import numpy as np

from gpuwatch.core.model import STALE_NAN_BITS
from gpuwatch.store.chunkcache import ChunkCache, Piece
from gpuwatch.store.chunkindex import ChunkIndex, Key
from gpuwatch.store.chunking import dedupe_last, dedupe_last_order
from gpuwatch.store.codec import decode_times
from gpuwatch.store.decodemany import decode_chunks
from gpuwatch.store.headindex import HeadIndex
from gpuwatch.store.readgate import ReadGate, turn

# One series' samples from chunks or head: timestamps, values and write order (one number, or one per
# sample), by which the newest write of a timestamp wins.
Part = tuple[np.ndarray, np.ndarray, np.ndarray | int]


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


class Statements:
    """Parsed SQL by its text, shared by a store's reading threads (a `duckdb.Statement` is usable by
    any connection): a read's statement is the same text whenever the same series are read (a
    dashboard's refresh, a rule's round), and parsing it is ~0.15 ms of a small read's ~0.8 ms. Holds
    at most `size` texts of up to `text_max` characters (longer ones are long id lists: rare, and their
    read dwarfs the parse); when full it starts over."""

    def __init__(self, size: int = 256, text_max: int = 4096) -> None:
        self._size = size
        self._text_max = text_max
        self._parsed: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._parsed)

    def get(self, cur: duckdb.DuckDBPyConnection, sql: str) -> Any:
        """The statement to execute for `sql`: parsed once, or the text itself where it is too long."""
        if len(sql) > self._text_max:
            return sql
        statement = self._parsed.get(sql)
        if statement is None:
            statement = cur.extract_statements(sql)[0]
            with self._lock:
                if len(self._parsed) >= self._size:
                    self._parsed.clear()
                self._parsed[sql] = statement
        return statement


def _fetchnumpy(
    cur: duckdb.DuckDBPyConnection,
    sql: str,
    params: list[Any],
    gate: ReadGate | None,
    statements: Statements | None,
) -> dict[str, Any]:
    """`cur.execute(sql, params).fetchnumpy()` in one of `gate`'s turns (the result lies in DuckDB's
    memory until fetched; decoding it needs no turn), parsed once per text where `statements` is given."""
    statement = sql if statements is None else statements.get(cur, sql)
    with turn(gate):
        return dict(cur.execute(statement, params).fetchnumpy())


def _id_filter(ids: Sequence[int]) -> str:
    return f"series_id IN ({','.join(str(int(i)) for i in ids)})"


def read_samples(
    cur: duckdb.DuckDBPyConnection,
    ids: Sequence[int],
    start_ms: int,
    end_ms: int,
    head_index: HeadIndex | None = None,
    gate: ReadGate | None = None,
    statements: Statements | None = None,
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Return {series id: (timestamps, values)} with start_ms <= t <= end_ms; empty series left out.

    All chunks of all the series are fetched in one statement and decoded together
    (`decodemany.decode_chunks`); each series' samples are then a slice of the concatenation. The head
    table is left out of the statement where `head_index` shows it holds nothing of these series in
    range (and the read repeated with it if the writer marked head rows meanwhile). Each statement
    runs in one of `gate`'s turns, the decoding after it in none; `statements` parses each text once.
    """
    if not ids:
        return {}
    where = _id_filter(ids)
    marks = None if head_index is None else head_index.clear_of(np.asarray(ids, np.int64), end_ms)
    chunks, head = _fetch(cur, where, start_ms, end_ms, gate, statements, with_head=marks is None)
    if marks is not None and head_index is not None and not head_index.unmarked_since(marks):
        chunks, head = _fetch(cur, where, start_ms, end_ms, gate, statements, with_head=True)
    head_parts = _head_parts(head)
    parts: dict[int, list[Part]] = {}
    if len(chunks["n"]):
        n = np.asarray(chunks["n"], np.int64)
        t, v = decode_chunks(n, list(chunks["ts"]), list(chunks["vs"]))
        _chunk_parts(
            n,
            t,
            v,
            np.asarray(chunks["seq"], np.int64),
            np.asarray(chunks["series_id"], np.int64),
            np.asarray(chunks["t_min_ms"], np.int64),
            np.asarray(chunks["t_max_ms"], np.int64),
            start_ms,
            end_ms,
            parts,
            head_parts.keys(),
        )
    for sid, part in head_parts.items():
        parts.setdefault(sid, []).append(part)
    return {sid: _combine(p) for sid, p in parts.items()}


Samples = dict[int, tuple[np.ndarray, np.ndarray]]  # series id -> (timestamps, values)


@dataclass(frozen=True)
class CachedRead:
    """What a read through the chunk cache found; `is_stale_free`: no value is a staleness marker."""

    samples: Samples
    is_stale_free: bool


Cuts = dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]]  # (id(t), lo, hi) -> (t, t[lo:hi])


def read_samples_cached(  # noqa: C901 - cache lookups and the misses' read in one pass
    cur: duckdb.DuckDBPyConnection,
    ids: Sequence[int],
    start_ms: int,
    end_ms: int,
    head_index: HeadIndex | None,
    cache: ChunkCache,
    gate: ReadGate | None = None,
    statements: Statements | None = None,
) -> CachedRead | None:
    """`read_samples` with chunks from memory (chunkcache.py): the chunk index says which chunks hold
    the range, the cache holds them decoded, and only the ones it lacks are read from the database.
    A series read before in the same way is answered by its view (`SeriesView`), without looking at
    its chunks one by one. Return None where the writer changed chunks during the read: then
    `read_samples` reads it. As there, only DuckDB's statements take turns of `gate`: a read answered
    from memory takes none."""
    if not ids:
        return CachedRead({}, True)
    generation = cache.generation.stable()
    if generation is None:
        return None
    index = cache.index(cur, generation, gate)
    if index is None:
        return None
    id_list = sorted(set(ids))
    marks = None if head_index is None else head_index.clear_of(np.asarray(id_list, np.int64), end_ms)
    head = (
        _NO_HEAD
        if marks is not None
        else _fetch_head(cur, _id_filter(ids), start_ms, end_ms, gate, statements)
    )
    views, rest = cache.views(index, id_list, start_ms, end_ms)
    rows = index.rows_of(np.asarray(rest, np.int64), start_ms, end_ms) if rest else np.zeros(0, np.int64)
    keys = index.keys(rows) if rows.size else []
    found, missing = cache.lookup(keys) if keys else ([], [])
    if missing and not cache.fits(int(index.n[rows[missing]].sum())):
        return None  # too big to keep: the plain read decodes it as fast, without the bookkeeping
    if missing:
        fetched = cache.fetch(cur, index, rows[missing], gate)
        if fetched is None:
            return None
        for i, piece in zip(missing, fetched, strict=True):
            found[i] = piece
    if marks is not None and head_index is not None and not head_index.unmarked_since(marks):
        head = _fetch_head(cur, _id_filter(ids), start_ms, end_ms, gate, statements)
    if cache.generation.value != generation:
        return None
    head_parts = _head_parts(head)
    in_head = head_parts.keys()
    parts: dict[int, list[Part]] = {}
    cuts: Cuts = {}
    stale_free = True
    for view in views:
        lo, hi = 0, view.t.size
        if view.t_first < start_ms or view.t_last > end_ms:
            lo, hi = np.searchsorted(view.t, [start_ms, end_ms + 1]).tolist()
        if hi == lo:
            continue
        s_id = view.sid
        order: np.ndarray | int = view.seq if view.seq is not None else 0
        if view.seq is None and s_id in in_head:
            order = np.repeat(index.seq[view.r0 : view.r1], index.n[view.r0 : view.r1])[
                view.skip + lo : view.skip + hi
            ]
        parts[s_id] = [(_cut(cuts, view.t, lo, hi), view.v[lo:hi], order)]
        stale_free = stale_free and not view.has_stale
    if rows.size:
        stale_free = (
            _cached_parts(
                index, rows, keys, cast("list[Piece]", found), start_ms, end_ms, cache, parts, in_head, cuts
            )
            and stale_free
        )
    for s_id, part in head_parts.items():
        parts.setdefault(s_id, []).append(part)
        stale_free = stale_free and not (part[1].view(np.uint64) == np.uint64(STALE_NAN_BITS)).any()
    samples = {s_id: (p[0][0], p[0][1]) if len(p) == 1 else _combine(p) for s_id, p in parts.items()}
    return CachedRead(samples, stale_free)


def _cached_parts(
    index: ChunkIndex,
    rows: np.ndarray,
    keys: list[Key],
    pieces: list[Piece],
    start_ms: int,
    end_ms: int,
    cache: ChunkCache,
    parts: dict[int, list[Part]],
    in_head: Collection[int],
    cuts: Cuts,
) -> bool:
    """Add each series' samples in range from its cached chunks (at index positions `rows`, found at
    `pieces`) to `parts`, keeping a view of each series whose chunks follow one another; return
    whether all of them are known to hold no staleness marker."""
    stale_free = True
    sid, n, seq = index.sids(rows), index.n[rows], index.seq[rows]
    lo_t, hi_t = index.t_min[rows], index.t_max[rows]
    bounds = np.r_[0, np.flatnonzero(sid[1:] != sid[:-1]) + 1, rows.size].tolist()
    for a, b in itertools.pairwise(bounds):
        overlap = b - a > 1 and not (lo_t[a + 1 : b] > hi_t[a : b - 1]).all()
        piece, skip = cache.join(keys[a:b], pieces[a:b], None if overlap else start_ms)
        block, p0, p1 = piece
        t, v = block.t[p0:p1], block.v[p0:p1]
        s_id = int(sid[a])
        if overlap:  # chunks overlap: newest wins
            _chunk_parts(
                n[a:b].copy(),
                t,
                v,
                seq[a:b],
                sid[a:b],
                lo_t[a:b],
                hi_t[a:b],
                start_ms,
                end_ms,
                parts,
                in_head,
            )
            stale_free = False
            continue
        r0, r1 = int(rows[a]), int(rows[b - 1]) + 1
        view = cache.keep_view(index, r0, r1, piece, skip) if r1 - r0 == b - a else None
        stale_free = stale_free and view is not None and not view.has_stale
        if view is not None:
            t = view.t  # maybe another series' equal timestamps
        # The chunks follow one another in time: the samples in range are one slice (a view).
        lo, hi = 0, t.size
        if lo_t[a] < start_ms or hi_t[b - 1] > end_ms:
            lo, hi = np.searchsorted(t, [start_ms, end_ms + 1]).tolist()
        if hi == lo:
            continue
        s_seq = seq[a:b]
        order: np.ndarray | int = int(s_seq[0])
        if s_id in in_head and not (s_seq == s_seq[0]).all():
            order = np.repeat(s_seq, n[a:b])[skip + lo : skip + hi]
        parts[s_id] = [(_cut(cuts, t, lo, hi), v[lo:hi], order)]
    return stale_free


def _cut(cuts: Cuts, t: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """`t[lo:hi]`, one object for the same (t, lo, hi) within a read (`cuts`): series whose views
    share their timestamps (`ChunkCache.keep_view`) then give the query engine one array."""
    if lo == 0 and hi == t.size:
        return t
    key = (id(t), lo, hi)
    got = cuts.get(key)
    if got is None:
        got = cuts[key] = (t, t[lo:hi])  # holding t: no other array gets its id while `cuts` lives
    return got[1]


def _head_parts(head: dict[str, np.ndarray]) -> dict[int, Part]:
    """Each series' head samples (sorted, the newest write of each timestamp), each with its own seq: a
    head row older than a bulk chunk written since must lose to it, even where a newer head row of the
    same series exists (one highest seq for the whole part let an old row win)."""
    head_parts: dict[int, Part] = {}
    h_ids = np.asarray(head["series_id"])
    if h_ids.size:
        h_t, h_seq = np.asarray(head["t_ms"]), np.asarray(head["seq"])
        h_v = np.asarray(head["v_bits"]).view(np.float64)
        cuts = np.flatnonzero(h_ids[1:] != h_ids[:-1]) + 1
        for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, h_ids.size], strict=True):
            head_parts[int(h_ids[lo])] = dedupe_last_order(h_t[lo:hi], h_v[lo:hi], h_seq[lo:hi])
    return head_parts


def _fetch_head(
    cur: duckdb.DuckDBPyConnection,
    where: str,
    start_ms: int,
    end_ms: int,
    gate: ReadGate | None,
    statements: Statements | None,
) -> dict[str, np.ndarray]:
    """Head rows in range, ordered by series then time then write order."""
    rows = _fetchnumpy(
        cur,
        f"SELECT series_id, t_ms, v_bits, seq FROM head WHERE {where} AND t_ms >= $1 AND t_ms <= $2",
        [start_ms, end_ms],
        gate,
        statements,
    )
    ids, t, seq = np.asarray(rows["series_id"]), np.asarray(rows["t_ms"]), np.asarray(rows["seq"])
    order = np.lexsort((seq, t, ids))
    return {
        "series_id": ids[order],
        "t_ms": t[order],
        "v_bits": np.asarray(rows["v_bits"])[order],
        "seq": seq[order],
    }


def _chunk_parts(
    n: np.ndarray,
    t: np.ndarray,
    v: np.ndarray,
    seq: np.ndarray,
    sid: np.ndarray,
    lo_t: np.ndarray,
    hi_t: np.ndarray,
    start_ms: int,
    end_ms: int,
    parts: dict[int, list[Part]],
    in_head: Collection[int],
) -> None:
    """Add each series' samples in range to `parts`, from decoded chunks (`n` samples each, their
    timestamps and values concatenated in `t` and `v`), ordered by series then time then write order.

    Each part carries the write order of its samples (`seq`: one number, or one per sample where a
    series' chunks differ and the head has samples of it too), so that the newest write wins.
    `n` is changed in place."""
    k = n.size
    first = np.zeros(k + 1, np.int64)
    np.cumsum(n, out=first[1:])
    # Chunks reaching outside the range (at most a few per series): drop their samples outside it.
    cut = np.flatnonzero((lo_t < start_ms) | (hi_t > end_ms))
    if cut.size:
        keep = np.ones(t.size, bool)
        for i in cut.tolist():
            a, b = int(first[i]), int(first[i + 1])
            lo, hi = np.searchsorted(t[a:b], [start_ms, end_ms + 1])
            keep[a : a + lo] = False
            keep[a + hi : b] = False
            n[i] = hi - lo
        t, v = t[keep], v[keep]
        np.cumsum(n, out=first[1:])
    # Within a chunk, timestamps rise strictly; between chunks of a series they may not (chunks
    # written in one window before a merge, or by separate bulk appends), and then the newest wins.
    full = np.flatnonzero(n)
    same = sid[full[1:]] == sid[full[:-1]]
    overlap = set(sid[full[1:]][same & (t[first[full[1:]]] <= t[first[full[:-1] + 1] - 1])].tolist())
    # One (t, v) run per series; the chunks come ordered by series, then time.
    bounds = np.r_[0, np.flatnonzero(sid[1:] != sid[:-1]) + 1, k]
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        lo, hi = int(first[a]), int(first[b])
        if hi == lo:
            continue
        st, sv = t[lo:hi], v[lo:hi]
        s_id, s_seq = int(sid[a]), seq[a:b]
        order: np.ndarray | int = int(s_seq[0])
        if (s_id in in_head or s_id in overlap) and not (s_seq == s_seq[0]).all():
            order = np.repeat(s_seq, n[a:b])
        if s_id in overlap and s_id not in in_head:  # with head samples too, `_combine` does this
            st, sv = dedupe_last(st, sv, np.broadcast_to(np.asarray(order, np.int64), st.shape))
        parts.setdefault(s_id, []).append((st, sv, order))


def _fetch(
    cur: duckdb.DuckDBPyConnection,
    where: str,
    start_ms: int,
    end_ms: int,
    gate: ReadGate | None,
    statements: Statements | None,
    *,
    with_head: bool = True,
) -> tuple[Any, Any]:
    """Chunk rows and (`with_head`) head rows in range, ordered by series then time then write order.

    One statement for both (it sees one consistent state, so a compaction moving head rows into
    chunks cannot come between them, and it costs one round trip): head rows come as n = -1 with
    t_ms in t_min_ms, their value bits in t_max_ms and no blobs."""
    sql = (
        f"SELECT series_id, seq, n, t_min_ms, t_max_ms, ts, vs FROM chunks WHERE {where} "
        "AND t_max_ms >= $1 AND t_min_ms <= $2"
    )
    if with_head:
        sql += (
            f" UNION ALL SELECT series_id, seq, -1, t_ms, v_bits, NULL, NULL FROM head WHERE {where} "
            "AND t_ms >= $1 AND t_ms <= $2"
        )
    rows = _fetchnumpy(cur, sql, [start_ms, end_ms], gate, statements)
    # Ordered here rather than by the statement: sorting a few hundred keys in numpy is cheaper than
    # DuckDB's ORDER BY carrying the blobs along (~0.4 ms of a 32-series read).
    order = np.lexsort((np.asarray(rows["seq"]), np.asarray(rows["t_min_ms"]), np.asarray(rows["series_id"])))
    if order.size and not (order[1:] > order[:-1]).all():
        rows = {
            k: (np.asarray(v) if k not in ("ts", "vs") else np.asarray(v, dtype=object))[order]
            for k, v in rows.items()
        }
    n = np.asarray(rows["n"])
    is_head = n < 0
    if not is_head.any():
        return rows, _NO_HEAD
    is_chunk = ~is_head
    chunks = {
        k: (np.asarray(v)[is_chunk] if k not in ("ts", "vs") else np.asarray(v, dtype=object)[is_chunk])
        for k, v in rows.items()
    }
    head = {
        "series_id": np.asarray(rows["series_id"])[is_head],
        "t_ms": np.asarray(rows["t_min_ms"])[is_head],
        "v_bits": np.asarray(rows["t_max_ms"])[is_head],
        "seq": np.asarray(rows["seq"])[is_head],
    }
    return chunks, head


_NO_HEAD: dict[str, np.ndarray] = {
    "series_id": np.zeros(0, np.int32),
    "t_ms": np.zeros(0, np.int64),
    "v_bits": np.zeros(0, np.int64),
    "seq": np.zeros(0, np.int64),
}


def _combine(parts: list[Part]) -> tuple[np.ndarray, np.ndarray]:
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
