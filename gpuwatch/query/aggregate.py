"""Aggregation operators (sum, avg, topk, quantile, count_values, ...) over vector frames."""

from __future__ import annotations

import functools

import numpy as np

from gpuwatch.query.errors import PromQLEvalError
from gpuwatch.query.frames import NAME, LabelSet, VectorFrame
from gpuwatch.query.kahan import kahan_inc, kahan_result, kahan_rows, mean_rows
from gpuwatch.query.values import format_value
from gpuwatch.query.windows import quantile_sorted, sorted_with_nan_first


def group_labels(labels: LabelSet, grouping: list[str], without: bool) -> LabelSet:
    """Return the output labels of a series' group."""
    if without:
        drop = set(grouping) | {NAME}
        return tuple(p for p in labels if p[0] not in drop)
    keep = set(grouping)
    return tuple(p for p in labels if p[0] in keep)


@functools.lru_cache(maxsize=1 << 16)
def _group_of(labels: LabelSet, grouping: tuple[str, ...], without: bool) -> LabelSet:
    """`group_labels` remembered: rules and dashboards aggregate the same series every round."""
    return group_labels(labels, list(grouping), without)


def _groups(frame: VectorFrame, grouping: list[str], without: bool) -> dict[LabelSet, list[int]]:
    groups: dict[LabelSet, list[int]] = {}
    by = tuple(grouping)
    for i, ls in enumerate(frame.labels):
        groups.setdefault(_group_of(ls, by, without), []).append(i)
    return groups


def aggregate(
    op: str, frame: VectorFrame, grouping: list[str], without: bool, param: np.ndarray | None
) -> VectorFrame:
    """Evaluate a simple aggregation (not topk/bottomk/count_values) per group and step."""
    n = frame.steps
    groups = _groups(frame, grouping, without)
    if op == "sum" and len(groups) == len(frame.labels) and groups:
        # Every group is one series (`sum by (le, ...)` of one series per bucket): all rows at once,
        # as the loop below computes a group of one.
        # The groups are the rows in order (each row made its own group, in turn).
        with np.errstate(all="ignore"):
            v = frame.values + 0.0  # what the Kahan sum of one row comes to (-0.0 becomes 0.0)
        if not frame.present.all():
            np.copyto(v, 0.0, where=~frame.present)
        return VectorFrame(list(groups), v, frame.present.copy())
    if op == "sum" and groups:
        return _sum_groups(frame, groups)
    out_labels: list[LabelSet] = []
    out_values: list[np.ndarray] = []
    out_present: list[np.ndarray] = []
    for key, rows in groups.items():
        v = frame.values[rows]
        m = frame.present[rows]
        present = np.asarray(m.any(axis=0))
        with np.errstate(all="ignore"):
            if op == "sum" and len(rows) == 1:
                res = np.where(m[0], 0.0 + v[0], 0.0)  # what the Kahan sum of one row comes to
            elif op == "sum":
                res = kahan_result(*kahan_rows(v, m))
            elif op == "avg":
                res = mean_rows(v, m)
            elif op == "count":
                res = m.sum(axis=0).astype(np.float64)
            elif op == "group":
                res = np.ones(n)
            elif op in ("min", "max"):
                filled = np.where(m, v, np.nan)
                res = (np.fmax if op == "max" else np.fmin).reduce(filled, axis=0)
            elif op in ("stddev", "stdvar"):
                res = _variance(v, m)
                if op == "stddev":
                    res = np.sqrt(res)
            elif op == "quantile":
                assert param is not None
                s, nans, counts = sorted_with_nan_first(v.T, m.T)
                res = quantile_sorted(param, s, nans, counts)
            else:
                raise PromQLEvalError(f"unknown aggregation {op}")
        out_labels.append(key)
        out_values.append(res)
        out_present.append(present)
    if not out_labels:
        return VectorFrame.empty(n)
    return VectorFrame(out_labels, np.array(out_values), np.array(out_present))


