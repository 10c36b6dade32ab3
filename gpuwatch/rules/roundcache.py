"""Share store reads between the rules of one evaluation round.

The built-in pack has dozens of rules over a few dozen metrics; read one selector at a time, each read
is a DuckDB round trip of a few milliseconds and a round of the pack costs hundreds of them.
`RoundCache` sits between the rules' query engine and the store:

- it remembers, per metric name, the time window (relative to the evaluation time) the rules read in
  the previous round, and at the start of a round (`begin`) fetches all those names in one store read
  per distinct window;
- a read of a name not fetched yet (the first round, a new rule) fetches every series of that name,
  and a later, wider read of it widens that; every read is filtered by its other matchers in memory;
- a name prefetched once is kept from its window's start on, and later rounds take in only what the
  store's flushes wrote since (`Store.select_written`, from memory; read whole again where the store
  cannot tell: a bulk import, retention, a write log that no longer reaches back);
- what a recording rule appends (`wrote`) is shown to later reads of its name from the point where
  the rule manager would otherwise flush the store (`publish`): as the store would, without the wait.

Instant selectors ask only for each series' last sample (`select_last`): those names are planned and
prefetched apart from the range reads, with the source's `select_last` (the store answers it from
memory), so the 5-minute lookback window is not read sample by sample.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

import numpy as np

from gpuwatch.model import Labels, Matcher, Sample, SeriesData, matcher_predicate
from gpuwatch.query.engine import Queryable
from gpuwatch.query.windows import same_times

NAME = "__name__"
KEEP_MARGIN_MS = 60_000
END_OF_TIME = 2**62


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
        # name -> every sample of the name's series from a window's start on, as of a write version:
        # the next round takes in what the store's flushes wrote since and cuts its window from it.
        self._kept: dict[str, _Kept] = {}
        # Samples rules appended this round, not flushed yet, by name and labels: (t, value).
        self._pending: dict[str, dict[Labels, tuple[int, float]]] = {}  # not to be seen yet
        self._written: dict[str, dict[Labels, tuple[int, float]]] = {}  # seen by reads by name
        self.reads = 0  # store reads since start (for tests and the benchmark)

    def begin(self, now_ms: int) -> None:
        """Start a round evaluated at `now_ms`: forget the last one's data, prefetch what it read."""
        with self._lock:
            if self._seen or self._last_seen:
                self._plan, self._seen = self._seen, {}
                self._last_plan, self._last_seen = self._last_seen, set()
            self._by_name.clear()
            self._last_by_name.clear()
            self._pending.clear()
            self._written.clear()
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
        """Read each (names, start, end). A name read in an earlier round is served from what was
        kept of it then plus what the store's flushes wrote since (`select_written`, from memory), as
        long as the window starts no earlier and the store can tell (else it is read again whole)."""
        written_since = getattr(self.source, "select_written", None)
        version_of = getattr(self.source, "write_version", None)
        version = version_of() if version_of is not None and written_since is not None else None
        full: dict[tuple[int, int], list[str]] = {}
        fresh: dict[str, tuple[int, int]] = {}
        for names, start, end in windows:
            for n in names:
                kept = self._kept.get(n)
                if version is not None and kept is not None and kept.start_ms <= start:
                    fresh[n] = (start, end)
                else:
                    full.setdefault((start, end), []).append(n)
        out: dict[str, tuple[int, int, list[SeriesData]]] = {}
        if fresh:
            kept_of = {n: self._kept[n] for n in fresh}
            since = min(k.version for k in kept_of.values())
            lo = min(k.start_ms for k in kept_of.values())
            got = written_since(list(fresh), since, lo)  # type: ignore[misc]
            if got is None:
                for n, window in fresh.items():
                    full.setdefault(window, []).append(n)
            else:
                now_version, new = got
                new_of: dict[str, list[SeriesData]] = {}
                for sd in new:
                    new_of.setdefault(sd.name, []).append(sd)
                for n, (start, end) in fresh.items():
                    kept = kept_of[n]
                    kept.take(new_of.get(n, ()), now_version)
                    out[n] = (start, end, kept.window(start, end))
        for (start, end), names in sorted(full.items()):
            found: dict[str, list[SeriesData]] = {n: [] for n in names}
            # Read to the end of time when keeping: later rounds take in only what is written after.
            upto = end if version is None else END_OF_TIME
            for sd in self.source.select([Matcher(NAME, "=~", _alternatives(names))], start, upto):
                found.setdefault(sd.name, []).append(sd)
            self.reads += 1
            for n, series in found.items():
                if version is None or any(sd.histograms is not None for sd in series):
                    self._kept.pop(n, None)
                    out[n] = (start, end, series)
                    continue
                # As of the flush before `version`: the writer adds a flush's new series to the
                # catalog just after counting it, so the read may have missed those of the last one.
                kept = _Kept(start, version - 1, series)
                self._kept[n] = kept
                out[n] = (start, end, kept.window(start, end))
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
            self._pending.clear()
            self._written.clear()

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
            # Not prefetched this round: a group that runs every other round (30 s in a 15 s job)
            # was not in the last round's plan. What an earlier round kept of the name, plus what
            # was written since, still serves it; only a name never kept is read from the store.
            hit = self._read_windows([([name], start_ms, end_ms)])[name]
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
        writes = self._written.get(name)
        if writes:
            data = _cut_last(_with_writes(data, name, writes, start_ms, end_ms), start_ms, end_ms)
        return _filter(data, matchers)


