"""Plain data passed between layers: samples, label sets, matchers, series."""

from __future__ import annotations

import collections
import functools
import math
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from gpuwatch.core import regex
from gpuwatch.core.errors import QueryError, SeriesLimitExceeded
from gpuwatch.core.regex import Regex

# A label set: (name, value) pairs sorted by name; never contains "__name__".
Labels = tuple[tuple[str, str], ...]

# Prometheus's staleness marker: a NaN with this exact bit pattern.
STALE_NAN_BITS = 0x7FF0000000000002
STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]


def is_stale(value: float) -> bool:
    """Tell whether `value` is Prometheus's staleness marker (not any NaN)."""
    return math.isnan(value) and struct.unpack("<Q", struct.pack("<d", value))[0] == STALE_NAN_BITS


@dataclass(frozen=True)
class LabelLimits:
    """How many labels a series may carry and how long their names and values may be: the same on
    every write path (scrape, push, import, alerts posted by other senders), so that no request can
    make gpuwatch hold an unbounded label. 0 means no limit, as in Prometheus's scrape configs."""

    labels: int = 64
    name_length: int = 1024
    value_length: int = 4096
    _shortest: int = field(init=False, repr=False, compare=False, default=0)  # the shorter length limit

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_shortest", min(x for x in (self.name_length, self.value_length, 1 << 62) if x)
        )

    def problem(self, labels: Iterable[tuple[str, str]]) -> str | None:
        """Return what is over a limit in `labels` (metric name included as `__name__`), or None."""
        n = 0
        for name, value in labels:
            n += 1
            if self.name_length and len(name) > self.name_length:
                return f"label name {name[:40]!r}... is longer than {self.name_length} characters (label_name_length_limit)"
            if self.value_length and len(value) > self.value_length:
                return f"value of label {name!r} is longer than {self.value_length} characters (label_value_length_limit)"
        if self.labels and n > self.labels:
            return f"more than {self.labels} labels (label_limit)"
        return None

    def is_within(self, longest: int, count: int) -> bool:
        """Tell whether every series of `count` labels whose name, label names and values are at most
        `longest` characters long is within the limits (no string of it need be looked at)."""
        return (not self.labels or count < self.labels) and longest <= self._shortest

    def series_problem(self, name: str, labels: Labels) -> str | None:
        """`problem` of the series `name{labels}`; most series are answered by one C-level pass over
        their strings (a scrape of new series checks every one)."""
        if self.is_within(max(len(name), max(map(len, chain.from_iterable(labels)), default=0)), len(labels)):
            return None
        return self.problem((("__name__", name), *labels))


DEFAULT_LABEL_LIMITS = LabelLimits()


@dataclass(frozen=True)
class SeriesLimits:
    """How many new series one request (a push, an import, a scrape) may bring, and how many a minute:
    the settings `max_new_series_per_request` and `max_new_series_per_minute`. 0 means no limit."""

    per_request: int = 1_000_000
    per_minute: int = 1_000_000

    def problem(self, new: int, in_last_minute: int) -> tuple[str, int] | None:
        """Why `new` more series (after `in_last_minute` in the last 60 s) are refused, with the HTTP
        status that says so (413: never, 429: not now), or None."""
        if self.per_request and new > self.per_request:
            text = f"{new} new series at once, more than max_new_series_per_request ({self.per_request})"
            return text, 413
        if self.per_minute and new and new + in_last_minute > self.per_minute:
            text = (
                f"{new} new series after {in_last_minute} in the last minute, more than "
                f"max_new_series_per_minute ({self.per_minute}); try again later"
            )
            return text, 429
        return None

    def admit(self, new: int, window: MinuteCounts, now_s: float) -> None:
        """Count `new` series in `window`, or raise SeriesLimitExceeded (and count nothing)."""
        problem = self.problem(new, window.total(now_s))
        if problem is not None:
            raise SeriesLimitExceeded(*problem)
        window.add(now_s, new)


DEFAULT_SERIES_LIMITS = SeriesLimits()
NO_SERIES_LIMITS = SeriesLimits(0, 0)


class MinuteCounts:
    """A sum over the last 60 s of a clock's monotonic seconds (the new series a minute brought).
    Not locked: its owner uses it from one thread."""

    def __init__(self) -> None:
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._total = 0

    def total(self, now_s: float) -> int:
        """The sum of what was added in the 60 s before `now_s`."""
        recent = self._recent
        while recent and recent[0][0] <= now_s - 60:
            self._total -= recent.popleft()[1]
        return self._total

    def add(self, now_s: float, n: int) -> None:
        if n:
            self._recent.append((now_s, n))
            self._total += n


