"""The store through its public API: round trips, matchers, ranges, labels, retention, compaction."""

from __future__ import annotations

import math
import struct
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import QueryError, StoreError
from gpuwatch.core.model import STALE_NAN, Batch, Labels, Matcher, Sample, is_stale, make_labels
from gpuwatch.store import Store

NAME = "__name__"
ALL = (-(2**62), 2**62)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> Iterator[Store]:
    s = Store.open(None, clock=clock)
    yield s
    s.close()


def bits(values: np.ndarray | list[float]) -> list[int]:
    return [struct.unpack("<Q", struct.pack("<d", float(v)))[0] for v in values]


def gpu(i: int, **extra: str) -> Labels:
    return make_labels({"gpu": str(i), "UUID": f"GPU-{i:04d}", "Hostname": "node1", **extra})


def fill(store: Store, names: list[str], gpus: int, ticks: int, t0: int = 0, step: int = 1000) -> None:
    for k in range(ticks):
        store.append(
            Batch(
                t0 + k * step,
                [Sample(n, gpu(g), float(k + g)) for n in names for g in range(gpus)],
            )
        )
    store.flush()


# -- round trips -------------------------------------------------------------------------------------

floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([STALE_NAN, math.nan, math.inf, -math.inf, -0.0, 0.0, 12.5, 1e300]),
    st.integers(-(2**60), 2**60).map(float),
    st.decimals(-1e6, 1e6, places=2, allow_nan=False, allow_infinity=False).map(float),
)
label_sets = st.dictionaries(
    st.sampled_from(["gpu", "job", "instance", "UUID", "odd label"]),
    st.text(min_size=1, max_size=8),
    max_size=3,
)
series_st = st.tuples(
    st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "up", "training_loss", "vllm:num_requests_running"]),
    label_sets,
    st.dictionaries(st.integers(-(2**50), 2**50), floats, min_size=1, max_size=40),
)


def _expected(
    data: list[tuple[str, dict[str, str], dict[int, float]]],
) -> dict[tuple[str, Labels], dict[int, float]]:
    want: dict[tuple[str, Labels], dict[int, float]] = {}
    for name, labels, samples in data:
        want.setdefault((name, make_labels(labels)), {}).update(samples)  # last write wins
    return want


def _check(store: Store, want: dict[tuple[str, Labels], dict[int, float]]) -> None:
    got = {(s.name, s.labels): s for s in store.select([], *ALL)}
    assert set(got) == set(want)
    for key, samples in want.items():
        s = got[key]
        ts = sorted(samples)
        assert s.timestamps_ms.dtype == np.int64 and s.values.dtype == np.float64
        assert s.timestamps_ms.tolist() == ts
        assert bits(s.values) == bits([samples[t] for t in ts])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.lists(series_st, min_size=1, max_size=6), bulk=st.booleans())
def test_round_trip_head_chunks_and_reopen(tmp_path: Path, data: list, bulk: bool) -> None:
    d = Path(tempfile.mkdtemp(dir=tmp_path))
    want = _expected(data)
    with Store.open(d, clock=FakeClock()) as s:
        for name, labels, samples in data:
            ts = np.array(list(samples), dtype=np.int64)
            vs = np.array(list(samples.values()), dtype=np.float64)
            if bulk:
                s.append_series(name, make_labels(labels), ts, vs)
            else:
                for t, v in zip(ts, vs, strict=True):
                    s.append(Batch(int(t), [Sample(name, make_labels(labels), float(v))]))
        s.flush()
        _check(s, want)  # from the head
        s.compact()
        _check(s, want)  # from chunks
    with Store.open(d, clock=FakeClock()) as s:
        _check(s, want)  # after reopening


def test_large_bulk_series_round_trips_and_skips_nothing(store: Store) -> None:
    t = np.arange(20_000, dtype=np.int64) * 1000 + 7
    v = np.round(np.sin(np.arange(20_000) / 50) * 100, 2)
    v[[5, 500, 19_999]] = [STALE_NAN, math.inf, math.nan]
    store.append_series("power", gpu(0), t, v)
    store.flush()
    (got,) = store.select([Matcher(NAME, "=", "power")], *ALL)
    assert got.timestamps_ms.tolist() == t.tolist()
    assert bits(got.values) == bits(v)
    assert is_stale(got.values[5]) and not is_stale(got.values[19_999])


