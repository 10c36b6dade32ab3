"""Binary operators: arithmetic, comparisons (with bool), and/or/unless, vector matching."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from gpuwatch.query.errors import PromQLEvalError
from gpuwatch.query.frames import NAME, LabelSet, VectorFrame, drop_name, label_value, merge_same_labels

ARITHMETIC = frozenset({"+", "-", "*", "/", "%", "^", "atan2"})
COMPARISON = frozenset({"==", "!=", ">", "<", ">=", "<="})
SET_OPS = frozenset({"and", "or", "unless"})


@dataclass(frozen=True)
class Matching:
    """How two vectors' series are paired: cardinality, on/ignoring labels, group_x labels."""

    card: str  # one-to-one | many-to-one | one-to-many | many-to-many
    on: bool
    labels: tuple[str, ...]
    include: tuple[str, ...]


def compute(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Apply arithmetic or comparison `op`; comparisons return booleans."""
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return np.true_divide(a, b)
        if op == "%":
            return np.fmod(a, b)
        if op == "^":
            return np.power(a, b)
        if op == "atan2":
            return np.arctan2(a, b)
        if op == "==":
            return a == b
        if op == "!=":
            return a != b
        if op == ">":
            return a > b
        if op == "<":
            return a < b
        if op == ">=":
            return a >= b
        if op == "<=":
            return a <= b
    raise PromQLEvalError(f"operator {op!r} not allowed here")


def scalar_scalar(op: str, a: np.ndarray, b: np.ndarray, return_bool: bool) -> np.ndarray:
    res = compute(op, a, b)
    if op in COMPARISON:
        if not return_bool:
            raise PromQLEvalError("comparisons between scalars must use BOOL modifier")
        return res.astype(np.float64)
    return res


def vector_scalar(
    op: str, vec: VectorFrame, scalar: np.ndarray, swap: bool, return_bool: bool
) -> VectorFrame:
    """Apply `op` between each series and a scalar (scalar on the left when `swap`)."""
    if op in SET_OPS:
        raise PromQLEvalError(f"set operator {op!r} not allowed in binary scalar expression")
    s = scalar[None, :]
    res = compute(op, s, vec.values) if swap else compute(op, vec.values, s)
    present = vec.present.copy()
    labels = vec.labels
    if op in COMPARISON:
        if return_bool:
            values = res.astype(np.float64)
        else:
            values = vec.values
            present &= res
    else:
        values = res
    if op in ARITHMETIC or return_bool:
        labels = [drop_name(ls) for ls in labels]
        return merge_same_labels(VectorFrame(labels, values, present))
    return VectorFrame(labels, values, present)


@functools.lru_cache(maxsize=1 << 16)
def _signature(labels: LabelSet, matching: Matching) -> LabelSet:
    """The labels `labels` is matched on (remembered: rules match the same series every round)."""
    if matching.on:
        keep = set(matching.labels)
        return tuple(p for p in labels if p[0] in keep)
    drop = set(matching.labels) | {NAME}
    return tuple(p for p in labels if p[0] not in drop)


def _by_signature(frame: VectorFrame, matching: Matching) -> tuple[list[LabelSet], dict[LabelSet, list[int]]]:
    sigs = [_signature(ls, matching) for ls in frame.labels]
    groups: dict[LabelSet, list[int]] = {}
    for i, sig in enumerate(sigs):
        groups.setdefault(sig, []).append(i)
    return sigs, groups


def _any_rows(frame: VectorFrame, sigs: list[LabelSet]) -> tuple[dict[LabelSet, int], np.ndarray]:
    """Number the distinct signatures; return them and a (signatures + 1, steps) array: whether any
    series of each is present at each step, the last row all False (for a signature not there)."""
    index: dict[LabelSet, int] = {}
    rows = np.fromiter((index.setdefault(sig, len(index)) for sig in sigs), np.int64, len(sigs))
    out = np.zeros((len(index) + 1, frame.steps), dtype=bool)
    if rows.size:
        r, c = np.nonzero(frame.present.reshape(rows.size, frame.steps))
        out[rows[r], c] = True
    return index, out


def _rows_of(sigs: list[LabelSet], index: dict[LabelSet, int]) -> np.ndarray:
    none = len(index)
    return np.fromiter((index.get(sig, none) for sig in sigs), np.int64, len(sigs))


def set_operation(op: str, lhs: VectorFrame, rhs: VectorFrame, matching: Matching) -> VectorFrame:
    """Evaluate and/or/unless (with one array operation per side, not one per series)."""
    n = lhs.steps
    lsigs = [_signature(ls, matching) for ls in lhs.labels]
    rsigs = [_signature(ls, matching) for ls in rhs.labels]
    lpresent = lhs.present.reshape(-1, n).astype(bool)
    if op in ("and", "unless"):
        rindex, rany = _any_rows(rhs, rsigs)
        matched = rany[_rows_of(lsigs, rindex)]
        present = lpresent & (matched if op == "and" else ~matched)
        return VectorFrame(lhs.labels, lhs.values, present)
    # or
    lindex, lany = _any_rows(lhs, lsigs)
    rpresent = rhs.present.reshape(-1, n).astype(bool) & ~lany[_rows_of(rsigs, lindex)]
    out = VectorFrame(
        lhs.labels + rhs.labels,
        np.concatenate([lhs.values, rhs.values]),
        np.concatenate([lhs.present, rpresent]),
    )
    return merge_same_labels(out)


def _result_labels(many: LabelSet, one: LabelSet, matching: Matching, drop: bool) -> LabelSet:
    labels = drop_name(many) if drop else many
    if matching.card == "one-to-one":
        if matching.on:
            keep = set(matching.labels)
            labels = tuple(p for p in labels if p[0] in keep)
        else:
            gone = set(matching.labels)
            labels = tuple(p for p in labels if p[0] not in gone)
    if matching.include:
        d = dict(labels)
        for name in matching.include:
            v = label_value(one, name)
            if v:
                d[name] = v
            else:
                d.pop(name, None)
        labels = tuple(sorted(d.items()))
    return labels


def vector_vector(
    op: str, lhs: VectorFrame, rhs: VectorFrame, matching: Matching, return_bool: bool
) -> VectorFrame:
    """Evaluate an arithmetic or comparison operator between two vectors."""
    n = lhs.steps
    swapped = matching.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    msigs, _ = _by_signature(many, matching)
    _, ogroups = _by_signature(one, matching)
    for sig, rows in ogroups.items():
        if len(rows) > 1 and (one.present[rows].sum(axis=0) > 1).any():
            side = "left" if swapped else "right"
            raise PromQLEvalError(
                f"found duplicate series for the match group {dict(sig)} on the {side} hand-side of the "
                "operation;many-to-many matching not allowed: matching labels must be unique on one side"
            )
    drop = op in ARITHMETIC or return_bool
    pairs_i: list[int] = []
    pairs_j: list[int] = []
    for i, sig in enumerate(msigs):
        for j in ogroups.get(sig, ()):
            pairs_i.append(i)
            pairs_j.append(j)
    pi, pj = np.array(pairs_i, np.int64), np.array(pairs_j, np.int64)
    # All matched pairs at once, as (pairs, steps) arrays: the operators are elementwise, so each
    # pair gets the bits it would alone (^ and atan2 excepted: libm may differ by array length).
    both = many.present.reshape(-1, n)[pi] & one.present.reshape(-1, n)[pj]
    keep = both.any(axis=1)
    pi, pj, both = pi[keep], pj[keep], both[keep]
    mv, ov = many.values.reshape(-1, n)[pi], one.values.reshape(-1, n)[pj]
    a, b = (ov, mv) if swapped else (mv, ov)
    if op in ("^", "atan2"):
        res = np.array([compute(op, a[k], b[k]) for k in range(len(pi))]).reshape(-1, n)
    else:
        res = compute(op, a, b)
    if op in COMPARISON:
        if return_bool:
            values, present = res.astype(np.float64), both
        else:
            values, present = a, both & res
    else:
        values, present = res, both
    labels = [
        _result_labels(many.labels[i], one.labels[j], matching, drop)
        for i, j in zip(pi.tolist(), pj.tolist(), strict=True)
    ]
    # Duplicate checks look at every matched pair, kept by a comparison or not.
    if len(labels) > 1:
        keys: dict[tuple[LabelSet, LabelSet], int] = {}
        one_to_one = matching.card == "one-to-one"
        key_rows = np.fromiter(
            (
                keys.setdefault((msigs[i], () if one_to_one else out), len(keys))
                for i, out in zip(pi.tolist(), labels, strict=True)
            ),
            np.int64,
            len(labels),
        )
        if len(keys) < len(labels):
            counts = np.zeros((len(keys), n), np.int64)
            np.add.at(counts, key_rows, both.astype(np.int64))
            if (counts > 1).any():
                _duplicate_error(matching)
    if not labels:
        return VectorFrame.empty(n)
    return merge_same_labels(VectorFrame(labels, np.array(values), np.array(present)))


def _duplicate_error(matching: Matching) -> NoReturn:
    if matching.card == "one-to-one":
        raise PromQLEvalError(
            "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
        )
    raise PromQLEvalError("multiple matches for labels: grouping labels must ensure unique matches")