def _sum_groups(frame: VectorFrame, groups: dict[LabelSet, list[int]]) -> VectorFrame:
    """`sum` of every group at once: the Kahan sum runs over the groups' first rows, then their
    second rows, ... as (groups, steps) arrays, so each group gets the bits of its own row by row
    sum (the operations are elementwise); a group of one row is that row plus 0.0, as below."""
    n = frame.steps
    rows_of = list(groups.values())
    sizes = np.fromiter((len(r) for r in rows_of), np.int64, len(rows_of))
    flat = np.fromiter((i for r in rows_of for i in r), np.int64, int(sizes.sum()))
    valid = np.arange(int(sizes.max())) < sizes[:, None]
    idx = np.zeros(valid.shape, np.int64)
    idx[valid] = flat  # row-major: each group's rows in order
    values, present = frame.values.reshape(-1, n), frame.present.reshape(-1, n)
    total = np.zeros((len(rows_of), n))
    comp = np.zeros((len(rows_of), n))
    out_present = np.zeros((len(rows_of), n), dtype=bool)
    for j in range(int(sizes.max())):
        m = present[idx[:, j]] & valid[:, j][:, None]
        out_present |= m  # a group is present where any of its rows is
        t, c = kahan_inc(values[idx[:, j]], total, comp)
        total = np.where(m, t, total)
        comp = np.where(m, c, comp)
    res = kahan_result(total, comp)
    single = sizes == 1
    if single.any():
        first = idx[single, 0]
        with np.errstate(all="ignore"):
            res[single] = np.where(present[first], 0.0 + values[first], 0.0)
    return VectorFrame(list(groups), res, out_present)


def _variance(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Welford's running variance over rows, seeded as Prometheus seeds it."""
    n = v.shape[1]
    count = np.zeros(n)
    mean = np.zeros(n)
    acc = np.zeros(n)
    for i in range(v.shape[0]):
        x = v[i]
        mi = m[i]
        first = mi & (count == 0)
        later = mi & ~first
        bad = ~np.isfinite(x)
        mean = np.where(first, x, mean)
        acc = np.where(first, np.where(bad, np.nan, 0.0), acc)
        cnt = count + 1
        delta = x - mean
        new_mean = mean + delta / cnt
        new_acc = acc + delta * (x - new_mean)
        mean = np.where(later, new_mean, mean)
        acc = np.where(later, new_acc, acc)
        count = np.where(mi, cnt, count)
    return acc / count


def topk(op: str, frame: VectorFrame, grouping: list[str], without: bool, k: np.ndarray) -> VectorFrame:
    """Keep the k largest (topk) or smallest (bottomk) series of each group at each step."""
    n = frame.steps
    kk = np.where(np.isnan(k), 0, np.clip(np.nan_to_num(k), -1, 2**62)).astype(np.int64)
    keep = np.zeros_like(frame.present)
    order_rows: list[int] = []
    for rows in _groups(frame, grouping, without).values():
        v = frame.values[rows]
        m = frame.present[rows]
        nan = np.isnan(v)
        # Rank: present non-NaN by value, then NaN, then absent.
        key = -v if op == "topk" else v
        key = np.where(nan | ~m, 0.0, key)
        cat = np.where(~m, 2, np.where(nan, 1, 0))
        order = np.argsort(key, axis=0, kind="stable")
        cat_sorted = np.take_along_axis(cat, order, axis=0)
        order = np.take_along_axis(order, np.argsort(cat_sorted, axis=0, kind="stable"), axis=0)
        ranks = np.empty_like(order)
        np.put_along_axis(ranks, order, np.arange(len(rows))[:, None].repeat(n, axis=1), axis=0)
        sel = m & (ranks < kk[None, :])
        keep[rows] = sel
        if n == 1:
            order_rows.extend(np.asarray(rows)[order[:, 0]].tolist())
    out = VectorFrame(frame.labels, frame.values, keep)
    if n == 1:
        out = out.take(order_rows)
    return out


def count_values(frame: VectorFrame, label: str, grouping: list[str], without: bool) -> VectorFrame:
    """Count series per distinct value, the value written into label `label`."""
    n = frame.steps
    counts: dict[LabelSet, np.ndarray] = {}
    formatted: dict[float, str] = {}
    for i, ls in enumerate(frame.labels):
        row_present = frame.present[i]
        if not row_present.any():
            continue
        vals = frame.values[i]
        hist = None if frame.hist is None else frame.hist[i]
        for step in np.flatnonzero(row_present).tolist():
            h = None if hist is None else hist[step]
            if h is not None:
                text = h.text()  # a native histogram sample: its text form, as Prometheus writes it
            else:
                x = float(vals[step])
                text = formatted.get(x) if x == x else "NaN"
                if text is None:
                    text = format_value(x)
                    formatted[x] = text
            full = tuple(sorted([p for p in ls if p[0] != label] + [(label, text)]))
            if without:
                key = group_labels(full, grouping, True)
            else:
                key = group_labels(full, [*grouping, label], False)
            arr = counts.get(key)
            if arr is None:
                arr = np.zeros(n)
                counts[key] = arr
            arr[step] += 1
    if not counts:
        return VectorFrame.empty(n)
    labels = list(counts)
    values = np.array([counts[k] for k in labels])
    return VectorFrame(labels, values, values > 0)
