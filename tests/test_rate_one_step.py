"""rate/increase/delta of many series at one step (rules, instant queries) equal the series-by-series path."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.query.rates import extrapolated_rate, extrapolated_rate_at
from gpuwatch.query.windows import Window

END = 1_800_000_000_000
RANGE = 60_000


@st.composite
def many_series(draw: st.DrawFn) -> list[tuple[np.ndarray, np.ndarray]]:
    out = []
    for _ in range(draw(st.integers(1, 8))):
        n = draw(st.integers(0, 12))
        gaps = draw(st.lists(st.integers(1, 20_000), min_size=n, max_size=n))
        first = END - draw(st.integers(0, 150_000))
        times = first + np.cumsum(np.array(gaps, dtype=np.int64)) - sum(gaps[: n // 2])
        value = st.one_of(
            st.floats(0, 1e6),
            st.sampled_from([0.0, 1.0, 1e300, float("inf"), float("nan"), -5.0]),
        )
        values = np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=np.float64)
        out.append((np.sort(times), values))
    return out


@settings(max_examples=300, deadline=None)
@given(many_series(), st.sampled_from([(True, True), (True, False), (False, False)]))
def test_one_pass_equals_series_by_series(series: list[tuple[np.ndarray, np.ndarray]], kind: tuple[bool, bool]) -> None:  # fmt: skip
    is_counter, is_rate = kind
    got = extrapolated_rate_at(series, END, RANGE, is_counter, is_rate)
    assert got is not None
    values, ok = got
    for i, (times, vals) in enumerate(series):
        window = Window(times, vals, np.array([END]), RANGE)
        if not window.count[0]:  # the engine never asks about a series with nothing in the window
            assert not ok[i]
            continue
        want, want_ok = extrapolated_rate(window, is_counter, is_rate)
        assert bool(ok[i]) == bool(want_ok[0]), i
        if want_ok[0]:
            np.testing.assert_array_equal(values[i], want[0])


def test_counter_reset_in_one_series_only() -> None:
    t = END - np.array([45_000, 30_000, 15_000, 0], dtype=np.int64)
    reset = (t, np.array([10.0, 20.0, 5.0, 15.0]))
    steady = (t, np.array([100.0, 110.0, 120.0, 130.0]))
    values, ok = extrapolated_rate_at([steady, reset, steady], END, RANGE, True, False) or (None, None)
    assert ok is not None and ok.all() and values is not None
    # steady: 30 over 45 s, extrapolated to 60 s; reset: 10 + (20 after the reset: 5 -> 15 and 20 kept)
    assert values.tolist() == pytest.approx([40.0, (15.0 - 10.0 + 20.0) * 60 / 45, 40.0], rel=1e-15)
