"""rate, increase, delta, irate and idelta: Prometheus's extrapolated rate over range windows.

`extrapolated_rate` works on one series' `Window`; `extrapolated_rate_rows` on many series that share
timestamps at once; `extrapolated_rate_at` on many series at a single step (rules, instant queries).
All give the same bits as the one-series path (tests/test_promql_fastpaths.py).
"""

from __future__ import annotations

import numpy as np

from gpuwatch.query.windows import Window, WindowResult, pair_sums


def _take_cols(rows: np.ndarray, idx: np.ndarray, view: bool = False) -> np.ndarray:
    """`rows[:, idx]` for ascending `idx`; where `idx` steps evenly (windows over regular samples at a
    fixed step), the columns are copied as a strided slice instead of gathered one by one, and with
    `view` (for a read-only use) not copied at all when all of `idx` steps evenly."""
    n = idx.size
    if n < 64:
        return rows[:, idx]
    d = np.diff(idx)
    s = int(d[-1])
    if s <= 0:
        return rows[:, idx]
    odd = np.flatnonzero(d != s)
    p = int(odd[-1]) + 1 if odd.size else 0  # idx[p:] is idx[p], idx[p] + s, ...
    if n - p < n // 2:
        return rows[:, idx]
    if view and p == 0:
        return rows[:, int(idx[0]) : int(idx[0]) + s * n : s]
    out = np.empty((rows.shape[0], n), rows.dtype)
    if p:
        out[:, :p] = rows[:, idx[:p]]
    a = int(idx[p])
    out[:, p:] = rows[:, a : a + s * (n - p) : s]
    return out


def extrapolated_rate_rows(
    w: Window, rows: np.ndarray, is_counter: bool, is_rate: bool
) -> WindowResult | None:
    """`extrapolated_rate` of several series at once that share `w`'s timestamps: `rows` is their
    (k, samples) values. Returns (k, steps) values and a (steps,) mask, or None where a row needs the
    careful path (non-finite or huge counter drops); elementwise the same arithmetic as one series.

    Everything that depends only on the timestamps (window edges, the extrapolation factor without
    a counter's zero point) is computed once per step; per (series, step) only the differences, the
    corrections and, where a counter would reach zero inside the extrapolated span, its own factor."""
    ok = w.count >= 2
    n = len(w.lo)
    k = rows.shape[0]
    if not ok.any() or rows.shape[1] == 0:
        return np.zeros((k, n)), ok
    if k > 1:
        # A row holding one finite value throughout (a counter that never moved: ECC errors, XIDs)
        # comes to exactly 0.0 at every step (x - x is +0.0, times a finite positive factor): only
        # the other rows need the arithmetic.
        const = (rows == rows[:, :1]).all(axis=1) & np.isfinite(rows[:, 0])
        if const.all():
            return np.zeros((k, n)), ok
        if const.any():
            moving = np.flatnonzero(~const)
            got = extrapolated_rate_rows(w, rows[moving], is_counter, is_rate)
            if got is None:
                return None
            out = np.zeros((k, n))
            out[moving] = got[0]
            return out, ok
    first = np.minimum(w.lo, rows.shape[1] - 1)
    last = np.maximum(w.hi - 1, 0)
    ft = w.times[first].astype(np.float64)
    lt = w.times[last].astype(np.float64)
    fv = _take_cols(rows, first)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        result = np.subtract(_take_cols(rows, last, view=True), fv)
        if is_counter and rows.shape[1] >= 2 and not (rows[:, 1:] < rows[:, :-1]).any():
            np.add(
                result, 0.0, out=result
            )  # no counter resets: the corrections are all zero (-0.0 + 0.0 is 0.0)
        elif is_counter and rows.shape[1] >= 2:
            prev = rows[:, :-1]
            drop = np.zeros(rows.shape)
            np.copyto(drop[:, 1:], prev, where=rows[:, 1:] < prev)
            if not (np.isfinite(drop).all() and np.abs(drop).max(initial=0.0) < 1e15):
                return None
            cum = np.zeros((k, rows.shape[1] + 1))
            np.cumsum(drop, axis=1, out=cum[:, 1:])
            np.add(result, cum[:, w.hi] - cum[:, np.minimum(w.lo + 1, w.hi)], out=result)
        # A cell whose window saw no change (result +-0.0) comes to that same zero: times a positive
        # finite factor, and never at a counter's zero point (fv / 0 is not finite). Where few steps
        # saw a change at all (a counter that moves now and then: errors, ECC errors, XIDs), the rest
        # is worked out at those steps only.
        if np.count_nonzero(result) * 4 < result.size:
            steps = np.flatnonzero((result != 0).any(axis=0))
            if steps.size * 2 < n:
                out = result  # the zeros stay as they are
                out[:, steps] = _extrapolate_rows(
                    result[:, steps],
                    fv[:, steps],
                    ft[steps],
                    lt[steps],
                    w.ends[steps],
                    w.count[steps],
                    w.range_ms,
                    is_counter,
                    is_rate,
                )
                return out, ok
        return _extrapolate_rows(result, fv, ft, lt, w.ends, w.count, w.range_ms, is_counter, is_rate), ok


