"""Instant-vector operations over all series at once equal the series-by-series code, bit for bit.

`binary.vector_vector` and `binary.set_operation` work on every matched pair of series in one array
operation, `aggregate`'s `sum` on every group at once; the references here are the pair-by-pair and
group-by-group code they replaced, on random frames."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.query import binary, histogram
from gpuwatch.query.aggregate import _groups, aggregate
from gpuwatch.query.binary import COMPARISON, Matching, compute, set_operation, vector_vector
from gpuwatch.query.errors import PromQLEvalError
from gpuwatch.query.frames import NAME, LabelSet, VectorFrame, merge_same_labels
from gpuwatch.query.kahan import kahan_result, kahan_rows

VALUE = st.sampled_from([0.0, -0.0, 1.0, -2.5, 3.0, 1e16, 1e-16, 1e300, float("inf"), float("nan")])


@st.composite
def frames(draw: st.DrawFn, steps: int) -> VectorFrame:
    k = draw(st.integers(0, 6))
    labels: list[LabelSet] = []
    for _ in range(k):
        ls = tuple(
            (name, draw(st.sampled_from(["a", "b"])))
            for name in ("__name__", "gpu", "host")
            if draw(st.booleans()) or name == "gpu"
        )
        labels.append(ls)
    values = np.array([[draw(VALUE) for _ in range(steps)] for _ in range(k)]).reshape(k, steps)
    present = np.array([[draw(st.booleans()) for _ in range(steps)] for _ in range(k)], bool).reshape(
        k, steps
    )
    return VectorFrame(labels, values, present)


def pairwise(
    op: str, lhs: VectorFrame, rhs: VectorFrame, matching: Matching, return_bool: bool
) -> VectorFrame:
    """`vector_vector` as it was: one pair at a time."""
    n = lhs.steps
    swapped = matching.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    msigs, _ = binary._by_signature(many, matching)
    _, ogroups = binary._by_signature(one, matching)
    for rows in ogroups.values():
        if len(rows) > 1 and (one.present[rows].sum(axis=0) > 1).any():
            raise PromQLEvalError("duplicate series")
    drop = op in binary.ARITHMETIC or return_bool
    labels, values, present = [], [], []
    checks: dict[tuple[LabelSet, LabelSet], np.ndarray] = {}
    for i, sig in enumerate(msigs):
        for j in ogroups.get(sig, []):
            both = many.present[i] & one.present[j]
            if not both.any():
                continue
            a, b = (one.values[j], many.values[i]) if swapped else (many.values[i], one.values[j])
            res = compute(op, a, b)
            if op in COMPARISON:
                val, ok = (res.astype(np.float64), both) if return_bool else (a, both & res)
            else:
                val, ok = res, both
            out_labels = binary._result_labels(many.labels[i], one.labels[j], matching, drop)
            labels.append(out_labels)
            values.append(val)
            present.append(ok)
            key = (sig, out_labels if matching.card != "one-to-one" else ())
            checks[key] = checks[key] + both if key in checks else both.astype(np.int64)
    if checks and (np.array(list(checks.values())) > 1).any():
        raise PromQLEvalError("multiple matches")
    if not labels:
        return VectorFrame.empty(n)
    return merge_same_labels(VectorFrame(labels, np.array(values), np.array(present)))


def set_pairwise(op: str, lhs: VectorFrame, rhs: VectorFrame, matching: Matching) -> VectorFrame:
    """`set_operation` as it was: one series at a time."""
    n = lhs.steps

    def any_present(frame: VectorFrame) -> tuple[list[LabelSet], dict[LabelSet, np.ndarray]]:
        sigs, groups = binary._by_signature(frame, matching)
        return sigs, {sig: frame.present[rows].any(axis=0) for sig, rows in groups.items()}

    lsigs, lany = any_present(lhs)
    rsigs, rany = any_present(rhs)
    none = np.zeros(n, dtype=bool)
    if op in ("and", "unless"):
        keep = [rany.get(sig, none) if op == "and" else ~rany.get(sig, none) for sig in lsigs]
        present = np.array([lhs.present[i] & keep[i] for i in range(len(lsigs))]).reshape(-1, n)
        return VectorFrame(lhs.labels, lhs.values, present)
    rpresent = np.array([rhs.present[i] & ~lany.get(sig, none) for i, sig in enumerate(rsigs)]).reshape(-1, n)
    out = VectorFrame(
        lhs.labels + rhs.labels,
        np.concatenate([lhs.values, rhs.values]),
        np.concatenate([lhs.present, rpresent.astype(bool)]),
    )
    return merge_same_labels(out)


def outcome(fn, *args) -> object:  # type: ignore[no-untyped-def]
    try:
        f = fn(*args)
    except PromQLEvalError as e:
        return type(e), "multiple matches" in str(e) or "many-to-many" in str(e) or "duplicate" in str(e)
    return f.labels, f.values.tobytes(), f.values.shape, f.present.tobytes()


MATCHINGS = st.builds(
    Matching,
    st.sampled_from(["one-to-one", "many-to-one", "one-to-many"]),
    st.booleans(),
    st.sampled_from([(), ("gpu",), ("host",), ("gpu", "host")]),
    st.sampled_from([(), ("host",)]),
)


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 3).flatmap(lambda n: st.tuples(frames(n), frames(n))), MATCHINGS, st.data())
def test_vector_matching_at_once_equals_pair_by_pair(
    sides: tuple[VectorFrame, VectorFrame], matching: Matching, data: st.DataObject
) -> None:
    lhs, rhs = sides
    op = data.draw(st.sampled_from(sorted(binary.ARITHMETIC | COMPARISON)))
    return_bool = op in COMPARISON and data.draw(st.booleans())
    assert outcome(vector_vector, op, lhs, rhs, matching, return_bool) == outcome(
        pairwise, op, lhs, rhs, matching, return_bool
    )
    if matching.card == "one-to-one" and not matching.include:
        for set_op in ("and", "or", "unless"):
            assert outcome(set_operation, set_op, lhs, rhs, matching) == outcome(
                set_pairwise, set_op, lhs, rhs, matching
            )


def sum_by_group(frame: VectorFrame, grouping: list[str], without: bool) -> VectorFrame:
    """`sum` as it was: one group at a time."""
    groups = _groups(frame, grouping, without)
    if not groups:
        return VectorFrame.empty(frame.steps)
    values, present = [], []
    for rows in groups.values():
        v, m = frame.values[rows], frame.present[rows]
        with np.errstate(all="ignore"):
            if len(rows) == 1:
                values.append(np.where(m[0], 0.0 + v[0], 0.0))
            else:
                values.append(kahan_result(*kahan_rows(v, m)))
        present.append(m.any(axis=0))
    return VectorFrame(list(groups), np.array(values), np.array(present))


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 3).flatmap(frames),
    st.sampled_from([[], ["gpu"], ["host"], ["gpu", "host"]]),
    st.booleans(),
)
def test_sum_of_all_groups_at_once_equals_group_by_group(
    frame: VectorFrame, grouping: list[str], without: bool
) -> None:
    assert outcome(aggregate, "sum", frame, grouping, without, None) == outcome(
        sum_by_group, frame, grouping, without
    )


@st.composite
def bucket_frames(draw: st.DrawFn) -> VectorFrame:
    """Histograms of a few servers at one step: the same bounds or not, buckets missing or not."""
    labels: list[LabelSet] = []
    values: list[float] = []
    present: list[bool] = []
    for server in range(draw(st.integers(0, 5))):
        bounds = draw(
            st.sampled_from([["0.1", "1", "+Inf"], ["0.5", "1", "2.5", "+Inf"], ["1", "1.0", "+Inf"]])
        )
        total = 0.0
        for le in bounds:
            total += draw(st.sampled_from([0.0, 1.0, 3.0, 1e-12, float("nan")]))
            labels.append((("__name__", "h_bucket"), ("le", le), ("server", str(server))))
            values.append(total if draw(st.integers(0, 9)) else draw(VALUE))
            present.append(bool(draw(st.integers(0, 9))))
    k = len(labels)
    return VectorFrame(labels, np.array(values).reshape(k, 1), np.array(present, bool).reshape(k, 1))


@settings(max_examples=300, deadline=None)
@given(bucket_frames(), st.sampled_from([0.0, 0.5, 0.99, 1.0, 1.5, -1.0, float("nan")]))
def test_histogram_quantile_of_many_histograms_at_once_equals_one_by_one(
    frame: VectorFrame, q: float
) -> None:
    # At one step, histograms with the same bounds go together; at two steps each goes alone.
    got = histogram.histogram_quantile(np.array([q]), frame)
    two = VectorFrame(frame.labels, np.repeat(frame.values, 2, axis=1), np.repeat(frame.present, 2, axis=1))
    alone = histogram.histogram_quantile(np.array([q, q]), two)

    def rows(f: VectorFrame) -> list[tuple[LabelSet, bytes, bool]]:
        return [(f.labels[i], f.values[i, 0].tobytes(), bool(f.present[i, 0])) for i in range(len(f.labels))]

    assert rows(got) == rows(alone)


def test_sum_of_one_series_per_group_equals_the_kahan_sum() -> None:
    """`sum by (le, ...)` keeping every series apart: each row is its own Kahan sum (-0.0 -> 0.0,
    NaN kept, absent cells 0.0 and absent), and the frame given is left as it was."""
    values = np.array([[-0.0, 1.5, math.nan, 2.0], [math.inf, -0.0, 3.0, 5e-324]])
    present = np.array([[True, True, True, False], [True, True, False, True]])
    frame = VectorFrame([((NAME, "a"), ("le", "1")), ((NAME, "a"), ("le", "2"))], values, present)
    before = values.view(np.int64).tolist(), present.tolist()
    out = aggregate("sum", frame, ["le"], False, None)
    assert out.labels == [(("le", "1"),), (("le", "2"),)]
    for i in range(2):
        want = kahan_result(*kahan_rows(values[i : i + 1], present[i : i + 1]))
        assert (
            out.values[i].view(np.int64).tolist() == np.where(present[i], want, 0.0).view(np.int64).tolist()
        )
    assert out.present.tolist() == present.tolist()
    assert out.values is not values and out.present is not present
    assert (values.view(np.int64).tolist(), present.tolist()) == before
