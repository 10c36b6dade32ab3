"""A series read again is answered from its view of cached chunks (chunkcache.SeriesView): bit for bit what
the plain read (`read.read_samples`, no cache) returns, while the writer flushes, compacts and trims."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import STALE_NAN, Batch, Matcher, Sample, make_labels
from gpuwatch.query import Engine
from gpuwatch.query.values import Vector
from gpuwatch.store import Store
from gpuwatch.store import writer as writer_module
from gpuwatch.store.chunkcache import ChunkCache
from gpuwatch.store.chunking import WINDOW_MS
from gpuwatch.store.read import read_samples
from tests.storemodel import Op, modelled_store, operations

NAME = Matcher("__name__", "=", "m")
T0 = 1_800_000_000_000 // WINDOW_MS * WINDOW_MS
STEP = 600_000  # 10 minutes: a window holds 12 samples
Read = list[tuple[str, list[int], list[int]]]


def _cache(store: Store) -> ChunkCache:
    cache = store._chunks
    assert cache is not None
    return cache


def _got(store: Store, start: int, end: int, matchers: list[Matcher] | None = None) -> Read:
    return sorted(
        (dict(sd.labels)["s"], sd.timestamps_ms.tolist(), sd.values.view(np.uint64).tolist())
        for sd in store.select(matchers or [NAME], start, end)
    )


def _plain(store: Store, start: int, end: int) -> Read:
    """What the database holds, read without the cache."""
    entries = {e.series_id: dict(e.labels)["s"] for e in store._snapshot().by_id.values()}
    found = read_samples(store._cursor(), sorted(entries), start, end, None)
    return sorted((entries[i], t.tolist(), v.view(np.uint64).tolist()) for i, (t, v) in found.items())


def _agree(store: Store, start: int, end: int) -> Read:
    got = _got(store, start, end)
    assert got == _plain(store, start, end), (start, end)
    return got


def _batch(store: Store, k: int, values: dict[str, float]) -> None:
    store.append(Batch(T0 + k * STEP, [Sample("m", make_labels({"s": s}), v) for s, v in values.items()]))


def _series(store: Store, s: str, ks: list[int], values: list[float]) -> None:
    t = np.array([T0 + k * STEP for k in ks], np.int64)
    store.append_series("m", make_labels({"s": s}), t, np.array(values, np.float64))


def _compacted(**kw: Any) -> Store:
    """Series a, b and c over three closed windows (compacted into one chunk per window each)."""
    store = Store.open(None, clock=FakeClock(T0 / 1000), flush_interval_s=3600, retention_s=0, **kw)
    for k in range(36):
        _batch(store, k, {"a": float(k), "b": -float(k), "c": k / 7})
    store.compact()
    return store


def test_a_repeated_read_is_answered_by_views_and_returns_what_is_stored() -> None:
    with _compacted() as store:
        cache = _cache(store)
        whole, part = (T0, T0 + 40 * STEP), (T0 + 5 * STEP + 1, T0 + 20 * STEP)
        first = _agree(store, *whole)
        assert cache.served == 0 and len(cache._views) == 3  # kept by the first read
        assert _agree(store, *whole) == first
        assert cache.served == 3
        for sd in store.select([NAME], *whole):  # views of what the cache holds: nobody may change them
            assert not sd.timestamps_ms.flags.writeable and not sd.values.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                sd.values[0] = 1.0
        assert cache.served == 6
        assert [s for s, _, _ in _agree(store, *part)] == ["a", "b", "c"]  # a range inside the view
        assert cache.served == 9
        one = [NAME, Matcher("s", "=", "b")]
        assert _got(store, *part, one) == [x for x in _plain(store, *part) if x[0] == "b"]
        assert cache.served == 10


def test_writes_between_reads_are_seen() -> None:
    with _compacted() as store:
        cache = _cache(store)
        _agree(store, T0, T0 + 50 * STEP)
        _agree(store, T0, T0 + 50 * STEP)
        served = cache.served
        # Head rows: a new sample, and one overwriting a sample of a chunk (the newest write wins).
        _batch(store, 40, {"a": 40.0})
        _batch(store, 3, {"b": 333.0})
        store.flush()
        got = dict((s, (t, v)) for s, t, v in _agree(store, T0, T0 + 50 * STEP))
        assert got["a"][0][-1] == T0 + 40 * STEP
        assert got["b"][1][3] == np.float64(333.0).view(np.uint64)
        assert cache.served == served + 3  # the views of before, with the head rows on top
        # Compaction writes the overwritten window's chunk of b anew; a and c keep theirs.
        store.compact()
        served = cache.served
        got = dict((s, (t, v)) for s, t, v in _agree(store, T0, T0 + 30 * STEP))
        assert got["b"][1][3] == np.float64(333.0).view(np.uint64)
        assert cache.served == served + 2  # a and c: carried over to the new chunk index
        # Retention trims the first window away.
        store.apply_retention(T0 + 14 * STEP)
        assert _agree(store, T0, T0 + 50 * STEP)[0][1][0] == T0 + 14 * STEP
        assert _agree(store, T0, T0 + 50 * STEP)[0][1][0] == T0 + 14 * STEP


def test_overlapping_chunks_and_mixed_write_orders_read_as_the_plain_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(writer_module, "_BULK_MIN", 2)  # imports of 2+ samples become chunks directly
    with Store.open(None, clock=FakeClock(T0 / 1000), flush_interval_s=3600, retention_s=0) as store:
        cache = _cache(store)
        _series(store, "o", [0, 2, 4, 6], [1.0, 2.0, 3.0, 4.0])
        _series(store, "o", [1, 2, 3, 5], [10.0, 20.0, 30.0, 40.0])  # overlaps the first: newest wins
        _batch(store, 13, {"x": 99.0})  # a head row that a chunk written after it overwrites
        store.flush()
        _series(store, "x", [0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])
        _series(store, "x", [12, 13, 14, 15], [5.0, 6.0, 7.0, 8.0])  # the next window, a later write
        # w: a chunk spanning its window, a later one inside it, and one in the next window; a read
        # after the inner one's end reads the outer two only, and keeps no view of them.
        _series(store, "w", [0, 11], [1.0, 2.0])
        _series(store, "w", [2, 3], [3.0, 4.0])
        _series(store, "w", [12, 13], [5.0, 6.0])
        store.flush()
        _agree(store, T0 + 5 * STEP, T0 + 13 * STEP)
        for _ in range(2):
            got = {s: (t, v) for s, t, v in _agree(store, T0, T0 + 30 * STEP)}
            assert got["o"][0] == [T0 + k * STEP for k in range(7)]
            x = dict(
                zip(got["x"][0], np.array(got["x"][1], np.uint64).view(np.float64).tolist(), strict=True)
            )
            assert (x[T0 + 13 * STEP], x[T0 + 14 * STEP]) == (6.0, 7.0)
            assert got["w"][0] == [T0 + k * STEP for k in (0, 2, 3, 11, 12, 13)]
            _agree(store, T0 + 2 * STEP, T0 + 13 * STEP)
        assert "o" not in {dict(store._snapshot().by_id[i].labels)["s"] for i in cache._views}
        assert cache.served > 0  # x, from its view, with its head row


def test_views_go_with_their_blocks_and_count_in_the_budget() -> None:
    with _compacted(chunk_cache_mb=2_000 / 2**20) as store:  # room for about one series' two windows
        cache = _cache(store)
        for s in "abcabc":
            _got(store, T0, T0 + 23 * STEP, [NAME, Matcher("s", "=", s)])
            assert cache.bytes <= cache.max_bytes
            assert cache.bytes == sum(b.nbytes for b in cache._blocks.values())
            assert all(cache._blocks.get(id(v.block)) is v.block for v in cache._views.values())
        assert 0 < len(cache._views) < 3
        assert _agree(store, T0, T0 + 23 * STEP) == _plain(store, T0, T0 + 23 * STEP)


def test_staleness_markers_are_known_where_read_from_views() -> None:
    with _compacted() as store:
        _batch(store, 40, {"a": STALE_NAN})
        store.compact()
        engine = Engine(store, lookback_ms=300_000, max_samples=10**6, timeout_s=10, monotonic=time.monotonic)
        counts = []
        for _ in range(2):
            clean = store.select([NAME, Matcher("s", "=~", "b|c")], T0, T0 + 50 * STEP)
            marked = store.select([NAME], T0, T0 + 50 * STEP)
            result = engine.instant("count_over_time(m[1d])", T0 + 50 * STEP)
            assert isinstance(result, Vector)
            counts.append(sorted((s.labels["s"], s.value) for s in result.samples))
        assert clean and all(sd.is_stale_free for sd in clean)
        assert marked and not any(sd.is_stale_free for sd in marked)
        assert counts[0] == counts[1] == [("a", 36.0), ("b", 36.0), ("c", 36.0)]  # the marker is not a sample


_read = st.tuples(st.just("read"), st.integers(0, 32), st.integers(0, 32))


@settings(max_examples=30, deadline=None)
@given(ops=operations(max_size=16, extra=[_read]), cache_kb=st.sampled_from([1, 4, 1024]))
def test_reads_between_writes_return_what_the_plain_read_returns(ops: list[Op], cache_kb: int) -> None:
    with modelled_store(step_ms=STEP, bulk_min=4, chunk_cache_mb=cache_kb / 1024) as m:
        for op in ops:
            if op[0] == "read":
                start, end = T0 + min(op[1:]) * STEP, T0 + max(op[1:]) * STEP + op[1] % 2
                _agree(m.store, start, end)
                _agree(m.store, start, end)
            else:
                m.apply(op)
            _agree(m.store, T0, T0 + 32 * STEP)
            m.agree([(T0, T0 + 32 * STEP)])
            cache = _cache(m.store)
            assert cache.bytes <= cache.max_bytes
            assert cache.bytes == sum(b.nbytes for b in cache._blocks.values())


def test_series_added_or_deleted_between_reads_are_seen() -> None:
    with _compacted() as store:
        sel = [NAME, Matcher("s", "=~", "a|d")]
        assert [dict(sd.labels)["s"] for sd in store.select(sel, T0, T0 + 50 * STEP)] == ["a"]
        assert [dict(sd.labels)["s"] for sd in store.select(sel, T0, T0 + 50 * STEP)] == ["a"]
        _batch(store, 40, {"d": 1.0})
        store.flush()
        assert [dict(sd.labels)["s"] for sd in store.select(sel, T0, T0 + 50 * STEP)] == ["a", "d"]
        store.apply_retention(T0 + 38 * STEP)  # deletes a, b and c, which end before it
        assert [dict(sd.labels)["s"] for sd in store.select(sel, T0, T0 + 50 * STEP)] == ["d"]
        assert [dict(sd.labels)["s"] for sd in store.select_last(sel, T0, T0 + 50 * STEP)] == ["d"]


def test_series_with_equal_timestamps_share_one_array_and_others_keep_their_own() -> None:
    # a and b sampled together; c has the same count, first and last timestamp but one sample moved;
    # d starts later. Only a and b may share: the engine takes one array for both (no per-query compare).
    store = Store.open(None, clock=FakeClock(T0 / 1000), flush_interval_s=3600, retention_s=0)
    ks = list(range(36))
    moved = [*ks[:10], 10.5, *ks[11:]]
    with store:
        for s in ("a", "b"):
            _series(store, s, ks, [float(k) for k in ks])
        t = np.array([T0 + int(k * STEP) for k in moved], np.int64)
        store.append_series("m", make_labels({"s": "c"}), t, np.arange(36, dtype=np.float64))
        _series(store, "d", ks[5:], [1.0] * 31)
        store.compact()
        for start, end in ((T0, T0 + 40 * STEP), (T0 + 5 * STEP + 1, T0 + 20 * STEP), (T0, T0 + 40 * STEP)):
            got = {dict(sd.labels)["s"]: sd.timestamps_ms for sd in store.select([NAME], start, end)}
            assert got["a"] is got["b"], (start, end)
            assert got["c"] is not got["a"] and got["d"] is not got["a"]
            assert got["c"].tolist() != got["a"].tolist()
            _agree(store, start, end)  # and every series reads what is stored
        assert _cache(store).served > 0  # the last two reads came from views
        _series(store, "e", [40, 41], [1.0, 2.0])  # a new index generation; a and b's chunks stay
        store.compact()
        served = _cache(store).served
        got = {dict(sd.labels)["s"]: sd.timestamps_ms for sd in store.select([NAME], T0, T0 + 40 * STEP)}
        assert _cache(store).served > served and got["a"] is got["b"]  # views carried over, still shared
