"""Fast paths of range queries equal the straightforward ones bit for bit, on random data.

- `extrapolated_rate_rows` (rate/increase/delta of series sharing timestamps, as one 2-D array, with
  strided column copies for evenly stepping windows) against `extrapolated_rate` series by series;
- `histogram._needs_fix` (which skips the full almost-equal test where buckets clearly rise) against
  the plain test over every cell.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.query import histogram
from gpuwatch.query.rates import extrapolated_rate, extrapolated_rate_rows
from gpuwatch.query.windows import Window

T0 = 1_800_000_000_000
KINDS = [(True, True), (True, False), (False, False)]
VALUE = st.one_of(
    st.floats(0, 1e6),
    st.floats(-1e3, 1e3),
    st.sampled_from([0.0, -0.0, 1.0, 1e-300, 5e-324, 1e300, float("inf"), float("nan")]),
)


@st.composite
def shared_series(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(times, (k, samples) values, step ends, range): mostly regular samples, sometimes a gap or jitter."""
    n = draw(st.integers(0, 150))
    interval = draw(st.sampled_from([1_000, 15_000]))
    times = T0 + np.arange(n, dtype=np.int64) * interval
    if n > 3 and draw(st.booleans()):
        times[n // 2 :] += draw(st.integers(1, 3 * interval))  # a gap or a late scrape
    k = draw(st.integers(1, 4))
    counter_like = draw(st.booleans())
    # Rarely moving series (error and ECC counters, settings): most windows see no change.
    increments = draw(
        st.sampled_from([st.integers(0, 50), st.integers(0, 50).map(lambda x: x if x > 46 else 0)])
    )
    rows = np.empty((k, n))
    for r in range(k):
        if counter_like:
            inc = draw(st.lists(increments, min_size=n, max_size=n))
            rows[r] = np.cumsum(np.array(inc, dtype=np.float64)) * draw(st.sampled_from([1.0, 0.1, 1e-9]))
            if n and draw(st.booleans()):
                rows[r, draw(st.integers(0, n - 1))] = draw(VALUE)  # a reset, a NaN, an odd value
        elif draw(st.booleans()):
            rows[r] = np.array(draw(st.lists(VALUE, min_size=n, max_size=n)), dtype=np.float64)
        else:  # a gauge that stays, with a few other values (-0.0 against 0.0 included)
            rows[r] = draw(VALUE)
            for _ in range(draw(st.integers(0, 3))):
                if n:
                    rows[r, draw(st.integers(0, n - 1)) :] = draw(VALUE)
    step = draw(st.sampled_from([interval, 2 * interval, 7_000, 60_000]))
    start = T0 - draw(st.integers(0, 4)) * interval + draw(st.sampled_from([0, 7_000]))
    steps = draw(st.integers(1, 120))
    ends = start + np.arange(steps, dtype=np.int64) * step
    range_ms = draw(st.sampled_from([2 * interval, 5 * interval, 300_000]))
    return times, rows, ends, range_ms


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


@settings(max_examples=400, deadline=None)
@given(shared_series(), st.sampled_from(KINDS))
def test_rate_rows_equal_series_by_series(data: tuple[np.ndarray, np.ndarray, np.ndarray, int], kind: tuple[bool, bool]) -> None:  # fmt: skip
    times, rows, ends, range_ms = data
    is_counter, is_rate = kind
    w = Window(times, rows[0], ends, range_ms)
    got = extrapolated_rate_rows(w, rows, is_counter, is_rate)
    if got is None:  # a non-finite or huge counter drop: the caller goes series by series
        assert (is_counter and not np.isfinite(rows).all()) or np.abs(rows).max() >= 1e15
        return
    values, ok = got
    for r in range(rows.shape[0]):
        one, one_ok = extrapolated_rate(Window(times, rows[r], ends, range_ms), is_counter, is_rate)
        assert np.array_equal(ok, one_ok)
        assert np.array_equal(bits(values[r][ok]), bits(one[ok]))


def test_rate_rows_of_rarely_moving_counters_work_out_only_the_steps_that_moved(monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # A day at 15 s of three ECC-like counters: two move at a few samples, one never. Only the steps
    # whose window saw a change get the extrapolation; the answers are the series-by-series ones.
    from gpuwatch.query import rates

    n = 5_760
    times = T0 + np.arange(n, dtype=np.int64) * 15_000
    rows = np.zeros((3, n))
    rows[0, 1_000:] += 1.0
    rows[0, 4_000:] += 2.0
    rows[1, 2_500:] = 7.0
    rows[2] = 3.0
    ends = times.copy()
    sizes: list[int] = []
    plain = rates._extrapolate_rows

    def spy(result: np.ndarray, *args: object) -> np.ndarray:
        sizes.append(result.shape[1])
        return plain(result, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(rates, "_extrapolate_rows", spy)
    for is_counter, is_rate in KINDS:
        w = Window(times, rows[0], ends, 3_600_000)
        got = extrapolated_rate_rows(w, rows, is_counter, is_rate)
        assert got is not None
        values, ok = got
        for r in range(3):
            one, one_ok = extrapolated_rate(Window(times, rows[r], ends, 3_600_000), is_counter, is_rate)
            assert np.array_equal(ok, one_ok)
            assert np.array_equal(bits(values[r][ok]), bits(one[ok]))
    assert sizes and all(size < n // 4 for size in sizes), sizes  # three 1 h bursts of 240 steps


def _needs_fix_plain(counts: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        later, earlier = counts[1:], counts[:-1]
        same = later == earlier
        close = histogram._almost_equal(earlier, later, histogram._SMALL_DELTA)
        return np.asarray((~same & ((later < earlier) | close)).any(axis=0))


@settings(max_examples=400, deadline=None)
@given(st.integers(2, 6), st.integers(1, 20), st.data())
def test_needs_fix_equals_the_plain_test(buckets: int, steps: int, data: st.DataObject) -> None:
    base = data.draw(st.lists(st.floats(0, 1e3), min_size=steps, max_size=steps))
    counts = np.empty((buckets, steps))
    counts[0] = base
    for b in range(1, buckets):
        rel = data.draw(st.sampled_from([0.0, 1e-13, 2e-12, 1e-11, 0.5, -1e-13, -0.1]))
        counts[b] = counts[b - 1] * (1 + rel) + data.draw(st.sampled_from([0.0, 0.0, 1.0, 1e-310]))
    for _ in range(data.draw(st.integers(0, 3))):
        counts[data.draw(st.integers(0, buckets - 1)), data.draw(st.integers(0, steps - 1))] = data.draw(
            VALUE
        )
    assert np.array_equal(histogram._needs_fix(counts), _needs_fix_plain(counts))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 30), st.integers(1, 3), st.integers(60, 200), st.integers(0, 5))
def test_strided_column_copy_equals_gather(prefix: int, stride: int, n: int, start: int) -> None:
    from gpuwatch.query.rates import _take_cols

    idx = np.r_[np.zeros(prefix, np.int64), start + stride * np.arange(n - prefix, dtype=np.int64)]
    rows = np.arange(3 * (int(idx[-1]) + 1), dtype=np.float64).reshape(3, -1)
    assert np.array_equal(_take_cols(rows, idx), rows[:, idx])


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
