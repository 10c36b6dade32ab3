"""Binary operators: arithmetic, comparisons (with bool), and/or/unless, vector matching."""

from __future__ import annotations

from dataclasses import dataclass

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


def _signature(labels: LabelSet, matching: Matching) -> LabelSet:
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


def _any_present(frame: VectorFrame, groups: dict[LabelSet, list[int]]) -> dict[LabelSet, np.ndarray]:
    return {sig: np.asarray(frame.present[rows].any(axis=0)) for sig, rows in groups.items()}


def set_operation(op: str, lhs: VectorFrame, rhs: VectorFrame, matching: Matching) -> VectorFrame:
    """Evaluate and/or/unless."""
    n = lhs.steps
    lsigs, _ = _by_signature(lhs, matching)
    rsigs, rgroups = _by_signature(rhs, matching)
    rany = _any_present(rhs, rgroups)
    none = np.zeros(n, dtype=bool)
    if op == "and":
        present = np.array([lhs.present[i] & rany.get(sig, none) for i, sig in enumerate(lsigs)]).reshape(
            -1, n
        )
        return VectorFrame(lhs.labels, lhs.values, present)
    if op == "unless":
        present = np.array([lhs.present[i] & ~rany.get(sig, none) for i, sig in enumerate(lsigs)]).reshape(
            -1, n
        )
        return VectorFrame(lhs.labels, lhs.values, present)
    # or
    _, lgroups = _by_signature(lhs, matching)
    lany = _any_present(lhs, lgroups)
    rpresent = (
        np.array([rhs.present[i] & ~lany.get(sig, none) for i, sig in enumerate(rsigs)])
        .reshape(-1, n)
        .astype(bool)
    )
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
    labels: list[LabelSet] = []
    values: list[np.ndarray] = []
    present: list[np.ndarray] = []
    checks: dict[tuple[LabelSet, LabelSet], np.ndarray] = {}
    for i, sig in enumerate(msigs):
        for j in ogroups.get(sig, []):
            both = many.present[i] & one.present[j]
            if not both.any():
                continue
            a, b = (one.values[j], many.values[i]) if swapped else (many.values[i], one.values[j])
            res = compute(op, a, b)
            if op in COMPARISON:
                if return_bool:
                    val = res.astype(np.float64)
                    ok = both
                else:
                    val = a
                    ok = both & res
            else:
                val = res
                ok = both
            out_labels = _result_labels(many.labels[i], one.labels[j], matching, drop)
            labels.append(out_labels)
            values.append(val)
            present.append(ok)
            # Duplicate checks look at every matched pair, kept by a comparison or not.
            key = (sig, out_labels if matching.card != "one-to-one" else ())
            if key in checks:
                checks[key] = checks[key] + both
            else:
                checks[key] = both.astype(np.int64)
    _check_duplicates(checks, matching)
    if not labels:
        return VectorFrame.empty(n)
    return merge_same_labels(VectorFrame(labels, np.array(values), np.array(present)))


def _check_duplicates(checks: dict[tuple[LabelSet, LabelSet], np.ndarray], matching: Matching) -> None:
    if not checks or not (np.array(list(checks.values())) > 1).any():  # one array op, not one per pair
        return
    if matching.card == "one-to-one":
        raise PromQLEvalError(
            "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
        )
    raise PromQLEvalError("multiple matches for labels: grouping labels must ensure unique matches")
