"""histogram_quantile over classic `_bucket` series, with Prometheus's bucket fixes."""

from __future__ import annotations

import math

import numpy as np

from gpuwatch.query.frames import NAME, LabelSet, VectorFrame, label_value, merge_same_labels

_SMALL_DELTA = 1e-12
_MIN_NORMAL = 2.2250738585072014e-308


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


def _monotonic(counts: np.ndarray) -> np.ndarray:
    """Prometheus's ensureMonotonicAndIgnoreSmallDeltas over buckets (rows) at every step."""
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
    steps = counts.shape[1]
    if not math.isinf(bounds[-1]) or bounds[-1] < 0:
        return np.full(steps, np.nan)
    # Coalesce buckets with the same upper bound.
    uniq, inverse = np.unique(bounds, return_inverse=True)
    if len(uniq) != len(bounds):
        merged = np.zeros((len(uniq), steps))
        np.add.at(merged, inverse, counts)
        bounds, counts = uniq, merged
    needs_fix = _needs_fix(counts)
    if needs_fix.any():  # steps are independent: fix up only those that need it
        cols = np.flatnonzero(needs_fix)
        counts = counts.copy()
        counts[:, cols] = _monotonic(counts[:, cols])
    out = np.full(steps, np.nan)
    if len(bounds) < 2:
        return out
    total = counts[-1]
    with np.errstate(all="ignore"):
        rank = q * total
        # first bucket index b in [0, len-1) with count >= rank, else len-1
        ge = counts[:-1] >= rank[None, :]
        b = np.where(ge.any(axis=0), ge.argmax(axis=0), len(bounds) - 1)
        cols = np.arange(steps)
        last = len(bounds) - 1
        bucket_end = bounds[np.minimum(b, last)]
        bucket_start = np.where(b > 0, bounds[np.maximum(b - 1, 0)], 0.0)
        count_b = counts[np.minimum(b, last), cols]
        below = np.where(b > 0, counts[np.maximum(b - 1, 0), cols], 0.0)
        interp = bucket_start + (bucket_end - bucket_start) * ((rank - below) / (count_b - below))
        res = np.where(b == last, bounds[last - 1], interp)
        res = np.where((b == 0) & (bounds[0] <= 0), bounds[0], res)
        res = np.where(total == 0, np.nan, res)
    res = np.where(np.isnan(q), np.nan, res)
    res = np.where(q < 0, -np.inf, res)
    res = np.where(q > 1, np.inf, res)
    return res


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
        elif full.any():
            cols = np.flatnonzero(full)
            res[cols] = bucket_quantile(q[cols], bounds, counts[:, cols])
        for col in np.flatnonzero(any_present & ~full).tolist():
            sel = pres[:, col]
            res[col] = bucket_quantile(q[col : col + 1], bounds[sel], counts[sel, col : col + 1])[0]
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
