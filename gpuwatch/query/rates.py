"""rate, increase, delta, irate and idelta: Prometheus's extrapolated rate over range windows.

`extrapolated_rate_rows` is the one implementation: several series that share timestamps (scraped
together) as the rows of one (series, samples) array; `extrapolated_rate` is it for one series.
"""

from __future__ import annotations

import numpy as np

from gpuwatch.query.windows import Window, WindowResult


def extrapolated_rate(w: Window, is_counter: bool, is_rate: bool) -> WindowResult:
    """Prometheus's rate/increase/delta of one series, with extrapolation to the window edges."""
    values, ok = extrapolated_rate_rows(w, w.values[None, :], is_counter, is_rate)
    return values[0], ok


def _columns(rows: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """`rows[:, idx]` for ascending `idx`, to be read only: where `idx` steps evenly (windows over
    regular samples at a fixed step), a strided view or slice copy instead of a gather (4-5x
    cheaper); a range's first windows, cut at the data's start, may come before the even part."""
    n = idx.size
    if n < 64:
        return rows[:, idx]
    d = np.diff(idx)
    s = int(d[-1])
    odd = np.flatnonzero(d != s)
    p = int(odd[-1]) + 1 if odd.size else 0  # idx[p:] is idx[p], idx[p] + s, ...
    if s <= 0 or n - p < n // 2:
        return rows[:, idx]
    a = int(idx[p])
    if p == 0:
        return rows[:, a : a + s * n : s]
    out = np.empty((rows.shape[0], n), rows.dtype)
    out[:, :p] = rows[:, idx[:p]]
    out[:, p:] = rows[:, a : a + s * (n - p) : s]
    return out


def extrapolated_rate_rows(w: Window, rows: np.ndarray, is_counter: bool, is_rate: bool) -> WindowResult:
    """`extrapolated_rate` of several series at once that share `w`'s timestamps: `rows` is their
    (k, samples) values. Returns (k, steps) values and a (steps,) mask.

    What depends only on the timestamps (window edges, the extrapolation factor) is computed once
    per step; per series and step only the differences, the counter corrections and, where a
    counter would reach zero inside the extrapolated span, its own factor."""
    ok = w.count >= 2
    k, n = rows.shape[0], len(w.lo)
    if not ok.any() or rows.shape[1] == 0:
        return np.zeros((k, n)), ok
    # A series holding one finite value throughout (a counter that never moved: ECC errors, XIDs)
    # comes to exactly 0.0 at every step (x - x is +0.0, times a finite positive factor).
    const = (rows == rows[:, :1]).all(axis=1) & np.isfinite(rows[:, 0])
    if const.any():
        out = np.zeros((k, n))
        moving = np.flatnonzero(~const)
        if moving.size:
            out[moving] = extrapolated_rate_rows(w, rows[moving], is_counter, is_rate)[0]
        return out, ok
    first = np.minimum(w.lo, rows.shape[1] - 1)
    last = np.maximum(w.hi - 1, 0)
    ft = w.times[first].astype(np.float64)
    lt = w.times[last].astype(np.float64)
    fv = _columns(rows, first)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        result = _columns(rows, last) - fv
        if is_counter and (rows[:, 1:] < rows[:, :-1]).any():  # counter resets: add what was lost
            result += _counter_corrections(w, rows)
        elif is_counter:
            result += 0.0  # as adding no corrections (-0.0 + 0.0 is 0.0)
        return extrapolate(result, fv, ft, lt, w.count, w.ends, w.range_ms, is_counter, is_rate), ok


def extrapolate(
    result: np.ndarray,
    fv: np.ndarray,
    ft: np.ndarray,
    lt: np.ndarray,
    count: np.ndarray,
    ends: np.ndarray,
    range_ms: int,
    is_counter: bool,
    is_rate: bool,
) -> np.ndarray:
    """Extrapolate each window's difference `result` ((k, steps): its last value less its first,
    `fv`, with counter resets added) from its first and last sample times `ft` and `lt` (float ms)
    to the window's edges, as Prometheus does; `count` is the window's samples. Only these figures
    enter, so a window summed up from tier points comes to the same answer as its raw samples."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        n = len(ends)
        to_start = (ft - (ends - range_ms).astype(np.float64)) / 1000
        to_end = (ends.astype(np.float64) - lt) / 1000
        sampled = (lt - ft) / 1000
        avg = sampled / np.maximum(count - 1, 1)
        threshold = avg * 1.1
        to_start = np.where(to_start >= threshold, avg / 2, to_start)
        to_end = np.where(to_end >= threshold, avg / 2, to_end)
        out = result * _factor(sampled, to_start, to_end, range_ms, is_rate)
        if is_counter:
            # A counter is not extrapolated below zero: where its zero point is nearer than the
            # window's start, the extrapolation stops there.
            to_zero = sampled * (fv / result)
            near = to_zero < to_start
            near &= result > 0
            near &= fv >= 0
            r, c = np.divmod(np.flatnonzero(near), n)  # (cheaper than np.nonzero)
            if r.size:
                out[r, c] = result[r, c] * _factor(sampled[c], to_zero[r, c], to_end[c], range_ms, is_rate)
        return out


def _factor(
    sampled: np.ndarray, to_start: np.ndarray, to_end: np.ndarray, range_ms: int, is_rate: bool
) -> np.ndarray:
    """How much the difference over `sampled` seconds grows when extrapolated to the window."""
    factor = np.where(sampled != 0, (sampled + to_start + to_end) / sampled, 1.0)
    return factor / (range_ms / 1000) if is_rate else factor


def _counter_corrections(w: Window, rows: np.ndarray) -> np.ndarray:
    """Per series and step, the sum of the values before each counter reset inside the window."""
    k, m = rows.shape
    drop = np.zeros((k, m))
    if m >= 2:
        prev = rows[:, :-1]
        with np.errstate(invalid="ignore"):
            np.copyto(drop[:, 1:], prev, where=rows[:, 1:] < prev)
    # Prefix sums: the drops after each window's first sample, up to its last. A series with an
    # infinite, NaN or huge drop (which prefix sums would lose or round away) sums each window.
    with np.errstate(invalid="ignore"):
        odd = np.asarray(~(np.abs(drop) < 1e15).all(axis=1))
    cum = np.zeros((k, m + 1))
    np.cumsum(np.where(odd[:, None], 0.0, drop) if odd.any() else drop, axis=1, out=cum[:, 1:])
    out = cum[:, w.hi] - cum[:, np.minimum(w.lo + 1, w.hi)]
    for r in np.flatnonzero(odd).tolist():
        out[r] = _window_drops(w, drop[r])
    return out


def _window_drops(w: Window, drop: np.ndarray) -> np.ndarray:
    """Sum `drop` over the samples after each window's first, one window at a time."""

    def direct(g: np.ndarray, m: np.ndarray, steps: np.ndarray) -> np.ndarray:
        lo = w.lo[steps]
        gl = drop[np.minimum(lo[:, None] + np.arange(g.shape[1])[None, :], len(drop) - 1)]
        mm = m.copy()
        mm[:, 0] = False  # the first sample of a window starts no pair inside it
        with np.errstate(invalid="ignore"):
            return np.where(mm, gl, 0.0).sum(axis=1)

    return w.reduce(direct)


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
        res = np.where(lv < pv, lv, lv - pv) / (dt / 1000) if is_rate else lv - pv
    return res, ok