def test_append_many_round_trips_long_short_and_repeated_series(store: Store) -> None:
    """Long series are encoded together; a series given twice keeps the second write where they meet."""
    t = np.arange(0, 30_000_000, 15_000, dtype=np.int64)  # 2,000 samples over five 2-hour windows
    power = np.round(np.random.default_rng(1).uniform(80, 700, t.size), 3)
    ones = np.ones(t.size)
    store.append_many(
        [
            ("power", gpu(0), t, power),
            ("power", gpu(1), t[::2], power[::2]),
            ("twice", (), t, ones),
            ("short", (), t[:5], ones[:5]),
            ("one", (), t[:1], ones[:1]),
            ("twice", (), t[1000:], 2 * ones[1000:]),
        ]
    )
    store.flush()

    def read(name: str, labels: Labels = ()) -> tuple[list[int], list[int]]:
        (got,) = store.select([Matcher(NAME, "=", name), *(Matcher(k, "=", v) for k, v in labels)], *ALL)
        return got.timestamps_ms.tolist(), bits(got.values)

    assert read("power", gpu(0)) == (t.tolist(), bits(power))
    assert read("power", gpu(1)) == (t[::2].tolist(), bits(power[::2]))
    assert read("twice") == (t.tolist(), bits(np.r_[ones[:1000], 2 * ones[1000:]]))
    assert read("short") == (t[:5].tolist(), bits(ones[:5]))
    assert read("one") == (t[:1].tolist(), bits(ones[:1]))


def test_duplicate_timestamps_last_write_wins(store: Store) -> None:
    for v in (1.0, 2.0, 3.0):
        store.append(Batch(5000, [Sample("m", (), v)]))
    store.flush()
    assert store.select([], *ALL)[0].values.tolist() == [3.0]
    store.compact()
    store.append(Batch(5000, [Sample("m", (), 4.0)]))
    store.flush()
    assert store.select([], *ALL)[0].values.tolist() == [4.0]
    store.compact()
    (s,) = store.select([], *ALL)
    assert (s.timestamps_ms.tolist(), s.values.tolist()) == ([5000], [4.0])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    writes=st.lists(
        st.tuples(st.booleans(), st.integers(0, 3 * 7200), st.integers(1, 3000), st.integers(1, 3)),
        min_size=1,
        max_size=6,
    ),
    window=st.tuples(st.integers(-100, 4 * 7200), st.integers(0, 4 * 7200)),
)
def test_overlapping_chunks_and_head_newest_write_wins(
    clock: FakeClock, writes: list[tuple[bool, int, int, int]], window: tuple[int, int]
) -> None:
    want: dict[int, float] = {}
    with Store.open(None, clock=clock) as s:
        for k, (bulk, first, count, step) in enumerate(writes):
            t = (first + np.arange(count if bulk else min(count, 50)) * step).astype(np.int64) * 1000
            v = np.arange(t.size, dtype=np.float64) + 0.25 * k
            if bulk and t.size >= 1024:
                s.append_series("m", (), t, v)
            else:
                for ti, vi in zip(t.tolist(), v.tolist(), strict=True):
                    s.append(Batch(ti, [Sample("m", (), vi)]))
            s.flush()
            want.update(zip(t.tolist(), v.tolist(), strict=True))
            lo = window[0] * 1000
            hi = lo + window[1] * 1000
            for _ in range(2):
                got = s.select([], lo, hi)
                expect = sorted(x for x in want if lo <= x <= hi)
                if not expect:
                    assert got == []
                else:
                    (g,) = got
                    assert g.timestamps_ms.tolist() == expect
                    assert g.values.tolist() == [want[x] for x in expect]
                if k % 2:
                    break
                s.compact()


# -- matchers, ranges, labels ---------------------------------------------------------------------------