def _extrapolate_rows(
    result: np.ndarray,
    fv: np.ndarray,
    ft: np.ndarray,
    lt: np.ndarray,
    ends: np.ndarray,
    count: np.ndarray,
    range_ms: int,
    is_counter: bool,
    is_rate: bool,
) -> np.ndarray:
    """`result` (k, steps) extrapolated to its windows' edges: the part of `extrapolated_rate_rows`
    after the differences (`fv`: each window's first value; `ft`, `lt`: its first and last sample's
    time; `ends`, `count`: each step's end and number of samples). Reuses `fv` for the answer."""
    n = len(ends)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        range_start = (ends - range_ms).astype(np.float64)
        range_end = ends.astype(np.float64)
        to_start = (ft - range_start) / 1000
        to_end = (range_end - lt) / 1000
        sampled = (lt - ft) / 1000
        avg = sampled / np.maximum(count - 1, 1)
        threshold = avg * 1.1
        to_start = np.where(to_start >= threshold, avg / 2, to_start)
        to_end = np.where(to_end >= threshold, avg / 2, to_end)
        factor = _factor(sampled, to_start, to_end, range_ms, is_rate)
        if not is_counter:
            return np.multiply(result, factor, out=result)
        # A counter's zero point replaces `to_start` where it is nearer: (result > 0) & (fv >= 0) &
        # (sampled * (fv / result) < to_start), elementwise as `_extrapolate` decides it.
        to_zero = np.divide(fv, result)
        np.multiply(to_zero, sampled, out=to_zero)
        near = to_zero < to_start
        near &= result > 0
        near &= fv >= 0
        out = np.multiply(result, factor, out=fv)
        at = np.flatnonzero(near)  # cheaper than the (rows, cols) of np.nonzero
        if at.size:
            r, c = np.divmod(at, n)
            out[r, c] = result[r, c] * _factor(sampled[c], to_zero[r, c], to_end[c], range_ms, is_rate)
        return out


def _factor(
    sampled: np.ndarray, to_start: np.ndarray, to_end: np.ndarray, range_ms: int, is_rate: bool
) -> np.ndarray:
    factor = np.where(sampled != 0, (sampled + to_start + to_end) / sampled, 1.0)
    if is_rate:
        factor = factor / (range_ms / 1000)
    return factor


def _counter_corrections(w: Window) -> np.ndarray:
    v = w.values
    if len(v) < 2:
        return np.zeros(len(w.lo))
    prev = v[:-1]
    with np.errstate(invalid="ignore"):
        drop = np.concatenate(([0.0], np.where(v[1:] < prev, prev, 0.0)))
    if np.isfinite(drop).all() and np.abs(drop).max(initial=0.0) < 1e15:
        return pair_sums(drop, w.lo, w.hi)

    def direct(g: np.ndarray, m: np.ndarray, steps: np.ndarray) -> np.ndarray:
        lo = w.lo[steps]
        gl = drop[np.minimum(lo[:, None] + np.arange(g.shape[1])[None, :], len(drop) - 1)]
        mm = m.copy()
        mm[:, 0] = False  # the first sample of a window starts no pair inside it
        with np.errstate(invalid="ignore"):
            return np.where(mm, gl, 0.0).sum(axis=1)

    return w.reduce(direct)


def extrapolated_rate(w: Window, is_counter: bool, is_rate: bool) -> WindowResult:
    """Prometheus's rate/increase/delta with extrapolation to the window edges."""
    ok = w.count >= 2
    n = len(w.lo)
    if not ok.any() or len(w.values) == 0:
        return np.zeros(n), ok
    first = np.minimum(w.lo, len(w.values) - 1)
    last = np.maximum(w.hi - 1, 0)
    corrections = _counter_corrections(w) if is_counter else None
    return _extrapolate(w.times[first], w.times[last], w.values[first], w.values[last], w.count,
                        corrections, w.ends, w.range_ms, is_counter, is_rate), ok  # fmt: skip


