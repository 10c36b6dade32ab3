"""What a remote-write request stores: its series checked, grouped and handed to the store as columns.

A series is refused, and named in the answer, when it has no `__name__`, a label name twice, a name
that is not a Prometheus name, a label over the limits that scrape and push apply, a timestamp gpuwatch
cannot store, or native histogram samples (gpuwatch stores floats). The other series of the request
are stored: a sender never retries a 4xx, so refusing the whole batch would lose its good samples.
Label pairs may come in any order (they are sorted), and a label with an empty value is no label, as
in Prometheus. Samples may be older than what is stored (a node catching up after an outage), and a
series' samples may come out of order; where one (series, time) arrives twice, the last value wins,
so a sender that retries a batch the receiver already stored changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpuwatch.collect.importer import group_columns
from gpuwatch.core.model import DEFAULT_LABEL_LIMITS, LabelLimits, Labels, SeriesColumns
from gpuwatch.core.units import MAX_TIME_MS, MIN_TIME_MS
from gpuwatch.promtext.result import ParseIssue
from gpuwatch.remote.columns import Read, Run, RunMemory, read_columns
from gpuwatch.remote.wire import LABEL_CACHE_SIZE, TimeSeries, decode_request

_LABEL_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_LABEL_REST = _LABEL_START | frozenset("0123456789")
_NAME_START = _LABEL_START | {":"}
_NAME_REST = _LABEL_REST | {":"}


@dataclass(frozen=True)
class Received:
    """The series to store, and the refused ones (each with its reason)."""

    columns: SeriesColumns
    refused: list[str] = field(default_factory=list)
    samples_refused: int = 0


def _is_name(text: str, start: frozenset[str], rest: frozenset[str]) -> bool:
    return bool(text) and text[0] in start and all(c in rest for c in text[1:])


def _label_problem(pairs: Labels) -> str | None:
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        return "a label name appears twice"
    metric = dict(pairs).get("__name__", "")
    if not metric:
        return "no __name__ label"
    if not _is_name(metric, _NAME_START, _NAME_REST):
        return f"metric name {metric!r} is not a Prometheus name"
    for name in names:
        if name != "__name__" and not _is_name(name, _LABEL_START, _LABEL_REST):
            return f"label name {name!r} is not a Prometheus name"
    return None


def _key(pairs: Labels) -> tuple[str, Labels, str | None]:
    """The metric name, the stored label set (sorted, no `__name__`, no empty value) and what is wrong."""
    problem = _label_problem(pairs)
    name = dict(pairs).get("__name__", "")
    labels = tuple(sorted(p for p in pairs if p[0] != "__name__" and p[1]))
    return name, labels, problem


def _problem(series: TimeSeries, label_problem: str | None) -> str | None:
    if label_problem is not None:
        return label_problem
    if series.histograms:
        return f"{series.histograms} native histogram sample(s): gpuwatch stores float samples only"
    if series.timestamps_ms and not (
        min(series.timestamps_ms) >= MIN_TIME_MS and max(series.timestamps_ms) <= MAX_TIME_MS
    ):
        return "a timestamp out of range"
    return None


def _describe(pairs: Labels) -> str:
    shown = ",".join(f'{k}="{v}"' for k, v in pairs[:8])
    return "{" + (shown[:200] + "..." if len(shown) > 200 else shown) + "}"


class Receiver:
    """Remote-write requests into columns, remembering the label sets it has read (bounded): a sender
    writes the same series every few seconds, and reading and checking their labels is most of the work.
    `read` takes the common shape straight into columns (columns.py), any other through `decode`."""

    def __init__(self) -> None:
        self.label_runs: dict[bytes, Labels] = {}  # the wire's label bytes -> pairs (wire.decode_request)
        self._keys: dict[Labels, tuple[str, Labels, str | None]] = {}
        self._limits = DEFAULT_LABEL_LIMITS
        self._memory = RunMemory(self._run)

    def _run(self, pairs: Labels) -> Run:
        name, labels, problem = _key(pairs)
        if problem is None:
            over = self._limits.problem((("__name__", name), *labels))
            problem = None if over is None else f"series {name}: {over}"
        else:
            problem = f"series {_describe(pairs)}: {problem}"
        return Run(name, labels, problem)

    def read(self, body: bytes, *, limits: LabelLimits = DEFAULT_LABEL_LIMITS) -> Received:
        """Check and group an inflated `WriteRequest` (WireError when it is not one)."""
        if limits != self._limits:
            self._limits = limits
            self._memory.forget()
        fast = read_columns(body, self._memory)
        if fast is None:
            return self.received(self.decode(body), limits=limits)
        return _grouped(fast, self._memory.runs)

    def decode(self, body: bytes) -> list[TimeSeries]:
        """The series of an inflated `WriteRequest` (WireError when it is not one)."""
        return decode_request(body, self.label_runs)

    def key(self, pairs: Labels) -> tuple[str, Labels, str | None]:
        found = self._keys.get(pairs)
        if found is None:
            found = _key(pairs)
            if len(self._keys) >= LABEL_CACHE_SIZE:
                self._keys.clear()
            self._keys[pairs] = found
        return found

    def received(self, series: list[TimeSeries], *, limits: LabelLimits = DEFAULT_LABEL_LIMITS) -> Received:
        """Check and group the series of one request (nothing is written here)."""
        return _received(series, self.key, limits)


def received(series: list[TimeSeries], *, limits: LabelLimits = DEFAULT_LABEL_LIMITS) -> Received:
    """Check and group the series of one request (nothing is written here), remembering nothing."""
    return _received(series, _key, limits)


def _received(
    series: list[TimeSeries], key: Callable[[Labels], tuple[str, Labels, str | None]], limits: LabelLimits
) -> Received:
    refused: list[str] = []
    refused_samples = 0
    samples: list[tuple[str, Labels, int | None, float]] = []
    for one in series:
        name, labels, label_problem = key(one.labels)
        problem = _problem(one, label_problem)
        if problem is not None:
            refused.append(f"series {_describe(one.labels)}: {problem}")
            refused_samples += len(one.values) + one.histograms
            continue
        if len(one.values) == 1:
            samples.append((name, labels, one.timestamps_ms[0], one.values[0]))
        else:
            samples.extend((name, labels, ts, v) for ts, v in zip(one.timestamps_ms, one.values, strict=True))
    errors: list[ParseIssue] = []
    columns = group_columns(samples, errors, now_ms=0, limits=limits)
    for issue in errors:  # over the label limits
        refused.append(issue.message)
    if errors:
        refused_samples += len(samples) - columns.samples
    return Received(columns, list(dict.fromkeys(refused)), refused_samples)  # a series named once


def _grouped(read: Read, runs: list[Run]) -> Received:
    """`read`'s samples by series in order of first appearance, each in time order, a repeated time's
    last value kept; refused series left out and named (as `_received` does)."""
    uniq, first, inverse = np.unique(read.runs, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    rank = np.empty_like(by_first)
    rank[by_first] = np.arange(by_first.size)
    group = rank[inverse.ravel()]
    found = [runs[k] for k in uniq[by_first].tolist()]
    t, v = read.t_ms, read.values
    refused = list(dict.fromkeys(run.problem for run in found if run.problem is not None))
    refused_samples = 0
    if refused:
        bad = np.array([run.problem is not None for run in found])
        drop = bad[group]
        refused_samples = int(drop.sum())
        kept = np.flatnonzero(~bad)
        renumber = np.full(len(found), -1, np.int64)
        renumber[kept] = np.arange(kept.size)
        group, t, v = renumber[group[~drop]], t[~drop], v[~drop]
        found = [found[k] for k in kept.tolist()]
    order = np.lexsort((t, group))  # stable: a repeated time keeps the request's order
    group, t, v = group[order], t[order], v[order]
    keep = np.ones(group.size, dtype=bool)
    keep[:-1] = (group[1:] != group[:-1]) | (t[1:] != t[:-1])
    group, t, v = group[keep], t[keep], v[keep]
    starts = np.searchsorted(group, np.arange(len(found) + 1)).astype(np.int64)
    columns = SeriesColumns([r.name for r in found], [r.labels for r in found], starts, t, v)
    return Received(columns, refused, refused_samples)
