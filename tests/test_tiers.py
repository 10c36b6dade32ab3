"""Tier points (gpuwatch/core/tiers.py) and the answers read from them (gpuwatch/query/tiered.py): built by
hand on small cases, then against the raw engine on random series with counter resets, gaps, NaN and
staleness markers, at 1-minute and 1-hour resolution (the hour built from minutes and from samples)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import promql_parser
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuwatch.core import tiers
from gpuwatch.core.model import STALE_NAN, SeriesData, last_samples
from gpuwatch.query import tiered, windows
from gpuwatch.query.calls import RANGE_FUNCTIONS
from gpuwatch.query.frames import is_stale_array
from gpuwatch.query.reads import QueryReads
from gpuwatch.query.windows import Window, WindowResult

M, H = tiers.MINUTE_MS, tiers.HOUR_MS
S = 1000
NAN = np.nan


def points(times: list[int], values: list[float], res: int = M) -> tiers.TierPoints:
    return tiers.build(np.array(times, np.int64), np.array(values, np.float64), res)


# -- raw answers, through the engine's own code -------------------------------------------------------


def raw_window(
    name: str, times: np.ndarray, values: np.ndarray, ends: np.ndarray, range_ms: int
) -> WindowResult:
    """What the engine answers over the samples: staleness markers dropped (reads.matrix_selector), the
    function of calls.RANGE_FUNCTIONS over windows.Window."""
    keep = ~is_stale_array(values)
    return RANGE_FUNCTIONS[name](Window(times[keep], values[keep], ends, range_ms), [], ends)


class _Source:
    def __init__(self, times: np.ndarray, values: np.ndarray) -> None:
        self.times, self.values = times, values

    def select(self, matchers: Any, start_ms: int, end_ms: int) -> list[SeriesData]:
        lo, hi = np.searchsorted(self.times, [start_ms, end_ms + 1])
        return [SeriesData("x", (), self.times[lo:hi], self.values[lo:hi])]

    def select_last(self, matchers: Any, start_ms: int, end_ms: int) -> list[SeriesData]:
        return last_samples(self.select(matchers, start_ms, end_ms), start_ms, end_ms)


class _Engine:
    def __init__(self, source: _Source, lookback_ms: int) -> None:
        self.source = source
        self.lookback_ms = lookback_ms
        self.max_samples = 10**9
        self.timeout_s = 60.0
        self.monotonic = time.monotonic


def raw_instant(times: np.ndarray, values: np.ndarray, ends: np.ndarray, lookback_ms: int) -> WindowResult:
    """What the engine's instant selector `x` takes at each end (reads.QueryReads.vector_selector)."""
    reads = QueryReads(_Engine(_Source(times, values), lookback_ms), int(ends[0]), int(ends[-1]), None)
    frame = reads.vector_selector(promql_parser.parse("x"), ends)
    return frame.values[0], frame.present[0]


# -- comparing ----------------------------------------------------------------------------------------


def assert_same(got: WindowResult | None, want: WindowResult, tol: Any = 0.0) -> None:
    """Equal masks; where present, values equal (NaN to NaN) or within `tol` (a bound per step)."""
    assert got is not None
    (gv, gok), (wv, wok) = got, want
    np.testing.assert_array_equal(gok, wok)
    bound = np.broadcast_to(tol, wok.shape)[wok]
    gv, wv = gv[wok], wv[wok]
    same = (gv == wv) | (np.isnan(gv) & np.isnan(wv))
    with np.errstate(invalid="ignore"):
        bad = ~same & ~(np.abs(gv - wv) <= bound)
    assert not bad.any(), f"{gv[bad][:5]} != {wv[bad][:5]} (bound {bound[bad][:5]})"


# -- build and combine by hand ------------------------------------------------------------------------


