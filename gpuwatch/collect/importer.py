"""Import Prometheus text or OpenMetrics with timestamps into the store (backfill, testing rules).

All or nothing by default: if any line is invalid, nothing is written and every bad line is reported
with its number; `partial=True` writes the good lines and still reports the bad ones. Samples without a
timestamp get `now_ms`. Per series, samples are sorted by time and, where one timestamp appears twice,
the later line wins. As in Prometheus, a label with an empty value is the same as no label. The
import only adds samples; it never deletes or rewrites what is already stored.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpuwatch.model import DEFAULT_LABEL_LIMITS, LabelLimits, Labels
from gpuwatch.promtext.parser import ParseIssue, parse
from gpuwatch.units import MAX_TIME_MS, MIN_TIME_MS


class SeriesSink(Protocol):
    """What the importer needs from the store."""

    def append_many(self, series: Sequence[tuple[str, Labels, np.ndarray, np.ndarray]]) -> None: ...

    def flush(self) -> None: ...


@dataclass(frozen=True)
class PreparedSeries:
    """One series ready to append: sorted, de-duplicated timestamps and their values."""

    name: str
    labels: Labels
    timestamps_ms: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class Prepared:
    """A parsed body: the series to write and the invalid lines."""

    series: list[PreparedSeries]
    errors: list[ParseIssue]
    lines: int

    @property
    def samples(self) -> int:
        return sum(len(s.timestamps_ms) for s in self.series)


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
    series = group_samples(result.samples, errors, now_ms=now_ms, limits=limits)
    return Prepared(series, errors, result.lines)


def group_samples(
    samples: Iterable[tuple[str, Labels, int | None, float]],
    errors: list[ParseIssue],
    *,
    now_ms: int,
    limits: LabelLimits = DEFAULT_LABEL_LIMITS,
) -> list[PreparedSeries]:
    """Group (name, labels, time or None, value) samples per series, sorted by time, a repeated time's
    last value kept; a series over the label limits or with a time beyond +-2^62 ms is left out and
    added to `errors` (one per series)."""
    groups: dict[tuple[str, Labels], tuple[list[int], list[float]]] = {}
    refused: set[tuple[str, Labels]] = set()
    clean: dict[Labels, Labels] = {}
    for name, labels, ts, value in samples:
        kept = clean.get(labels)
        if kept is None:
            kept = clean[labels] = tuple(p for p in labels if p[1] != "")
        entry = groups.get((name, kept))
        if entry is None:
            if (name, kept) in refused:
                continue
            problem = limits.problem((("__name__", name), *kept))
            if problem is not None:
                refused.add((name, kept))
                errors.append(ParseIssue(0, f"series {name}: {problem}", name))
                continue
            entry = groups[(name, kept)] = ([], [])
        if ts is not None and not MIN_TIME_MS <= ts <= MAX_TIME_MS:
            # OpenMetrics allows 1e19 seconds; int64 milliseconds do not (an OverflowError, a 500)
            del groups[(name, kept)]
            refused.add((name, kept))
            errors.append(ParseIssue(0, f"series {name}: timestamp {ts} ms out of range", name))
            continue
        entry[0].append(now_ms if ts is None else ts)
        entry[1].append(value)
    series = []
    for (name, labels), (ts_list, value_list) in groups.items():
        if len(ts_list) == 1:  # most series of a big import of new series: nothing to sort
            one_t, one_v = np.array(ts_list, np.int64), np.array(value_list, np.float64)
            series.append(PreparedSeries(name, labels, one_t, one_v))
            continue
        t = np.asarray(ts_list, dtype=np.int64)
        v = np.asarray(value_list, dtype=np.float64)
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
        keep = np.ones(len(t), dtype=bool)
        keep[:-1] = t[1:] != t[:-1]  # a repeated timestamp: keep the last line's value
        series.append(PreparedSeries(name, labels, t[keep], v[keep]))
    return series


def write(store: SeriesSink, prepared: Prepared) -> ImportResult:
    """Append every prepared series to `store` (one request to its writer) and flush; return what was
    written."""
    kept = [s for s in prepared.series if len(s.timestamps_ms)]
    store.append_many([(s.name, s.labels, s.timestamps_ms, s.values) for s in kept])
    store.flush()
    oldest = min((int(s.timestamps_ms[0]) for s in kept), default=None)
    return ImportResult(prepared.samples, len(prepared.series), list(prepared.errors), oldest)


def import_text(
    store: SeriesSink,
    data: bytes | str,
    *,
    now_ms: int,
    openmetrics: bool | None = None,
    partial: bool = False,
    limits: LabelLimits = DEFAULT_LABEL_LIMITS,
) -> ImportResult:
    """Parse and import one body; with errors and not `partial`, write nothing and return the errors."""
    prepared = prepare(data, now_ms=now_ms, openmetrics=openmetrics, limits=limits)
    if prepared.errors and not partial:
        return ImportResult(0, 0, list(prepared.errors))
    return write(store, prepared)


def describe_errors(errors: list[ParseIssue], limit: int = 20) -> str:
    """Return the first `limit` errors as one line: `line 12: ...; line 40: ... (and 3 more)`."""
    text = "; ".join(str(e) for e in errors[:limit])
    if len(errors) > limit:
        text += f" (and {len(errors) - limit} more)"
    return text
