"""Reads from chunks kept in memory (store/chunkcache.py) return what is stored, while the writer moves it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import StoreError
from gpuwatch.core.model import Batch, Matcher, Sample, make_labels
from gpuwatch.store import Store, chunkcache
from gpuwatch.store.chunkcache import ChunkCache
from gpuwatch.store.chunkindex import ChunkIndex
from gpuwatch.store.chunking import WINDOW_MS
from gpuwatch.store.core import READERS
from gpuwatch.store.readgate import ReadGate
from tests.storemodel import NAME, T0, ModelledStore, Op, bits, modelled_store, operations, read

STEP = 600_000  # 10 minutes: a window holds 12 samples, so ops cross windows and compaction merges them
RANGES = [(T0, T0 + 30 * STEP), (T0 + 5 * STEP, T0 + 14 * STEP), (T0 + 13 * STEP + 1, T0 + 13 * STEP + 1)]


def _cache(store: Store) -> ChunkCache:
    """The store's chunk cache (private: the store has no public view of it)."""
    cache = store._chunks
    assert cache is not None
    return cache


@settings(max_examples=25, deadline=None)
@given(ops=operations(slots=30, retention_slots=20), cache_kb=st.sampled_from([1, 4, 1024]))
def test_reads_return_what_was_written_through_compaction_retention_and_reopening(
    ops: list[Op], cache_kb: int
) -> None:
    with modelled_store(step_ms=STEP, chunk_cache_mb=cache_kb / 1024) as m:
        for op in ops:
            m.apply(op)
            m.agree(RANGES)
            m.agree(RANGES)  # again: now from the cache where it kept them
            cache = _cache(m.store)
            assert cache.bytes <= cache.max_bytes
        m.reopen_read_only()
        m.agree(RANGES)
        m.agree(RANGES)


# Ranges that start late in a window: reads leave out the start of its chunk (`TRIM_MIN` lowered)
# and then read ranges that start earlier, from the same view or not.
LATE_STARTS = [(T0 + 9 * STEP, T0 + 20 * STEP), (T0 + 10 * STEP + 1, T0 + 30 * STEP), (T0, T0 + 30 * STEP)]
LATE_STARTS += [(T0 + 21 * STEP, T0 + 26 * STEP), (T0 + 20 * STEP, T0 + 26 * STEP)]


@settings(max_examples=25, deadline=None)
@given(ops=operations(slots=30, retention_slots=20))
def test_reads_that_leave_out_a_chunks_start_return_what_was_written(ops: list[Op]) -> None:
    with pytest.MonkeyPatch.context() as mp, modelled_store(step_ms=STEP, chunk_cache_mb=1) as m:
        mp.setattr(chunkcache, "TRIM_MIN", 1)
        for op in ops:
            m.apply(op)
            m.agree(LATE_STARTS)
            m.agree(LATE_STARTS[::-1])
        m.reopen_read_only()
        m.agree(LATE_STARTS)


def _store_with_chunks_and_head() -> ModelledStore:
    """Two compacted windows of series a and b, and a head row of each in the third."""
    m = ModelledStore(None, step_ms=STEP, retention_s=30 * 86400)
    for k in range(24):
        m.apply(("batch", k, [("a", float(k)), ("b", -float(k))]), flush=False)
    m.store.compact()
    m.apply(("batch", 24, [("a", 24.0), ("b", -24.0)]))
    return m


def _once(action: Callable[[], None]) -> Callable[[], None]:
    done: list[bool] = []

    def run() -> None:
        if not done:
            done.append(True)
            action()

    return run