def extrapolated_rate_at(
    series: list[tuple[np.ndarray, np.ndarray]], end_ms: int, range_ms: int, is_counter: bool, is_rate: bool
) -> WindowResult | None:
    """Return rate/increase/delta of many series at one time `end_ms`, one element per series.

    The same arithmetic as `extrapolated_rate`, but over all series at once (an instant query or a
    rule over hundreds of histogram buckets would otherwise pay numpy's per-call cost per series).
    Returns None for timestamps outside 0..2^42 ms; the caller then goes series by series.
    """
    k = len(series)
    sizes = np.fromiter((len(t) for t, _ in series), dtype=np.int64, count=k)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    times = np.concatenate([t for t, _ in series]) if k else np.zeros(0, dtype=np.int64)
    values = np.concatenate([v for _, v in series]) if k else np.zeros(0)
    # Each series' times are ascending: search them all at once in (series index, time) order.
    seg = np.repeat(np.arange(k, dtype=np.int64), sizes)
    shift = np.int64(1 << 42)  # ms timestamps stay below 2^42 until the year 2109
    if len(times) and (times.min() < 0 or times.max() >= shift or end_ms >= shift or end_ms - range_ms < 0):
        return None
    key = seg * shift + times
    base = np.arange(k, dtype=np.int64) * shift
    lo = np.searchsorted(key, base + (end_ms - range_ms), side="right")
    hi = np.searchsorted(key, base + end_ms, side="right")
    count = hi - lo
    ok = count >= 2
    if not ok.any():
        return np.zeros(k), ok
    n = len(values)
    first = np.minimum(lo, max(n - 1, 0))
    last = np.maximum(hi - 1, 0)
    corrections = None
    if is_counter:
        with np.errstate(invalid="ignore"):
            drop = np.concatenate(([0.0], np.where(values[1:] < values[:-1], values[:-1], 0.0)))
        drop[starts[sizes > 0]] = 0.0  # the first sample of a series follows no sample of its own
        corrections = np.zeros(k)
        # Resets are rare: only series that have one get the corrections, one by one, exactly as
        # `extrapolated_rate` computes them (prefix sums across series would round differently).
        for i in np.intersect1d(seg[drop != 0], np.flatnonzero(ok)):
            a, b = starts[i], starts[i] + sizes[i]
            w = Window(times[a:b], values[a:b], np.array([end_ms], dtype=np.int64), range_ms)
            corrections[i] = _counter_corrections(w)[0]
    ends = np.full(k, end_ms, dtype=np.int64)
    return _extrapolate(times[first], times[last], values[first], values[last], count, corrections, ends,
                        range_ms, is_counter, is_rate), ok  # fmt: skip


def _extrapolate(
    ft_ms: np.ndarray,
    lt_ms: np.ndarray,
    fv: np.ndarray,
    lv: np.ndarray,
    count: np.ndarray,
    corrections: np.ndarray | None,
    ends: np.ndarray,
    range_ms: int,
    is_counter: bool,
    is_rate: bool,
) -> np.ndarray:
    ft = ft_ms.astype(np.float64)
    lt = lt_ms.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        result = lv - fv
        if corrections is not None:
            result = result + corrections
        range_start = (ends - range_ms).astype(np.float64)
        range_end = ends.astype(np.float64)
        to_start = (ft - range_start) / 1000
        to_end = (range_end - lt) / 1000
        sampled = (lt - ft) / 1000
        avg = sampled / np.maximum(count - 1, 1)
        threshold = avg * 1.1
        to_start = np.where(to_start >= threshold, avg / 2, to_start)
        if is_counter:
            to_zero = np.where((result > 0) & (fv >= 0), sampled * (fv / result), to_start)
            to_start = np.where(to_zero < to_start, to_zero, to_start)
        to_end = np.where(to_end >= threshold, avg / 2, to_end)
        factor = np.where(sampled != 0, (sampled + to_start + to_end) / sampled, 1.0)
        if is_rate:
            factor = factor / (range_ms / 1000)
        return np.asarray(result * factor)


def instant_value(w: Window, is_rate: bool) -> WindowResult:
    """Prometheus's irate/idelta from the last two samples of each window."""
    ok = w.count >= 2
    n = len(w.lo)
    if not ok.any():
        return np.zeros(n), ok
    last = np.maximum(w.hi - 1, 0)
    prev = np.maximum(w.hi - 2, 0)
    dt = (w.times[last] - w.times[prev]).astype(np.float64)
    ok = ok & (dt != 0)
    lv = w.values[last]
    pv = w.values[prev]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if is_rate:
            res = np.where(lv < pv, lv, lv - pv) / (dt / 1000)
        else:
            res = lv - pv
    return res, ok