class _Samples:
    """One series' samples in a buffer with room to append, handed out as read-only views."""

    __slots__ = ("hi", "lo", "t", "v")

    def __init__(self, t: np.ndarray, v: np.ndarray) -> None:
        self.t, self.v, self.lo, self.hi = t, v, 0, t.size

    def view(self) -> np.ndarray:
        return self.t[self.lo : self.hi]

    def add(self, t: np.ndarray, v: np.ndarray) -> bool:
        """Take in samples written later than these (a later write wins at an equal timestamp);
        return whether they simply went after the end."""
        if not t.size:
            return True
        n, k = self.hi - self.lo, t.size
        if n and t[0] <= self.t[self.hi - 1]:  # not simply after the end: merge into new arrays
            all_t = np.concatenate([self.t[self.lo : self.hi], t])
            all_v = np.concatenate([self.v[self.lo : self.hi], v])
            order = np.lexsort((np.r_[np.zeros(n, np.int64), np.ones(k, np.int64)], all_t))
            all_t, all_v = all_t[order], all_v[order]
            keep = np.ones(all_t.size, bool)
            keep[:-1] = all_t[1:] != all_t[:-1]
            self.t, self.v = all_t[keep], all_v[keep]
            self.lo, self.hi = 0, self.t.size
            return False
        if self.hi + k > self.t.size:  # views handed out before stay as they were: only new room is written
            room_t, room_v = np.empty(2 * (n + k) + 16, np.int64), np.empty(2 * (n + k) + 16, np.float64)
            room_t[:n], room_v[:n] = self.t[self.lo : self.hi], self.v[self.lo : self.hi]
            self.t, self.v, self.lo, self.hi = room_t, room_v, 0, n
        self.t[self.hi : self.hi + k] = t
        self.v[self.hi : self.hi + k] = v
        self.hi += k
        return True

    def drop_before(self, start_ms: int) -> int:
        """Forget the samples before `start_ms`; return how many there were."""
        gone = int(self.t[self.lo : self.hi].searchsorted(start_ms))
        self.lo += gone
        return gone


class _Kept:
    """Every sample of one name's series at or after `start_ms` as of store write `version`."""

    def __init__(self, start_ms: int, version: int, series: list[SeriesData]) -> None:
        self.start_ms, self.version = start_ms, version
        self.name = series[0].name if series else ""
        self.series = {sd.labels: _Samples(sd.timestamps_ms, sd.values) for sd in series}
        self.order = [sd.labels for sd in series]  # as the store returns them: by labels
        # Per series (in `order`): whether its timestamps are those of the one before (sampled
        # together): `window` then hands out one timestamps array for both, which the engine's
        # grouping of series by timestamps recognises by identity instead of comparing them.
        self.same = self._compare_all()

    def _compare_all(self) -> list[bool]:
        views = [self.series[labels].view() for labels in self.order]
        return [i > 0 and same_times(views[i], views[i - 1]) for i in range(len(views))]

    def take(self, new: Sequence[SeriesData], version: int) -> None:
        """Take in what the store's flushes after `self.version` wrote, up to `version`."""
        added = False
        appended: dict[Labels, np.ndarray | None] = {}  # the new timestamps where simply appended
        for sd in new:
            s = self.series.get(sd.labels)
            if s is None:
                s = self.series[sd.labels] = _Samples(sd.timestamps_ms[:0], sd.values[:0])
                self.name = sd.name
                added = True
            appended[sd.labels] = sd.timestamps_ms if s.add(sd.timestamps_ms, sd.values) else None
        self.version = version
        if added:
            self.order = sorted(self.series)
            self.same = self._compare_all()
            return
        for i in range(1, len(self.order)):
            a, b = self.order[i - 1], self.order[i]
            if a not in appended and b not in appended:
                continue
            ta, tb = appended.get(a), appended.get(b)
            if self.same[i] and ta is not None and tb is not None and same_times(ta, tb):
                continue  # the same timestamps before, the same ones appended
            self.same[i] = same_times(self.series[b].view(), self.series[a].view())

    def window(self, start_ms: int, end_ms: int) -> list[SeriesData]:
        """Return what `Store.select` would for [start_ms, end_ms]; forget what is before `start_ms`."""
        self.start_ms = start_ms
        out = []
        prev: np.ndarray | None = None
        gone = 0
        for labels, same in zip(self.order, self.same, strict=True):
            s = self.series[labels]
            if same and prev is not None:  # the timestamps of the one before: as many go
                s.lo += gone
                t = prev
            else:
                gone = s.drop_before(start_ms)
                t = s.view()
                if t.size and t[-1] > end_ms:
                    t = t[: int(np.searchsorted(t, end_ms, side="right"))]
            prev = t
            if t.size:
                out.append(SeriesData(self.name, labels, t, s.v[s.lo : s.lo + t.size]))
        return out


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


def _cut_last(data: list[SeriesData], start_ms: int, end_ms: int) -> list[SeriesData]:
    """Each series' last sample in [start_ms, end_ms], series without one left out."""
    out = []
    for s in data:
        t = s.timestamps_ms
        if not t.size:
            continue
        hi = t.size if t[-1] <= end_ms else int(t.searchsorted(end_ms, side="right"))
        if hi and t[hi - 1] >= start_ms:
            out.append(SeriesData(s.name, s.labels, t[hi - 1 : hi], s.values[hi - 1 : hi], s.histograms))
    return out