def test_a_bucket_holds_the_samples_after_its_start_up_to_its_end():
    p = points([0, 1, 60 * S, 60 * S + 1, 125 * S], [1, 2, 3, 4, 5])
    assert p.end_ms.tolist() == [0, 60 * S, 120 * S, 180 * S]
    assert p.n.tolist() == [1, 2, 1, 1]
    assert p.sum.tolist() == [1, 5, 4, 5]
    assert (p.first_t.tolist(), p.last_t.tolist()) == (
        [0, 1, 60 * S + 1, 125 * S],
        [0, 60 * S, 60 * S + 1, 125 * S],
    )


def test_a_counter_reset_inside_a_bucket_is_a_correction():
    p = points([10 * S, 20 * S, 30 * S, 40 * S], [10, 20, 5, 8])
    assert p.correction.tolist() == [20.0]
    assert tiers.increase(p).tolist() == [18.0]  # 10 -> 20, then 0 -> 8 after the reset


def test_a_counter_reset_across_a_bucket_boundary_is_joined_when_read_and_combined():
    t = np.array([20, 40, 70, 90], np.int64) * S
    v = np.array([10.0, 20, 5, 8])
    p = tiers.build(t, v, M)
    assert p.correction.tolist() == [0.0, 0.0]  # each bucket alone has no reset
    ends = np.array([120 * S])
    for name in ("increase", "rate", "delta", "sum_over_time"):
        assert_same(tiered.window(name, p, ends, 2 * M), raw_window(name, t, v, ends, 2 * M))
    got = tiered.window("increase", p, ends, 2 * M)
    assert got is not None
    assert got[0][0] > 0  # the reset counted `5`, not the drop to it
    hour = tiers.combine(p, H)
    assert hour.correction.tolist() == [20.0] == tiers.build(t, v, H).correction.tolist()


def test_empty_buckets_have_no_row_and_windows_span_the_gap():
    t = np.array([10, 50, 3 * 3600 + 10, 3 * 3600 + 30], np.int64) * S
    v = np.array([1.0, 2, 3, 4])
    p = tiers.build(t, v, M)
    assert p.end_ms.tolist() == [60 * S, 3 * H + M]
    ends = np.arange(1, 4 * 60 + 1) * M
    for name in tiered.FUNCTIONS:
        for rng in (M, 30 * M, 4 * H):
            assert_same(tiered.window(name, p, ends, rng), raw_window(name, t, v, ends, rng))


def test_a_staleness_marker_last_in_a_bucket_hides_its_sample_from_an_instant_selector():
    t = np.array([10, 20, 30, 70], np.int64) * S
    v = np.array([1.0, 2, STALE_NAN, 4])
    p = tiers.build(t, v, M)
    assert p.n.tolist() == [2, 1] and p.stale_after.tolist() == [True, False]
    assert p.last_v.tolist() == [2.0, 4.0]  # the marker is no sample
    ends = np.array([60, 120, 180], np.int64) * S
    got = tiered.instant(p, ends, 5 * M)
    assert got[1].tolist() == [False, True, True]
    assert_same(got, raw_instant(t, v, ends, 5 * M))


def test_a_bucket_of_markers_alone_has_a_row_that_hides_an_earlier_sample():
    t = np.array([10, 130], np.int64) * S
    v = np.array([1.0, STALE_NAN])
    p = tiers.build(t, v, M)
    assert p.end_ms.tolist() == [M, 3 * M] and p.n.tolist() == [1, 0]
    ends = np.array([1, 2, 3, 4], np.int64) * M
    got = tiered.instant(p, ends, 5 * M)
    assert got[1].tolist() == [True, True, False, False]
    assert_same(got, raw_instant(t, v, ends, 5 * M))
    assert_same(
        tiered.window("count_over_time", p, ends, 5 * M), raw_window("count_over_time", t, v, ends, 5 * M)
    )


