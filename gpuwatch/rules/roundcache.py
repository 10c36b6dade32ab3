"""Share store reads between the rules of one evaluation round.

The built-in pack has dozens of rules over a few dozen metrics; read one selector at a time, each read
is a DuckDB round trip of a few milliseconds and a round of the pack costs hundreds of them.
`RoundCache` sits between the rules' query engine and the store:

- it remembers, per metric name, the time window (relative to the evaluation time) the rules read in
  the previous round, and at the start of a round (`begin`) fetches all those names in one store read
  per distinct window;
- a read of a name not fetched yet (the first round, a new rule, a group that runs every other round)
  fetches every series of that name, and a later, wider read of it widens that; every read is
  filtered by its other matchers in memory;
- what a recording rule appends (`wrote`) is shown to later reads of its name from the point where
  the rule manager would otherwise flush the store (`publish`): as the store would, without the wait;
- at the end of the round (`end`) the samples are dropped: each round reads afresh.

Instant selectors ask only for each series' last sample (`select_last`): those names are planned and
prefetched apart from the range reads, with the source's `select_last` (the store answers it from
memory), so the 5-minute lookback window is not read sample by sample.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import numpy as np

from gpuwatch.core.model import Labels, Matcher, Sample, SeriesData, last_samples, matcher_predicate
from gpuwatch.query.source import Queryable

NAME = "__name__"


def _alternatives(names: list[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(names))


class RoundCache:
    """A Queryable over `source` that reads each metric name about once per round (module docstring)."""

    def __init__(self, source: Queryable) -> None:
        self.source = source
        self._lock = threading.Lock()
        self._by_name: dict[str, tuple[int, int, list[SeriesData]]] = {}
        self._now_ms = 0
        self._plan: dict[str, tuple[int, int]] = {}  # name -> window read last round, relative to now
        self._seen: dict[str, tuple[int, int]] = {}  # the same, for this round
        # Last-sample reads, by name and exact window (windows of one name are not merged: a last
        # sample cannot be cut from a wider window's last sample).
        self._last_by_name: dict[tuple[str, int, int], list[SeriesData]] = {}
        self._last_plan: set[tuple[str, int, int]] = set()
        self._last_seen: set[tuple[str, int, int]] = set()
        # Samples rules appended this round, not flushed yet, by name and labels: (t, value).
        self._pending: dict[str, dict[Labels, tuple[int, float]]] = {}  # not to be seen yet
        self._written: dict[str, dict[Labels, tuple[int, float]]] = {}  # seen by reads by name
        self.reads = 0  # store reads since start (for tests and the benchmark)

    def begin(self, now_ms: int) -> None:
        """Start a round evaluated at `now_ms`: prefetch what the last round read."""
        with self._lock:
            if self._seen or self._last_seen:
                self._plan, self._seen = self._seen, {}
                self._last_plan, self._last_seen = self._last_seen, set()
            self._drop()
            self._now_ms = now_ms
            windows: dict[tuple[int, int], list[str]] = {}
            for name, window in self._plan.items():
                windows.setdefault(window, []).append(name)
            last_windows: dict[tuple[int, int], list[str]] = {}
            for name, lo, hi in self._last_plan:
                last_windows.setdefault((lo, hi), []).append(name)
        for (lo, hi), names in sorted(last_windows.items()):
            start, end = now_ms + lo, now_ms + hi
            data = self.source.select_last([Matcher(NAME, "=~", _alternatives(names))], start, end)
            self.reads += 1
            found: dict[str, list[SeriesData]] = {n: [] for n in names}
            for s in data:
                found.setdefault(s.name, []).append(s)
            with self._lock:
                for n, series in found.items():
                    self._last_by_name[(n, start, end)] = series
        for (lo, hi), names in sorted(windows.items()):
            start, end = now_ms + lo, now_ms + hi
            data = self.source.select([Matcher(NAME, "=~", _alternatives(names))], start, end)
            self.reads += 1
            found = {n: [] for n in names}
            for s in data:
                found.setdefault(s.name, []).append(s)
            with self._lock:
                for n, series in found.items():
                    self._by_name[n] = (start, end, series)

    def end(self) -> None:
        """End the round: drop what it read (what it learned to prefetch stays)."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        self._by_name.clear()
        self._last_by_name.clear()
        self._pending.clear()
        self._written.clear()

    def clear(self) -> None:
        """Forget all data and what was learned (rules were replaced)."""
        with self._lock:
            self._drop()
            self._plan.clear()
            self._seen.clear()
            self._last_plan.clear()
            self._last_seen.clear()

    def wrote(self, samples: Sequence[Sample], t_ms: int) -> None:
        """Note samples a rule has just appended to the store (not yet flushed): from `publish` on,
        this round's reads of their names show them as the store will once they are flushed."""
        with self._lock:
            for x in samples:
                self._pending.setdefault(x.name, {})[x.labels] = (t_ms, x.value)

    def publish(self) -> None:
        """Let this round's reads by name see what `wrote` noted (where a flush would have)."""
        with self._lock:
            for name, writes in self._pending.items():
                self._written.setdefault(name, {}).update(writes)
            self._pending.clear()

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        name = next((m.value for m in matchers if m.name == NAME and m.op == "="), None)
        if name is None:  # `{job="x"}` alone: nothing to share by name
            self.reads += 1
            return self.source.select(matchers, start_ms, end_ms)
        with self._lock:
            rel = (start_ms - self._now_ms, end_ms - self._now_ms)
            old = self._seen.get(name)
            self._seen[name] = rel if old is None else (min(old[0], rel[0]), max(old[1], rel[1]))
            hit = self._by_name.get(name)
        if hit is None or start_ms < hit[0] or end_ms > hit[1]:
            if hit is not None:
                start_ms, end_ms = min(start_ms, hit[0]), max(end_ms, hit[1])
            data = self.source.select([Matcher(NAME, "=", name)], start_ms, end_ms)
            self.reads += 1
            hit = (start_ms, end_ms, data)
            with self._lock:
                self._by_name[name] = hit
        data = hit[2]
        writes = self._written.get(name)
        if writes:
            data = _with_writes(data, name, writes, hit[0], hit[1])
        return _filter(data, matchers)

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """What `select` returns cut to each series' last sample (an instant selector's read)."""
        name = next((m.value for m in matchers if m.name == NAME and m.op == "="), None)
        if name is None:
            self.reads += 1
            return list(self.source.select_last(matchers, start_ms, end_ms))
        with self._lock:
            self._last_seen.add((name, start_ms - self._now_ms, end_ms - self._now_ms))
            hit = self._last_by_name.get((name, start_ms, end_ms))
            wide = self._by_name.get(name)
        if hit is not None:
            data = hit
        elif wide is not None and wide[0] <= start_ms and end_ms <= wide[1]:
            data = last_samples(wide[2], start_ms, end_ms)
        else:
            data = self.source.select_last([Matcher(NAME, "=", name)], start_ms, end_ms)
            self.reads += 1
            with self._lock:
                self._last_by_name[(name, start_ms, end_ms)] = data
        writes = self._written.get(name)
        if writes:
            data = last_samples(_with_writes(data, name, writes, start_ms, end_ms), start_ms, end_ms)
        return _filter(data, matchers)


