"""The store's 1-minute and 1-hour tiers: built a closed day at a time, rebuilt for late samples,
resumed after a restart, backfilled after an upgrade, kept by their own retention; and the engine's
answers from them equal to its answers from the raw samples (store/tierbuild.py, query/tierpick.py)."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import STALE_NAN, Batch, Matcher, Sample, SeriesData, make_labels
from gpuwatch.core.tiers import COLUMNS, HOUR_MS, MINUTE_MS, TierPoints, build
from gpuwatch.query import Engine
from gpuwatch.query.recent import RecentSamples, WithRecent
from gpuwatch.query.values import Matrix
from gpuwatch.store import Store, sizecap, tierbuild
from gpuwatch.store.tierrows import DAY_MS, decode_points, encode_points

T0 = 1_699_920_000_000  # a UTC midnight
DAYS = 6
NOW = T0 + (DAYS + 1) * DAY_MS  # the clock's time
UTIL = [Matcher("__name__", "=", "util")]


class RawOnly:
    """The store without its tiers: what the engine answers from samples alone."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def select(self, *args: object) -> list[SeriesData]:
        return self.store.select(*args)  # type: ignore[arg-type]

    def select_last(self, *args: object) -> list[SeriesData]:
        return self.store.select_last(*args)  # type: ignore[arg-type]