@pytest.fixture
def fleet(store: Store) -> Store:
    fill(store, ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP"], gpus=3, ticks=5)
    store.append(Batch(0, [Sample("up", make_labels({"job": "vllm", "instance": "a:1"}), 1.0)]))
    store.append(Batch(0, [Sample("up", make_labels({"job": "node"}), 1.0)]))
    store.flush()
    return store


def names_of(store: Store, *matchers: Matcher) -> list[tuple[str, str]]:
    return sorted(
        (s.name, s.label_dict().get("gpu", s.label_dict().get("job", "")))
        for s in store.select(matchers, *ALL)
    )


def test_matcher_ops(fleet: Store) -> None:
    util = Matcher(NAME, "=", "DCGM_FI_DEV_GPU_UTIL")
    assert names_of(fleet, util, Matcher("gpu", "=", "1")) == [("DCGM_FI_DEV_GPU_UTIL", "1")]
    assert names_of(fleet, util, Matcher("gpu", "!=", "1")) == [
        ("DCGM_FI_DEV_GPU_UTIL", "0"),
        ("DCGM_FI_DEV_GPU_UTIL", "2"),
    ]
    assert names_of(fleet, util, Matcher("gpu", "=~", "[12]")) == [
        ("DCGM_FI_DEV_GPU_UTIL", "1"),
        ("DCGM_FI_DEV_GPU_UTIL", "2"),
    ]
    assert names_of(fleet, util, Matcher("gpu", "!~", "[12]")) == [("DCGM_FI_DEV_GPU_UTIL", "0")]


def test_regex_is_fully_anchored(fleet: Store) -> None:
    assert names_of(fleet, Matcher(NAME, "=~", "DCGM")) == []
    assert names_of(fleet, Matcher(NAME, "=~", "GPU_UTIL")) == []
    assert len(names_of(fleet, Matcher(NAME, "=~", "DCGM_.*"))) == 6
    assert len(names_of(fleet, Matcher(NAME, "=~", ".*_UTIL|up"))) == 5
    assert names_of(fleet, Matcher(NAME, "!~", "DCGM_.*")) == [("up", "node"), ("up", "vllm")]


def test_missing_label_matches_empty_string(fleet: Store) -> None:
    up = Matcher(NAME, "=", "up")
    assert names_of(fleet, up, Matcher("instance", "=", "")) == [("up", "node")]
    assert names_of(fleet, up, Matcher("instance", "!=", "")) == [("up", "vllm")]
    assert names_of(fleet, up, Matcher("instance", "=~", "a:.*|")) == [("up", "node"), ("up", "vllm")]
    assert names_of(fleet, up, Matcher("nope", "!~", ".+")) == [("up", "node"), ("up", "vllm")]
    assert names_of(fleet, Matcher("nope", "=", "x")) == []


def test_bad_regex_is_a_query_error(fleet: Store) -> None:
    with pytest.raises(QueryError, match="invalid regular expression"):
        fleet.select([Matcher("gpu", "=~", "(")], *ALL)


def test_time_range_edges_are_inclusive(fleet: Store) -> None:
    util0 = [Matcher(NAME, "=", "DCGM_FI_DEV_GPU_UTIL"), Matcher("gpu", "=", "0")]
    for compacted in (False, True):
        if compacted:
            fleet.compact()
        assert fleet.select(util0, 1000, 3000)[0].timestamps_ms.tolist() == [1000, 2000, 3000]
        assert fleet.select(util0, 1001, 2999)[0].timestamps_ms.tolist() == [2000]
        assert fleet.select(util0, 4000, 9000)[0].timestamps_ms.tolist() == [4000]
        assert fleet.select(util0, 1001, 1999) == []  # series without samples in range are omitted
        assert fleet.select(util0, 5000, 9000) == []


def test_series_label_names_and_values(fleet: Store) -> None:
    assert fleet.series([Matcher(NAME, "=", "up")], *ALL) == [  # sorted by name, then label pairs
        {NAME: "up", "job": "vllm", "instance": "a:1"},
        {NAME: "up", "job": "node"},
    ]
    assert fleet.label_names() == ["Hostname", "UUID", NAME, "gpu", "instance", "job"]
    assert fleet.label_names([Matcher(NAME, "=", "up")]) == [NAME, "instance", "job"]
    assert fleet.label_values(NAME) == ["DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "up"]
    assert fleet.label_values("gpu", [Matcher(NAME, "=~", ".*TEMP")]) == ["0", "1", "2"]
    assert fleet.label_values("missing") == []
    # time-limited: only `up` has a sample at t=0 .. 0 besides the GPUs; t=4000 only GPU series
    assert fleet.label_values(NAME, start_ms=4000, end_ms=4000) == [
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_GPU_UTIL",
    ]
    assert fleet.label_names(start_ms=10_000, end_ms=20_000) == []
    fleet.compact()
    assert fleet.series([Matcher(NAME, "=", "up")], 1, 4000) == []
    assert len(fleet.series([], 500, 1500)) == 6  # chunks spanning the range with a sample inside


def test_series_with_gap_spanning_the_range_is_not_listed(store: Store) -> None:
    store.append_series("gappy", (), np.array([0, 10000, *list(range(20000, 20000 + 2000))]), np.zeros(2002))
    store.compact()
    assert store.series([], 1, 9_999) == []
    assert store.series([], 1, 10_000) == [{NAME: "gappy"}]


def test_empty_labels_are_dropped_like_prometheus(store: Store) -> None:
    store.append(Batch(0, [Sample("m", (("a", ""), ("b", "1")), 1.0)]))
    store.append(Batch(1, [Sample("m", (("b", "1"),), 2.0)]))
    store.flush()
    (s,) = store.select([], *ALL)
    assert s.labels == (("b", "1"),) and s.values.tolist() == [1.0, 2.0]


# -- retention -----------------------------------------------------------------------------------------


def test_retention_with_fake_clock(clock: FakeClock) -> None:
    day = 86_400_000
    # The tiers kept as long as the samples: a series is deleted with its last sample.
    s = Store.open(
        None, clock=clock, retention_s=2 * 86400, tier_retention_s={60_000: 2 * 86400, 3_600_000: 2 * 86400}
    )
    start = clock.now_ms()
    step = 60_000  # 1 sample a minute, 4 days: chunks of several windows, some straddling the cutoff
    t = start + np.arange(4 * day // step, dtype=np.int64) * step
    s.append_series("old_and_new", (), t, np.arange(t.size, dtype=np.float64))
    s.append_series("only_old", (), t[:100], np.ones(100))
    s.append(Batch(int(t[-1]) + step, [Sample("head_only", (), 1.0)]))
    s.flush()
    assert s.apply_retention(clock.now_ms()) == 0
    clock.advance(3 * 86400 + 30)  # now - 2 days = start + 1 day + 30 s; retention deletes whole minutes:
    cutoff = (clock.now_ms() - 2 * day) // step * step  # start + 1 day
    deleted = s.apply_retention(clock.now_ms())
    assert deleted == int((t < cutoff).sum()) + 100
    (kept,) = s.select([Matcher(NAME, "=", "old_and_new")], *ALL)
    assert kept.timestamps_ms.tolist() == t[t >= cutoff].tolist()
    assert kept.values.tolist() == np.arange(t.size, dtype=np.float64)[t >= cutoff].tolist()
    assert s.label_values(NAME) == ["head_only", "old_and_new"]  # the orphan series is gone
    clock.advance(30 * 86400)
    s.compact()
    assert s.apply_retention(clock.now_ms()) == int((t >= cutoff).sum()) + 1
    assert s.stats()["series"] == 0 and s.stats()["samples"] == 0
    s.append(Batch(clock.now_ms(), [Sample("only_old", (), 2.0)]))  # a deleted series may come back
    s.flush()
    assert s.select([], *ALL)[0].values.tolist() == [2.0]
    s.close()


# -- errors, stats, lifecycle ----------------------------------------------------------------------------


def test_write_error_is_counted_not_fatal(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwatch.store import sqlrows

    real = sqlrows.insert_columns
    calls = {"n": 0}

    def flaky(cur: duckdb.DuckDBPyConnection, table: str, columns: dict) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise duckdb.IOException("No space left on device")
        real(cur, table, columns)

    monkeypatch.setattr(sqlrows, "insert_columns", flaky)
    store.append(Batch(1000, [Sample("m", (), 1.0)]))
    with pytest.raises(StoreError, match="No space left"):
        store.flush()
    assert store.stats()["write_errors"] == 1
    assert "No space left" in store.stats()["last_error"]
    store.append(Batch(2000, [Sample("m", (), 2.0)]))
    store.flush()  # retried: nothing lost, the writer thread is still there
    assert store.select([], *ALL)[0].values.tolist() == [1.0, 2.0]
    assert store.stats()["write_errors"] == 1


def test_background_write_error_is_counted(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwatch.store import sqlrows

    real = sqlrows.insert_columns
    failed = threading.Event()

    def flaky(cur: duckdb.DuckDBPyConnection, table: str, columns: dict, computed: str = "") -> None:
        if not failed.is_set():
            failed.set()
            raise duckdb.IOException("No space left on device")
        real(cur, table, columns, computed)

    monkeypatch.setattr(sqlrows, "insert_columns", flaky)
    # The writer looks at the (fake) clock whenever its queue wait times out, after flush_interval_s of
    # real time: 0.05 s rather than the default 2 s, the same flush on its own without the 2 s wait.
    with Store.open(None, clock=clock, flush_interval_s=0.05) as store:
        clock.advance(
            10
        )  # the flush interval has passed: the writer flushes on its own after the next append
        store.append(Batch(1000, [Sample("m", (), 1.0)]))
        assert failed.wait(10)
        store.flush()
        assert store.stats()["write_errors"] == 1
        assert store.select([], *ALL)[0].values.tolist() == [1.0]


def test_stats_and_close_is_idempotent(tmp_path: Path, clock: FakeClock) -> None:
    s = Store.open(tmp_path / "d", clock=clock)
    fill(s, ["a"], gpus=2, ticks=10)
    st_ = s.stats()
    assert (st_["series"], st_["samples"], st_["write_errors"], st_["queue_depth"]) == (2, 20, 0, 0)
    assert st_["last_flush_ms"] == clock.now_ms() and st_["file_bytes"] > 0
    s.close()
    s.close()
    s.append(Batch(0, [Sample("a", (), 1.0)]))  # dropped silently after close
    with pytest.raises(StoreError, match="closed"):
        s.select([], *ALL)
    with Store.open(tmp_path / "d", clock=clock, read_only=True) as ro:
        assert ro.stats()["samples"] == 20 and ro.stats()["read_only"]
        with pytest.raises(StoreError, match="read-only"):
            ro.compact()


def test_read_only_on_missing_dir_says_so(tmp_path: Path, clock: FakeClock) -> None:
    with pytest.raises(StoreError, match="no gpuwatch data"):
        Store.open(tmp_path / "none", clock=clock, read_only=True)


def test_concurrent_readers_and_writer(tmp_path: Path, clock: FakeClock) -> None:
    s = Store.open(tmp_path / "c", clock=clock, compact_rows=10_000)
    names = [f"DCGM_FI_DEV_{i}" for i in range(10)]
    ticks, gpus = 1000, 8
    done = threading.Event()
    errors: list[BaseException] = []
    reads = [0] * 4

    def reader(k: int) -> None:
        try:
            while not done.is_set() or reads[k] < 20:
                got = s.select([Matcher(NAME, "=~", "DCGM_.*"), Matcher("gpu", "=", str(k))], *ALL)
                for series in got:  # every series seen is a gap-free prefix 0..n-1 of what was written
                    n = series.timestamps_ms.size
                    assert series.timestamps_ms.tolist() == [i * 1000 for i in range(n)]
                s.label_values("gpu")
                s.stats()
                reads[k] += 1
        except BaseException as exc:  # noqa: BLE001 - reported to the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for k in range(ticks):
        s.append(Batch(k * 1000, [Sample(n, gpu(g), float(k)) for n in names for g in range(gpus)]))
        if k % 50 == 0:
            s.flush()
    s.flush()
    done.set()
    for th in threads:
        th.join()
    assert not errors, errors
    assert min(reads) >= 20
    assert s.stats()["samples"] == ticks * len(names) * gpus and s.stats()["write_errors"] == 0
    got = s.select([], *ALL)
    assert len(got) == len(names) * gpus and all(x.values.size == ticks for x in got)
    s.close()


def test_reads_from_many_short_lived_threads_keep_one_cursor_a_live_thread(clock: FakeClock) -> None:
    """A web server that reads on a new thread per request must not leave a DuckDB cursor behind for
    each finished thread; and the parsed statements they share stay bounded."""
    s = Store.open(None, clock=clock)
    fill(s, ["DCGM_FI_DEV_GPU_UTIL"], 4, 10)
    answers: list[int] = []

    def read(k: int) -> None:
        answers.append(len(s.select([Matcher("gpu", "=", str(k % 4))], *ALL)[0].values))

    for k in range(300):
        th = threading.Thread(target=read, args=(k,))
        th.start()
        th.join()
    assert answers == [10] * 300
    assert len(s._cursors) <= 2  # the last reader's (and this thread's, had it read): not 300
    assert 0 < len(s._statements) <= 256
    s.close()


def test_the_store_counts_the_dead_nodes_duckdb_keeps_from_its_reads(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Reads of rows not yet checkpointed leave nodes in DuckDB's eviction queues for blocks that are
    gone, heap DuckDB does not count as its memory (bench/README.md, "Soak"); /metrics shows them."""
    with Store.open(tmp_path, clock=clock) as s:
        fill(s, ["DCGM_FI_DEV_GPU_UTIL"], 16, 200)
        before = s.duckdb_dead_queue_nodes()
        if before is None:
            pytest.skip("this DuckDB has no duckdb_eviction_queues()")
        for k in range(50):
            assert len(s.select([Matcher("gpu", "=~", f"{k % 8}|{k % 8 + 8}")], *ALL)) == 2
        after = s.duckdb_dead_queue_nodes()
        assert after is not None and after > before


def test_a_failed_write_is_one_line_in_the_error_and_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # DuckDB appends paragraphs of advice to its errors ("Possible solutions: ..."); users and logs get the
    # first line. Here a write fails for want of memory under a 2 MB cap, and the store keeps what it has.
    from gpuwatch.store import core

    with Store.open(tmp_path, clock=FakeClock(1_800_000_000), flush_interval_s=3600) as store:
        store.append_series("m", make_labels({"s": "a"}), np.array([1_800_000_000_000]), np.array([1.0]))
        store.flush()
    monkeypatch.setattr(core, "MEMORY_LIMIT_MB", 2)
    store = Store.open(tmp_path, clock=FakeClock(1_800_000_000), flush_interval_s=3600)
    t = np.arange(1_800_000_000_000, 1_800_000_000_000 + 400_000 * 15_000, 15_000, dtype=np.int64)
    store.append_series("big", make_labels({"s": "b"}), t, np.random.default_rng(0).random(t.size))
    with pytest.raises(StoreError) as got:
        store.flush()
    assert "\n" not in str(got.value) and str(got.value).startswith("store write failed: Out of Memory Error")
    assert all("\n" not in r.getMessage() for r in caplog.records)
    with pytest.raises(
        StoreError, match=r"the last \d+ samples could not be written before exit: .*Out of Memory"
    ):
        store.close()  # everything is released all the same
    monkeypatch.setattr(core, "MEMORY_LIMIT_MB", 64)
    with Store.open(tmp_path, clock=FakeClock(1_800_000_000)) as store:
        assert len(store.select([Matcher("__name__", "=", "m")], 0, 2_000_000_000_000)) == 1


def test_the_catalogue_grown_in_steps_equals_one_built_at_once() -> None:
    from gpuwatch.store.catalog import Catalog, Entry, match

    entries = [Entry.make(i, f"m{i % 3}", make_labels({"pod": f"p{i}"})) for i in range(60)]
    grown = Catalog(entries[:10])
    for lo in range(10, 60, 7):
        grown.add(entries[lo : lo + 7])
    whole = Catalog(entries)
    a, b = grown.snapshot(), whole.snapshot()
    assert a.by_id == b.by_id
    assert {k: sorted(e.series_id for e in v) for k, v in a.by_name.items()} == {
        k: sorted(e.series_id for e in v) for k, v in b.by_name.items()
    }
    for matchers in ([Matcher("__name__", "=", "m1")], [Matcher("pod", "=~", "p1.*")]):
        assert match(a, matchers) == match(b, matchers)