def _with_writes(
    data: list[SeriesData], name: str, writes: dict[Labels, tuple[int, float]], start_ms: int, end_ms: int
) -> list[SeriesData]:
    """`data` (a read of `name` over [start_ms, end_ms], series by labels) with `writes` stored: each
    is a sample at its time, replacing one there (the later write wins), a series of its own if new."""
    by_labels = {sd.labels: sd for sd in data}
    for labels, (t_ms, value) in writes.items():
        if not start_ms <= t_ms <= end_ms:
            continue
        sd = by_labels.get(labels)
        if sd is None:
            by_labels[labels] = SeriesData(name, labels, np.array([t_ms], np.int64), np.array([value]))
            continue
        t, v = sd.timestamps_ms, sd.values
        i = int(np.searchsorted(t, t_ms))
        j = i + 1 if i < t.size and t[i] == t_ms else i
        t = np.concatenate([t[:i], np.array([t_ms], np.int64), t[j:]])
        v = np.concatenate([v[:i], np.array([value]), v[j:]])
        hist = sd.histograms
        if hist is not None:  # (native histograms by timestamp: a float written there replaces one)
            hist = {k: h for k, h in hist.items() if k != t_ms}
        by_labels[labels] = SeriesData(name, labels, t, v, hist)
    return [by_labels[k] for k in sorted(by_labels)]


def _filter(data: list[SeriesData], matchers: Sequence[Matcher]) -> list[SeriesData]:
    tests = [(m.name, matcher_predicate(m)) for m in matchers if m.name != NAME]
    if not tests:
        return list(data)
    return [s for s in data if all(test(dict(s.labels).get(label, "")) for label, test in tests)]