def fill(store: Store, seed: int = 1, days: int = DAYS, gpus: int = 3, step_ms: int = 15_000) -> None:
    """`util` (a gauge with gaps, NaN and a staleness marker) and `energy` (a counter with resets) for
    `gpus` GPUs over `days` days, off the minute grid by 7 ms."""
    rng = np.random.default_rng(seed)
    t = T0 + 7 + np.arange(0, days * DAY_MS, step_ms, dtype=np.int64)
    for g in range(gpus):
        keep = rng.random(t.size) > 0.05  # gaps
        keep[t.size // 2 : t.size // 2 + 400] = False  # a 100-minute hole
        tt = t[keep]
        util = np.round(rng.random(tt.size) * 100, 1)
        util[rng.integers(0, tt.size, 5)] = np.nan
        util[tt.size // 3] = STALE_NAN
        energy = np.cumsum(rng.random(tt.size) * 50_000)
        for cut in (tt.size // 4, 2 * tt.size // 3):
            energy[cut:] -= energy[cut] - rng.random() * 10  # a counter reset
        labels = (("gpu", str(g)),)
        store.append_series("util", labels, tt, util)
        store.append_series("energy", labels, tt, energy)
    store.flush()
    store.compact()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW / 1000)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    s = Store.open(tmp_path / "data", clock=clock)
    yield s
    s.close()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """A store filled and its tiers built, half a day before its clock: shared by the tests that only
    read it (each fill and build takes ~1-2 s)."""
    clock = FakeClock(NOW / 1000)
    s = Store.open(tmp_path_factory.mktemp("built") / "data", clock=clock)
    fill(s)
    s.build_tiers()
    clock.advance(0.5 * 86400)  # the engine's end below is past the built days: made from samples
    yield s
    s.close()


def rows(result: object) -> list[tuple[object, list[int], list[float]]]:
    assert isinstance(result, Matrix)
    return [(s.labels, s.timestamps_ms.tolist(), s.values.tolist()) for s in result]


def built_ms(store: Store) -> int | None:
    assert store._writer is not None
    return store._writer.tiers.state.built_ms


def test_points_round_trip_through_a_row() -> None:
    rng = np.random.default_rng(3)
    t = np.sort(rng.choice(np.arange(1, 10 * DAY_MS // 1000), 5000, replace=False)).astype(np.int64) * 1000
    v = rng.standard_normal(t.size) * 1e6
    v[::97] = np.nan
    v[5] = STALE_NAN
    for res in (MINUTE_MS, HOUR_MS):
        p = build(t, v, res)
        for narrow in (True, False):  # the 1-minute rows' form and the 1-hour rows'
            back = decode_points(encode_points(p, narrow=narrow), p.size)
            for a, b in zip(p, back, strict=True):
                assert a.dtype == b.dtype
                assert np.array_equal(a, b, equal_nan=True)


def test_rows_in_the_fixed_width_form_before_still_decode() -> None:
    import cramjam

    rng = np.random.default_rng(4)
    t = np.sort(rng.choice(np.arange(1, DAY_MS // 1000), 3000, replace=False)).astype(np.int64) * 1000
    v = np.round(rng.random(t.size) * 100, 1)
    v[::50] = np.nan
    p = build(t, v, MINUTE_MS)
    # As the release before wrote a row: fixed-width columns, the floats byte-shuffled, one zstd frame.
    floats = np.stack([p.sum, p.min, p.max, p.first_v, p.last_v, p.correction]).astype("<f8")
    body = b"".join(
        [
            np.diff(p.end_ms, prepend=np.int64(0)).astype("<i8").tobytes(),
            p.n.astype("<i4").tobytes(),
            (p.end_ms - p.first_t).astype("<i4").tobytes(),
            (p.end_ms - p.last_t).astype("<i4").tobytes(),
            np.ascontiguousarray(floats.reshape(-1).view(np.uint8).reshape(-1, 8).T).tobytes(),
            np.packbits(p.stale_after).tobytes(),
        ]
    )
    old = bytes(cramjam.zstd.compress(body, 3))
    assert encode_points(p, narrow=False) == old  # 1-hour rows are still written so
    new = encode_points(p)
    assert len(new) < len(old)
    for blob in (old, new):
        for a, b in zip(p, decode_points(blob, p.size), strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)


def random_points(seed: int, res: int) -> TierPoints:
    """A counter with resets and a gauge's NaN, gaps of minutes to hours, staleness markers, as points."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4000))
    step = np.where(rng.random(n) < 0.03, rng.integers(60_000, 3 * HOUR_MS, n), rng.integers(1000, 30_000, n))
    t = T0 + np.cumsum(step).astype(np.int64)
    if seed % 2:  # a counter: resets to 0 now and then
        inc = rng.exponential(20, n)
        total = np.cumsum(inc)
        v = total - np.maximum.accumulate(np.where(rng.random(n) < 0.02, total - inc, 0.0))
    else:
        v = np.round(rng.normal(50, 30, n), int(rng.integers(0, 4)))
    v[rng.random(n) < 0.02] = np.nan
    v[rng.random(n) < 0.01] = STALE_NAN
    return build(t, v, res)


@pytest.mark.parametrize("seed", range(40))
def test_some_columns_decode_as_the_whole_row_does_and_the_others_are_none(seed: int) -> None:
    res = (MINUTE_MS, HOUR_MS)[(seed // 2) % 2]  # (a counter or a gauge at each)
    p = random_points(seed, res)
    rng = np.random.default_rng(seed)
    for narrow in (True, False):
        blob = encode_points(p, narrow=narrow)
        whole = decode_points(blob, p.size)
        for _ in range(6):
            asked = {c for c in COLUMNS if rng.random() < 0.3}
            got = decode_points(blob, p.size, asked)
            for col, a, b in zip(COLUMNS, got, whole, strict=True):
                if col in asked or col == "end_ms":  # (always read)
                    assert a is not None and a.dtype == b.dtype, col
                    assert np.array_equal(a, b, equal_nan=True), col
                    assert np.array_equal(a, getattr(p, col), equal_nan=True), col
                else:
                    assert a is None, col
    with pytest.raises(ValueError, match="no tier point columns"):
        decode_points(blob, p.size, ["count"])


def test_closed_days_are_built_and_equal_points_made_from_the_samples(store: Store) -> None:
    fill(store)
    assert store.build_tiers() is False
    # Every hour closed 10 minutes ago: the clock is at the start of day 7, the data ends with day 6.
    assert built_ms(store) == NOW - HOUR_MS
    raw = store.select(UTIL, T0 + 1, T0 + DAYS * DAY_MS)
    for res in (MINUTE_MS, HOUR_MS):
        got = store.select_tiers(UTIL, res, T0, T0 + DAYS * DAY_MS)
        assert [s.labels for s in got] == [s.labels for s in raw]
        for s, r in zip(got, raw, strict=True):
            want = build(r.timestamps_ms, r.values, res)
            assert np.array_equal(s.points.end_ms, want.end_ms)
            for col in ("n", "min", "max", "first_t", "first_v", "last_t", "last_v", "stale_after"):
                assert np.array_equal(getattr(s.points, col), getattr(want, col), equal_nan=True), col
            # The hours are summed from the minutes: to within rounding of the samples' sums.
            np.testing.assert_allclose(s.points.sum, want.sum, rtol=1e-12)


QUERIES = [
    "util",
    "timestamp(util)",
    "avg_over_time(util[1h])",
    "max_over_time(util[1d])",
    "min_over_time(util[1h] offset 1h)",
    "count_over_time(util[10m])",
    "sum_over_time(util[1h])",
    "last_over_time(util[1h])",
    "rate(energy[1h])",
    "increase(energy[1d])",
    "sum(rate(energy[2h]))",
    "delta(util[3h])",
    "quantile_over_time(0.5, util[1h])",  # not from tiers: read from samples
]


@pytest.mark.parametrize("query", QUERIES)
@pytest.mark.parametrize(
    ("start_ms", "step_ms"),
    [
        (T0 + HOUR_MS, HOUR_MS),  # aligned: the 1-hour tier (or the 1-minute one for a lookback)
        (T0 + HOUR_MS, 10 * MINUTE_MS),  # aligned: the 1-minute tier
        (T0 + 7, HOUR_MS),  # off the grid: samples
    ],
)
def test_the_engine_answers_from_tiers_as_from_samples(
    built: Store, query: str, start_ms: int, step_ms: int
) -> None:
    store = built
    end = T0 + DAYS * DAY_MS + 12 * HOUR_MS  # past the built days: the rest made from samples
    tiered = Engine(store).range(query, start_ms, end, step_ms)
    raw = Engine(RawOnly(store)).range(query, start_ms, end, step_ms)
    assert isinstance(tiered, Matrix) and isinstance(raw, Matrix)
    assert [s.labels for s in tiered] == [s.labels for s in raw]
    assert len(raw) > 0
    for a, b in zip(tiered, raw, strict=True):
        assert np.array_equal(a.timestamps_ms, b.timestamps_ms)
        np.testing.assert_allclose(a.values, b.values, rtol=1e-9, atol=1e-9, equal_nan=True)


def test_a_read_of_some_columns_has_those_of_the_whole_read_and_none_else(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpuwatch.store.tierbuild.BATCH_SAMPLES", 10_000)  # a series a batch
    fill(store)
    late = T0 + (DAYS - 1) * DAY_MS + np.arange(1, 2000, dtype=np.int64) * 15_000
    store.append_series("util", (("gpu", "9"),), late, np.arange(late.size) % 7.0)  # the last day only
    store.flush()
    while built_ms(store) != T0 + (DAYS - 1) * DAY_MS:  # the last day not built: made from samples
        assert store.build_tiers(max_batches=1)
    span = (T0, T0 + DAYS * DAY_MS)
    for res in (MINUTE_MS, HOUR_MS):
        whole = store.select_tiers(UTIL, res, *span)
        assert len(whole) == 4 and whole[0].points.end_ms[-1] > T0 + (DAYS - 1) * DAY_MS
        for asked in (["sum", "n"], ["last_t", "last_v", "stale_after"], ["max"], []):
            got = store.select_tiers(UTIL, res, *span, columns=asked)
            assert whole and got and [s.labels for s in got] == [s.labels for s in whole]
            # As the engine reads the store: with gpuwatch's own recent figures (none of `util`) beside it.
            beside = WithRecent(store, RecentSamples(60_000)).select_tiers(UTIL, res, *span, asked)
            assert beside is not None and [[a is None for a in s.points] for s in beside] == [
                [a is None for a in s.points] for s in got
            ]
            for g, w in zip(got, whole, strict=True):
                for col, a, b in zip(COLUMNS, g.points, w.points, strict=True):
                    if col in asked or col == "end_ms":
                        assert np.array_equal(a, b, equal_nan=True), col
                    else:
                        assert a is None, col


@pytest.mark.parametrize(
    ("query", "columns"),
    [
        ("avg_over_time(util[1h])", {"end_ms", "n", "sum"}),
        ("max_over_time(util[1h])", {"end_ms", "n", "max"}),
        ("last_over_time(util[1h])", {"end_ms", "n", "last_v"}),
        ("rate(energy[1h])", {"end_ms", "n", "first_t", "first_v", "last_t", "last_v", "correction"}),
        ("util", {"end_ms", "last_t", "last_v", "stale_after"}),
        ("timestamp(util)", {"end_ms", "last_t", "stale_after"}),
    ],
)
@pytest.mark.parametrize("step_ms", [HOUR_MS, 10 * MINUTE_MS])  # 1-hour rows (fixed-width), 1-minute rows
def test_the_engine_decodes_only_the_columns_its_function_reads(
    built: Store, monkeypatch: pytest.MonkeyPatch, query: str, columns: set[str], step_ms: int
) -> None:
    store = built
    asked: list[set[str] | None] = []

    def whole_rows(blob: bytes, n: int, columns: Collection[str] | None = None) -> TierPoints:
        return decode_points(blob, n)

    def spy(blob: bytes, n: int, columns: Collection[str] | None = None) -> TierPoints:
        asked.append(None if columns is None else set(columns))
        return decode_points(blob, n, columns)

    monkeypatch.setattr("gpuwatch.store.tierrows.decode_points", whole_rows)
    whole = Engine(store).range(query, T0 + HOUR_MS, T0 + DAYS * DAY_MS, step_ms)
    monkeypatch.setattr("gpuwatch.store.tierrows.decode_points", spy)
    got = Engine(store).range(query, T0 + HOUR_MS, T0 + DAYS * DAY_MS, step_ms)
    assert asked and all(a == columns for a in asked)
    assert isinstance(got, Matrix) and isinstance(whole, Matrix) and len(got) == len(whole) == 3
    for a, b in zip(got, whole, strict=True):
        assert a.labels == b.labels and np.array_equal(a.timestamps_ms, b.timestamps_ms)
        assert np.array_equal(a.values, b.values, equal_nan=True)


def test_a_late_sample_rebuilds_its_day(store: Store, clock: FakeClock) -> None:
    fill(store)
    store.build_tiers()
    q = "count_over_time(util[1d])"
    at = T0 + 2 * DAY_MS
    engine = Engine(store)

    def last_count(e: Engine) -> list[float]:
        got = e.range(q, at - DAY_MS, at, HOUR_MS)  # the 1-minute tier (24 steps x 1 day)
        assert isinstance(got, Matrix)
        return next(iter(got)).values.tolist()

    count = last_count(engine)[-1]
    # A node's backlog arrives: one sample of day 2 that was never stored, in a chunk of its own.
    late_t = np.array([T0 + DAY_MS + 3 * HOUR_MS + 1], np.int64)
    store.append_series("util", (("gpu", "0"),), late_t, np.array([42.0]))
    store.flush()
    store.compact()
    assert last_count(engine)[-1] == count  # not yet: the day's row was built before the sample
    store.build_tiers()
    assert last_count(engine)[-1] == count + 1
    assert last_count(engine) == last_count(Engine(RawOnly(store)))


def test_a_build_resumes_after_a_restart(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpuwatch.store.tierbuild.BATCH_SAMPLES", 10_000)  # a series a batch
    with Store.open(tmp_path / "d", clock=clock) as s:
        fill(s)
        assert s.build_tiers(max_batches=4) is True
        assert built_ms(s) == T0 + DAY_MS  # day 1's first three series, then day 2's first
    with Store.open(tmp_path / "d", clock=clock) as s:
        assert s._writer is not None and s._writer.tiers.state.next_sid > 0
        assert s.build_tiers() is False
        got = s.select_tiers(UTIL, MINUTE_MS, T0, T0 + DAYS * DAY_MS)
        raw = s.select(UTIL, T0 + 1, T0 + DAYS * DAY_MS)
        for g, r in zip(got, raw, strict=True):
            assert np.array_equal(g.points.n, build(r.timestamps_ms, r.values, MINUTE_MS).n)


def test_a_store_from_before_tiers_is_backfilled(tmp_path: Path, clock: FakeClock) -> None:
    with Store.open(tmp_path / "d", clock=clock) as s:
        fill(s)
    # What a store written by the release before tiers looks like: no tier tables, schema 11.
    con = duckdb.connect(str(tmp_path / "d" / "gpuwatch.duckdb"))
    con.execute(
        "DROP TABLE tier_1m; DROP TABLE tier_1h; DROP TABLE tier_state; DELETE FROM schema_migrations WHERE version = 12"
    )
    con.close()
    with Store.open(tmp_path / "d", clock=clock) as s:
        assert built_ms(s) is None
        q = "max_over_time(util[1h])"
        raw = rows(Engine(RawOnly(s)).range(q, T0 + HOUR_MS, T0 + DAYS * DAY_MS, HOUR_MS))
        assert rows(Engine(s).range(q, T0 + HOUR_MS, T0 + DAYS * DAY_MS, HOUR_MS)) == raw  # from samples
        s.build_tiers()
        assert built_ms(s) == NOW - HOUR_MS
        assert rows(Engine(s).range(q, T0 + HOUR_MS, T0 + DAYS * DAY_MS, HOUR_MS)) == raw


def test_tiers_outlive_raw_retention_and_keep_their_own(tmp_path: Path, clock: FakeClock) -> None:
    day_s = DAY_MS / 1000
    s = Store.open(
        tmp_path / "d",
        clock=clock,
        retention_s=2 * day_s,
        tier_retention_s={MINUTE_MS: 4 * day_s, HOUR_MS: 30 * day_s},
    )
    try:
        fill(s)
        # Retention builds the days it is about to delete first: nothing is lost to it.
        s.apply_retention(clock.now_ms())  # now: day 7 begins; raw keeps days 6 and 7
        assert built_ms(s) == T0 + 5 * DAY_MS  # (up to the cutoff, a day's end: 2 days ago)
        assert not s.select(UTIL, T0, T0 + 5 * DAY_MS - 1)
        assert s.select(UTIL, T0 + 5 * DAY_MS, T0 + 6 * DAY_MS)
        # The first day's hours are still there, its minutes are not (kept 4 days).
        first_day = (T0, T0 + DAY_MS)
        assert not s.select_tiers(UTIL, MINUTE_MS, *first_day)
        hours = s.select_tiers(UTIL, HOUR_MS, *first_day)
        assert len(hours) == 3 and hours[0].points.size == 24
        # A panel over the whole week still has its first day, from the 1-hour tier.
        week = Engine(s).range("avg_over_time(util[1d])", T0 + DAY_MS, T0 + DAYS * DAY_MS, DAY_MS)
        assert isinstance(week, Matrix) and len(week) == 3
        assert next(iter(week)).timestamps_ms[0] == T0 + DAY_MS
    finally:
        s.close()


def test_a_read_only_store_answers_from_its_tiers(tmp_path: Path, clock: FakeClock) -> None:
    with Store.open(tmp_path / "d", clock=clock) as s:
        fill(s)
        s.build_tiers()
        want = rows(Engine(s).range("rate(energy[1h])", T0 + HOUR_MS, T0 + DAYS * DAY_MS, HOUR_MS))
    with Store.open(tmp_path / "d", clock=clock, read_only=True) as s:
        assert s.select_tiers(UTIL, HOUR_MS, T0, T0 + DAY_MS)
        assert rows(Engine(s).range("rate(energy[1h])", T0 + HOUR_MS, T0 + DAYS * DAY_MS, HOUR_MS)) == want


def test_retention_by_size_deletes_the_oldest_raw_days_first(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    keep_all = 100 * DAY_MS / 1000
    with Store.open(tmp_path / "d", clock=clock, retention_s=keep_all) as s:
        fill(s, gpus=8, step_ms=5_000)
        s.build_tiers()
    full = sizecap.file_bytes(tmp_path / "d" / "gpuwatch.duckdb")
    cap = int(full * 0.8 / sizecap.KEEP)  # the file is 20 % over the mark
    with Store.open(tmp_path / "d", clock=clock, retention_s=keep_all, size_cap_bytes=cap) as s:
        assert s.apply_retention(clock.now_ms()) > 0
        assert "retention_size: the database file is" in caplog.text
        kept = s.select(UTIL, T0, T0 + DAYS * DAY_MS)
        assert min(int(r.timestamps_ms[0]) for r in kept) >= T0 + 2 * DAY_MS  # the oldest days went ...
        assert max(int(r.timestamps_ms[-1]) for r in kept) > T0 + (DAYS - 1) * DAY_MS  # ... the newest stayed
        # ... and their points did not: a week's panel still starts on the first day.
        week = Engine(s).range("max_over_time(util[1h])", T0 + HOUR_MS, T0 + DAYS * DAY_MS, HOUR_MS)
        assert isinstance(week, Matrix)
        assert min(int(r.timestamps_ms[0]) for r in week) == T0 + HOUR_MS
        # The file has not grown since: the next pass deletes nothing.
        assert s.apply_retention(clock.now_ms()) == 0


def test_today_is_built_an_hour_at_a_time(tmp_path: Path) -> None:
    clock = FakeClock((T0 + 2 * DAY_MS + 5 * HOUR_MS + 20 * MINUTE_MS) / 1000)  # day 2, 05:20
    with Store.open(tmp_path / "d", clock=clock) as s:
        t = T0 + 7 + np.arange(0, 2 * DAY_MS + 5 * HOUR_MS + 20 * MINUTE_MS, 15_000, dtype=np.int64)
        s.append_series("util", (("gpu", "0"),), t, np.arange(t.size) % 97.0)
        s.flush()
        s.build_tiers()
        assert built_ms(s) == T0 + 2 * DAY_MS + 5 * HOUR_MS  # 05:00 closed at 05:10
        clock.advance(3600)  # an hour later, its samples written
        t2 = t[-1] + np.arange(15_000, HOUR_MS + 1, 15_000, dtype=np.int64)
        s.append_series("util", (("gpu", "0"),), t2, np.arange(t2.size) % 13.0)
        s.flush()
        s.build_tiers()
        assert built_ms(s) == T0 + 2 * DAY_MS + 6 * HOUR_MS
        q = "sum_over_time(util[1h])"
        end = T0 + 2 * DAY_MS + 6 * HOUR_MS
        assert rows(Engine(s).range(q, T0 + HOUR_MS, end, HOUR_MS)) == rows(
            Engine(RawOnly(s)).range(q, T0 + HOUR_MS, end, HOUR_MS)
        )


def test_the_live_streams_chunks_are_not_late(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples after the built hour, compacted into chunks as a live store does every few minutes, are
    for the next hour's build: no day is rebuilt for them (each compaction rebuilt every sampled
    series' day so far). A sample at or before the built hour still is late."""
    clock = FakeClock((T0 + 2 * DAY_MS + 5 * HOUR_MS + 20 * MINUTE_MS) / 1000)  # day 2, 05:20
    spans: list[tuple[int, int]] = []
    real = tierbuild.build_span

    def spy(cur: Any, ids: list[int], lo: int, hi: int, head_index: Any) -> Any:
        spans.append((lo, hi))
        return real(cur, ids, lo, hi, head_index)

    monkeypatch.setattr("gpuwatch.store.tierbuild.build_span", spy)
    with Store.open(tmp_path / "d", clock=clock) as s:
        t = T0 + 7 + np.arange(0, 2 * DAY_MS + 5 * HOUR_MS + 20 * MINUTE_MS, 15_000, dtype=np.int64)
        s.append_series("util", (("gpu", "0"),), t, np.arange(t.size) % 97.0)
        s.flush()
        s.build_tiers()
        assert built_ms(s) == T0 + 2 * DAY_MS + 5 * HOUR_MS
        for _ in range(3):  # the live stream: 5 minutes at a time, compacted, the tiers stepped
            clock.advance(300)
            spans.clear()
            t = t[-1] + np.arange(15_000, 300_001, 15_000, dtype=np.int64)
            s.append_series("util", (("gpu", "0"),), t, np.arange(t.size) % 13.0)
            s.flush()
            s.compact()
            s.build_tiers()
            assert spans == []
        late = np.array([T0 + 2 * DAY_MS + 4 * HOUR_MS + 1], np.int64)  # before the built hour's end
        spans.clear()
        s.append_series("util", (("gpu", "0"),), late, np.array([42.0]))
        s.flush()
        s.compact()
        s.build_tiers()
        assert spans == [(T0 + 2 * DAY_MS, T0 + 3 * DAY_MS)]
        q = "count_over_time(util[1h])"
        end = T0 + 2 * DAY_MS + 5 * HOUR_MS
        assert rows(Engine(s).range(q, T0 + HOUR_MS, end, HOUR_MS)) == rows(
            Engine(RawOnly(s)).range(q, T0 + HOUR_MS, end, HOUR_MS)
        )


def test_a_span_mostly_not_built_is_read_from_samples_while_they_are_all_kept(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Making tier points from samples costs ~10x reading them: where most of a span is not built yet
    and its raw samples are all kept, the engine reads samples; once the oldest raw days are gone,
    their points answer, and the rest is made from samples."""
    monkeypatch.setattr("gpuwatch.store.tierbuild.BATCH_SAMPLES", 10_000)  # a series a batch
    keep_s = (NOW - (T0 + 2 * DAY_MS)) / 1000  # raw samples from day 3 on
    with Store.open(tmp_path / "d", clock=clock, retention_s=keep_s) as store:
        fill(store)
        span = (T0, T0 + DAYS * DAY_MS)
        assert store.select_tiers(UTIL, HOUR_MS, *span) is None  # nothing built, all raw kept
        while built_ms(store) != T0 + 2 * DAY_MS:  # days 1 and 2 only
            assert store.build_tiers(max_batches=1)
        assert store.select_tiers(UTIL, HOUR_MS, *span) is None  # 4 of 6 days not built: samples
        raw = Engine(RawOnly(store)).range("max_over_time(util[1h])", T0 + HOUR_MS, span[1], HOUR_MS)
        store.apply_retention(NOW)  # days 1-2's raw samples go
        got = store.select_tiers(UTIL, HOUR_MS, *span)
        assert got is not None and len(got) == 3
        assert all(int(s.points.end_ms[0]) == T0 + HOUR_MS for s in got)  # days 1-2 from their points
        tiered = Engine(store).range("max_over_time(util[1h])", T0 + HOUR_MS, span[1], HOUR_MS)
        assert isinstance(tiered, Matrix) and isinstance(raw, Matrix)
        for a, b in zip(tiered, raw, strict=True):  # the same answer as before the raw days went
            assert np.array_equal(a.timestamps_ms, b.timestamps_ms)
            np.testing.assert_array_equal(a.values, b.values)


def test_a_closed_window_merged_is_not_late(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The live stream compacted every 5 minutes past a 2-hour window's close: the window's chunks
    merged into one keep each sample's write seq, and the merged chunk is no late sample. Before, its
    seq (its newest sample's) was past the look and its start before the built hour, so every series'
    day so far was rebuilt at every window close (soak j: 3,168 series-days at 04:00, 582 MiB)."""
    start = T0 + 2 * DAY_MS + 5 * HOUR_MS + 22 * MINUTE_MS + 30_000  # day 2, 05:22:30
    clock = FakeClock(start / 1000)
    spans: list[tuple[int, int]] = []
    real = tierbuild.build_span

    def spy(cur: Any, ids: list[int], lo: int, hi: int, head_index: Any) -> Any:
        spans.append((lo, hi))
        return real(cur, ids, lo, hi, head_index)

    monkeypatch.setattr("gpuwatch.store.tierbuild.build_span", spy)
    with Store.open(tmp_path / "d", clock=clock) as s:
        t = T0 + 7 + np.arange(0, start - T0, 15_000, dtype=np.int64)
        s.append_series("util", (("gpu", "0"),), t, np.arange(t.size) % 97.0)
        s.flush()
        s.compact()
        s.build_tiers()
        chunks_before = s.stats()["chunks"]
        # 05:22:30 -> 07:22:30: the window closes at 06:00 (the compaction at 06:02:30 writes its last
        # 2.5 minutes) and is merged at 07:17:30
        for _ in range(24):
            clock.advance(300)
            for k in range(20):  # a sample every 15 s, through the head as the sampler's are
                t_ms = int(t[-1]) + 15_000
                t = np.append(t, t_ms)
                s.append(Batch(t_ms, [Sample("util", make_labels({"gpu": "0"}), float(k))]))
            s.flush()
            s.compact()
            s.build_tiers()
        assert (T0 + 2 * DAY_MS, T0 + 3 * DAY_MS) not in spans  # no day rebuilt
        assert built_ms(s) == T0 + 2 * DAY_MS + 7 * HOUR_MS
        assert s.stats()["chunks"] < chunks_before + 24  # the closed window was merged
        q = "count_over_time(util[1h])"
        end = T0 + 2 * DAY_MS + 6 * HOUR_MS
        assert rows(Engine(s).range(q, T0 + HOUR_MS, end, HOUR_MS)) == rows(
            Engine(RawOnly(s)).range(q, T0 + HOUR_MS, end, HOUR_MS)
        )


def test_today_s_row_is_written_fixed_width_and_narrowed_once_the_day_is_over(tmp_path: Path) -> None:
    """Each hour's build rewrites today's 1-minute row of every series: narrowing it cost 12-17 ms a
    series each time, so it is written fixed-width until its day is over, then narrowed once. The
    answers are the same either way."""
    clock = FakeClock((T0 + 2 * DAY_MS + 22 * HOUR_MS + 20 * MINUTE_MS) / 1000)  # day 2, 22:20
    q = "sum_over_time(util[1h])"

    def forms(s: Store, day: int) -> list[bytes]:
        lo = T0 + day * DAY_MS
        got = (
            s._cursor()
            .execute("SELECT data FROM tier_1m WHERE t_min_ms > ? AND t_min_ms <= ?", [lo, lo + DAY_MS])
            .fetchall()
        )
        return [bytes(r[0][:1]) for r in got]

    with Store.open(tmp_path / "d", clock=clock) as s:
        t = T0 + 7 + np.arange(0, 2 * DAY_MS + 22 * HOUR_MS + 20 * MINUTE_MS, 15_000, dtype=np.int64)
        s.append_series("util", (("gpu", "0"),), t, np.arange(t.size) % 97.0)
        s.flush()
        s.build_tiers()
        assert built_ms(s) == T0 + 2 * DAY_MS + 22 * HOUR_MS
        assert forms(s, 1) == [b"\x01"]  # a closed day: narrowed
        assert forms(s, 2) != [b"\x01"]  # today's: fixed-width
        clock.advance(2 * 3600)  # past midnight and its grace, the day's last samples written
        t2 = t[-1] + np.arange(15_000, 2 * HOUR_MS + 1, 15_000, dtype=np.int64)
        s.append_series("util", (("gpu", "0"),), t2, np.arange(t2.size) % 13.0)
        s.flush()
        s.build_tiers()
        assert built_ms(s) == T0 + 3 * DAY_MS
        assert forms(s, 2) == [b"\x01"]
        end = T0 + 3 * DAY_MS
        assert rows(Engine(s).range(q, T0 + HOUR_MS, end, HOUR_MS)) == rows(
            Engine(RawOnly(s)).range(q, T0 + HOUR_MS, end, HOUR_MS)
        )
