"""Range functions and instant selectors answered from one series' tier points instead of its samples.

A window `(e - r, e]` whose end and range are whole multiples of the resolution is a run of whole
buckets, so the figures the raw functions (windows.py, rates.py) compute from the window's samples
follow from the bucket rows inside it: the sample count, the first and last sample, the extremes,
the sum and the counter corrections. Each function here is vectorised over steps: the rows of step j
are `a[j]:b[j]` (searchsorted on the rows' ends); sums by compensated prefix sums (core.tiers.range_sums),
extremes by a sparse table.

How close to the raw functions, measured by tests/test_tiers.py on random series:
- count, present, last, first, their timestamps, min and max: equal, NaN rules included (min and max
  are NaN only where every value is: fmin/fmax of the buckets' extremes is the samples' extreme).
- rate, increase, delta: `last - first + corrections`, extrapolated by rates.extrapolate from the same
  first and last samples and count, so equal wherever the corrections sum exactly (no counter reset in
  the window, or integer values). Otherwise the corrections here are correctly rounded sums and the raw
  ones prefix sums (off by up to ~1e-12 of their size); answers differ by up to ~1e-11 relative.
- sum, avg: within a few units in the last place of the window's magnitudes of the exact sum, as the raw
  Kahan path is; the raw prefix-sum path (windows._fast_sums, wide windows) is off by rounding of the
  running total. avg is sum / count: where a window's sum overflows float64 the raw avg (incremental
  then) differs.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuwatch.core.tiers import TierPoints, range_sums, samples_only
from gpuwatch.query.rates import extrapolate
from gpuwatch.query.windows import WindowResult


def usable(res_ms: int, ends: np.ndarray, range_ms: int, offset_ms: int = 0) -> bool:
    """Whether windows `(end - offset - range, end - offset]` (or an instant selector's lookback
    `range_ms`) are whole buckets of resolution `res_ms`, so that tier points answer them exactly."""
    if res_ms <= 0 or range_ms < res_ms or range_ms % res_ms:
        return False
    return bool(((np.asarray(ends, np.int64) - offset_ms) % res_ms == 0).all())


class Spans:
    """One series' sample rows and the rows `a[j]:b[j]` of each step's window."""

    def __init__(self, points: TierPoints, ends: np.ndarray, range_ms: int) -> None:
        self.points = p = samples_only(points)
        self.ends = np.asarray(ends, np.int64)
        self.range_ms = int(range_ms)
        self.a = np.searchsorted(p.end_ms, self.ends - self.range_ms, side="right")
        self.b = np.searchsorted(p.end_ms, self.ends, side="right")
        cum = np.concatenate(([0], np.cumsum(p.n)))
        self.count = cum[self.b] - cum[self.a]
        self.first = np.minimum(self.a, max(p.size - 1, 0))  # rows of each window's first sample ...
        self.last = np.maximum(self.b - 1, 0)  # ... and last one (meaningful where count > 0)


def _extremes(ufunc: np.ufunc, x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Reduce `x[a[j]:b[j]]` by `ufunc` (fmin or fmax: idempotent, so two overlapping blocks of a
    power-of-two length cover a window) with a sparse table; NaN for an empty window."""
    width = b - a
    out = np.full(a.size, np.nan)
    some = width > 0
    if not some.any():
        return out
    level = np.zeros(a.size, np.int64)
    top = int(width.max()).bit_length() - 1
    for k in range(1, top + 1):
        level[width >= (1 << k)] = k
    table = x
    for k in range(top + 1):
        if k:
            h = 1 << (k - 1)
            table = ufunc(table[:-h], table[h:])  # table[i] reduces x[i : i + 2**k]
        at = some & (level == k)
        if at.any():
            out[at] = ufunc(table[a[at]], table[b[at] - (1 << k)])
    return out


def _present(s: Spans) -> WindowResult:
    return np.ones(s.a.size), s.count > 0


def _count(s: Spans) -> WindowResult:
    return s.count.astype(np.float64), s.count > 0


def _pick(s: Spans, column: np.ndarray, rows: np.ndarray, scale: float = 1.0) -> WindowResult:
    ok = s.count > 0
    if not column.size:
        return np.zeros(s.a.size), ok
    return column[rows] / scale if scale != 1.0 else column[rows], ok


def _sum(s: Spans) -> WindowResult:
    return range_sums(s.points.sum, s.a, s.b), s.count > 0


def _avg(s: Spans) -> WindowResult:
    with np.errstate(invalid="ignore", divide="ignore"):
        return range_sums(s.points.sum, s.a, s.b) / s.count, s.count > 0


def _corrections(s: Spans) -> np.ndarray:
    """Each window's counter corrections in time order: its first row's own, then for each later row
    the link from the row before (that row's last value, where this row's first is below it) and its own."""
    p = s.points
    link = np.zeros(p.size)
    if p.size > 1:
        with np.errstate(invalid="ignore"):
            link[1:] = np.where(p.first_v[1:] < p.last_v[:-1], p.last_v[:-1], 0.0)
    terms = np.empty(2 * p.size)  # row i: terms 2i (link in), 2i + 1 (own)
    terms[0::2], terms[1::2] = link, p.correction
    return range_sums(terms, np.minimum(2 * s.a + 1, 2 * s.b), 2 * s.b)


