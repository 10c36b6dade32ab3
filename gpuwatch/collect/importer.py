"""Import Prometheus text or OpenMetrics with timestamps into the store (backfill, testing rules).

All or nothing by default: if any line is invalid, nothing is written and every bad line is reported
with its number; `partial=True` writes the good lines and still reports the bad ones. Samples without a
timestamp get `now_ms`. Per series, samples are sorted by time and, where one timestamp appears twice,
the later line wins. As in Prometheus, a label with an empty value is the same as no label. The
import only adds samples; it never deletes or rewrites what is already stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any, Protocol

import numpy as np

from gpuwatch.core.model import (
    DEFAULT_LABEL_LIMITS,
    NO_SERIES_LIMITS,
    LabelLimits,
    Labels,
    SeriesColumns,
    SeriesLimits,
)
from gpuwatch.core.units import MAX_TIME_MS, MIN_TIME_MS
from gpuwatch.promtext.parser import parse
from gpuwatch.promtext.result import ParseIssue

_NAME, _LABELS, _TIME, _VALUE = (itemgetter(i) for i in range(4))
# A C-level loop (`map`, `dict.fromkeys`) holds the GIL until it ends: over a million samples that was
# 0.3-0.5 s a call, three of them back to back, and the sampler's thread waited (a GPU sample 2.5 s
# old in the store). Loops over an import's samples go this many at a time (~10-30 ms each).
_SLICE = 1 << 16


def _mapped(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """`list(map(fn, items))`, a slice at a time (_SLICE)."""
    out: list[Any] = []
    for i in range(0, len(items), _SLICE):
        out.extend(map(fn, items[i : i + _SLICE]))
    return out


class SeriesSink(Protocol):
    """What the importer needs from the store."""

    def write_columns(self, columns: SeriesColumns, limits: SeriesLimits = NO_SERIES_LIMITS) -> None: ...


@dataclass(frozen=True)
class PreparedSeries:
    """One series ready to append: sorted, de-duplicated timestamps and their values."""

    name: str
    labels: Labels
    timestamps_ms: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class Prepared:
    """A parsed body: the series to write (as columns) and the invalid lines."""

    columns: SeriesColumns
    errors: list[ParseIssue]
    lines: int

    @property
    def samples(self) -> int:
        return self.columns.samples

    @property
    def series(self) -> list[PreparedSeries]:
        """The series one by one (built on each call)."""
        return split(self.columns)


@dataclass(frozen=True)
class ImportResult:
    """What an import did: samples and series written (0 when rejected) and the invalid lines."""

    samples: int
    series: int
    errors: list[ParseIssue] = field(default_factory=list)
    oldest_ms: int | None = None

    @property
    def is_rejected(self) -> bool:
        return bool(self.errors) and self.samples == 0 and self.series == 0


def prepare(
    data: bytes | str,
    *,
    now_ms: int,
    openmetrics: bool | None = None,
    limits: LabelLimits = DEFAULT_LABEL_LIMITS,
) -> Prepared:
    """Parse `data` and group its samples per series, sorted by time; nothing is written. A series
    over the label limits is an error (one per series) and is left out."""
    result = parse(data, openmetrics=openmetrics, default_timestamp_ms=now_ms)
    errors = list(result.errors)
    columns = group_columns(result.samples, errors, now_ms=now_ms, limits=limits)
    return Prepared(columns, errors, result.lines)


def group_columns(
    samples: Sequence[tuple[str, Labels, int | None, float]],
    errors: list[ParseIssue],
    *,
    now_ms: int,
    limits: LabelLimits = DEFAULT_LABEL_LIMITS,
) -> SeriesColumns:
    """Group (name, labels, time or None, value) samples per series, in order of first appearance,
    sorted by time, a repeated time's last value kept; a label with an empty value is dropped; a series
    over the label limits is left out and added to `errors` (one per series).

    Columnar: the work per sample is done by C loops (`map`, `zip`, dict building) and numpy; Python
    loops run only over distinct label pairs, and over series when some label is empty or a limit is hit.
    """
    n = len(samples)
    names: list[str] = _mapped(_NAME, samples)
    labels: list[Labels] = _mapped(_LABELS, samples)
    times = _mapped(_TIME, samples)
    if None in times:
        times = [now_ms if t is None else t for t in times]
    if times and (min(times) < MIN_TIME_MS or max(times) > MAX_TIME_MS):
        # OpenMetrics allows 1e19 seconds; int64 milliseconds do not (an OverflowError, a 500)
        kept = _within_time_range(samples, times, errors)
        return group_columns(kept, errors, now_ms=now_ms, limits=limits)
    t = np.array(times, np.int64)
    v = np.array(_mapped(_VALUE, samples), np.float64)
    # Label sets by identity first (a parser hands out one tuple per label text), then their pairs.
    distinct: dict[int, Labels] = {}
    for i in range(0, n, _SLICE):
        part = labels[i : i + _SLICE]
        distinct.update(zip(map(id, part), part, strict=True))
    found_sets = list(distinct.values())
    pairs: set[tuple[str, str]] = set()
    for i in range(0, len(found_sets), _SLICE):
        pairs.update(chain.from_iterable(found_sets[i : i + _SLICE]))
    pair_names, pair_values = list(map(_NAME, pairs)), list(map(_LABELS, pairs))
    if "" in pair_values:  # as in Prometheus, `a=""` is no label `a`
        cleaned = {
            key: tuple(p for p in found if p[1] != "")
            for key, found in distinct.items()
            if any(not value for _, value in found)
        }
        labels = [cleaned.get(id(found), found) for found in labels]
    keys: list[tuple[str, Labels]] = []
    first: dict[tuple[str, Labels], None] = {}
    for i in range(0, n, _SLICE):
        some = list(zip(names[i : i + _SLICE], labels[i : i + _SLICE], strict=True))
        keys.extend(some)
        first.update(dict.fromkeys(some))
    if len(first) == n:  # every sample its own series (an import of new series): nothing to sort
        starts = np.arange(n + 1, dtype=np.int64)
    else:
        position = {key: i for i, key in enumerate(first)}
        group = np.array(_mapped(position.__getitem__, keys), np.int64)
        order = np.lexsort((t, group))  # stable: a repeated time keeps its lines' order
        group, t, v = group[order], t[order], v[order]
        keep = np.ones(n, dtype=bool)
        keep[:-1] = (group[1:] != group[:-1]) | (t[1:] != t[:-1])  # the last line of a repeated time
        group, t, v = group[keep], t[keep], v[keep]
        starts = np.searchsorted(group, np.arange(len(first) + 1)).astype(np.int64)
        distinct_keys = list(first)
        names, labels = _mapped(_NAME, distinct_keys), _mapped(_LABELS, distinct_keys)
    longest = (max(map(len, pair_names), default=0), max(map(len, pair_values), default=0))
    refused = _over_limits(names, labels, longest, errors, limits)
    if refused:
        keep_series = np.ones(len(names), dtype=bool)
        keep_series[refused] = False
        counts = np.diff(starts)
        per_sample = np.repeat(keep_series, counts)
        t, v = t[per_sample], v[per_sample]
        starts = np.concatenate(([0], np.cumsum(counts[keep_series]))).astype(np.int64)
        names = [x for x, kept in zip(names, keep_series.tolist(), strict=True) if kept]
        labels = [x for x, kept in zip(labels, keep_series.tolist(), strict=True) if kept]
    return SeriesColumns(names, labels, starts, t, v)


def _within_time_range(
    samples: Sequence[tuple[str, Labels, int | None, float]], times: list[int], errors: list[ParseIssue]
) -> list[tuple[str, Labels, int | None, float]]:
    """The samples of every series with no time beyond +-2^62 ms; each other series is left out and
    added to `errors` (once)."""
    refused: dict[tuple[str, Labels], int] = {}
    for (name, labels, _, _), ts in zip(samples, times, strict=True):
        if not MIN_TIME_MS <= ts <= MAX_TIME_MS and (name, labels) not in refused:
            refused[(name, labels)] = ts
            errors.append(ParseIssue(0, f"series {name}: timestamp {ts} ms out of range", name))
    return [s for s in samples if (s[0], s[1]) not in refused]


def _over_limits(
    names: list[str],
    labels: list[Labels],
    longest: tuple[int, int],
    errors: list[ParseIssue],
    limits: LabelLimits,
) -> list[int]:
    """The indexes of the series over the label limits, each reported in `errors`. Checked on the
    longest label name and value and the most labels first; series by series only when one is over."""
    name_len, value_len = limits.name_length, limits.value_length
    suspect = bool(limits.labels and labels and max(map(len, labels)) + 1 > limits.labels)
    suspect = suspect or bool(value_len and names and max(map(len, set(names))) > value_len)
    suspect = (
        suspect or bool(name_len and longest[0] > name_len) or bool(value_len and longest[1] > value_len)
    )
    if not suspect:
        return []
    refused = []
    for k, (name, found) in enumerate(zip(names, labels, strict=True)):
        problem = limits.problem((("__name__", name), *found))
        if problem is not None:
            refused.append(k)
            errors.append(ParseIssue(0, f"series {name}: {problem}", name))
    return refused


def split(columns: SeriesColumns) -> list[PreparedSeries]:
    """The series of `columns` one by one."""
    return [
        PreparedSeries(name, found, *columns.series(k))
        for k, (name, found) in enumerate(zip(columns.names, columns.labels, strict=True))
    ]


def group_samples(
    samples: Sequence[tuple[str, Labels, int | None, float]],
    errors: list[ParseIssue],
    *,
    now_ms: int,
    limits: LabelLimits = DEFAULT_LABEL_LIMITS,
) -> list[PreparedSeries]:
    """`group_columns`, as one `PreparedSeries` per series."""
    return split(group_columns(samples, errors, now_ms=now_ms, limits=limits))


def write(store: SeriesSink, prepared: Prepared, limits: SeriesLimits = NO_SERIES_LIMITS) -> ImportResult:
    """Write every prepared series to `store`, all or nothing (one request to its writer, one
    transaction), and wait for it; raise SeriesLimitExceeded if it would make more new series than
    `limits` allow. Return what was written."""
    columns = prepared.columns
    store.write_columns(columns, limits)
    oldest = int(columns.t_ms.min()) if columns.samples else None
    return ImportResult(prepared.samples, len(columns), list(prepared.errors), oldest)


def import_text(
    store: SeriesSink,
    data: bytes | str,
    *,
    now_ms: int,
    openmetrics: bool | None = None,
    partial: bool = False,
    limits: LabelLimits = DEFAULT_LABEL_LIMITS,
    series_limits: SeriesLimits = NO_SERIES_LIMITS,
) -> ImportResult:
    """Parse and import one body; with errors and not `partial`, write nothing and return the errors.
    Raise SeriesLimitExceeded (nothing written) if it would make more new series than `series_limits`
    allow."""
    prepared = prepare(data, now_ms=now_ms, openmetrics=openmetrics, limits=limits)
    if prepared.errors and not partial:
        return ImportResult(0, 0, list(prepared.errors))
    return write(store, prepared, series_limits)


def describe_errors(errors: list[ParseIssue], limit: int = 20) -> str:
    """Return the first `limit` errors as one line: `line 12: ...; line 40: ... (and 3 more)`."""
    text = "; ".join(str(e) for e in errors[:limit])
    if len(errors) > limit:
        text += f" (and {len(errors) - limit} more)"
    return text