def test_nan_values_count_and_are_skipped_by_min_and_max_and_reset_detection():
    t = np.array([10, 20, 30, 70, 80], np.int64) * S
    v = np.array([10.0, NAN, 5, NAN, NAN])
    p = tiers.build(t, v, M)
    assert p.n.tolist() == [3, 2]
    np.testing.assert_array_equal(p.min, [5.0, NAN])
    np.testing.assert_array_equal(p.max, [10.0, NAN])
    assert p.correction.tolist() == [0.0, 0.0]  # 10 > 5, but a NaN stands between them
    ends = np.array([60, 120], np.int64) * S
    for name in tiered.FUNCTIONS:
        for rng in (M, 2 * M):
            assert_same(tiered.window(name, p, ends, rng), raw_window(name, t, v, ends, rng))


def test_infinities_sum_as_the_raw_sum_does():
    t = np.arange(1, 200, dtype=np.int64) * 20 * S
    v = np.ones(t.size)
    v[[10, 50]], v[120] = np.inf, -np.inf
    p = tiers.build(t, v, M)
    ends = np.arange(1, 70) * M
    for rng in (M, 40 * M):  # Kahan over few rows, counts of infinities over many
        for name in ("sum_over_time", "avg_over_time", "increase"):
            assert_same(tiered.window(name, p, ends, rng), raw_window(name, t, v, ends, rng))


def test_a_build_of_consecutive_spans_is_the_build_of_all():
    t = np.cumsum(np.full(500, 7 * S, np.int64))
    v = np.where(np.arange(500) % 37 == 0, STALE_NAN, np.arange(500.0) % 90)
    whole = tiers.build(t, v, M)
    cut = np.searchsorted(t, 20 * M, side="right")
    parts = tiers.concat([tiers.build(t[:cut], v[:cut], M), tiers.build(t[cut:], v[cut:], M)])
    for a, b in zip(whole, parts, strict=True):
        np.testing.assert_array_equal(a, b)
    assert tiers.cut(whole, 20 * M, 25 * M).end_ms.tolist() == [21 * M, 22 * M, 23 * M, 24 * M, 25 * M]


def test_each_function_declares_the_columns_it_reads():
    assert set(tiered.NEEDS) == set(tiered.FUNCTIONS)
    assert tiered.columns("irate") is None  # not declared: every column
    p = points([10 * S, 70 * S, 80 * S], [1.0, 5.0, 2.0])
    ends = np.array([2 * M], np.int64)
    for name in tiered.FUNCTIONS:
        cols = tiered.columns(name)
        assert cols is not None and {"end_ms", "n"} <= set(cols), name
        whole = tiered.window(name, p, ends, 2 * M)
        alone = tiered.window(name, tiers.only(p, cols), ends, 2 * M)  # enough: it reads nothing else
        assert alone is not None and whole is not None and alone[0].tolist() == whole[0].tolist(), name
        for col in set(cols) - {"end_ms", "n"}:  # and each of its columns is read: changed, it tells
            moved = p._replace(**{col: getattr(p, col) + (1000 if col.endswith("_t") else 1.5)})
            got = tiered.window(name, tiers.only(moved, cols), ends, 2 * M)
            assert got is not None and got[0].tolist() != whole[0].tolist(), (name, col)
    alone = tiers.only(p, ["sum"])
    assert alone.sum is p.sum and alone.end_ms is p.end_ms and alone.max is None and alone.n is None
    kept = tiers.concat([alone, tiers.take(alone, slice(0, 1))])
    assert kept.sum.tolist() == [*p.sum.tolist(), p.sum[0]] and kept.max is None
    assert tiers.concat([alone, p]).max is None  # a column one part has not read is not read


def test_usable_wants_whole_buckets():
    ends = np.array([2, 4], np.int64) * M
    assert tiered.usable(M, ends, 5 * M)
    assert not tiered.usable(M, ends + 1, 5 * M)
    assert not tiered.usable(M, ends, 90 * S)
    assert not tiered.usable(2 * M, ends, M)  # shorter than a bucket
    assert tiered.usable(M, ends + 30 * S, M, offset_ms=30 * S)
    assert not tiered.usable(H, ends, 5 * M)
    hours = np.array([1, 2], np.int64) * H
    assert tiered.usable_instant(H, hours, 5 * M)  # within one bucket: its last sample, if recent
    assert tiered.usable_instant(H, hours, 2 * H) and not tiered.usable_instant(H, hours, 90 * M)
    assert not tiered.usable_instant(H, hours + M, 5 * M)
    assert tiered.window("irate", tiers.empty(), ends, M) is None


