"""histogram_quantile's fast paths equal the code they replaced, bit for bit, on random histograms.

The references (`plain_*`) are histogram.py as it was before them: every step tested for the bucket
fix-up by floats, the fix-up in numpy, the first bucket at or over the rank by argmax, the steps
where every bucket is present copied out. The fast paths: `_unsure_cols` (which proves by the floats'
bits that clearly rising or equal buckets need no fix-up), `_monotonic_few` (the fix-up of a few steps
in Python floats), counting the buckets at or over the rank where counts rise, and all steps at once
when most have every bucket. Tests below also check that those paths are taken where they should be.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.query import histogram
from gpuwatch.query.aggregate import aggregate
from gpuwatch.query.errors import PromQLEvalError
from gpuwatch.query.frames import NAME, LabelSet, VectorFrame, label_value, merge_same_labels
from gpuwatch.query.kahan import kahan_result, kahan_rows


# The code as it was (histogram.py before the fast paths), verbatim but for the names.
# fmt: off
def plain_monotonic(counts: np.ndarray) -> np.ndarray:
    """Prometheus's ensureMonotonicAndIgnoreSmallDeltas over buckets (rows) at every step."""
    counts = counts.copy()
    prev = counts[0].copy()
    for i in range(1, len(counts)):
        cur = counts[i]
        same = cur == prev
        close = ~same & histogram._almost_equal(prev, cur, histogram._SMALL_DELTA)
        lower = ~same & ~close & (cur < prev)
        fix = close | lower
        counts[i] = np.where(fix, prev, cur)
        prev = np.where(fix | same, prev, cur)
    return counts


def plain_needs_fix(counts: np.ndarray) -> np.ndarray:
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
            out[cols] = (unsure[:, cols] & ((lt < ea) | histogram._almost_equal(ea, lt, histogram._SMALL_DELTA))).any(axis=0)
    return out


