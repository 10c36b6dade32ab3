"""Share store reads between the rules of one evaluation round.

The built-in pack has dozens of rules over a few dozen metrics; read one selector at a time, each read
is a DuckDB round trip of a few milliseconds and a round of the pack costs hundreds of them.
`RoundCache` sits between the rules' query engine and the store:

- it remembers, per metric name, the time window (relative to the evaluation time) the rules read in
  the previous round, and at the start of a round (`begin`) fetches all those names in one store read
  per distinct window;
- a read of a name not fetched yet (the first round, a new rule) fetches every series of that name,
  and a later, wider read of it widens that; every read is filtered by its other matchers in memory;
- a recording rule's output is forgotten when the rule writes (`forget`), so later rules read it anew.

Instant selectors ask only for each series' last sample (`select_last`): those names are planned and
prefetched apart from the range reads, with the source's `select_last` (the store answers it from
memory), so the 5-minute lookback window is not read sample by sample.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gpuwatch.model import Labels, Matcher, SeriesData, matcher_predicate
from gpuwatch.query.engine import Queryable

NAME = "__name__"
KEEP_MARGIN_MS = 60_000


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
        # name -> (start, cut, write version, series): a range read's samples up to `cut` (a minute
        # before its end, older than live samples still on their way to the store), kept for the
        # next round, which reads only what comes after `cut` while the store reports no write at
        # or before it since `version` (`Store.changed_since`).
        self._kept: dict[str, tuple[int, int, int, list[SeriesData]]] = {}
        self.reads = 0  # store reads since start (for tests and the benchmark)

    def begin(self, now_ms: int) -> None:
        """Start a round evaluated at `now_ms`: forget the last one's data, prefetch what it read."""
        with self._lock:
            if self._seen or self._last_seen:
                self._plan, self._seen = self._seen, {}
                self._last_plan, self._last_seen = self._last_seen, set()
            self._by_name.clear()
            self._last_by_name.clear()
            self._now_ms = now_ms
            # A last-sample read ending over a minute back (`x offset 1h`) cannot be answered from
            # memory by the store; it joins the name's range read, which later rounds read only the
            # new part of, and is cut from that.
            plan = dict(self._plan)
            last_windows: dict[tuple[int, int], list[str]] = {}
            old_reads = {n for n, _, hi in self._last_plan if hi < -KEEP_MARGIN_MS}
            for name, lo, hi in sorted(self._last_plan):
                if name in old_reads:  # all of the name's last-sample reads: one range read serves them
                    old = plan.get(name)
                    plan[name] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
                else:
                    last_windows.setdefault((lo, hi), []).append(name)
            windows: dict[tuple[int, int], list[str]] = {}
            for name, window in plan.items():
                windows.setdefault(window, []).append(name)
        select_last = getattr(self.source, "select_last", None)
        for (lo, hi), names in sorted(last_windows.items()):
            if select_last is None:
                break
            pattern = "|".join(re.escape(n) for n in sorted(names))
            start, end = now_ms + lo, now_ms + hi
            data = select_last([Matcher(NAME, "=~", pattern)], start, end)
            self.reads += 1
            found: dict[str, list[SeriesData]] = {n: [] for n in names}
            for s in data:
                found.setdefault(s.name, []).append(s)
            with self._lock:
                for n, series in found.items():
                    self._last_by_name[(n, start, end)] = series
        fetched = self._read_windows(
            [(names, now_ms + lo, now_ms + hi) for (lo, hi), names in sorted(windows.items())]
        )
        with self._lock:
            self._by_name.update(fetched)

    def _read_windows(
        self, windows: list[tuple[list[str], int, int]]
    ) -> dict[str, tuple[int, int, list[SeriesData]]]:
        """Read each (names, start, end); where the previous round's samples of a name up to its cut
        are still exact (no write at or before the cut since), only the samples after the cut are
        read, for all such names in one read per cut."""
        version_of = getattr(self.source, "write_version", None)
        version = version_of() if version_of is not None else None  # before reading: conservative
        window_of: dict[str, tuple[int, int]] = {}
        delta: dict[tuple[int, int], list[str]] = {}
        full: dict[tuple[int, int], list[str]] = {}
        found: dict[str, list[SeriesData]] = {}
        for names, start, end in windows:
            for n in names:
                window_of[n] = (start, end)
                found[n] = []
                kept = self._kept.get(n)
                if (
                    version is not None
                    and kept is not None
                    and kept[0] <= start <= kept[1] < end
                    and not self.source.changed_since(kept[2], kept[1])  # type: ignore[attr-defined]
                ):
                    delta.setdefault((kept[1], end), []).append(n)
                else:
                    full.setdefault((start, end), []).append(n)
        # A window inside a delta read's (cut, end] (a `[1m]` rate next to the cut a minute back) rides
        # along with it instead of costing a read of its own.
        for (start, end), names in list(full.items()):
            ride = next((key for key in delta if key[1] == end and key[0] < start), None)
            if ride is not None:
                delta[ride].extend(names)
                del full[(start, end)]
        for (start, end), names in sorted(full.items()):
            for sd in self.source.select([Matcher(NAME, "=~", _alternatives(names))], start, end):
                found.setdefault(sd.name, []).append(sd)
            self.reads += 1
        for (cut, end), group in sorted(delta.items()):
            new: dict[str, dict[Labels, SeriesData]] = {}
            for sd in self.source.select([Matcher(NAME, "=~", _alternatives(group))], cut + 1, end):
                new.setdefault(sd.name, {})[sd.labels] = sd
            self.reads += 1
            for n in group:
                start = window_of[n][0]
                merged: dict[Labels, SeriesData] = {}
                kept = self._kept.get(n)
                for sd in kept[3] if kept is not None and kept[1] == cut else ():
                    if sd.timestamps_ms.size and sd.timestamps_ms[0] >= start:
                        merged[sd.labels] = sd
                        continue
                    lo = int(np.searchsorted(sd.timestamps_ms, start))
                    if lo < sd.timestamps_ms.size:
                        merged[sd.labels] = SeriesData(
                            sd.name, sd.labels, sd.timestamps_ms[lo:], sd.values[lo:], sd.histograms
                        )
                for labels, sd in new.get(n, {}).items():
                    t, v = sd.timestamps_ms, sd.values
                    old = merged.get(labels)
                    if old is not None:
                        t, v = np.concatenate([old.timestamps_ms, t]), np.concatenate([old.values, v])
                    elif t.size and t[0] < start:  # a window that rode along: cut to its start
                        lo = int(np.searchsorted(t, start))
                        if lo == t.size:
                            continue
                        t, v = t[lo:], v[lo:]
                    merged[labels] = SeriesData(sd.name, labels, t, v, sd.histograms)
                found[n] = [merged[k] for k in sorted(merged)]
        out = {}
        for n, (start, end) in window_of.items():
            out[n] = (start, end, found[n])
            cut = end - KEEP_MARGIN_MS
            if version is None or cut < start:
                self._kept.pop(n, None)
                continue
            kept_series = []
            for sd in found[n]:
                if not sd.timestamps_ms.size or sd.timestamps_ms[-1] <= cut:
                    kept_series.append(sd)
                    continue
                hi = int(np.searchsorted(sd.timestamps_ms, cut, side="right"))
                kept_series.append(
                    SeriesData(sd.name, sd.labels, sd.timestamps_ms[:hi], sd.values[:hi], sd.histograms)
                )
            self._kept[n] = (start, cut, version, kept_series)
        return out

    def clear(self) -> None:
        """Forget all data and what was learned (rules were replaced)."""
        with self._lock:
            self._by_name.clear()
            self._plan.clear()
            self._seen.clear()
            self._last_by_name.clear()
            self._last_plan.clear()
            self._last_seen.clear()
            self._kept.clear()

    def forget(self, name: str) -> None:
        """Drop what was read of `name` this round (a recording rule has just written it)."""
        with self._lock:
            self._by_name.pop(name, None)
            for key in [k for k in self._last_by_name if k[0] == name]:
                del self._last_by_name[key]

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
        return _filter(hit[2], matchers)

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """What `select` returns cut to each series' last sample (an instant selector's read)."""
        name = next((m.value for m in matchers if m.name == NAME and m.op == "="), None)
        select_last = getattr(self.source, "select_last", None)
        if name is None:
            self.reads += 1
            if select_last is None:
                return _cut_last(self.source.select(matchers, start_ms, end_ms), start_ms, end_ms)
            return list(select_last(matchers, start_ms, end_ms))
        with self._lock:
            self._last_seen.add((name, start_ms - self._now_ms, end_ms - self._now_ms))
            hit = self._last_by_name.get((name, start_ms, end_ms))
            wide = self._by_name.get(name)
        if hit is not None:
            data = hit
        elif wide is not None and wide[0] <= start_ms and end_ms <= wide[1]:
            data = _cut_last(wide[2], start_ms, end_ms)
        else:
            if select_last is None:
                data = _cut_last(
                    self.source.select([Matcher(NAME, "=", name)], start_ms, end_ms), start_ms, end_ms
                )
            else:
                data = select_last([Matcher(NAME, "=", name)], start_ms, end_ms)
            self.reads += 1
            with self._lock:
                self._last_by_name[(name, start_ms, end_ms)] = data
        return _filter(data, matchers)


def _filter(data: list[SeriesData], matchers: Sequence[Matcher]) -> list[SeriesData]:
    tests = [(m.name, matcher_predicate(m)) for m in matchers if m.name != NAME]
    if not tests:
        return list(data)
    return [s for s in data if all(test(dict(s.labels).get(label, "")) for label, test in tests)]


def _cut_last(data: list[SeriesData], start_ms: int, end_ms: int) -> list[SeriesData]:
    """Each series' last sample in [start_ms, end_ms], series without one left out."""
    out = []
    for s in data:
        lo, hi = np.searchsorted(s.timestamps_ms, [start_ms, end_ms + 1])
        if hi > lo:
            out.append(replace(s, timestamps_ms=s.timestamps_ms[hi - 1 : hi], values=s.values[hi - 1 : hi]))
    return out
