"""histogram_quantile over classic `_bucket` series, with Prometheus's bucket fixes."""

from __future__ import annotations

import functools
import math

import numpy as np

from gpuwatch.query.frames import NAME, LabelSet, VectorFrame, label_value, merge_same_labels

_SMALL_DELTA = 1e-12
_MIN_NORMAL = 2.2250738585072014e-308
_MAX_FLOAT = float(np.finfo(np.float64).max)
_FEW_COLUMNS = 16  # up to this many steps to fix, `_monotonic` goes in Python floats
# Two non-negative floats whose bits (as int64) are this far apart differ by over 7e-12 of the
# smaller (each step of the bits adds at least 2**-53 of it) and by over 3e-319: neither below nor
# almost equal (1e-12) to each other. See `_unsure_cols`.
_CLEAR_BITS = 1 << 16
_INF_BITS = 0x7FF0000000000000


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
    """`_monotonic` column by column in Python floats: for a few steps (a counter reset here and
    there) far cheaper than a dozen numpy calls per bucket, with the same comparisons."""
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


def _unsure_cols(counts: np.ndarray) -> np.ndarray | None:
    """Steps (columns) where some bucket is not equal to, nor clearly above, the one before it, by
    the bits of the floats; None when a count has its sign bit set (the test needs none).

    With every sign bit clear, the int64 view of the floats orders them as their values (NaN above
    +Inf). Two neighbouring buckets with the same bits are equal (or the same NaN), and ones whose
    bits rise by `_CLEAR_BITS` or more are neither lower nor almost equal (nor NaN below non-NaN): at
    neither can the fix-up change anything. Only the other columns need `_needs_fix_at`."""
    bits = counts.view(np.int64)
    if bits.min() < 0:
        return None
    rise = bits[1:] - bits[:-1]  # no overflow: both in [0, 2**63)
    unsure = rise.min(axis=0) < 0  # a bucket below the one before
    rise -= 1  # equal bits become -1, the largest uint64: only rises of 1 to _CLEAR_BITS - 1 stay small
    unsure |= rise.view(np.uint64).min(axis=0) < _CLEAR_BITS - 1
    return np.asarray(unsure)


def _needs_fix(counts: np.ndarray) -> np.ndarray:
    """Steps (columns) where some bucket is below, or almost equal to but not equal to, the one before
    it: only there can the fix-up loop change anything."""
    if counts.shape[0] < 2 or not counts.size:
        return np.zeros(counts.shape[1], bool)
    return _needs_fix_of(counts, _unsure_cols(counts))


def _needs_fix_of(counts: np.ndarray, unsure: np.ndarray | None) -> np.ndarray:
    """`_needs_fix` given `_unsure_cols(counts)`: the full test where that is unsure (steps are
    independent), everywhere where it is None."""
    cols = np.arange(counts.shape[1]) if unsure is None else np.flatnonzero(unsure)
    if len(cols) == counts.shape[1]:
        return _needs_fix_at(counts)
    out = np.zeros(counts.shape[1], bool)
    if cols.size:
        out[cols] = _needs_fix_at(counts[:, cols])
    return out


def _steps_to_fix(counts: np.ndarray) -> np.ndarray:
    """Steps that may need the fix-up: the few that `_unsure_cols` cannot clear (the fix-up leaves
    one that needs none as it was), else exactly those `_needs_fix` finds."""
    if counts.shape[0] < 2 or not counts.size:
        return np.zeros(0, np.intp)
    unsure = _unsure_cols(counts)
    if unsure is not None and np.count_nonzero(unsure) <= _FEW_COLUMNS:
        return np.flatnonzero(unsure)
    return np.flatnonzero(_needs_fix_of(counts, unsure))


