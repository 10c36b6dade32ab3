"""rate, increase and delta: Prometheus's extrapolated rate, against a sample-by-sample reference.

The reference is Prometheus's `extrapolatedRate` written out in Python floats, one series and one step
at a time. The engine computes series scraped together (equal timestamps) as rows of one array, and
others one by one; the answers must not depend on that.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.query import Engine, Matrix, Vector
from gpuwatch.query.rates import extrapolated_rate, extrapolated_rate_rows
from gpuwatch.query.windows import Window
from tests.promql_harness import ArrayStore

T0 = 1_800_000_000_000
KINDS = {"rate": (True, True), "increase": (True, False), "delta": (False, False)}
VALUE = st.one_of(
    st.floats(0, 1e6),
    st.floats(-1e3, 1e3),
    st.sampled_from([0.0, -0.0, 1.0, 1e-300, 5e-324, 1e300, math.inf, math.nan]),
)


def reference(
    times: list[int], values: list[float], end: int, range_ms: int, is_counter: bool, is_rate: bool
) -> float | None:
    """Prometheus's extrapolatedRate of one series' samples in (end - range_ms, end]."""
    start = end - range_ms
    pts = [(t, v) for t, v in zip(times, values, strict=True) if start < t <= end]
    if len(pts) < 2:
        return None
    (first_t, first_v), (last_t, last_v) = pts[0], pts[-1]
    result = last_v - first_v
    if is_counter:
        prev = 0.0
        for _, v in pts:
            if v < prev:
                result += prev
            prev = v
    sampled = (last_t - first_t) / 1000
    avg = sampled / (len(pts) - 1)
    to_start, to_end = (first_t - start) / 1000, (end - last_t) / 1000
    threshold = avg * 1.1
    if to_start >= threshold:
        to_start = avg / 2
    if is_counter and result > 0 and first_v >= 0:
        to_zero = sampled * (first_v / result)
        if to_zero < to_start:
            to_start = to_zero
    if to_end >= threshold:
        to_end = avg / 2
    factor = (sampled + to_start + to_end) / sampled
    if is_rate:
        factor /= range_ms / 1000
    return result * factor


@st.composite
def scrapes(draw: st.DrawFn) -> list[tuple[list[int], list[float]]]:
    """A few targets, each scraping a few series together (the same timestamps), with gaps and jitter;
    counters with resets and odd values now and then."""
    out = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(0, 30))
        interval = draw(st.sampled_from([5_000, 15_000]))
        jitter = draw(st.lists(st.integers(0, interval // 2), min_size=n, max_size=n))
        times = sorted({T0 + i * interval + j for i, j in enumerate(jitter)})
        if n > 3 and draw(st.booleans()):
            times = times[: n // 3] + times[n // 2 :]  # a gap
        for _ in range(draw(st.integers(1, 3))):
            if draw(st.booleans()):
                inc = draw(st.lists(st.integers(0, 50), min_size=len(times), max_size=len(times)))
                values = np.cumsum(np.array(inc, dtype=np.float64)).tolist()
                if values and draw(st.booleans()):
                    values[draw(st.integers(0, len(values) - 1))] = draw(VALUE)  # a reset, a NaN, ...
            else:
                values = draw(st.lists(VALUE, min_size=len(times), max_size=len(times)))
            out.append((times, values))
    return out


def _store(series: list[tuple[list[int], list[float]]]) -> ArrayStore:
    store = ArrayStore()
    for i, (times, values) in enumerate(series):
        for t, v in zip(times, values, strict=True):
            store.append({"__name__": "c", "s": f"{i:02d}"}, t, v)
    store.prepare()
    return store


def _agree(got: float, want: float, magnitude: float) -> bool:
    """Equal but for rounding: the engine adds a window's counter corrections up before adding them to
    the difference, Prometheus one by one, so the error is relative to the values, not to the answer."""
    if math.isnan(want) or math.isinf(want):
        return math.isnan(got) if math.isnan(want) else got == want
    return got == pytest.approx(want, rel=1e-9, abs=1e-12 * magnitude)


@settings(max_examples=300, deadline=None)
@given(
    scrapes(),
    st.sampled_from(sorted(KINDS)),
    st.sampled_from([30_000, 60_000, 300_000]),
    st.integers(1, 12),
    st.sampled_from([7_000, 15_000, 60_000]),
)
def test_rates_equal_the_reference_series_by_series_at_every_step(
    series: list[tuple[list[int], list[float]]], fn: str, range_ms: int, steps: int, step_ms: int
) -> None:
    is_counter, is_rate = KINDS[fn]
    store = _store(series)
    start = T0 + 20_000
    end = start + (steps - 1) * step_ms
    query = f"{fn}(c[{range_ms // 1000}s])"
    results = [Engine(store).range(query, start, end, step_ms)]
    if steps == 1:
        results.append(Engine(store).instant(query, start))
    for result in results:
        got: dict[tuple[str, int], float] = {}
        if isinstance(result, Matrix):
            for s in result:
                got.update(
                    ((s.labels["s"], int(t)), float(v))
                    for t, v in zip(s.timestamps_ms, s.values, strict=True)
                )
        else:
            assert isinstance(result, Vector)
            got.update(((x.labels["s"], start), x.value) for x in result)
        want: dict[tuple[str, int], float] = {}
        magnitude: dict[str, float] = {}
        for i, (times, values) in enumerate(series):
            finite = [abs(v) for v in values if math.isfinite(v)]
            magnitude[f"{i:02d}"] = 10 * max(finite, default=0.0)  # (extrapolated: a few times the range)
            for end_ms in range(start, end + 1, step_ms):
                r = reference(times, values, end_ms, range_ms, is_counter, is_rate)
                if r is not None:
                    want[(f"{i:02d}", end_ms)] = r
        assert got.keys() == want.keys()
        bad = [(k, got[k], want[k]) for k in want if not _agree(got[k], want[k], magnitude[k[0]])]
        assert not bad, bad[:5]


def test_a_counter_reset_in_one_series_only() -> None:
    t = [T0 - 45_000, T0 - 30_000, T0 - 15_000, T0]
    store = ArrayStore()
    for s, values in (("a", [100.0, 110.0, 120.0, 130.0]), ("b", [10.0, 20.0, 5.0, 15.0])):
        for ti, v in zip(t, values, strict=True):
            store.append({"__name__": "c", "s": s}, ti, v)
    store.prepare()
    result = Engine(store).instant("increase(c[1m])", T0)
    assert isinstance(result, Vector)
    got = {x.labels["s"]: x.value for x in result}
    # a: 30 over 45 s, extrapolated to 60 s; b: 10 + 20 (the value before the reset) over 45 s
    assert got == pytest.approx({"a": 40.0, "b": (15.0 - 10.0 + 20.0) * 60 / 45}, rel=1e-15)


@settings(max_examples=200, deadline=None)
@given(st.data(), st.sampled_from(sorted(KINDS)))
def test_a_series_computed_with_others_gets_what_it_gets_alone(data: st.DataObject, fn: str) -> None:
    # Rows of one array: an odd value (a NaN, an infinite reset) in one row changes no other.
    is_counter, is_rate = KINDS[fn]
    n = data.draw(st.integers(0, 80))
    times = T0 + np.arange(n, dtype=np.int64) * 15_000
    k = data.draw(st.integers(1, 4))
    rows = np.array([data.draw(st.lists(VALUE, min_size=n, max_size=n)) for _ in range(k)]).reshape(k, n)
    ends = T0 + np.arange(data.draw(st.integers(1, 40)), dtype=np.int64) * 60_000
    w = Window(times, rows[0], ends, 300_000)
    values, ok = extrapolated_rate_rows(w, rows, is_counter, is_rate)
    for r in range(rows.shape[0]):
        one, one_ok = extrapolated_rate(Window(times, rows[r], ends, 300_000), is_counter, is_rate)
        assert np.array_equal(ok, one_ok)
        assert values[r][ok].view(np.int64).tolist() == one[ok].view(np.int64).tolist()


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 300),
    t0=st.integers(-(2**62), 2**62),
    step=st.integers(1, 10**7),
    starts=st.integers(-(10**9), 10**9),
    count=st.integers(1, 200),
    every=st.integers(1, 10**6),
    range_ms=st.integers(1, 10**9),
    jitter=st.booleans(),
)
def test_window_bounds_by_arithmetic_equal_searchsorted(
    n: int, t0: int, step: int, starts: int, count: int, every: int, range_ms: int, jitter: bool
) -> None:
    """Evenly spaced samples get their window bounds by arithmetic, others by binary search: the same."""
    if abs(t0) + n * step >= 2**62:
        t0 = 0
    times = t0 + np.arange(n, dtype=np.int64) * step
    if jitter and n > 2:
        times[n // 2] += 1 if step > 2 else 0
    ends = t0 + starts + np.arange(count, dtype=np.int64) * every
    w = Window(times, np.zeros(n), ends, range_ms)
    assert w.lo.tolist() == np.searchsorted(times, ends - range_ms, side="right").tolist()
    assert w.hi.tolist() == np.searchsorted(times, ends, side="right").tolist()
    assert w.count.tolist() == (w.hi - w.lo).tolist()


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 30), st.integers(1, 3), st.integers(60, 200), st.integers(0, 5))
def test_columns_of_evenly_stepping_windows_equal_a_gather(
    prefix: int, stride: int, n: int, start: int
) -> None:
    from gpuwatch.query.rates import _columns

    idx = np.r_[np.zeros(prefix, np.int64), start + stride * np.arange(n - prefix, dtype=np.int64)]
    rows = np.arange(3 * (int(idx[-1]) + 1), dtype=np.float64).reshape(3, -1)
    assert np.array_equal(_columns(rows, idx), rows[:, idx])
