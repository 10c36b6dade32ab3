"""Range-vector functions (*_over_time, changes, deriv, ...; rates are in rates.py), vectorised over steps.

Each function gets one series' samples and the per-step window bounds `lo:hi` (indices into the
samples, found with searchsorted) and returns (values, present) arrays over the steps.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gpuwatch.query.kahan import kahan_inc, kahan_result, mean_rows

# Gathered windows larger than this many cells are processed in chunks of steps.
_GATHER_CELLS = 4_000_000

WindowResult = tuple[np.ndarray, np.ndarray]


class Window:
    """One series' samples and its windows at every step."""

    lo: np.ndarray  # per step: index of the window's first sample
    hi: np.ndarray  # per step: one past its last sample
    count: np.ndarray

    def __init__(
        self,
        times: np.ndarray,
        values: np.ndarray,
        ends: np.ndarray,
        range_ms: int,
        like: Window | None = None,
    ) -> None:
        self.times = times
        self.values = values
        self.ends = ends
        self.range_ms = range_ms
        if (
            like is not None
            and like.range_ms == range_ms
            and same_times(like.ends, ends)
            and same_times(like.times, times)
        ):
            self.lo, self.hi, self.count = like.lo, like.hi, like.count  # the same windows: reuse them
            return
        step = _regular_step(times, ends, range_ms)
        if step:  # evenly spaced samples (every scrape on time): the bounds by arithmetic
            t0, n = int(times[0]), len(times)
            self.lo = np.clip((ends - (range_ms + t0)) // step + 1, 0, n)
            self.hi = np.clip((ends - t0) // step + 1, 0, n)
        else:
            self.lo = np.searchsorted(times, ends - range_ms, side="right")
            self.hi = np.searchsorted(times, ends, side="right")
        self.count = self.hi - self.lo

    def gather(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return windows as a padded (steps, width) array and its mask."""
        width = int((hi - lo).max()) if len(lo) else 0
        idx = lo[:, None] + np.arange(width)[None, :]
        mask = idx < hi[:, None]
        if len(self.values) == 0:
            return np.full(idx.shape, np.nan), mask
        g = self.values[np.minimum(idx, len(self.values) - 1)]
        return np.where(mask, g, np.nan), mask

    def reduce(self, fn: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """Apply `fn(windows, mask, steps)` to chunks of steps; return the concatenated result."""
        n = len(self.lo)
        out = np.full(n, np.nan)
        width = int(self.count.max()) if n else 0
        chunk = max(1, _GATHER_CELLS // max(width, 1))
        for start in range(0, n, chunk):
            sl = slice(start, min(n, start + chunk))
            g, m = self.gather(self.lo[sl], self.hi[sl])
            out[sl] = fn(g, m, np.arange(sl.start, sl.stop))
        return out


_SAFE = 2**61  # bounds of timestamps and ends for which the arithmetic below cannot overflow


def _regular_step(times: np.ndarray, ends: np.ndarray, range_ms: int) -> int:
    """The step of `times` if they are evenly spaced int64 (t0, t0 + step, ...), else 0: then
    `searchsorted(times, x, side="right")`, the number of samples at or before x, is
    `clip((x - t0) // step + 1, 0, n)` (floor division), ~4x cheaper for thousands of steps."""
    n = len(times)
    if n < 64 or times.dtype != np.int64 or ends.dtype != np.int64 or not len(ends):
        return 0
    t0, step = int(times[0]), int(times[1]) - int(times[0])
    if step <= 0 or int(times[-1]) - t0 != step * (n - 1):
        return 0
    if max(abs(t0), abs(int(times[-1])), abs(int(ends.min())), abs(int(ends.max())), range_ms) >= _SAFE:
        return 0
    return step if bool((np.diff(times) == step).all()) else 0


def same_times(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two series have the same timestamps (series scraped together mostly do). The store
    hands series of one cached block with equal timestamps one array (store/chunkcache.py), so
    mostly this is `a is b`: comparing 8 bytes a sample of every series in every query is what
    that saves (4-6 ms of a 7-day query over 64 GPUs, bench/bench_query.py's query 4)."""
    return a is b or bool(np.array_equal(a, b))


def pair_sums(flags: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Sum `flags[i]` (a property of the pair i-1, i) over the pairs inside each window."""
    cum = np.concatenate(([0.0], np.cumsum(flags)))
    # pairs (lo, lo+1) .. (hi-2, hi-1) -> flags[lo+1 .. hi-1]
    a = np.minimum(lo + 1, hi)
    return cum[hi] - cum[a]


def _kahan_windows(g: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    total = np.zeros(g.shape[0])
    comp = np.zeros(g.shape[0])
    for j in range(g.shape[1]):
        t, c = kahan_inc(g[:, j], total, comp)
        total = np.where(m[:, j], t, total)
        comp = np.where(m[:, j], c, comp)
    return total, comp


def _fast_sums(w: Window) -> np.ndarray | None:
    """Window sums by prefix sums, for wide windows of finite, moderate values (Kahan otherwise)."""
    v = w.values
    if len(v) == 0 or int(w.count.max()) <= 32 or not np.isfinite(v).all() or np.abs(v).max() >= 1e15:
        return None
    cum = np.concatenate(([0.0], np.cumsum(v)))
    return cum[w.hi] - cum[w.lo]


def sum_over_time(w: Window) -> WindowResult:
    fast = _fast_sums(w)
    if fast is not None:
        return fast, w.count > 0

    def fn(g: np.ndarray, m: np.ndarray, _s: np.ndarray) -> np.ndarray:
        return kahan_result(*_kahan_windows(g, m))

    return w.reduce(fn), w.count > 0


def avg_over_time(w: Window) -> WindowResult:
    fast = _fast_sums(w)
    if fast is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            return fast / w.count, w.count > 0

    def fn(g: np.ndarray, m: np.ndarray, _s: np.ndarray) -> np.ndarray:
        return mean_rows(g.T, m.T)

    return w.reduce(fn), w.count > 0


def _extreme(w: Window, is_max: bool) -> WindowResult:
    def fn(g: np.ndarray, _m: np.ndarray, _s: np.ndarray) -> np.ndarray:
        if g.shape[1] == 0:
            return np.full(g.shape[0], np.nan)
        return (np.fmax if is_max else np.fmin).reduce(g, axis=1)

    return w.reduce(fn), w.count > 0


def max_over_time(w: Window) -> WindowResult:
    return _extreme(w, True)


def min_over_time(w: Window) -> WindowResult:
    return _extreme(w, False)


def sorted_with_nan_first(g: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort each row's masked values as Go's sort with NaN-first Less does.

    Returns (sorted non-NaN values padded with +Inf, NaN counts, value counts).
    """
    nan = np.isnan(g) & m
    s = np.sort(np.where(m & ~nan, g, np.inf), axis=1)
    return s, nan.sum(axis=1), m.sum(axis=1)


def quantile_sorted(q: np.ndarray, s: np.ndarray, nans: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Prometheus's quantile() on rows sorted by `sorted_with_nan_first`."""
    rows = np.arange(s.shape[0])
    with np.errstate(invalid="ignore"):
        n = counts.astype(np.float64)
        rank = q * (n - 1)
        lower = np.maximum(0, np.floor(rank))
        upper = np.minimum(n - 1, lower + 1)
        weight = rank - np.floor(rank)

        def at(pos: np.ndarray) -> np.ndarray:
            p = np.nan_to_num(pos, nan=0.0).astype(np.int64)
            inner = np.clip(p - nans, 0, max(s.shape[1] - 1, 0))
            vals = s[rows, inner] if s.shape[1] else np.full(len(rows), np.nan)
            return np.where(p < nans, np.nan, vals)

        res = at(lower) * (1 - weight) + at(upper) * weight
    res = np.where(np.isnan(q), np.nan, res)
    res = np.where(q < 0, -np.inf, res)
    res = np.where(q > 1, np.inf, res)
    return np.where(counts == 0, np.nan, res)


def quantile_over_time(w: Window, q: np.ndarray) -> WindowResult:
    def fn(g: np.ndarray, m: np.ndarray, steps: np.ndarray) -> np.ndarray:
        s, nans, counts = sorted_with_nan_first(g, m)
        return quantile_sorted(q[steps], s, nans, counts)

    return w.reduce(fn), w.count > 0


def mad_over_time(w: Window) -> WindowResult:
    def fn(g: np.ndarray, m: np.ndarray, _s: np.ndarray) -> np.ndarray:
        half = np.full(g.shape[0], 0.5)
        s, nans, counts = sorted_with_nan_first(g, m)
        median = quantile_sorted(half, s, nans, counts)
        with np.errstate(invalid="ignore"):
            dev = np.abs(g - median[:, None])
        s2, nans2, counts2 = sorted_with_nan_first(dev, m)
        res = quantile_sorted(half, s2, nans2, counts2)
        return np.where(nans > 0, np.nan, res)

    return w.reduce(fn), w.count > 0


def _variance(w: Window) -> np.ndarray:
    def fn(g: np.ndarray, m: np.ndarray, _s: np.ndarray) -> np.ndarray:
        k = g.shape[0]
        count = np.zeros(k)
        mean = np.zeros(k)
        cmean = np.zeros(k)
        aux = np.zeros(k)
        caux = np.zeros(k)
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            for j in range(g.shape[1]):
                mj = m[:, j]
                x = g[:, j]
                cnt = count + 1
                delta = x - (mean + cmean)
                nm, nc = kahan_inc(delta / cnt, mean, cmean)
                na, nca = kahan_inc(delta * (x - (nm + nc)), aux, caux)
                count = np.where(mj, cnt, count)
                mean = np.where(mj, nm, mean)
                cmean = np.where(mj, nc, cmean)
                aux = np.where(mj, na, aux)
                caux = np.where(mj, nca, caux)
            return (aux + caux) / count

    return w.reduce(fn)


def stdvar_over_time(w: Window) -> WindowResult:
    return _variance(w), w.count > 0


def stddev_over_time(w: Window) -> WindowResult:
    with np.errstate(invalid="ignore"):
        return np.sqrt(_variance(w)), w.count > 0


def count_over_time(w: Window) -> WindowResult:
    return w.count.astype(np.float64), w.count > 0


def present_over_time(w: Window) -> WindowResult:
    return np.ones(len(w.lo)), w.count > 0


def last_over_time(w: Window) -> WindowResult:
    ok = w.count > 0
    if len(w.values) == 0:
        return np.zeros(len(w.lo)), ok
    return w.values[np.maximum(w.hi - 1, 0)], ok


def first_over_time(w: Window) -> WindowResult:
    ok = w.count > 0
    if len(w.values) == 0:
        return np.zeros(len(w.lo)), ok
    return w.values[np.minimum(w.lo, len(w.values) - 1)], ok


def ts_of_last_over_time(w: Window) -> WindowResult:
    ok = w.count > 0
    if len(w.times) == 0:
        return np.zeros(len(w.lo)), ok
    return w.times[np.maximum(w.hi - 1, 0)] / 1000.0, ok


def ts_of_first_over_time(w: Window) -> WindowResult:
    ok = w.count > 0
    if len(w.times) == 0:
        return np.zeros(len(w.lo)), ok
    return w.times[np.minimum(w.lo, len(w.times) - 1)] / 1000.0, ok


def _ts_of_extreme(w: Window, is_max: bool) -> WindowResult:
    def fn(g: np.ndarray, m: np.ndarray, steps: np.ndarray) -> np.ndarray:
        lo = w.lo[steps]
        best = g[:, 0].copy() if g.shape[1] else np.full(g.shape[0], np.nan)
        best_t = w.times[np.minimum(lo, len(w.times) - 1)].astype(np.float64)
        for j in range(1, g.shape[1]):
            x = g[:, j]
            with np.errstate(invalid="ignore"):
                better = (x >= best) if is_max else (x <= best)
            take = m[:, j] & (better | np.isnan(best))
            best = np.where(take, x, best)
            best_t = np.where(take, w.times[np.minimum(lo + j, len(w.times) - 1)], best_t)
        return best_t / 1000.0

    return w.reduce(fn), w.count > 0


def ts_of_max_over_time(w: Window) -> WindowResult:
    return _ts_of_extreme(w, True)


def ts_of_min_over_time(w: Window) -> WindowResult:
    return _ts_of_extreme(w, False)


def changes(w: Window) -> WindowResult:
    v = w.values
    if len(v) < 2:
        return np.zeros(len(w.lo)), w.count > 0
    prev = v[:-1]
    cur = v[1:]
    with np.errstate(invalid="ignore"):
        flags = (cur != prev) & ~(np.isnan(cur) & np.isnan(prev))
    return pair_sums(np.concatenate(([0.0], flags.astype(np.float64))), w.lo, w.hi), w.count > 0


def resets(w: Window) -> WindowResult:
    v = w.values
    if len(v) < 2:
        return np.zeros(len(w.lo)), w.count > 0
    with np.errstate(invalid="ignore"):
        flags = v[1:] < v[:-1]
    return pair_sums(np.concatenate(([0.0], flags.astype(np.float64))), w.lo, w.hi), w.count > 0


def _regression(w: Window, intercept_ms: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares slope and intercept per window, as Prometheus's linearRegression."""
    n = len(w.lo)
    slope = np.full(n, np.nan)
    intercept = np.full(n, np.nan)
    if len(w.values) == 0:
        return slope, intercept
    width = int(w.count.max()) if n else 0
    chunk = max(1, _GATHER_CELLS // max(width, 1))
    for start in range(0, n, chunk):
        sl = slice(start, min(n, start + chunk))
        lo = w.lo[sl]
        hi = w.hi[sl]
        g, m = w.gather(lo, hi)
        idx = np.minimum(lo[:, None] + np.arange(g.shape[1])[None, :], len(w.times) - 1)
        base = w.times[np.minimum(lo, len(w.times) - 1)] if intercept_ms is None else intercept_ms[sl]
        x = (w.times[idx] - base[:, None]) / 1e3
        k = g.shape[0]
        sx = np.zeros(k)
        cx = np.zeros(k)
        sy = np.zeros(k)
        cy = np.zeros(k)
        sxy = np.zeros(k)
        cxy = np.zeros(k)
        sx2 = np.zeros(k)
        cx2 = np.zeros(k)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            for j in range(g.shape[1]):
                mj = m[:, j]
                xj = x[:, j]
                yj = g[:, j]
                for acc in ((xj, "x"), (yj, "y"), (xj * yj, "xy"), (xj * xj, "x2")):
                    val, key = acc
                    if key == "x":
                        t, c = kahan_inc(val, sx, cx)
                        sx, cx = np.where(mj, t, sx), np.where(mj, c, cx)
                    elif key == "y":
                        t, c = kahan_inc(val, sy, cy)
                        sy, cy = np.where(mj, t, sy), np.where(mj, c, cy)
                    elif key == "xy":
                        t, c = kahan_inc(val, sxy, cxy)
                        sxy, cxy = np.where(mj, t, sxy), np.where(mj, c, cxy)
                    else:
                        t, c = kahan_inc(val, sx2, cx2)
                        sx2, cx2 = np.where(mj, t, sx2), np.where(mj, c, cx2)
            cnt = m.sum(axis=1).astype(np.float64)
            first = g[:, 0] if g.shape[1] else np.full(k, np.nan)
            const_y = np.where(m, g == first[:, None], True).all(axis=1)
            sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
            cov = sxy - sx * sy / cnt
            var = sx2 - sx * sx / cnt
            sl_v = cov / var
            ic_v = sy / cnt - sl_v * sx / cnt
            inf_y = np.isinf(first)
            sl_v = np.where(const_y, np.where(inf_y, np.nan, 0.0), sl_v)
            ic_v = np.where(const_y, np.where(inf_y, np.nan, first), ic_v)
        slope[sl] = sl_v
        intercept[sl] = ic_v
    return slope, intercept


def deriv(w: Window) -> WindowResult:
    slope, _ = _regression(w, None)
    return slope, w.count >= 2


def predict_linear(w: Window, duration: np.ndarray, eval_ms: np.ndarray) -> WindowResult:
    slope, intercept = _regression(w, eval_ms)
    with np.errstate(invalid="ignore", over="ignore"):
        return slope * duration + intercept, w.count >= 2


def double_exponential_smoothing(w: Window, sf: np.ndarray, tf: np.ndarray) -> WindowResult:
    """Holt's linear smoothing of each window (Prometheus's double_exponential_smoothing)."""
    n = len(w.lo)
    out = np.full(n, np.nan)
    ok = w.count >= 2
    v = w.values
    for j in np.flatnonzero(ok).tolist():
        s_f, t_f = float(sf[j]), float(tf[j])
        vals = v[w.lo[j] : w.hi[j]]
        s0, s1 = 0.0, float(vals[0])
        b = float(vals[1] - vals[0])
        for i in range(1, len(vals)):
            x = s_f * float(vals[i])
            b = t_f * (s1 - s0) + (1 - t_f) * b if i > 1 else b
            s0, s1 = s1, x + (1 - s_f) * (s1 + b)
        out[j] = s1
    return out, ok