# -- tiered against raw on random series --------------------------------------------------------------


def random_series(seed: int, kind: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A series as scrapes leave it: irregular intervals of 1-90 s, gaps of minutes to hours (mostly after
    a staleness marker, as a target that vanished), markers and NaN here and there; a counter with
    resets, an integer counter, or a gauge."""
    rng = np.random.default_rng(seed)
    step = rng.integers(1 * S, 90 * S + 1, n)
    gap = rng.random(n) < 0.02
    step = np.where(gap, rng.integers(2 * M, 3 * H, n), step)
    times = rng.integers(0, 2 * H) + np.cumsum(step)
    if kind == "gauge":
        values = np.round(rng.normal(50, 30, n), 2)
    else:
        inc = rng.exponential(20, n) if kind == "counter" else rng.integers(0, 40, n).astype(float)
        total = np.cumsum(inc)
        reset = rng.random(n) < 0.02
        # at a reset the counter starts again from 0: take off what it had before
        values = total - np.maximum.accumulate(np.where(reset, total - inc, 0.0))
    values[rng.random(n) < 0.01] = np.nan
    stale = (rng.random(n) < 0.02) | (np.roll(gap, -1) & (rng.random(n) < 0.7))
    values[stale] = STALE_NAN
    return times.astype(np.int64), values


EPS = np.finfo(np.float64).eps
RATE_REL = 1e-9  # rate, increase, delta: relative to the raw answer, where a reset falls in the window


def exact_sums(
    times: np.ndarray, values: np.ndarray, ends: np.ndarray, rng: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each window's sum, correctly rounded (math.fsum), and the sum of its magnitudes."""
    keep = ~is_stale_array(values)
    w = Window(times[keep], values[keep], ends, rng)
    v = w.values
    sums = np.array(
        [
            math.fsum(v[lo:hi]) if np.isfinite(v[lo:hi]).all() else np.sum(v[lo:hi])
            for lo, hi in zip(w.lo, w.hi, strict=True)
        ]
    )
    mags = np.array([math.fsum(np.abs(v[lo:hi])) for lo, hi in zip(w.lo, w.hi, strict=True)])
    return sums, mags


def compare(
    times: np.ndarray, values: np.ndarray, p: tiers.TierPoints, ends: np.ndarray, rng: int, res: int
) -> None:
    """Every tiered answer against the raw one: equal, except where additions are grouped otherwise.

    sum and avg must be within 4 units in the last place of the window's magnitudes of the exact sum,
    and of the raw one: the raw's Kahan path is as close; its prefix-sum path (windows._fast_sums) may
    be off by rounding of the running total, Higham's bound `n eps sum|v|` for n samples. rate,
    increase and delta are equal where no counter reset falls in the window, else within RATE_REL."""
    keep = ~is_stale_array(values)
    w = Window(times[keep], values[keep], ends, rng)
    integral = bool((np.isnan(w.values) | (w.values == np.round(w.values))).all())
    exact, mags = exact_sums(times, values, ends, rng)
    with np.errstate(invalid="ignore", divide="ignore"):
        raw_error = (
            0.0
            if windows._fast_sums(w) is None
            else len(w.values) * EPS * math.fsum(np.abs(w.values[np.isfinite(w.values)]))
        )
        sum_tol = {"exact": 4 * EPS * mags, "raw": 4 * EPS * mags + raw_error}
        per_sample = {k: t / w.count for k, t in sum_tol.items()}
        no_reset = windows.resets(w)[0] == 0
        finite = np.where(np.isfinite(w.values), np.abs(w.values), 0.0)
        peaks = np.array([finite[lo:hi].max(initial=0.0) for lo, hi in zip(w.lo, w.hi, strict=True)])
    for name in tiered.FUNCTIONS:
        want = raw_window(name, times, values, ends, rng)
        got = tiered.window(name, p, ends, rng)
        # From its declared columns alone (the others None, as a tiered read leaves them): the same.
        alone = tiered.window(name, tiers.only(p, tiered.columns(name)), ends, rng)
        assert got is not None and alone is not None
        np.testing.assert_array_equal(alone[0], got[0], err_msg=name)
        np.testing.assert_array_equal(alone[1], got[1], err_msg=name)
        if name in ("sum_over_time", "avg_over_time") and not integral:
            tol = sum_tol if name == "sum_over_time" else per_sample
            with np.errstate(invalid="ignore", divide="ignore"):
                want_exact = exact if name == "sum_over_time" else exact / w.count
            assert_same(got, (want_exact, want[1]), tol["exact"])
            assert_same(got, want, tol["raw"])
        elif name in ("rate", "increase", "delta") and not integral:
            # Relative to the values the answer is made of, not to the answer alone: a gauge that
            # ends where it began gives ~0 from terms of ordinary size (seed 65 once: 0 vs -1.3e-14).
            scale = np.abs(want[0]) + peaks * (1.0 if name != "rate" else 1000.0 / rng)
            assert_same(got, want, np.where(no_reset, 0.0, RATE_REL * scale))
        else:
            assert_same(got, want)
    assert_same(tiered.instant(p, ends, rng), raw_instant(times, values, ends, rng))
    for want_times in (False, True):
        whole = tiered.instant(p, ends, rng, want_times)
        alone = tiered.instant(tiers.only(p, tiered.instant_columns(want_times)), ends, rng, want_times)
        np.testing.assert_array_equal(alone[0], whole[0])
        np.testing.assert_array_equal(alone[1], whole[1])
    # An instant selector's lookback within one bucket (5 minutes on 1-hour points): exact too.
    for lookback in (5 * M, 30 * S):
        if tiered.usable_instant(res, ends, lookback):
            assert_same(tiered.instant(p, ends, lookback), raw_instant(times, values, ends, lookback))


def same_points(a: tiers.TierPoints, b: tiers.TierPoints) -> None:
    """Equal points, but for sums of the same values grouped otherwise (each within an ulp of exact)."""
    for field, x, y in zip(a._fields, a, b, strict=True):
        if field in ("sum", "correction"):
            np.testing.assert_allclose(x, y, rtol=8 * EPS, atol=1e-12, err_msg=field)  # measured: 2 ulps
        else:
            np.testing.assert_array_equal(x, y, err_msg=field)


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["counter", "integer counter", "gauge"]),
    res=st.sampled_from([M, H]),
)
@example(seed=65, kind="gauge", res=M)  # a delta of ~0 from ordinary values, across a decrease
def test_tiered_answers_are_the_raw_answers(seed: int, kind: str, res: int):
    # Sizes from the seed, not from Hypothesis, which would mostly try the smallest.
    sizes = np.random.default_rng(seed + 1)
    n = int(np.exp(sizes.uniform(0, np.log(3000))))
    rng = int(sizes.choice([1, 2, 5, 15, 30, 60, 240]) if res == M else sizes.choice([1, 2, 3, 6, 24])) * res
    step = int(sizes.integers(1, 6)) * res
    times, values = random_series(seed, kind, n)
    first = int(times[0]) // res * res
    ends = np.arange(first, int(times[-1]) + rng + step, step, dtype=np.int64)
    assert tiered.usable(res, ends, rng)
    p = tiers.build(times, values, res)
    if res == H:
        from_minutes = tiers.combine(tiers.build(times, values, M), H)
        same_points(from_minutes, p)
        compare(times, values, from_minutes, ends, rng, res)
    compare(times, values, p, ends, rng, res)
