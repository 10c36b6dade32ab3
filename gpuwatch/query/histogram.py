"""histogram_quantile over classic `_bucket` series, with Prometheus's bucket fixes."""

from __future__ import annotations

import math

import numpy as np

from gpuwatch.query.frames import NAME, LabelSet, VectorFrame, label_value, merge_same_labels

_SMALL_DELTA = 1e-12
_MIN_NORMAL = 2.2250738585072014e-308
_MAX_FLOAT = float(np.finfo(np.float64).max)
_FEW_COLUMNS = 16  # up to this many steps to fix, `_monotonic` goes in Python floats


def _almost_equal(a: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    with np.errstate(all="ignore"):
        diff = np.abs(a - b)
        tiny = (a == 0) | (b == 0) | (np.abs(a) + np.abs(b) < _MIN_NORMAL)
        rel = diff / np.minimum(np.abs(a) + np.abs(b), np.finfo(np.float64).max)
        return (a == b) | np.where(tiny, diff < eps * _MIN_NORMAL, rel < eps)


def _parse_le(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:
        return None


def _almost_equal_one(a: float, b: float, eps: float) -> bool:
    """`_almost_equal` of two Python floats (the same IEEE operations, so the same answer)."""
    if a == b:
        return True
    diff = abs(a - b)
    both = abs(a) + abs(b)
    if a == 0 or b == 0 or both < _MIN_NORMAL:
        return diff < eps * _MIN_NORMAL
    return diff / min(both, _MAX_FLOAT) < eps


def _monotonic(counts: np.ndarray) -> np.ndarray:
    """Prometheus's ensureMonotonicAndIgnoreSmallDeltas over buckets (rows) at every step."""
    if counts.shape[1] <= _FEW_COLUMNS:
        return _monotonic_few(counts)
    counts = counts.copy()
    prev = counts[0].copy()
    for i in range(1, len(counts)):
        cur = counts[i]
        same = cur == prev
        close = ~same & _almost_equal(prev, cur, _SMALL_DELTA)
        lower = ~same & ~close & (cur < prev)
        fix = close | lower
        counts[i] = np.where(fix, prev, cur)
        prev = np.where(fix | same, prev, cur)
    return counts


def _monotonic_few(counts: np.ndarray) -> np.ndarray:
    """`_monotonic` column by column in Python floats, as Prometheus's loop: for a few steps (a
    counter reset here and there) far cheaper than a dozen numpy calls per bucket."""
    out = counts.copy()
    for col in range(counts.shape[1]):
        column = counts[:, col].tolist()
        prev = column[0]
        for i in range(1, len(column)):
            cur = column[i]
            if cur == prev:
                continue
            if _almost_equal_one(prev, cur, _SMALL_DELTA) or cur < prev:
                out[i, col] = prev
            else:
                prev = cur
    return out


def _needs_fix(counts: np.ndarray) -> np.ndarray:
    """Steps (columns) where some bucket is below, or almost equal to but not equal to, the one before
    it: only there can the fix-up loop change anything.

    A bucket clearly above the one before (the usual case) is neither: with `earlier >= 0`,
    `later > earlier * (1 + 1e-11)` and `later > 1e-290`, the relative difference is over 4e-12 (and
    not tiny), so `_almost_equal` is false there. Only the other cells get the full test."""
    with np.errstate(invalid="ignore", over="ignore"):
        later, earlier = counts[1:], counts[:-1]
        open_ = earlier * (1.0 + 1e-11)
        unsure = ~(later > open_)
        unsure |= earlier < 0
        unsure |= later <= 1e-290
        unsure &= later != earlier
        cols = np.flatnonzero(unsure.any(axis=0))
        out = np.zeros(counts.shape[1], bool)
        if cols.size:
            lt, ea = later[:, cols], earlier[:, cols]
            out[cols] = (unsure[:, cols] & ((lt < ea) | _almost_equal(ea, lt, _SMALL_DELTA))).any(axis=0)
    return out


def bucket_quantile(q: np.ndarray, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Quantile at each step (column) of buckets sorted by upper bound; counts is (buckets, steps)."""
    res = np.full(counts.shape[1], np.nan)
    if math.isinf(bounds[-1]) and bounds[-1] > 0:
        res = _quantile(q, bounds, counts)
    # A q outside [0, 1] gives -Inf or +Inf (NaN: NaN) whatever the buckets, as in Prometheus.
    res = np.where(np.isnan(q), np.nan, res)
    res = np.where(q < 0, -np.inf, res)
    return np.where(q > 1, np.inf, res)


def _quantile(q: np.ndarray, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`bucket_quantile` of buckets whose last bound is +Inf."""
    steps = counts.shape[1]
    # Coalesce buckets with the same upper bound (strictly rising bounds, the usual case, have none).
    if len(bounds) > 1 and not bool((bounds[1:] > bounds[:-1]).all()):
        uniq, inverse = np.unique(bounds, return_inverse=True)
        if len(uniq) != len(bounds):
            merged = np.zeros((len(uniq), steps))
            with np.errstate(all="ignore"):  # Inf + -Inf is NaN, as in Prometheus
                np.add.at(merged, inverse, counts)
            bounds, counts = uniq, merged
    if len(bounds) < 2:
        return np.full(steps, np.nan)
    needs_fix = _needs_fix(counts)
    if needs_fix.any():  # steps are independent: fix up only those that need it
        cols = np.flatnonzero(needs_fix)
        counts = counts.copy()
        counts[:, cols] = _monotonic(counts[:, cols])
    total = counts[-1]
    with np.errstate(all="ignore"):
        rank = q * total
        # first bucket index b in [0, len-1) with count >= rank, else len-1
        ge = counts[:-1] >= rank[None, :]
        b = np.where(ge.any(axis=0), ge.argmax(axis=0), len(bounds) - 1)
        cols = np.arange(steps)
        last = len(bounds) - 1
        bucket_end = bounds[b]
        bucket_start = np.where(b > 0, bounds[np.maximum(b - 1, 0)], 0.0)
        count_b = counts[b, cols]
        below = np.where(b > 0, counts[np.maximum(b - 1, 0), cols], 0.0)
        interp = bucket_start + (bucket_end - bucket_start) * ((rank - below) / (count_b - below))
        res = np.where(b == last, bounds[last - 1], interp)
        res = np.where((b == 0) & (bounds[0] <= 0), bounds[0], res)
        return np.where(total == 0, np.nan, res)


def histogram_quantile(q: np.ndarray, frame: VectorFrame) -> VectorFrame:
    """Evaluate histogram_quantile(q, buckets) at every step."""
    n = frame.steps
    groups: dict[LabelSet, list[tuple[float, int]]] = {}
    for i, ls in enumerate(frame.labels):
        le = _parse_le(label_value(ls, "le"))
        if le is None:
            continue
        key = tuple(p for p in ls if p[0] != "le")
        groups.setdefault(key, []).append((le, i))
    labels: list[LabelSet] = []
    values: list[np.ndarray] = []
    present: list[np.ndarray] = []
    # At one step (rules, instant queries), histograms with the same bucket bounds and every bucket
    # present are computed together, one column each: bucket_quantile treats columns apart.
    together: dict[tuple[float, ...], list[tuple[int, list[int]]]] = {}
    for key, members in groups.items():
        members.sort(key=lambda m: m[0])
        bounds = np.array([m[0] for m in members])
        rows = [m[1] for m in members]
        counts = frame.values[rows]
        pres = frame.present[rows]
        any_present = np.asarray(pres.any(axis=0))
        full = pres.all(axis=0)
        res = np.full(n, np.nan)
        if n == 1 and bool(full.all()):
            together.setdefault(tuple(bounds.tolist()), []).append((len(values), rows))
        elif full.all():  # every bucket present at every step (the usual case): no column copies
            res = bucket_quantile(q, bounds, counts)
        for col in np.flatnonzero(any_present & ~full).tolist():
            sel = pres[:, col]
            res[col] = bucket_quantile(q[col : col + 1], bounds[sel], counts[sel, col : col + 1])[0]
        if n > 1 and 2 * np.count_nonzero(full) >= n and not full.all():
            # Most steps have every bucket (a rate's first steps lack them): all steps at once,
            # without copying columns out (`counts` is a copy; steps are independent).
            counts[:, ~full] = 0.0
            res[full] = bucket_quantile(q, bounds, counts)[full]
        elif n > 1 and full.any() and not full.all():
            cols = np.flatnonzero(full)
            res[cols] = bucket_quantile(q[cols], bounds, counts[:, cols])
        labels.append(tuple(p for p in key if p[0] != NAME))
        values.append(res)
        present.append(any_present)
    for bounds_key, hists in together.items():
        counts = frame.values[np.array([rows for _, rows in hists]).T, 0]  # (buckets, histograms)
        got = bucket_quantile(np.repeat(q, len(hists)), np.array(bounds_key), counts)
        for (at, _), value in zip(hists, got.tolist(), strict=True):
            values[at] = np.array([value])
    if not labels:
        return VectorFrame.empty(n)
    return merge_same_labels(VectorFrame(labels, np.array(values), np.array(present)))