def test_a_compaction_between_the_index_and_the_head_read_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head rows move into new chunks after the reader took the chunk index and before it reads the
    head: the index misses the new chunks and the head is empty, so the read must notice and read again."""
    m = _store_with_chunks_and_head()
    with m.store as store:
        m.agree(RANGES)  # the index is built and the chunks cached
        compact = _once(store.compact)
        original = ChunkCache.index

        def index_then_compact(
            self: ChunkCache, cur: Any, generation: int, gate: ReadGate | None = None
        ) -> ChunkIndex | None:
            found = original(self, cur, generation, gate)
            compact()
            return found

        monkeypatch.setattr(ChunkCache, "index", index_then_compact)
        assert m.read(T0, T0 + 30 * STEP) == m.expected(T0, T0 + 30 * STEP)
        assert store.stats()["head_samples"] == 0  # the compaction did happen inside the read
        m.agree(RANGES)


def test_an_index_built_while_the_writer_rewrites_chunks_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _store_with_chunks_and_head()
    with m.store as store:
        before = m.expected(T0, T0 + 30 * STEP)
        m.apply(("batch", 25, [("a", 25.0)]), flush=False)

        def rewrite() -> None:
            store.compact()  # moves the head rows (t 24 and 25) into chunks
            store.apply_retention(T0 + 5 * STEP)  # retention_s=30d: deletes nothing

        rewrite_once = _once(rewrite)
        original = ChunkIndex.load.__func__  # type: ignore[attr-defined]

        def load_then_rewrite(cls: type[ChunkIndex], cur: Any, generation: int) -> ChunkIndex:
            found = original(cls, cur, generation)
            rewrite_once()
            return found

        monkeypatch.setattr(ChunkIndex, "load", classmethod(load_then_rewrite))
        store.flush()
        assert m.read(T0, T0 + 30 * STEP) in (before, m.expected(T0, T0 + 30 * STEP))
        assert _cache(store)._index is None  # built during a write: not kept
        m.agree(RANGES)  # the next reads build it again and see the new chunks


def test_chunks_rewritten_after_they_were_cached_are_read_anew() -> None:
    """Compaction merges a window's chunks into one and retention trims them: cached chunks of before are
    not what is stored any more, and reads must show what is."""
    m = ModelledStore(None, step_ms=STEP)
    with m.store as store:
        for k in range(0, 12, 2):
            m.apply(("batch", k, [("a", float(k))]), flush=False)
        store.compact()
        m.agree(RANGES)
        for k in range(1, 12, 2):  # the same window again: compaction merges the two chunks into one
            m.apply(("batch", k, [("a", 100.0 + k)]), flush=False)
        m.apply(("batch", 4, [("a", -4.0)]), flush=False)  # and overwrites a sample
        store.compact()
        m.agree(RANGES)
        m.apply(("retention", 7), flush=False)
        m.agree(RANGES)
        # What the cache holds is what is stored now: the chunks before the merge and the trim are gone.
        cache = _cache(store)
        assert cache._index is not None
        live = set(cache._index.keys(np.arange(cache._index.size)))
        assert cache._where and set(cache._where) <= live
        assert cache.bytes == sum(b.nbytes for b in cache._blocks.values())


def test_the_cache_keeps_within_its_size_and_skips_reads_bigger_than_half_of_it() -> None:
    store = Store.open(None, clock=FakeClock(T0 / 1000), chunk_cache_mb=0.1)  # 104,857 bytes
    t = T0 + np.arange(2_000, dtype=np.int64) * 15_000  # 7 windows of 480 samples, the last of 80
    with store:
        for s in range(6):
            store.append_series("m", make_labels({"s": str(s)}), t, np.sin(t / 1e6 + s))
        store.flush()
        cache = _cache(store)
        small = [Matcher("__name__", "=", "m"), Matcher("s", "=", "0")]
        first = store.select(small, int(t[0]), int(t[-1]))
        assert cache.bytes > 2_000 * 16
        misses = cache.misses
        assert [s.values.tolist() for s in store.select(small, int(t[0]), int(t[-1]))] == [
            s.values.tolist() for s in first
        ]
        assert cache.misses == misses  # answered from memory
        everything = store.select([NAME], int(t[0]), int(t[-1]))  # 12,000 samples: 192 kB > half
        assert len(everything) == 6 and all(s.values.size == 2_000 for s in everything)
        assert cache.bytes <= cache.max_bytes
        for s in range(6):  # series by series, each fits: older ones go first
            one = store.select([NAME, Matcher("s", "=", str(s))], int(t[0]), int(t[-1]))
            assert one[0].values.tolist() == np.sin(t / 1e6 + s).tolist()
            assert cache.bytes <= cache.max_bytes


def test_chunks_no_read_used_for_ten_minutes_are_let_go() -> None:
    """A chart reads the same recent chunks at every refresh; chunks that slid out of every chart's range
    are let go 10 minutes after their last read (not kept until the cache is full), and are read from
    the store again if asked for later."""
    clock = FakeClock(T0 / 1000)
    t = T0 + np.arange(2_000, dtype=np.int64) * 15_000
    with Store.open(None, clock=clock, chunk_cache_mb=1) as store:
        for s in "ab":
            store.append_series("m", make_labels({"s": s}), t, np.sin(t / 1e6 + ord(s)))
        store.flush()
        cache = _cache(store)
        a, b = ([NAME, Matcher("s", "=", s)] for s in "ab")
        store.select(a, int(t[0]), int(t[-1]))
        store.select(b, int(t[0]), int(t[-1]))
        both = cache.bytes
        clock.advance(9 * 60)
        store.select(a, int(t[0]), int(t[-1]))  # a is used again, b is not
        clock.advance(2 * 60)
        misses, served = cache.misses, cache.served
        assert store.select(a, int(t[0]), int(t[-1]))[0].values.size == 2_000
        assert (cache.misses, cache.served) == (misses, served + 1)  # a: from memory
        assert 0 < cache.bytes < both  # b's chunks went
        got = store.select(b, int(t[0]), int(t[-1]))
        assert got[0].values.tolist() == np.sin(t / 1e6 + ord("b")).tolist()
        assert cache.misses > misses  # b: read from the store again
        clock.advance(11 * 60)
        store._writer.after_rewrite(store._cursor())  # the writer's refresh after a compaction: no read
        assert cache.bytes == 0


def test_a_chart_sliding_on_keeps_about_one_copy_of_its_range() -> None:
    """A 1-hour chart refreshing every 30 s while each 5-minute compaction adds a chunk to the open
    2-hour window, then past the window's close (its chunks merged into one): the cache settles at
    about one copy of the range between compactions. Before, the blocks each refresh joined from kept
    the chunks the range slid past for 10 minutes (4.5 h of samples a series held for this chart), and
    the closed window's 2-hour chunk was kept whole under the 1-hour range (bench/README.md, "Chart
    cache")."""
    clock = FakeClock(T0 / 1000)
    series = 4
    settled: list[float] = []
    with Store.open(None, clock=clock, chunk_cache_mb=64, flush_interval_s=3600, retention_s=0) as store:
        cache = _cache(store)
        one_range = series * 3_600 * 16
        t_ms = T0
        while t_ms < T0 + WINDOW_MS + 3_900_000:
            ts = t_ms + np.arange(30, dtype=np.int64) * 1000  # 1 s samples, 30 s at a time
            for s in range(series):
                store.append_series("m", make_labels({"s": str(s)}), ts, np.sin(ts / 1e5 + s))
            t_ms += 30_000
            clock.advance(30)
            store.flush()
            if (t_ms - T0) % 300_000 == 0:
                store.compact()
            got = store.select([NAME], t_ms - 3_600_000, t_ms)  # the chart
            assert [x.values.size for x in got] == [min(3_600, (t_ms - T0) // 1000)] * series
            # 3 minutes after a compaction, once the range has slid past the window's first chunks
            if t_ms >= T0 + 3_900_000 and (t_ms - T0) % 300_000 == 180_000:
                settled.append(cache.bytes / one_range)
    assert len(settled) == 24
    assert max(settled) <= 1.3, settled  # 1.02-1.06; before: up to 4.0, then 3.0


def test_a_store_without_a_cache_reads_the_same() -> None:
    t = T0 + np.arange(1_500, dtype=np.int64) * 15_000
    answers = []
    for mb in (0, 64):
        with Store.open(None, clock=FakeClock(T0 / 1000), chunk_cache_mb=mb) as store:
            store.append_series("m", make_labels({"s": "a"}), t, np.cos(t / 1e7))
            store.append(Batch(int(t[-1]) + 15_000, [Sample("m", make_labels({"s": "a"}), 7.0)]))
            store.flush()
            assert (store._chunks is None) == (mb == 0)
            answers.append(read(store, int(t[100]), int(t[-1]) + 15_000))
    assert answers[0] == answers[1]
    assert answers[0][0][1][-1] == int(t[-1]) + 15_000  # the head row


def test_the_setting_sizes_the_cache_of_gpuwatch_serve(tmp_path: Path, clock: FakeClock, nvml: Any) -> None:
    from gpuwatch.app.build import build_runtime
    from gpuwatch.app.config import load
    from gpuwatch.core.errors import ConfigError

    settings = load(None, {"GPUWATCH_CHUNK_CACHE_MB": "16"}, {"data_dir": str(tmp_path / "d"), "demo": True})
    runtime = build_runtime(settings, "node-1", clock=clock, nvml=nvml)
    try:
        assert _cache(runtime.store).max_bytes == 16 * 2**20
    finally:
        runtime.close()
    with pytest.raises(ConfigError, match="chunk_cache_mb"):
        load(None, {"GPUWATCH_CHUNK_CACHE_MB": "-1"}, {})


def test_reads_racing_flushes_and_compactions_see_every_flushed_sample() -> None:
    """A reader thread reads while the writer flushes and compacts (windows closing and merging): every
    read holds all samples flushed before it began, without holes. Not timing-based: it holds for any
    interleaving; the threads just make many of them happen."""
    import threading

    store = Store.open(None, clock=FakeClock(T0 / 1000), flush_interval_s=3600, chunk_cache_mb=1)
    step = WINDOW_MS // 8  # a window closes every 8 batches, so compaction keeps merging
    flushed = [0]  # batches flushed so far
    errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            before = flushed[0]
            for sd in store.select([NAME], T0, T0 + 400 * step):
                k = (sd.timestamps_ms - T0) // step
                if k.tolist() != list(range(k.size)) or sd.values.tolist() != [float(x) for x in k.tolist()]:
                    errors.append(f"hole or wrong value in {dict(sd.labels)}: {k.tolist()[:20]}...")
                if k.size < before:
                    errors.append(f"{k.size} samples, {before} were flushed before the read")

    reader = threading.Thread(target=read)
    with store:
        reader.start()
        try:
            for k in range(200):
                store.append(
                    Batch(T0 + k * step, [Sample("m", make_labels({"s": s}), float(k)) for s in "abc"])
                )
                store.flush()
                flushed[0] = k + 1
                if k % 3 == 2:
                    store.compact()
        finally:
            stop.set()
            reader.join()
    assert not errors, errors[:3]


_ROW = st.tuples(
    st.integers(0, 5),  # series
    st.sampled_from([-(2**40), -1, 0, 7, 2**41 + 3]),  # first timestamp (shared by several chunks)
    st.integers(1, 3),  # samples
    st.sampled_from([0, 1, 2**63 + 5, 2**64 - 1]),  # content hash
)


@given(rows=st.lists(_ROW, max_size=30), asked=st.lists(_ROW, max_size=30))
@settings(max_examples=300, deadline=None)
def test_the_index_tells_which_keys_are_its_chunks(
    rows: list[tuple[int, int, int, int]], asked: list[tuple[int, int, int, int]]
) -> None:
    # `holds` (a search per key, used to forget chunks a rewrite removed) agrees with the set of all keys.
    index = ChunkIndex(
        {
            "series_id": np.array([r[0] for r in rows], np.int64),
            "t_min_ms": np.array([r[1] for r in rows], np.int64),
            "t_max_ms": np.array([r[1] + 10 for r in rows], np.int64),
            "n": np.array([r[2] for r in rows], np.int64),
            "seq": np.arange(len(rows), dtype=np.int64)[::-1],
            "h": np.array([r[3] for r in rows], np.uint64),
        },
        generation=1,
    )
    keys = asked + rows
    assert index.holds(keys).tolist() == [k in set(rows) for k in keys]


def test_a_store_from_before_the_chunk_hash_column_is_upgraded_and_read_alike(tmp_path: Path) -> None:
    # Schema 6 had no `h`: opening the store adds it, fills it with each old chunk's hash, and reads
    # (from the database, then from chunks kept in memory) return the old samples; new chunks get theirs.
    import duckdb

    from gpuwatch.store import schema
    from gpuwatch.store.chunking import encode_series
    from gpuwatch.store.core import DB_FILE

    t = np.arange(T0, T0 + 30 * STEP, STEP, dtype=np.int64)
    con = duckdb.connect(str(tmp_path / DB_FILE))
    schema.current_version(con)
    for number, sql in schema.MIGRATIONS:
        if number <= 6:
            con.execute(sql)
            con.execute("INSERT INTO schema_migrations VALUES (?, 0)", [number])
    con.execute("""INSERT INTO series VALUES (1, 'm', '[["s", "a"]]')""")
    for r in encode_series(1, t, t / 1000.0, 1):
        con.execute(
            "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
            [r.series_id, r.t_min_ms, r.t_max_ms, r.n, r.seq, r.ts, r.vs],
        )
    con.close()

    with pytest.raises(
        StoreError, match=rf"schema version 6, this gpuwatch needs {schema.LATEST}; start `gpuwatch serve`"
    ):
        Store.open(tmp_path, clock=FakeClock(T0 / 1000), read_only=True)
    with Store.open(tmp_path, clock=FakeClock(T0 / 1000), flush_interval_s=3600, retention_s=0) as store:
        for _ in range(2):
            (sd,) = store.select([NAME], T0, T0 + 40 * STEP)
            assert sd.timestamps_ms.tolist() == t.tolist() and sd.values.tolist() == (t / 1000.0).tolist()
        assert _cache(store).served == 1  # the second read, from memory
        store.append_series("m", make_labels({"s": "b"}), t, np.ones(t.size))
        store.compact()  # b's chunks, and a's merged again
        cur = store._cursor()
        assert cur.execute(
            "SELECT count(*) FROM chunks WHERE h IS DISTINCT FROM hash(ts, vs)"
        ).fetchone() == (0,)
        assert cur.execute("SELECT count(DISTINCT series_id) FROM chunks").fetchone() == (2,)
    # A file from a newer gpuwatch is refused, not half written.
    newer = schema.LATEST + 1
    con = duckdb.connect(str(tmp_path / DB_FILE))
    con.execute("INSERT INTO schema_migrations VALUES (?, 0)", [newer])
    con.close()
    for read_only in (False, True):
        with pytest.raises(
            StoreError,
            match=f"schema version {newer}, written by a newer gpuwatch; this one reads up to {schema.LATEST}",
        ):
            Store.open(tmp_path, clock=FakeClock(T0 / 1000), read_only=read_only)


def test_the_writer_rebuilds_the_index_after_a_compaction_so_the_next_read_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loads: list[str] = []
    real_load = ChunkIndex.load.__func__  # type: ignore[attr-defined]

    def load(cls: type[ChunkIndex], cur: Any, generation: int) -> ChunkIndex:
        loads.append(threading.current_thread().name)
        return real_load(cls, cur, generation)  # type: ignore[no-any-return]

    monkeypatch.setattr(ChunkIndex, "load", classmethod(load))
    store = Store.open(None, clock=FakeClock(T0 / 1000), flush_interval_s=3600, retention_s=0)
    with store:
        for k in range(30):
            store.append(Batch(T0 + k * STEP, [Sample("m", make_labels({"s": "a"}), float(k))]))
        store.compact()
        assert loads == []  # nobody has read: no index is built for nobody
        assert len(_read(store)) == 30
        assert loads == [threading.current_thread().name]  # the first read builds it
        store.append(Batch(T0 + 30 * STEP, [Sample("m", make_labels({"s": "a"}), 30.0)]))
        store.compact()
        assert loads[1:] == ["gpuwatch-store-writer"]  # rebuilt by the writer, after its rewrite
        assert len(_read(store)) == 31  # and the read uses it: no other build
        assert len(loads) == 2


def test_readers_that_arrive_together_build_the_index_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page load's requests reach a cold store together: one builds the index, the others wait for it
    (as many as the read gate lets into DuckDB at once)."""
    readers = READERS
    loads: list[str] = []
    entered: list[str] = []
    all_in = threading.Event()
    real_load = ChunkIndex.load.__func__  # type: ignore[attr-defined]
    real_index = ChunkCache.index

    def index(self: ChunkCache, cur: Any, generation: int, gate: ReadGate | None = None) -> ChunkIndex | None:
        entered.append(threading.current_thread().name)
        if len(entered) == readers:
            all_in.set()
        return real_index(self, cur, generation, gate)

    def load(cls: type[ChunkIndex], cur: Any, generation: int) -> ChunkIndex:
        loads.append(threading.current_thread().name)
        if len(loads) == 1:
            assert all_in.wait(10), "the readers did not arrive together"  # all inside before the build ends
        return real_load(cls, cur, generation)  # type: ignore[no-any-return]

    store = Store.open(None, clock=FakeClock(T0 / 1000), flush_interval_s=3600, retention_s=0)
    with store:
        for k in range(30):
            store.append(Batch(T0 + k * STEP, [Sample("m", make_labels({"s": "a"}), float(k))]))
        store.compact()
        monkeypatch.setattr(ChunkCache, "index", index)
        monkeypatch.setattr(ChunkIndex, "load", classmethod(load))
        got: list[int] = []
        threads = [threading.Thread(target=lambda: got.append(len(_read(store)))) for _ in range(readers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert got == [30] * readers and len(loads) == 1


def test_a_read_from_memory_takes_no_turn_of_the_read_gate() -> None:
    """The read gate admits DuckDB's statements, not the decoding around them: with every turn taken
    (readers busy in DuckDB), a warm read of chunks held in memory still answers (a warm page's
    requests used to take turns: bench/README.md, "Dashboard")."""
    store = Store.open(None, clock=FakeClock(T0 / 1000), flush_interval_s=3600, retention_s=0)
    with store:
        for k in range(30):
            store.append(Batch(T0 + k * STEP, [Sample("m", make_labels({"s": "a"}), float(k))]))
        store.compact()
        assert len(_read(store)) == 30  # the index built and the chunks cached
        taken, release = threading.Barrier(READERS + 1), threading.Event()

        def hold() -> None:
            with store._gate.reading():
                taken.wait()
                release.wait()

        holders = [threading.Thread(target=hold) for _ in range(READERS)]
        for th in holders:
            th.start()
        taken.wait()  # every turn is held
        got: list[int] = []
        warm = threading.Thread(target=lambda: got.append(len(_read(store))))
        try:
            warm.start()
            warm.join(10)  # (a guard against a hang, not a measure of speed)
            assert got == [30]  # answered with every turn held: it asked DuckDB nothing
        finally:
            release.set()
            for th in holders:
                th.join()
            warm.join()


def _read(store: Store) -> list[float]:
    (sd,) = store.select([NAME], T0, T0 + 40 * STEP)
    return list(sd.values.tolist())


@pytest.mark.parametrize("cache_mb", [0.0, 1.0])
def test_a_head_row_overwritten_by_a_later_import_stays_overwritten(cache_mb: float) -> None:
    # Found by Hypothesis: a sample written live (head), then an import of the same time (a bulk chunk, newer),
    # then a newer live sample of the same series at another time. Reads took the head part's newest seq for
    # all its rows, and compaction gave the old row the chunk's newest seq: the old value came back.
    with modelled_store(step_ms=STEP, chunk_cache_mb=cache_mb) as m:
        m.apply(("batch", 1, [("a", 1.0)]))
        m.apply(("series", "a", [(0, 2.0)] * 5 + [(1, 0.0)]))  # 6 samples: a chunk of its own
        m.apply(("batch", 0, [("a", 3.0)]))
        want = [("a", [T0, T0 + STEP], [bits(3.0), bits(0.0)])]
        assert m.read(T0, T0 + 30 * STEP) == want
        assert m.read(T0, T0 + 30 * STEP) == want  # again, from the cache where kept
        m.apply(("compact",))
        assert m.read(T0, T0 + 30 * STEP) == want
        m.reopen_read_only()
        assert m.read(T0, T0 + 30 * STEP) == want