def _rate(is_counter: bool, is_rate: bool) -> Callable[[Spans], WindowResult]:
    def fn(s: Spans) -> WindowResult:
        ok = s.count >= 2
        p = s.points
        if not ok.any():
            return np.zeros(s.a.size), ok
        fv = p.first_v[s.first]
        with np.errstate(invalid="ignore", over="ignore"):
            result = p.last_v[s.last] - fv
            if is_counter:
                result = result + _corrections(s)
        ft = p.first_t[s.first].astype(np.float64)
        lt = p.last_t[s.last].astype(np.float64)
        out = extrapolate(
            result[None, :], fv[None, :], ft, lt, s.count, s.ends, s.range_ms, is_counter, is_rate
        )
        return out[0], ok

    return fn


FUNCTIONS: dict[str, Callable[[Spans], WindowResult]] = {
    "sum_over_time": _sum,
    "avg_over_time": _avg,
    "min_over_time": lambda s: (_extremes(np.fmin, s.points.min, s.a, s.b), s.count > 0),
    "max_over_time": lambda s: (_extremes(np.fmax, s.points.max, s.a, s.b), s.count > 0),
    "count_over_time": _count,
    "present_over_time": _present,
    "last_over_time": lambda s: _pick(s, s.points.last_v, s.last),
    "first_over_time": lambda s: _pick(s, s.points.first_v, s.first),
    "ts_of_last_over_time": lambda s: _pick(s, s.points.last_t, s.last, 1000.0),
    "ts_of_first_over_time": lambda s: _pick(s, s.points.first_t, s.first, 1000.0),
    "rate": _rate(True, True),
    "increase": _rate(True, False),
    "delta": _rate(False, False),
}


# The columns of TierPoints each function reads (`Spans` reads `end_ms` and `n` for all): a tiered read
# decodes only these (store/tierrows.py `decode_points`; tests/test_tiers.py checks each function
# with its columns alone). A function not here (None) is given every column.
_SPANS = ("end_ms", "n")
_RATE = (*_SPANS, "first_t", "first_v", "last_t", "last_v")
NEEDS: dict[str, tuple[str, ...]] = {
    "sum_over_time": (*_SPANS, "sum"),
    "avg_over_time": (*_SPANS, "sum"),
    "min_over_time": (*_SPANS, "min"),
    "max_over_time": (*_SPANS, "max"),
    "count_over_time": _SPANS,
    "present_over_time": _SPANS,
    "last_over_time": (*_SPANS, "last_v"),
    "first_over_time": (*_SPANS, "first_v"),
    "ts_of_last_over_time": (*_SPANS, "last_t"),
    "ts_of_first_over_time": (*_SPANS, "first_t"),
    "rate": (*_RATE, "correction"),
    "increase": (*_RATE, "correction"),
    "delta": _RATE,  # a gauge's: no reset corrections
}


def columns(name: str) -> tuple[str, ...] | None:
    """The tier point columns range function `name` reads (`window`); None (all of them) for a
    function not declared here."""
    return NEEDS.get(name)


def instant_columns(want_times: bool = False) -> tuple[str, ...]:
    """The columns `instant` reads: the newest row's end, last sample and staleness flag."""
    return (
        ("end_ms", "last_t", "stale_after") if want_times else ("end_ms", "last_t", "last_v", "stale_after")
    )


def window(name: str, points: TierPoints, ends: np.ndarray, range_ms: int) -> WindowResult | None:
    """Return range function `name` over one series' tier points at each step's window
    `(end - range_ms, end]`, as windows.py and rates.py would over its samples; None where `name`
    cannot be answered from tier points. The windows must be whole buckets (`usable`)."""
    fn = FUNCTIONS.get(name)
    return None if fn is None else fn(Spans(points, ends, range_ms))


def usable_instant(res_ms: int, ends: np.ndarray, lookback_ms: int) -> bool:
    """Whether tier points of resolution `res_ms` answer an instant selector with `lookback_ms` at
    `ends` (`instant`): the ends on the grid, and the lookback within one bucket or whole buckets."""
    if res_ms <= 0 or not (lookback_ms <= res_ms or lookback_ms % res_ms == 0):
        return False
    return bool((np.asarray(ends, np.int64) % res_ms == 0).all())


def instant(points: TierPoints, ends: np.ndarray, lookback_ms: int, want_times: bool = False) -> WindowResult:
    """Return what an instant selector takes at each end: the newest sample in `(end - lookback_ms, end]`
    (its time in seconds with `want_times`), none where a staleness marker is newer. Exact where
    `usable_instant`: the newest event at or before an end on the grid is the last of the newest row
    ending at or before it, and within the lookback only if its time is."""
    e = np.asarray(ends, np.int64)
    if not points.size:
        return np.zeros(e.size), np.zeros(e.size, bool)
    i = np.searchsorted(points.end_ms, e, side="right") - 1
    ok = i >= 0
    i = np.maximum(i, 0)
    ok &= (points.last_t[i] > e - lookback_ms) & ~points.stale_after[i]
    return (points.last_t[i] / 1000.0 if want_times else points.last_v[i]), ok
