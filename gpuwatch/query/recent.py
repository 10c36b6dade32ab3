"""Samples held in memory for a few minutes, read beside the store.

gpuwatch's own figures (`gpuwatch_store_write_errors_total` and the rest of the sample job's self
figures) are what its self-monitoring rules read. When the store cannot write (a full disk), those
figures wait in the writer's buffer with everything else, and a rule that reads them from the store
alone would see nothing until space returns: the very alert meant to say so could not fire.
`RecentSamples` keeps the last minutes of them as the live process took them, and `WithRecent` is a
`Queryable` that answers every read from its source with those samples merged in (the same sample,
once flushed, is in both and counts once).
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left
from collections.abc import Collection, Iterable, Sequence

import numpy as np

from gpuwatch.core.model import Labels, Matcher, Sample, SeriesData, last_samples, matcher_predicate
from gpuwatch.core.tiers import TierSeries
from gpuwatch.query.source import Queryable, TierSource

NAME = "__name__"


class _Ring:
    """One series' times and values, oldest first; the dropped front is skipped until compacted."""

    __slots__ = ("start", "t", "v")

    def __init__(self) -> None:
        self.t = array("q")
        self.v = array("d")
        self.start = 0

    def append(self, t_ms: int, value: float) -> None:
        if len(self.t) > self.start and self.t[-1] >= t_ms:  # a clock step back: keep times ascending
            return
        self.t.append(t_ms)
        self.v.append(value)

    def drop_before(self, cutoff_ms: int) -> None:
        self.start = bisect_left(self.t, cutoff_ms, self.start)
        if self.start > len(self.t) // 2:
            del self.t[: self.start]
            del self.v[: self.start]
            self.start = 0

    def window(self, start_ms: int, end_ms: int) -> tuple[np.ndarray, np.ndarray]:
        t = np.frombuffer(self.t, np.int64)[self.start :]
        lo, hi = int(t.searchsorted(start_ms)), int(t.searchsorted(end_ms, side="right"))
        return t[lo:hi].copy(), np.frombuffer(self.v, np.float64)[self.start :][lo:hi].copy()


class RecentSamples:
    """The last `keep_ms` of the samples `add` is given, by series; a `Queryable` over them."""

    def __init__(self, keep_ms: int) -> None:
        self._keep_ms = keep_ms
        self._lock = threading.Lock()
        self._series: dict[tuple[str, Labels], _Ring] = {}

    def add(self, t_ms: int, samples: Iterable[Sample]) -> None:
        """Hold `samples`, taken at `t_ms`; forget what is older than `keep_ms` before it."""
        cutoff = t_ms - self._keep_ms
        with self._lock:
            for name, labels, value in samples:
                ring = self._series.get((name, labels))
                if ring is None:
                    ring = self._series[(name, labels)] = _Ring()
                ring.append(t_ms, value)
            for key, ring in list(self._series.items()):
                ring.drop_before(cutoff)
                if ring.start == len(ring.t):
                    del self._series[key]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(r.t) - r.start for r in self._series.values())

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        tests = [(m.name, matcher_predicate(m)) for m in matchers]
        out = []
        with self._lock:
            for (name, labels), ring in self._series.items():
                values = dict(labels)
                values[NAME] = name
                if not all(test(values.get(label, "")) for label, test in tests):
                    continue
                t, v = ring.window(start_ms, end_ms)
                if t.size:
                    out.append(SeriesData(name, labels, t, v))
        return out

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return last_samples(self.select(matchers, start_ms, end_ms), start_ms, end_ms)


class WithRecent:
    """A `Queryable`: what `source` reads, with what `recent` holds of the same series merged in."""

    def __init__(self, source: Queryable, recent: Queryable) -> None:
        self.source = source
        self.recent = recent

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        held = self.recent.select(matchers, start_ms, end_ms)
        stored = self.source.select(matchers, start_ms, end_ms)
        return _merged(stored, held) if held else stored

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        held = self.recent.select_last(matchers, start_ms, end_ms)
        stored = self.source.select_last(matchers, start_ms, end_ms)
        if not held:
            return stored
        by_key = {(s.name, s.labels): s for s in stored}
        for s in held:
            old = by_key.get((s.name, s.labels))
            if old is None or old.timestamps_ms[-1] < s.timestamps_ms[-1]:
                by_key[(s.name, s.labels)] = s
        return [by_key[k] for k in sorted(by_key)]

    def select_tiers(
        self,
        matchers: Sequence[Matcher],
        res_ms: int,
        start_ms: int,
        end_ms: int,
        columns: Collection[str] | None = None,
    ) -> list[TierSeries] | None:
        """The source's tier points, None where samples held here match (their points are not in it)."""
        if not isinstance(self.source, TierSource) or self.recent.select(matchers, start_ms, end_ms):
            return None
        return self.source.select_tiers(matchers, res_ms, start_ms, end_ms, columns)


def _merged(stored: list[SeriesData], held: list[SeriesData]) -> list[SeriesData]:
    """`stored` with `held` merged in by series; at a time both have, the held sample is kept."""
    by_key = {(s.name, s.labels): s for s in stored}
    for h in held:
        s = by_key.get((h.name, h.labels))
        if s is None or not s.timestamps_ms.size:
            by_key[(h.name, h.labels)] = h
            continue
        t = np.concatenate([h.timestamps_ms, s.timestamps_ms])
        v = np.concatenate([h.values, s.values])
        t, first = np.unique(t, return_index=True)  # sorted; the first of equal times is the held one
        by_key[(h.name, h.labels)] = SeriesData(h.name, h.labels, t, v[first], s.histograms)
    return [by_key[k] for k in sorted(by_key)]
