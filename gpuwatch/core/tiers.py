"""Tier points: one series' samples summed up per bucket of a fixed length (1 minute, 1 hour), keeping
what makes the answers of the range functions built on them exact.

A bucket of resolution `res` ending at `end` (a multiple of `res`) holds the samples with
`end - res < t <= end`, as PromQL's range windows are left-open: a window `(e - r, e]` whose end and
range are whole multiples of `res` is the union of whole buckets.

A bucket's row depends on its own samples only: building any span of whole buckets gives the rows a
build of all the series would give there, so the store can build a bucket once it closes and never
revisit it. What joins neighbouring buckets (a counter reset between one bucket's last sample and the
next one's first) is worked out when the rows are read, from their `first_v` and `last_v`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import NamedTuple, cast

import numpy as np

from gpuwatch.core.model import STALE_NAN_BITS, Labels

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
RESOLUTIONS_MS = (MINUTE_MS, HOUR_MS)


class TierPoints(NamedTuple):
    """One series' tier points at one resolution, one row per bucket that holds a sample or a staleness
    marker, ascending.

    Staleness markers are not samples (range functions drop them): they are not counted, and only
    `stale_after` records that one came after the bucket's last sample (an instant selector has no value
    at the bucket's end then). A bucket holding markers only has a row with n = 0 (sum and correction
    0, NaN values, both times its end), so that the marker hides an earlier bucket's sample from an
    instant selector whose lookback reaches both.

    A read of some columns only (`columns=` of the store's tier reads, the columns a range function
    reads: query/tiered.py) leaves the others None; `end_ms` is always read. `take`, `concat`, `cut`
    and `samples_only` (with `n`) keep None columns None."""

    end_ms: np.ndarray  # int64, multiples of the resolution
    n: np.ndarray  # int64: samples in the bucket (NaN values included)
    sum: np.ndarray  # float64: to within about a unit in the last place (`range_sums`)
    min: np.ndarray  # float64: NaN only where every sample is NaN (as min_over_time)
    max: np.ndarray  # float64: likewise
    first_t: np.ndarray  # int64: the bucket's first sample
    first_v: np.ndarray  # float64
    last_t: np.ndarray  # int64: the bucket's last sample
    last_v: np.ndarray  # float64
    # float64: the counter correction between the bucket's samples, the sum of the value before each
    # reset (a sample below the one before it; a NaN on either side is none), as rate() adds it. The
    # bucket's increase is `last_v - first_v + correction` (`increase`); kept this way, a window's
    # `last - first + corrections` is the raw computation's own, exactly so where no reset falls in it.
    correction: np.ndarray
    stale_after: np.ndarray  # bool: the bucket's newest event is a staleness marker

    @property
    def size(self) -> int:
        return int(self.end_ms.size)


COLUMNS: tuple[str, ...] = TierPoints._fields


def partial(columns: Iterable[np.ndarray | None]) -> TierPoints:
    """TierPoints of `columns` in their order, those not read None (the class's note). The fields stay
    typed as arrays: a reader reads only the columns it asked for (tests/test_tiers.py checks each
    range function with its columns alone)."""
    return TierPoints(*cast("Iterable[np.ndarray]", columns))


def only(points: TierPoints, columns: Collection[str] | None) -> TierPoints:
    """`points` with the columns not in `columns` (None: all) None; `end_ms` is kept."""
    if columns is None:
        return points
    return partial(a if f == "end_ms" or f in columns else None for f, a in zip(COLUMNS, points, strict=True))


class TierSeries(NamedTuple):
    """One series' tier points, as a source of them answers a selector."""

    name: str
    labels: Labels
    points: TierPoints


def empty() -> TierPoints:
    i, f = np.zeros(0, np.int64), np.zeros(0, np.float64)
    return TierPoints(i, i, f, f, f, i, f, i, f, f, np.zeros(0, bool))


def bucket_ends(times_ms: np.ndarray, res_ms: int) -> np.ndarray:
    """Return the end of the bucket of resolution `res_ms` holding each time: the next multiple of
    `res_ms` at or after it."""
    return -(-np.asarray(times_ms, np.int64) // res_ms) * res_ms


def build(times_ms: np.ndarray, values: np.ndarray, res_ms: int) -> TierPoints:
    """Sum up one series' raw samples (ascending distinct times; values may hold NaN and staleness
    markers) into tier points of resolution `res_ms`.

    Each sample is a point of its own (n = 1, its value as sum, min, max, first and last; each marker
    a point with n = 0 and `stale_after`), combined into buckets by `combine`: a coarser tier made from
    finer points and one made from the samples are the same by construction."""
    t = np.asarray(times_ms, np.int64)
    v = np.asarray(values, np.float64)
    stale = v.view(np.uint64) == np.uint64(STALE_NAN_BITS)
    sample = ~stale
    vs = np.where(stale, np.nan, v)
    units = TierPoints(
        end_ms=t,
        n=sample.astype(np.int64),
        sum=np.where(stale, 0.0, v),
        min=vs,
        max=vs,
        first_t=t,
        first_v=vs,
        last_t=t,
        last_v=vs,
        correction=np.zeros(t.size),
        stale_after=stale,
    )
    return combine(units, res_ms)


def combine(points: TierPoints, res_ms: int) -> TierPoints:
    """Sum up points into buckets of resolution `res_ms`, a multiple of theirs.

    Exact: n, min, max, first, last and `stale_after`. `sum` and `correction` are each summed to
    within about a unit in the last place (`range_sums`), of the finer sums here and of the samples in
    a build, so the two agree to about that (and exactly where the values are small integers)."""
    if not points.size:
        return empty()
    ends = bucket_ends(points.end_ms, res_ms)
    new = np.empty(ends.size, bool)
    new[0] = True
    np.not_equal(ends[1:], ends[:-1], out=new[1:])
    group = np.cumsum(new) - 1
    end_ms = ends[new]
    size = end_ms.size
    last_row = np.append(np.flatnonzero(new[1:]), ends.size - 1)
    stale_after = points.stale_after[last_row]

    has = points.n > 0
    sub = take(points, has) if not has.all() else points
    g = group[has]
    count = np.bincount(g, weights=sub.n, minlength=size).astype(np.int64)
    filled = count > 0
    first = np.flatnonzero(np.append(True, g[1:] != g[:-1])) if g.size else np.zeros(0, np.int64)
    last = np.append(first[1:] - 1, g.size - 1) if g.size else first

    def per_group(x: np.ndarray, fill: float | int) -> np.ndarray:
        out = np.full(size, fill, dtype=x.dtype)
        out[filled] = x
        return out

    # Reset corrections in time order: each finer point's own, after the link into it from the point
    # before it in the same bucket (that point's last value, where the first value here is below it).
    link = np.zeros(g.size)
    if g.size > 1:
        with np.errstate(invalid="ignore"):
            reset = (g[1:] == g[:-1]) & (sub.first_v[1:] < sub.last_v[:-1])
        link[1:] = np.where(reset, sub.last_v[:-1], 0.0)
    terms = np.empty(2 * g.size)  # point i: terms 2i (link in), 2i + 1 (own)
    terms[0::2], terms[1::2] = link, sub.correction
    return TierPoints(
        end_ms=end_ms,
        n=count,
        sum=per_group(range_sums(sub.sum, first, last + 1), 0.0),
        min=per_group(np.fmin.reduceat(sub.min, first) if g.size else sub.min, np.nan),
        max=per_group(np.fmax.reduceat(sub.max, first) if g.size else sub.max, np.nan),
        first_t=np.where(filled, per_group(sub.first_t[first], 0), end_ms),
        first_v=per_group(sub.first_v[first], np.nan),
        last_t=np.where(filled, per_group(sub.last_t[last], 0), end_ms),
        last_v=per_group(sub.last_v[last], np.nan),
        correction=per_group(range_sums(terms, 2 * first, 2 * last + 2), 0.0),
        stale_after=stale_after,
    )


def range_sums(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Sum `x[a[j]:b[j]]` for every j, each to within about a unit in the last place of its sum.

    Prefix sums alone would lose what rounding took from the running total (a window's sum after a
    long series of large values is off by units of the total, not of the window): each addition's
    rounding error is recovered exactly (Knuth's TwoSum on the running totals) and summed alongside.
    Infinities and NaN are counted apart and give the sum Kahan summation would: NaN where a NaN or
    both infinities are in the window, else the infinity. Not exact where the running total of the
    finite values overflows (magnitudes near 1.8e308)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    x = np.asarray(x, np.float64)
    if not x.size:
        return np.zeros(a.size)
    finite = np.isfinite(x)
    if not finite.all():
        out = range_sums(np.where(finite, x, 0.0), a, b)

        def within(mask: np.ndarray) -> np.ndarray:
            c = np.concatenate(([0], np.cumsum(mask)))
            return (c[b] - c[a]) > 0

        pos, neg = within(x == np.inf), within(x == -np.inf)
        out = np.where(pos, np.inf, np.where(neg, -np.inf, out))
        return np.where(within(np.isnan(x)) | (pos & neg), np.nan, out)
    nonzero = np.flatnonzero(x)
    if nonzero.size < x.size // 2:  # mostly zeros (counter corrections): sum the others alone
        x, a, b = x[nonzero], np.searchsorted(nonzero, a), np.searchsorted(nonzero, b)
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.concatenate(([0.0], np.cumsum(x)))
        before, after = total[:-1], total[1:]
        part = after - before  # TwoSum: after + err == before + x exactly
        err = (before - (after - part)) + (x - part)
        lost = np.concatenate(([0.0], np.cumsum(err)))
        return (total[b] - total[a]) + (lost[b] - lost[a])


def take(points: TierPoints, rows: np.ndarray | slice) -> TierPoints:
    """Return the rows `rows` (a mask, indices or a slice) of `points` (a column not read stays None)."""
    return partial(None if a is None else a[rows] for a in points)


def concat(parts: list[TierPoints]) -> TierPoints:
    """Join points of consecutive spans of one series (each after the one before) into one; a column
    that any part has not read is None."""
    if not parts:
        return empty()
    if len(parts) == 1:
        return parts[0]
    return partial(
        None if any(c is None for c in cols) else np.concatenate(cols) for cols in zip(*parts, strict=True)
    )


def cut(points: TierPoints, start_ms: int, end_ms: int) -> TierPoints:
    """Return the rows of buckets ending in (start_ms, end_ms]: those that hold the samples of a window
    (start_ms, end_ms] whose bounds are multiples of their resolution."""
    lo, hi = np.searchsorted(points.end_ms, [start_ms, end_ms], side="right")
    return take(points, slice(int(lo), int(hi)))


def samples_only(points: TierPoints) -> TierPoints:
    """Return the rows that hold samples (not those of staleness markers alone)."""
    has = points.n > 0
    return points if has.all() else take(points, has)


def increase(points: TierPoints) -> np.ndarray:
    """Return each bucket's counter increase between its first and last sample, resets removed."""
    return points.last_v - points.first_v + points.correction
