"""Scrape one Prometheus-format target: fetch over HTTP, parse, label, relabel, track staleness.

`Target.scrape()` returns the batches to store: the scraped samples with the target's `job` and
`instance` (and static) labels, Prometheus's report series (`up`, `scrape_duration_seconds`,
`scrape_samples_scraped`, `scrape_samples_post_metric_relabeling`, `scrape_series_added`) plus
`gpuwatch_scrape_invalid_lines`, and a staleness marker for every series the previous scrape had and
this one has not (all of them when the target is down), so queries stop seeing it at once.
Fetching is separate (`fetch(spec, timeout_s) -> FetchResult`), so tests can hand in bytes.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from itertools import chain, repeat
from operator import itemgetter
from typing import Any, cast

import numpy as np

from gpuwatch.collect.fetch import Fetch
from gpuwatch.collect.relabel import relabel
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import ScrapeError
from gpuwatch.core.model import (
    STALE_NAN,
    Batch,
    Labels,
    MinuteCounts,
    Sample,
    SeriesTable,
    TableSamples,
    make_labels,
)
from gpuwatch.core.units import format_duration
from gpuwatch.promtext.formats import is_openmetrics_content_type
from gpuwatch.promtext.parser import Parser
from gpuwatch.promtext.result import FamilyMeta, ParsedSample, ParseResult

REPORT_NAMES = (
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
    "gpuwatch_scrape_invalid_lines",
)
_MAX_CACHE = 500_000
_MAX_STAMPED = 1_000_000  # series whose newest timestamped sample a target remembers
_NEVER = "0001-01-01T00:00:00Z"
_NO_NUMBERS = np.zeros(0, np.intp)
_NO_VALUES = np.zeros(0, np.float64)
_VALUE = itemgetter(3)  # a parsed sample's value
_NAME, _LABELS = itemgetter(0), itemgetter(1)  # of a parsed sample or a (name, labels) key
_OLDEST = -(2**63)

SeriesKey = tuple[str, Labels]


def _iso(ms: int | None) -> str:
    if ms is None:
        return _NEVER
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


class Target:
    """One target's scraper and its state: the label caches, the series seen last time, its health.

    The scrape cache (as Prometheus's scrapeCache): the raw text of a line's series (the parser's
    `keys`) -> the number of the final series it becomes (after target labels, `honor_labels` and
    metric_relabel_configs) in the target's `SeriesTable`, or -1 where metric_relabel_configs drop it;
    an unchanged line then costs a dict lookup, done for the whole page in one `map`. Lines without a
    key (timestamps, escapes, OpenMetrics) are looked up by parsed name and labels. Staleness and
    `scrape_series_added` compare scrape numbers kept per series number in an array, and the batch
    carries the numbers and values as arrays (`TableSamples`), so the store maps them to its series
    ids with one numpy take. The cache lives as long as the target: a configuration change (relabel
    rules included) makes a new `TargetSpec` and so a new `Target` with an empty cache.
    """

    def __init__(self, spec: TargetSpec, fetch: Fetch, clock: Clock) -> None:
        self.spec = spec
        self._fetch = fetch
        self._clock = clock
        self._parser = Parser()
        self._target_names = frozenset(k for k, _ in spec.labels)
        # texts that a line's series text must lack for `_labels`'s first branch (see _new_numbers)
        self._clashes = ('""', *sorted(self._target_names))
        self._longest_target = max(map(len, chain.from_iterable(spec.labels)), default=0)
        self._new_table([])
        self._gen = 0  # number of the last scrape; a failed one counts, with no series
        self.health = "unknown"
        self.last_error = ""
        self.last_scrape_ms: int | None = None
        self.last_duration_s = 0.0
        self.last_invalid_lines = 0
        self.first_invalid_line = ""
        self.invalid_lines_total = 0
        self.last_out_of_order = 0  # timestamped samples of the last scrape not newer than the series' last
        self.scrapes = 0
        self.metadata: dict[str, FamilyMeta] = {}  # HELP/TYPE/UNIT from the last successful scrape
        self.lock = threading.Lock()  # held while a scrape runs: never two at once for one target
        # Per series, the newest timestamp stored of its timestamped samples (federation sends them).
        self._stamped_ms: dict[SeriesKey, int] = {}
        self._made: list[SeriesKey] = []  # series new to this target in this scrape (max_new_series_*)
        self._recent = MinuteCounts()  # ... and those of the last minute's scrapes

    def _new_table(self, keep: list[SeriesKey]) -> None:
        """Start a new series table holding the report series and `keep` (the last scrape's series)."""
        table = self._table = SeriesTable()
        self._report = np.array([table.add(n, self.spec.labels) for n in REPORT_NAMES], np.intp)
        self._by_key: dict[str, int] = {}  # raw series text -> number of the final series, -1: dropped
        self._by_labels: dict[SeriesKey, int] = {}  # parsed (name, labels) -> the same
        self._series: dict[SeriesKey, int] = {k: table.add(*k) for k in keep}  # final -> its number
        self._gens = np.full(max(64, 2 * len(table)), -1, np.int64)  # number -> last scrape that had it
        self._gens[len(REPORT_NAMES) : len(table)] = getattr(self, "_gen", 0)
        self._last = np.arange(len(REPORT_NAMES), len(table), dtype=np.intp)  # last scrape's, each once

    def _labels(self, name: str, labels: Labels) -> SeriesKey | None:
        """Attach the target labels (honor_labels decides conflicts), then metric_relabel_configs."""
        spec = self.spec
        d = dict(labels)
        if not spec.relabel and self._target_names.isdisjoint(d) and "" not in d.values():
            return name, tuple(sorted((*labels, *spec.labels)))  # (make_labels of the same, 2x as fast)
        for k, v in spec.labels:
            if spec.honor_labels:
                if not d.get(k):
                    d[k] = v
            else:
                old = d.get(k)
                if old:
                    exported = "exported_" + k
                    while exported in d:
                        exported = "exported_" + exported
                    d[exported] = old
                d[k] = v
        if spec.relabel:
            d["__name__"] = name
            result = relabel(d, spec.relabel)
            if result is None:
                return None
            name = result.pop("__name__", "")
            if not name:
                return None
        return name, make_labels(d)

    def _final(self, name: str, labels: Labels) -> int:
        final = self._labels(name, labels)
        if final is None:
            return -1
        found = self._series.get(final)
        if found is None:
            problem = self.spec.label_limits.series_problem(*final)
            if problem is not None:  # as Prometheus's label limits: the whole scrape fails
                raise ScrapeError(f"label limits exceeded: {final[0]}: {problem}")
            found = self._series[final] = self._table.add(*final)
            self._made.append(final)
        return found

    def _new_numbers(self, keys: list[str], samples: list[ParsedSample]) -> list[int]:
        """The numbers of text lines not in the scrape cache, `keys[i]` the series text of `samples[i]`.

        A keyed line has no escapes: its name and label names and values stand in its key as they
        are. So where no key holds `""` (an empty value) or a target label's name and nothing is
        relabelled, every series takes `_labels`'s first branch, and where no key is longer than the
        label limits' lengths, none needs its strings looked at: the lines are then joined and numbered
        in C-level passes (a page of new series; a big target's page after `_trim`). Otherwise line by
        line.
        """
        spec, series, table = self.spec, self._series, self._table
        target = spec.labels
        if (
            spec.relabel
            or any(map("\n".join(keys).__contains__, self._clashes))
            or not spec.label_limits.is_within(
                max(max(map(len, keys)), self._longest_target),
                len(target) + max(map(len, map(_LABELS, samples))),
            )
        ):
            by_key = self._by_key
            found: list[int] = []
            for key, (name, labels, _, _) in zip(keys, samples, strict=True):
                number = by_key.get(key)  # a page may name a new series twice
                if number is None:
                    number = by_key[key] = self._final(name, labels)
                found.append(number)
            return found
        finals = [(name, tuple(sorted((*labels, *target)))) for name, labels, _, _ in samples]
        start, before = len(table), len(series)
        numbers = list(range(start, start + len(finals)))  # (one int object per series)
        got = list(map(series.setdefault, finals, numbers))  # a known series keeps its number
        if len(series) - before < len(finals):  # some known, or one named twice
            # the new ones took their line's number, with gaps: number them on from `start` in page order
            taken = np.array(got, np.intp)
            first = np.flatnonzero(taken == np.arange(start, start + len(finals))).tolist()
            finals = list(map(finals.__getitem__, first))
            numbers = list(range(start, start + len(finals)))
            series.update(zip(finals, numbers, strict=True))
            renumber = dict(zip(map(start.__add__, first), numbers, strict=True))
            for j in np.flatnonzero(taken >= start).tolist():
                got[j] = renumber[got[j]]
        table.extend(list(map(_NAME, finals)), list(map(_LABELS, finals)))
        self._made.extend(finals)
        self._by_key.update(zip(keys, got, strict=True))
        return got

    def _lookup(self, name: str, labels: Labels) -> int:
        key = (name, labels)
        found = self._by_labels.get(key)
        if found is None:
            found = self._by_labels[key] = self._final(name, labels)
        return found

    def _trim(self) -> None:
        """Forget cached lines and series once there are too many (`_MAX_CACHE`, or twice the last
        scrape's where that is more: a bigger page stays known); keep the last scrape's series."""
        bound = max(_MAX_CACHE, 2 * self._last.size)
        if max(len(self._by_key), len(self._by_labels), len(self._series)) > bound:
            names, labels = self._table.names, self._table.labels
            self._new_table([(names[i], labels[i]) for i in self._last.tolist()])

    def _numbers(
        self, parsed: ParseResult, stamped: dict[int, list[Sample]], newest: dict[SeriesKey, int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's series number (-1: dropped) and value; timestamped samples go to `stamped`
        (by time) and the newest time of each of their series to `newest`."""
        samples, keys, n = parsed.samples, parsed.keys, len(parsed.samples)
        by_key = self._by_key
        if len(keys) == n and None not in keys:  # text format, every line `<series> <value>`
            text_keys = cast("list[str]", keys)
            index = np.fromiter(map(by_key.get, text_keys, repeat(-2)), np.intp, n)
            if n and index.min() < -1:  # lines not seen before (-2)
                new = np.flatnonzero(index == -2).tolist()
                index[new] = self._new_numbers(
                    list(map(text_keys.__getitem__, new)), list(map(samples.__getitem__, new))
                )
            return index, np.fromiter(map(_VALUE, samples), np.float64, n)
        numbers: list[int] = []
        values: list[float] = []
        honor_ts = self.spec.honor_timestamps
        names, labels = self._table.names, self._table.labels
        stamped_ms = self._stamped_ms
        for (name, labels_, ts, value), key in zip(
            samples, keys if len(keys) == n else repeat(None), strict=False
        ):
            if key is None:
                number = self._lookup(name, labels_)
            else:
                number = by_key.get(key, -2)
                if number == -2:
                    number = by_key[key] = self._final(name, labels_)
            if ts is None or not honor_ts or number < 0:
                numbers.append(number)
                values.append(value)
                continue
            final = (names[number], labels[number])
            if ts > newest.get(final, stamped_ms.get(final, _OLDEST)):
                newest[final] = ts
                stamped.setdefault(ts, []).append(Sample(final[0], final[1], value))
            else:
                # Not newer than what this target already gave for the series: a federated sample
                # that did not change since the last scrape (a duplicate) or one out of order.
                # Prometheus drops both (the duplicate silently); so does gpuwatch.
                self.last_out_of_order += 1
        return np.array(numbers, np.intp), np.array(values, np.float64)

    def _admit(self, now_s: float) -> None:
        """Hold this scrape's new series to the target's series limits, as Prometheus holds a page to
        sample_limit: over them, the scrape fails and the target forgets the series it brought."""
        made, self._made = self._made, []
        problem = self.spec.series_limits.problem(len(made), self._recent.total(now_s))
        if problem is not None:
            names, labels = self._table.names, self._table.labels
            last = [(names[i], labels[i]) for i in self._last.tolist()]
            skip = {*made, *last}
            self._new_table([*last, *(key for key in self._series if key not in skip)])
            first = len(REPORT_NAMES) + len(last)  # the others known: not in the last scrape
            self._last, self._gens[first : len(self._table)] = self._last[: len(last)], -1
            raise ScrapeError(f"new series limit exceeded: {problem[0]}")
        self._recent.add(now_s, len(made))

    def _mark(self, index: np.ndarray, gen: int) -> tuple[np.ndarray, int]:
        """Record that scrape `gen` had the series `index`; return them each once, and how many are new."""
        gens = self._gens
        if gens.size < len(self._table):
            grown = np.full(2 * len(self._table), -1, np.int64)
            grown[: gens.size] = gens
            gens = self._gens = grown
        if index.size and np.bincount(index).max() > 1:  # a series twice in one page: first one counts
            _, first = np.unique(index, return_index=True)
            index = index[np.sort(first)]
        added = int(np.count_nonzero(gens[index] != gen - 1))
        gens[index] = gen
        return index, added

    def scrape(self) -> list[Batch]:
        """Scrape once; return the batches to store (the first one is stamped with the scrape time)."""
        clock, spec = self._clock, self.spec
        now_ms = clock.now_ms()
        start = clock.monotonic()
        index, values = _NO_NUMBERS, _NO_VALUES
        stamped: dict[int, list[Sample]] = {}
        newest: dict[SeriesKey, int] = {}
        current = _NO_NUMBERS
        gen, added = self._gen + 1, 0
        error, scraped, invalid, first_invalid = "", 0, 0, ""
        self.last_out_of_order = 0
        self._made = []
        try:
            result = self._fetch(spec, spec.timeout_s)
            parsed = self._parser.parse(
                result.body, openmetrics=is_openmetrics_content_type(result.content_type)
            )
            invalid = len(parsed.errors)
            first_invalid = str(parsed.errors[0]) if parsed.errors else ""
            scraped = len(parsed.samples)
            if invalid and not scraped:  # an HTML error page, a wrong port: a failed scrape, as in Prometheus
                raise ScrapeError(f"no valid line in the page ({invalid} invalid; {first_invalid})")
            if parsed.metadata:
                self.metadata = parsed.metadata
            self._trim()
            index, values = self._numbers(parsed, stamped, newest)
            if index.size and index.min() < 0:
                keep = index >= 0
                index, values = index[keep], values[keep]
            post = index.size + sum(len(s) for s in stamped.values())
            if spec.sample_limit and post > spec.sample_limit:
                raise ScrapeError(
                    f"sample_limit exceeded: {post} samples after relabelling, limit {spec.sample_limit}"
                )
            self._admit(clock.monotonic())
            current, added = self._mark(index, gen)
            if newest:
                if len(self._stamped_ms) > _MAX_STAMPED:
                    self._stamped_ms.clear()
                self._stamped_ms.update(newest)
        except ScrapeError as e:
            error = str(e)
            index, values, stamped, current, added = _NO_NUMBERS, _NO_VALUES, {}, _NO_NUMBERS, 0
            gen += 1  # a number no series has: the next scrape counts every series as added
        post = index.size + sum(len(s) for s in stamped.values())
        duration = clock.monotonic() - start
        last = self._last
        stale = last[self._gens[last] != gen] if last.size else last
        self._gen, self._last = gen, current
        report = np.array(
            [0.0 if error else 1.0, duration, float(scraped), float(post), float(added), float(invalid)]
        )
        samples = TableSamples(
            self._table,
            np.concatenate((index, stale, self._report)),
            np.concatenate((values, np.full(stale.size, STALE_NAN), report)),
        )
        self.scrapes += 1
        self.health = "down" if error else "up"
        self.last_error = error
        self.last_scrape_ms = now_ms
        self.last_duration_s = duration
        self.last_invalid_lines = invalid
        self.first_invalid_line = first_invalid
        self.invalid_lines_total += invalid
        return [Batch(now_ms, samples), *(Batch(ts, s) for ts, s in sorted(stamped.items()))]

    def has_series(self, name: str, labels: Labels) -> bool:
        """Whether this target's scrapes made the series `name{labels}` (its report series included)."""
        return (name, labels) in self._series or (labels == self.spec.labels and name in REPORT_NAMES)

    def stale_batch(self, now_ms: int) -> Batch:
        """Staleness markers for every series of this target (it was removed from the configuration)."""
        names, labels = self._table.names, self._table.labels
        keys = [
            *((names[i], labels[i]) for i in self._last.tolist()),
            *((n, self.spec.labels) for n in REPORT_NAMES),
        ]
        self._last = _NO_NUMBERS
        self._gen += 1
        return Batch(now_ms, [Sample(n, labels, STALE_NAN) for n, labels in keys])

    def state(self) -> dict[str, Any]:
        """Return this target as Prometheus's /api/v1/targets shows an active target."""
        spec = self.spec
        return {
            "discoveredLabels": dict(spec.discovered),
            "labels": dict(spec.labels),
            "scrapePool": spec.job,
            "scrapeUrl": spec.url,
            "globalUrl": spec.url,
            "lastError": self.last_error,
            "lastScrape": _iso(self.last_scrape_ms),
            "lastScrapeDuration": self.last_duration_s,
            "health": self.health,
            "scrapeInterval": format_duration(spec.interval_s),
            "scrapeTimeout": format_duration(spec.timeout_s),
            "invalidLines": self.last_invalid_lines,
            "firstInvalidLine": self.first_invalid_line,
        }
