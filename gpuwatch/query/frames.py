"""Intermediate values of an evaluation: every expression is evaluated at all steps at once.

A query evaluated at `n` step timestamps yields one of these frames. An instant query is a
range evaluation with one step. Vectors are dense `(series, steps)` arrays plus a presence mask.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from gpuwatch.core.model import STALE_NAN_BITS
from gpuwatch.query.errors import PromQLEvalError

# A label set: sorted (name, value) pairs, `__name__` included where kept, no empty values.
LabelSet = tuple[tuple[str, str], ...]

NAME = "__name__"


def make_labelset(labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> LabelSet:
    """Return `labels` as a sorted LabelSet without empty values."""
    items = labels.items() if isinstance(labels, Mapping) else labels
    return tuple(sorted((k, v) for k, v in items if v != ""))


def drop_name(labels: LabelSet) -> LabelSet:
    """Return `labels` without `__name__`."""
    if labels and any(k == NAME for k, _ in labels):
        return tuple(p for p in labels if p[0] != NAME)
    return labels


def label_value(labels: LabelSet, name: str) -> str:
    """Return the value of label `name`, or "" when absent."""
    for k, v in labels:
        if k == name:
            return v
    return ""


def is_stale_array(values: np.ndarray) -> np.ndarray:
    """Return a boolean mask of Prometheus staleness markers in `values`."""
    return values.view(np.uint64) == np.uint64(STALE_NAN_BITS)


@dataclass
class ScalarFrame:
    """A scalar at each step."""

    values: np.ndarray  # (n,) float64


@dataclass
class StringFrame:
    """A string literal."""

    value: str


@dataclass
class VectorFrame:
    """An instant vector at each step: row i is series `labels[i]`."""

    labels: list[LabelSet]
    values: np.ndarray  # (k, n) float64
    present: np.ndarray  # (k, n) bool
    # Native histogram samples: a (k, n) object array (None where a cell is a float), or None
    # when the frame holds floats only. Only selectors make these; see engine._hist_mode.
    hist: np.ndarray | None = None

    @staticmethod
    def empty(n: int) -> VectorFrame:
        return VectorFrame([], np.zeros((0, n)), np.zeros((0, n), dtype=bool))

    @property
    def steps(self) -> int:
        return int(self.values.shape[1])

    def take(self, rows: list[int] | np.ndarray) -> VectorFrame:
        """Return the frame restricted to `rows` (in that order)."""
        idx = np.asarray(rows, dtype=np.int64)
        return VectorFrame(
            [self.labels[i] for i in idx.tolist()],
            self.values[idx],
            self.present[idx],
            None if self.hist is None else self.hist[idx],
        )

    def compact(self) -> VectorFrame:
        """Drop rows that are absent at every step."""
        keep = np.flatnonzero(self.present.any(axis=1))
        if len(keep) == len(self.labels):
            return self
        return self.take(keep)


def drop_histograms(frame: VectorFrame) -> VectorFrame:
    """The frame without its native histogram samples (for operations that ignore them)."""
    if frame.hist is None:
        return frame
    return VectorFrame(frame.labels, frame.values, frame.present & (frame.hist == None), None)  # noqa: E711


@dataclass
class RangeSeries:
    """The samples of one series (no staleness markers), as seen by a range-vector function."""

    labels: LabelSet
    times: np.ndarray  # int64 ascending
    values: np.ndarray  # float64
    hist: np.ndarray | None = None  # bool mask of native histogram samples, None if there are none


@dataclass
class RangeFrame:
    """A range vector at each step: step j sees the samples in (ends[j] - range_ms, ends[j]]."""

    series: list[RangeSeries]
    range_ms: int
    ends: np.ndarray  # (n,) int64
    from_selector: object | None = None  # the selector node, for absent_over_time's labels

    @property
    def hist(self) -> bool | None:
        """True when some series holds native histogram samples, else None (as VectorFrame.hist)."""
        return True if any(rs.hist is not None for rs in self.series) else None


def merge_same_labels(frame: VectorFrame) -> VectorFrame:
    """Merge rows with equal label sets; fail if two of them have a value at the same step."""
    if len(frame.labels) <= 1:
        return frame
    groups: dict[LabelSet, list[int]] = {}
    for i, ls in enumerate(frame.labels):
        groups.setdefault(ls, []).append(i)
    if len(groups) == len(frame.labels):
        return frame
    labels: list[LabelSet] = []
    values = []
    present = []
    for ls, rows in groups.items():
        if len(rows) == 1:
            labels.append(ls)
            values.append(frame.values[rows[0]])
            present.append(frame.present[rows[0]])
            continue
        pres = frame.present[rows]
        if (pres.sum(axis=0) > 1).any():
            raise PromQLEvalError("vector cannot contain metrics with the same labelset")
        pick = pres.argmax(axis=0)
        labels.append(ls)
        values.append(frame.values[rows][pick, np.arange(frame.steps)])
        present.append(pres.any(axis=0))
    return VectorFrame(
        labels,
        np.array(values).reshape(len(labels), frame.steps),
        np.array(present).reshape(len(labels), frame.steps),
    )


def check_unique_labels(frame: VectorFrame) -> None:
    """Fail when two rows that have any value share a label set (Prometheus's matrix check)."""
    seen: set[LabelSet] = set()
    has_any = np.asarray(frame.present.any(axis=1))
    for ls, ok in zip(frame.labels, has_any.tolist(), strict=True):
        if not ok:
            continue
        if ls in seen:
            raise PromQLEvalError("vector cannot contain metrics with the same labelset")
        seen.add(ls)