def plain_bucket_quantile(q: np.ndarray, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
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
    needs_fix = plain_needs_fix(counts)
    if needs_fix.any():  # steps are independent: fix up only those that need it
        cols = np.flatnonzero(needs_fix)
        counts = counts.copy()
        counts[:, cols] = plain_monotonic(counts[:, cols])
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


def plain_histogram_quantile(q: np.ndarray, frame: VectorFrame) -> VectorFrame:
    """Evaluate histogram_quantile(q, buckets) at every step."""
    n = frame.steps
    groups: dict[LabelSet, list[tuple[float, int]]] = {}
    for i, ls in enumerate(frame.labels):
        le = histogram._parse_le(label_value(ls, "le"))
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
            res = plain_bucket_quantile(q, bounds, counts)
        elif full.any():
            cols = np.flatnonzero(full)
            res[cols] = plain_bucket_quantile(q[cols], bounds, counts[:, cols])
        for col in np.flatnonzero(any_present & ~full).tolist():
            sel = pres[:, col]
            res[col] = plain_bucket_quantile(q[col : col + 1], bounds[sel], counts[sel, col : col + 1])[0]
        labels.append(tuple(p for p in key if p[0] != NAME))
        values.append(res)
        present.append(any_present)
    for bounds_key, hists in together.items():
        counts = frame.values[np.array([rows for _, rows in hists]).T, 0]  # (buckets, histograms)
        got = plain_bucket_quantile(np.repeat(q, len(hists)), np.array(bounds_key), counts)
        for (at, _), value in zip(hists, got.tolist(), strict=True):
            values[at] = np.array([value])
    if not labels:
        return VectorFrame.empty(n)
    return merge_same_labels(VectorFrame(labels, np.array(values), np.array(present)))
# fmt: on


ODD = [0.0, -0.0, -1.0, 1e-300, 5e-324, 1e300, math.inf, -math.inf, math.nan]
BOUNDS = [
    ["+Inf"],
    ["0.1", "1", "+Inf"],
    ["0.005", "0.01", "0.1", "0.5", "1", "2.5", "10", "+Inf"],
    ["0.1", "1"],  # no +Inf bucket
    ["1", "1.0", "2", "+Inf"],  # the same bound twice
    ["-1", "0", "+Inf"],
    ["10", "2", "+Inf", "NaN"],
]


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


def rising_counts(rng: np.random.Generator, buckets: int, steps: int, scale: float) -> np.ndarray:
    """Counts like a rate of buckets: cumulative, many buckets equal to the one before."""
    inc = rng.random((buckets, steps)) * scale
    inc[rng.random((buckets, steps)) < 0.4] = 0.0
    return np.cumsum(inc, axis=0)


def spoil(rng: np.random.Generator, counts: np.ndarray, how: int) -> None:
    """Make a few cells odd: a drop, an almost-equal rise, one float up or down, a NaN, an infinity,
    a sign."""
    b, n = counts.shape
    with np.errstate(all="ignore"):
        _spoil_cells(rng, counts, how, b, n)


def _spoil_cells(rng: np.random.Generator, counts: np.ndarray, how: int, b: int, n: int) -> None:
    for _ in range(how):
        i, j = int(rng.integers(b)), int(rng.integers(n))
        kind = int(rng.integers(5))
        prev = counts[i - 1, j] if i else 0.0
        if kind == 0:
            counts[i, j] = prev * 0.9
        elif kind == 1:
            counts[i, j] = prev * (1 + float(rng.choice([1e-13, 1.5e-12, 1.99e-12, 3e-12, 1e-11, 2e-11])))
        elif kind == 2:
            counts[i, j] = float(np.nextafter(prev, float(rng.choice([math.inf, -math.inf]))))
        else:
            counts[i, j] = float(rng.choice(ODD))


@st.composite
def histogram_frames(draw: st.DrawFn) -> tuple[np.ndarray, VectorFrame]:
    """(q at each step, `_bucket` series of a few histograms over several steps)."""
    steps = draw(st.sampled_from([1, 2, 7, 40]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    labels: list[LabelSet] = []
    values, present = [], []
    for model in range(draw(st.integers(1, 3))):
        bounds = draw(st.sampled_from(BOUNDS))
        counts = rising_counts(rng, len(bounds), steps, draw(st.sampled_from([1.0, 1e-9, 1e12])))
        spoil(rng, counts, draw(st.sampled_from([0, 0, 1, 3, 60])))
        pres = np.ones(counts.shape, bool)
        late = draw(st.sampled_from([0, 0, 1, steps // 2, steps]))
        pres[:, :late] = False  # a rate's first steps
        if draw(st.booleans()):
            pres[rng.random(pres.shape) < 0.05] = False  # a bucket missing here and there
        counts[~pres] = draw(st.sampled_from([0.0, math.nan, 7.0]))  # what absent cells hold
        for le, row, p in zip(bounds, counts, pres, strict=True):
            labels.append(((NAME, "h_bucket"), ("le", le), ("model", f"m{model}")))
            values.append(row)
            present.append(p)
    if draw(st.booleans()):
        q = np.full(steps, draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])))
    else:
        q = rng.choice(np.array([0.0, 0.25, 0.99, 1.0, 1.5, -1.0, math.nan]), steps)
    return q, VectorFrame(labels, np.array(values), np.array(present))


def outcome(f: Any, *args: Any) -> Any:
    try:
        out = f(*args)
    except PromQLEvalError as e:
        return str(e)
    return out.labels, bits(out.values).tolist(), out.present.tolist()


@settings(max_examples=500, deadline=None)
@given(histogram_frames())
def test_histogram_quantile_equals_the_plain_code(case: tuple[np.ndarray, VectorFrame]) -> None:
    q, frame = case
    got = outcome(histogram.histogram_quantile, q, frame)
    with np.errstate(all="ignore"):  # the plain code warned of Inf - Inf in coalesced buckets
        assert got == outcome(plain_histogram_quantile, q, frame)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 9),
    st.sampled_from([1, 3, 16, 17, 60]),
    st.sampled_from([0, 1, 2, 5, 400]),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.0, 0.5, 0.99, 1.0]),
)
def test_bucket_quantile_equals_the_plain_code(
    buckets: int, steps: int, odd: int, seed: int, q: float
) -> None:
    rng = np.random.default_rng(seed)
    counts = rising_counts(rng, buckets, steps, 1.0)
    spoil(rng, counts, odd)
    bounds = np.r_[np.cumsum(rng.random(buckets - 1) + 0.01), math.inf]
    qs = np.full(steps, q)
    got = histogram.bucket_quantile(qs, bounds, counts.copy())
    assert bits(got).tolist() == bits(plain_bucket_quantile(qs, bounds, counts)).tolist()
    assert np.array_equal(histogram._needs_fix(counts), plain_needs_fix(counts))


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 8), st.sampled_from([1, 2, 16, 17, 40]), st.integers(0, 2**32 - 1))
def test_fixup_of_few_steps_in_floats_equals_numpy(buckets: int, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rising_counts(rng, buckets, steps, float(rng.choice([1.0, 1e-310])))
    spoil(rng, counts, buckets * steps // 2)
    assert bits(histogram._monotonic(counts)).tolist() == bits(plain_monotonic(counts)).tolist()
    assert bits(histogram._monotonic_few(counts)).tolist() == bits(plain_monotonic(counts)).tolist()


NEAR = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([*ODD, 2.2250738585072014e-308, 2.225e-320, 1.7976931348623157e308]),
)


@settings(max_examples=1000, deadline=None)
@given(NEAR, st.one_of(NEAR, st.sampled_from([1e-13, -1e-13, 2e-12, 1e-11])), st.booleans())
def test_almost_equal_of_two_floats_equals_numpy(a: float, b: float, relative: bool) -> None:
    if relative and math.isfinite(a) and abs(b) < 1:
        b = a * (1 + b)  # near a
    want = bool(histogram._almost_equal(np.array([a]), np.array([b]), histogram._SMALL_DELTA)[0])
    assert histogram._almost_equal_one(a, b, histogram._SMALL_DELTA) is want


def test_rising_buckets_are_proven_without_the_full_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rate-like buckets (equal or clearly rising) skip the full test and take the counting path;
    one counter reset sends just its step (unsure by the bits) through the fix-up in Python floats.
    Many unsure steps get the full test first."""
    rng = np.random.default_rng(7)
    counts = rising_counts(rng, 16, 500, 1.0)
    assert histogram._unsure_cols(counts) is not None
    assert not histogram._unsure_cols(counts).any()
    full_tests: list[int] = []
    rising: list[bool] = []
    needs_fix_at, quantile_at = histogram._needs_fix_at, histogram._quantile_at

    def counting_needs_fix_at(c: np.ndarray) -> np.ndarray:
        full_tests.append(c.shape[1])
        return needs_fix_at(c)

    def recording_quantile_at(q: np.ndarray, b: np.ndarray, c: np.ndarray, r: bool) -> np.ndarray:
        rising.append(r)
        return quantile_at(q, b, c, r)

    few: list[int] = []
    monotonic_few = histogram._monotonic_few

    def recording_monotonic_few(c: np.ndarray) -> np.ndarray:
        few.append(c.shape[1])
        return monotonic_few(c)

    monkeypatch.setattr(histogram, "_monotonic_few", recording_monotonic_few)
    monkeypatch.setattr(histogram, "_needs_fix_at", counting_needs_fix_at)
    monkeypatch.setattr(histogram, "_quantile_at", recording_quantile_at)
    bounds = np.r_[np.arange(1.0, 16.0), math.inf]
    q = np.full(500, 0.99)
    got = histogram.bucket_quantile(q, bounds, counts)
    assert full_tests == [] and rising == [True]
    assert bits(got).tolist() == bits(plain_bucket_quantile(q, bounds, counts)).tolist()

    counts[9, 123] = counts[8, 123] * 0.5  # a reset in one bucket at one step
    got = histogram.bucket_quantile(q, bounds, counts)
    assert full_tests == [] and rising == [True, True, False] and few == [1]
    assert bits(got).tolist() == bits(plain_bucket_quantile(q, bounds, counts)).tolist()

    counts[9, 200:220] = counts[8, 200:220] * (1 + 1e-13)  # almost equal at 20 steps: none a drop
    got = histogram.bucket_quantile(q, bounds, counts)
    assert full_tests == [21] and few == [1]  # 21 steps to fix: in numpy
    assert bits(got).tolist() == bits(plain_bucket_quantile(q, bounds, counts)).tolist()


def test_sum_of_one_series_per_group_equals_the_kahan_sum() -> None:
    """`sum by (le, ...)` keeping every series apart: each row is its own Kahan sum (-0.0 -> 0.0,
    NaN kept, absent cells 0.0 and absent), and the frame given is left as it was."""
    values = np.array([[-0.0, 1.5, math.nan, 2.0], [math.inf, -0.0, 3.0, 5e-324]])
    present = np.array([[True, True, True, False], [True, True, False, True]])
    frame = VectorFrame([((NAME, "a"), ("le", "1")), ((NAME, "a"), ("le", "2"))], values, present)
    before = bits(values).tolist(), present.tolist()
    out = aggregate("sum", frame, ["le"], False, None)
    assert out.labels == [(("le", "1"),), (("le", "2"),)]
    for i in range(2):
        want = kahan_result(*kahan_rows(values[i : i + 1], present[i : i + 1]))
        assert bits(out.values[i]).tolist() == bits(np.where(present[i], want, 0.0)).tolist()
    assert out.present.tolist() == present.tolist()
    assert out.values is not values and out.present is not present
    assert (bits(values).tolist(), present.tolist()) == before
