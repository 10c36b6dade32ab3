"""histogram_quantile over classic buckets, against Prometheus's bucketQuantile step by step.

The reference is Prometheus's `BucketQuantile` (with `coalesceBuckets` and
`ensureMonotonicAndIgnoreSmallDeltas`) in Python floats, one histogram and one step at a time, over the
buckets present at that step. The bucket is found by a linear search for the first count at or over
the rank, as `sort.Search` finds it over the monotonic counts the fix-up leaves (a NaN count aside).
"""

from __future__ import annotations

import math
import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.query import histogram
from gpuwatch.query.frames import NAME, LabelSet, VectorFrame

SMALL_DELTA = 1e-12
MIN_NORMAL = 2.2250738585072014e-308


def almost_equal(a: float, b: float, eps: float) -> bool:
    """Prometheus's util/almost.Equal."""
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    abs_sum = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or abs_sum < MIN_NORMAL:
        return diff < eps * MIN_NORMAL
    return diff / min(abs_sum, sys.float_info.max) < eps


def reference_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus's BucketQuantile of (upper bound, count) pairs."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets, key=lambda b: b[0])
    if not buckets or not math.isinf(buckets[-1][0]) or buckets[-1][0] < 0:
        return math.nan
    merged: list[list[float]] = []
    for le, count in buckets:  # coalesceBuckets
        if merged and merged[-1][0] == le:
            merged[-1][1] += count
        else:
            merged.append([le, count])
    prev = merged[0][1]
    for b in merged[1:]:  # ensureMonotonicAndIgnoreSmallDeltas
        cur = b[1]
        if cur == prev:
            continue
        if almost_equal(prev, cur, SMALL_DELTA) or cur < prev:
            b[1] = prev
            continue
        prev = cur
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(merged) - 1) if merged[i][1] >= rank), len(merged) - 1)
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start, end, count = 0.0, merged[b][0], merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    with np.errstate(all="ignore"):  # Go's float division: 0/0 is NaN, x/0 an infinity
        fraction = float(np.float64(rank) / np.float64(count))
    return start + (end - start) * fraction


ODD = [0.0, -0.0, -1.0, 1e-300, 5e-324, 1e300, math.inf, -math.inf, math.nan]
BOUNDS = [
    ["+Inf"],
    ["0.1", "1", "+Inf"],
    ["0.005", "0.01", "0.1", "0.5", "1", "2.5", "10", "+Inf"],
    ["0.1", "1"],  # no +Inf bucket
    ["1", "1.0", "2", "+Inf"],  # the same bound twice
    ["-1", "0", "+Inf"],
    ["10", "2", "+Inf"],  # out of order
]


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
        labels.append(((NAME, "h_bucket"), ("le", "many"), ("model", "m0")))  # no number: left out
        values.append(np.ones(steps))
        present.append(np.ones(steps, bool))
    if draw(st.booleans()):
        q = np.full(steps, draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])))
    else:
        q = rng.choice(np.array([0.0, 0.25, 0.99, 1.0, 1.5, -1.0, math.nan]), steps)
    return q, VectorFrame(labels, np.array(values), np.array(present))


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=500, deadline=None)
@given(histogram_frames())
def test_histogram_quantile_equals_prometheus_step_by_step(case: tuple[np.ndarray, VectorFrame]) -> None:
    q, frame = case
    out = histogram.histogram_quantile(q, frame)
    got = {
        ls: [float(v) if p else None for v, p in zip(out.values[i], out.present[i], strict=True)]
        for i, ls in enumerate(out.labels)
        if out.present[i].any()
    }
    want: dict[LabelSet, list[float | None]] = {}
    for ls in frame.labels:
        want.setdefault(tuple(p for p in ls if p[0] not in (NAME, "le")), [None] * frame.steps)
    for key, row in want.items():
        for j in range(frame.steps):
            buckets = [
                (float(dict(ls)["le"]), float(frame.values[i, j]))
                for i, ls in enumerate(frame.labels)
                if tuple(p for p in ls if p[0] not in (NAME, "le")) == key
                and frame.present[i, j]
                and dict(ls)["le"] != "many"
            ]
            if buckets:
                row[j] = reference_quantile(float(q[j]), buckets)
    want = {k: v for k, v in want.items() if any(x is not None for x in v)}
    assert got.keys() == want.keys()
    for key, row in want.items():
        for j, (g, w) in enumerate(zip(got[key], row, strict=True)):
            assert (g is None) == (w is None), (key, j)
            if g is not None and w is not None:
                assert same(g, w), (key, j, g, w)


def frame_of(counts: dict[str, list[float]]) -> VectorFrame:
    labels = [((NAME, "h_bucket"), ("le", le)) for le in counts]
    values = np.array(list(counts.values()))
    return VectorFrame(labels, values, np.ones(values.shape, bool))