def _needs_fix_at(counts: np.ndarray) -> np.ndarray:
    """`_needs_fix` testing every column.

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
    # Coalesce buckets with the same upper bound (strictly rising bounds, the usual case, have none).
    if len(bounds) > 1 and not bool((bounds[1:] > bounds[:-1]).all()):
        uniq, inverse = np.unique(bounds, return_inverse=True)
        if len(uniq) != len(bounds):
            merged = np.zeros((len(uniq), steps))
            with np.errstate(all="ignore"):  # Inf + -Inf is NaN, as in Prometheus
                np.add.at(merged, inverse, counts)
            bounds, counts = uniq, merged
    fix = _steps_to_fix(counts)
    if len(bounds) < 2:
        return np.full(steps, np.nan)
    if 2 * fix.size > steps:  # odd buckets at most steps: fix them up, then all steps at once
        counts = counts.copy()
        counts[:, fix] = _monotonic(counts[:, fix])
        return _quantile_at(q, bounds, counts, False)
    # Steps are independent: all of them from the counts as they are, then those the fix-up changes
    # again from their fixed counts (few: a counter reset here and there).
    bits = counts.view(np.int64)
    rising = counts.size > 0 and bool(bits.min() >= 0) and bool(bits.max() <= _INF_BITS)
    res = _quantile_at(q, bounds, counts, rising)
    if fix.size:
        res[fix] = _quantile_at(q[fix], bounds, _monotonic(counts[:, fix]), False)
    return res


def _quantile_at(q: np.ndarray, bounds: np.ndarray, counts: np.ndarray, rising: bool) -> np.ndarray:
    """`bucket_quantile` of fixed-up counts; `rising` when every step that needs no fix-up has
    non-decreasing counts (no sign bit, no NaN: a fall there would have needed the fix-up)."""
    steps = counts.shape[1]
    total = counts[-1]
    last = len(bounds) - 1
    with np.errstate(all="ignore"):
        rank = q * total
        # first bucket index b in [0, len-1) with count >= rank, else len-1
        ge = counts[:-1] >= rank[None, :]
        if rising:  # those buckets are the last ones: count them
            b = last - np.add.reduce(ge, axis=0, dtype=np.intp)
        else:
            b = np.where(ge.any(axis=0), ge.argmax(axis=0), last)
        cols = np.arange(steps)
        before = np.maximum(b - 1, 0)  # b is in [0, last]
        above_first = b > 0
        bucket_end = bounds[b]
        bucket_start = np.where(above_first, bounds[before], 0.0)
        count_b = counts[b, cols]
        below = np.where(above_first, counts[before, cols], 0.0)
        interp = bucket_start + (bucket_end - bucket_start) * ((rank - below) / (count_b - below))
        res = np.where(b == last, bounds[last - 1], interp)
        if bounds[0] <= 0:
            res = np.where(b == 0, bounds[0], res)
        res = np.where(total == 0, np.nan, res)
        if q.size and not (q.min() >= 0 and q.max() <= 1):  # a NaN q fails both
            res = np.where(np.isnan(q), np.nan, res)
            res = np.where(q < 0, -np.inf, res)
            res = np.where(q > 1, np.inf, res)
    return res


@functools.lru_cache(maxsize=1 << 16)
def _bucket_of(labels: LabelSet) -> tuple[float | None, LabelSet]:
    """A bucket series' upper bound (None when `le` is no number) and its histogram's labels
    (remembered: rules and dashboards read the same buckets every round)."""
    return _parse_le(label_value(labels, "le")), tuple(p for p in labels if p[0] != "le")


def histogram_quantile(q: np.ndarray, frame: VectorFrame) -> VectorFrame:
    """Evaluate histogram_quantile(q, buckets) at every step."""
    n = frame.steps
    groups: dict[LabelSet, list[tuple[float, int]]] = {}
    for i, ls in enumerate(frame.labels):
        le, key = _bucket_of(ls)
        if le is None:
            continue
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
        if n > 1 and not full.all() and full.any():
            cols = np.flatnonzero(full)
            if 2 * len(cols) >= n:  # most steps (a rate's first steps lack them): all, without copies
                counts[:, ~full] = 0.0  # `counts` is a copy (read above); steps are independent
                res[cols] = bucket_quantile(q, bounds, counts)[cols]
            else:
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