def make_labels(labels: Mapping[str, str]) -> Labels:
    """Return `labels` as a sorted tuple, dropping `__name__` and empty values."""
    pairs = [kv for kv in labels.items() if kv[1] != "" and kv[0] != "__name__"]
    pairs.sort()
    return tuple(pairs)


@functools.lru_cache(maxsize=65_536)
def intern_labels(labels: Labels) -> Labels:
    """Return one shared tuple for each label set: the first equal one met (the 65,536 most recently
    used are remembered).

    The store's writer finds a series by the identity of its label tuple before it hashes anything,
    and remembers each tuple it meets; a source that builds an equal tuple afresh on every tick
    (self-monitoring counters, rule outputs) would add one entry per tick and always take the slow path.
    """
    return labels


def stable_labels(labels: Mapping[str, str]) -> Labels:
    """`make_labels`, interned: the same tuple object for the same label set on every call."""
    return intern_labels(make_labels(labels))


class Sample(NamedTuple):
    """One value of one series, timestamped by the batch that carries it."""

    name: str
    labels: Labels
    value: float


@dataclass(frozen=True)
class Batch:
    """Samples taken at one instant (Unix milliseconds)."""

    timestamp_ms: int
    samples: Sequence[Sample]


class SeriesTable:
    """A source's series numbered densely from 0, for batches that carry numbers instead of labels.

    A source that writes the same series again and again (a scrape target) adds each series once and
    hands the store `TableSamples`: an array of these numbers and an array of values. The store keeps
    its own number -> series id array per table (by the table's identity, weakly), so a batch costs it
    one numpy take instead of a label lookup per sample. Series are only ever appended; a source that
    wants to forget series starts a new table. The same (name, labels) may appear under two numbers.
    Labels are in `make_labels` form (sorted, no `__name__`, no empty value): the store takes them as
    they are.
    """

    __slots__ = ("__weakref__", "labels", "names")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.labels: list[Labels] = []

    def __len__(self) -> int:
        return len(self.names)

    def add(self, name: str, labels: Labels) -> int:
        """Append a series; return its number."""
        self.labels.append(labels)
        self.names.append(name)  # last: a reader that sees the new length sees both lists filled
        return len(self.names) - 1

    def extend(self, names: list[str], labels: list[Labels]) -> None:
        """Append series (as many names as label sets), numbered on from `len(self)`."""
        self.labels.extend(labels)
        self.names.extend(names)  # last, as in add


class TableSamples(Sequence[Sample]):
    """Samples as numbers into a `SeriesTable` (`numbers`, intp) and `values` (float64), in order.

    Reads as a sequence of `Sample`s for anyone who iterates it; the store takes the arrays directly.
    Both arrays belong to the batch: nobody changes them after it is made.
    """

    __slots__ = ("numbers", "table", "values")

    def __init__(self, table: SeriesTable, numbers: np.ndarray, values: np.ndarray) -> None:
        self.table = table
        self.numbers = numbers
        self.values = values

    def __len__(self) -> int:
        return int(self.numbers.size)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        k = int(self.numbers[i])
        return Sample(self.table.names[k], self.table.labels[k], float(self.values[i]))

    def __iter__(self) -> Any:
        names, labels = self.table.names, self.table.labels
        for k, v in zip(self.numbers.tolist(), self.values.tolist(), strict=True):
            yield Sample(names[k], labels[k], v)