def test_a_bucket_below_the_one_before_counts_as_equal_to_it() -> None:
    # Step 1: the 0.5 bucket dropped (a counter reset in one bucket's rate): it counts as 50.
    frame = frame_of({"0.1": [50.0, 50.0], "0.5": [90.0, 40.0], "1": [100.0, 100.0], "+Inf": [100.0, 100.0]})
    out = histogram.histogram_quantile(np.array([0.7, 0.7]), frame)
    assert out.values[0].tolist() == [0.1 + (0.5 - 0.1) * (20 / 40), 0.5 + (1 - 0.5) * (20 / 50)]


def test_almost_equal_buckets_are_made_equal() -> None:
    # 1e-13 apart: the 1 bucket is taken as equal to the 0.5 bucket, so a rank just over 80 falls in
    # the +Inf bucket (the answer: the 1 bucket's bound), not inside the 1 bucket.
    frame = frame_of({"0.5": [80.0], "1": [80.0 * (1 + 1e-13)], "+Inf": [100.0]})
    out = histogram.histogram_quantile(np.array([0.8 + 1e-14]), frame)
    assert out.values.tolist() == [[1.0]]


def test_without_an_inf_bucket_or_with_no_observations_the_answer_is_nan() -> None:
    no_inf = histogram.histogram_quantile(np.array([0.5]), frame_of({"0.1": [1.0], "1": [2.0]}))
    empty = histogram.histogram_quantile(np.array([0.5]), frame_of({"1": [0.0], "+Inf": [0.0]}))
    assert math.isnan(no_inf.values[0, 0]) and math.isnan(empty.values[0, 0])


def _needs_fix_plain(counts: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        later, earlier = counts[1:], counts[:-1]
        same = later == earlier
        close = histogram._almost_equal(earlier, later, histogram._SMALL_DELTA)
        return np.asarray((~same & ((later < earlier) | close)).any(axis=0))


@settings(max_examples=400, deadline=None)
@given(st.integers(2, 6), st.integers(1, 20), st.data())
def test_steps_needing_the_fix_up_are_those_of_the_full_test(
    buckets: int, steps: int, data: st.DataObject
) -> None:
    # `_needs_fix` gives a bucket clearly above the one before (over 1 + 1e-11 times it) no full test.
    value = st.one_of(st.floats(0, 1e3), st.sampled_from(ODD))
    counts = np.empty((buckets, steps))
    counts[0] = data.draw(st.lists(st.floats(0, 1e3), min_size=steps, max_size=steps))
    for b in range(1, buckets):
        rel = data.draw(st.sampled_from([0.0, 1e-13, 2e-12, 1e-11, 0.5, -1e-13, -0.1]))
        counts[b] = counts[b - 1] * (1 + rel) + data.draw(st.sampled_from([0.0, 0.0, 1.0, 1e-310]))
    for _ in range(data.draw(st.integers(0, 3))):
        counts[data.draw(st.integers(0, buckets - 1)), data.draw(st.integers(0, steps - 1))] = data.draw(
            value
        )
    assert np.array_equal(histogram._needs_fix(counts), _needs_fix_plain(counts))


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 8), st.sampled_from([1, 2, 16, 17, 40]), st.integers(0, 2**32 - 1))
def test_the_fix_up_in_python_floats_equals_the_one_in_numpy(buckets: int, steps: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rising_counts(rng, buckets, steps, float(rng.choice([1.0, 1e-310])))
    spoil(rng, counts, buckets * steps // 2)
    few = histogram._monotonic_few(counts)
    with np.errstate(all="ignore"):
        wide = np.concatenate([counts, counts[:, :1].repeat(histogram._FEW_COLUMNS + 1, axis=1)], axis=1)
    assert few.view(np.int64).tolist() == histogram._monotonic(wide)[:, :steps].view(np.int64).tolist()


@settings(max_examples=1000, deadline=None)
@given(
    st.one_of(st.floats(), st.sampled_from([*ODD, MIN_NORMAL, 2.225e-320, sys.float_info.max])),
    st.one_of(st.floats(), st.sampled_from([1e-13, -1e-13, 2e-12, 1e-11])),
    st.booleans(),
)
def test_almost_equal_of_two_floats_equals_numpy(a: float, b: float, relative: bool) -> None:
    if relative and math.isfinite(a) and abs(b) < 1:
        b = a * (1 + b)  # near a
    want = bool(histogram._almost_equal(np.array([a]), np.array([b]), histogram._SMALL_DELTA)[0])
    assert histogram._almost_equal_one(a, b, histogram._SMALL_DELTA) is want