class SeriesColumns:
    """Many series and their samples as columns (an import): series k is `names[k]{labels[k]}`, its
    samples `t_ms[starts[k]:starts[k + 1]]` and `values[...]`, times ascending and distinct.

    Labels are in `make_labels` form (sorted, no `__name__`, no empty value) and no series appears
    twice: the store takes them as they are. Nobody changes the arrays after it is made.
    """

    __slots__ = ("labels", "names", "starts", "t_ms", "values")

    def __init__(
        self, names: list[str], labels: list[Labels], starts: np.ndarray, t_ms: np.ndarray, values: np.ndarray
    ) -> None:
        if len(names) != len(labels) or starts.size != len(names) + 1 or t_ms.shape != values.shape:
            raise ValueError("names, labels, starts (one more), t_ms and values (as long) do not match")
        self.names = names
        self.labels = labels
        self.starts = starts
        self.t_ms = t_ms
        self.values = values

    def __len__(self) -> int:
        return len(self.names)

    @property
    def samples(self) -> int:
        return int(self.t_ms.size)

    def series(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Series k's timestamps and values (views)."""
        lo, hi = int(self.starts[k]), int(self.starts[k + 1])
        return self.t_ms[lo:hi], self.values[lo:hi]


class Matcher(NamedTuple):
    """A label matcher as in PromQL: op is one of '=', '!=', '=~', '!~'.

    Regexes are RE2, anchored (`^(?s:value)$`), as in Prometheus. The metric name is
    matched as the label `__name__`.
    """

    name: str
    op: str
    value: str


def _matcher_regex(pattern: str) -> Regex:
    try:
        return regex.compile_anchored(pattern)
    except regex.RegexError as e:
        raise QueryError(str(e)) from None


def is_utf8(text: str) -> bool:
    """Whether `text` is valid UTF-8: no lone surrogate (JSON's "\\udcff"), which DuckDB cannot store."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def matcher_predicate(m: Matcher) -> Callable[[str], bool]:
    """Return a test of one label value (empty when absent) against `m`; raise QueryError for a bad one."""
    if m.op == "=":
        return lambda v: v == m.value
    if m.op == "!=":
        return lambda v: v != m.value
    if m.op in ("=~", "!~"):
        rx = _matcher_regex(m.value)
        if m.op == "=~":
            return lambda v: rx.search(v) is not None
        return lambda v: rx.search(v) is None
    raise QueryError(f"unknown matcher operator {m.op!r}; expected one of =, !=, =~, !~")


@dataclass(frozen=True)
class SeriesData:
    """One series' samples in a time range, sorted by time."""

    name: str
    labels: Labels
    timestamps_ms: np.ndarray  # int64, ascending
    values: np.ndarray  # float64; may hold STALE_NAN
    # Native histogram samples by timestamp, where a source supplies them (values hold NaN there).
    histograms: Mapping[int, Any] | None = None
    # True where the source knows no value is a staleness marker (the engine then need not look).
    is_stale_free: bool = False

    def label_dict(self) -> dict[str, str]:
        """Return the labels as a dict including `__name__`."""
        return {"__name__": self.name, **dict(self.labels)}


def last_samples(data: Sequence[SeriesData], start_ms: int, end_ms: int) -> list[SeriesData]:
    """Return each series' last sample in [start_ms, end_ms], series without one left out: what a
    source's `select_last` answers, from what its `select` read."""
    out = []
    for s in data:
        t = s.timestamps_ms
        if not t.size:
            continue
        hi = t.size if t[-1] <= end_ms else int(t.searchsorted(end_ms, side="right"))
        if hi and t[hi - 1] >= start_ms:
            out.append(SeriesData(s.name, s.labels, t[hi - 1 : hi], s.values[hi - 1 : hi], s.histograms))
    return out


@dataclass(frozen=True)
class MetricInfo:
    """Metadata of a metric family, for HELP/TYPE lines and the docs."""

    name: str
    type: str  # gauge | counter | histogram | summary | unknown
    help: str
    unit: str = ""
    labels: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class RunRecord:
    """One training run as stored; times in Unix milliseconds, `config` and `gpus` decoded from JSON."""

    name: str
    status: str  # running | ok | failed
    start_ms: int | None
    end_ms: int | None
    total_steps: int | None
    config: dict[str, Any] | None
    host: str | None
    gpus: list[Any] | None
    last_step: float | None
    last_seen_ms: int | None
    process: dict[str, Any] | None = None  # what the SDK said of its process: pid, launcher_pid, devices


@dataclass(frozen=True)
class RunUpdate:
    """A change to one run; None fields leave the stored value as it is.

    `action` is `init` (start or resume: status running, end cleared), `finish` (status and end set)
    or `seen` (last step and last seen moved forward; creates a running run if the name is new).
    """

    name: str
    action: str
    time_ms: int
    status: str | None = None
    total_steps: int | None = None
    config: dict[str, Any] | None = None
    host: str | None = None
    gpus: list[Any] | None = None
    last_step: float | None = None
    process: dict[str, Any] | None = None


class LogLine(NamedTuple):
    """One line of a tailed log file as stored; `level` is ERROR, WARN, INFO, DEBUG or ''."""

    time_ms: int
    file: str
    run: str
    level: str
    text: str


class LogOffset(NamedTuple):
    """How far a tailed file has been read: the byte after its last complete line, per path and inode."""

    path: str
    inode: int
    offset: int


class SilenceRecord(NamedTuple):
    """One silence as stored: matchers as (name, value, is_regex, is_equal); times in Unix milliseconds."""

    id: str
    matchers: tuple[tuple[str, str, bool, bool], ...]
    starts_at_ms: int
    ends_at_ms: int
    created_by: str
    comment: str
    updated_at_ms: int
