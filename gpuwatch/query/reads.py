"""Selector reads: what one query reads from its source, and the instant and range vectors made of it.

Each selector's matchers are read once per query over the widest span it needs (at a single step,
only each series' last sample: `select_last`), and every read counts against `query_max_samples` and
the query's deadline. `times` places a selector at its steps after `@` and `offset`; `vector_selector`
takes each series' last sample within the lookback, `matrix_selector` the samples of each range,
staleness markers dropped. The tree walk that asks for them is `engine.py`'s `_Evaluation`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import numpy as np

from gpuwatch.core.model import Labels, Matcher, SeriesData
from gpuwatch.core.tiers import TierSeries
from gpuwatch.query.errors import QueryTimeout, QueryTooLarge
from gpuwatch.query.frames import (
    NAME,
    LabelSet,
    RangeFrame,
    RangeSeries,
    VectorFrame,
    is_stale_array,
    make_labelset,
)
from gpuwatch.query.parse import matchers_of
from gpuwatch.query.source import Queryable, TierSource
from gpuwatch.query.windows import same_times

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@functools.lru_cache(maxsize=1 << 16)
def _series_labels(name: str, labels: Labels) -> LabelSet:
    return make_labelset({NAME: name, **dict(labels)})


def series_labelset(sd: SeriesData | TierSeries) -> LabelSet:
    """Return a read series' labels with `__name__` as a LabelSet (remembered: series repeat)."""
    try:
        return _series_labels(sd.name, sd.labels)
    except TypeError:  # labels not hashable (a source handing out lists)
        return make_labelset({NAME: sd.name, **dict(sd.labels)})


def delta_ms(delta: timedelta | None) -> int:
    """A duration of the query text (`[5m]`, `offset 1h`) in ms; none is 0."""
    if delta is None:
        return 0
    return delta // timedelta(milliseconds=1)


class _Engine(Protocol):
    """What the reads use of the `Engine` (in engine.py, which builds on this module)."""

    source: Queryable
    lookback_ms: int
    max_samples: int
    timeout_s: float
    monotonic: Callable[[], float]


class QueryReads:
    """What one query has read (kept per selector for the query), its sample count and deadline;
    `engine._Evaluation` walks the query's tree on top of these."""

    def __init__(self, engine: _Engine, start_ms: int, end_ms: int, timeout_s: float | None) -> None:
        self.engine = engine
        self.start_ms = start_ms
        self.end_ms = end_ms
        self.lookback = engine.lookback_ms
        self.samples = 0
        self.deadline = engine.monotonic() + (engine.timeout_s if timeout_s is None else timeout_s)
        self.cache: dict[tuple[Matcher, ...], tuple[int, int, list[SeriesData]]] = {}
        self.last_cache: dict[tuple[tuple[Matcher, ...], int, int], list[SeriesData]] = {}

    # Limits ----------------------------------------------------------------------------------

    def check_deadline(self) -> None:
        if self.engine.monotonic() > self.deadline:
            raise QueryTimeout("query timed out in expression evaluation")

    def _count(self, n: int) -> None:
        self.samples += n
        if self.samples > self.engine.max_samples:
            raise QueryTooLarge("query processing would load too many samples into memory in query execution")

    # Data ------------------------------------------------------------------------------------

    def select(self, vs: Any, start_ms: int, end_ms: int, last: bool = False) -> list[SeriesData]:
        """Read `vs` over [start_ms, end_ms]; with `last`, only each series' last sample there is needed."""
        key = matchers_of(vs)
        cached = self.cache.get(key)
        if cached is not None and cached[0] <= start_ms and end_ms <= cached[1]:
            return cached[2]
        if last:
            found = self.last_cache.get((key, start_ms, end_ms))
            if found is None:
                found = self.engine.source.select_last(list(key), start_ms, end_ms)
                self._count(len(found))
                found.sort(key=series_labelset)
                self.last_cache[(key, start_ms, end_ms)] = found
                self.check_deadline()
            return found
        if cached is not None:
            start_ms, end_ms = min(start_ms, cached[0]), max(end_ms, cached[1])
        data = self.engine.source.select(list(key), start_ms, end_ms)
        self._count(sum(len(s.timestamps_ms) for s in data))
        data.sort(key=series_labelset)
        self.cache[key] = (start_ms, end_ms, data)
        self.check_deadline()
        return data

    def select_tiers(
        self, vs: Any, res_ms: int, start_ms: int, end_ms: int, columns: Collection[str] | None = None
    ) -> list[TierSeries] | None:
        """Read `vs`'s tier points of resolution `res_ms` for buckets ending in (start_ms, end_ms], sorted
        as `select` sorts series; None where the source has none (read samples then). `columns`: the
        point columns the caller reads (query/tiered.py), the others may be None; None: all."""
        source = self.engine.source
        if not isinstance(source, TierSource):
            return None
        found = source.select_tiers(list(matchers_of(vs)), res_ms, start_ms, end_ms, columns)
        if found is None:
            return None
        self._count(sum(s.points.size for s in found))
        found.sort(key=series_labelset)
        self.check_deadline()
        return found

    def times(self, node: Any, ts: np.ndarray) -> np.ndarray:
        """Return the times a selector or subquery reads at, after `@` and `offset`."""
        at = node.at
        base = ts
        if at is not None:
            kind = str(at.type)
            if kind.endswith("Start"):
                at_ms = self.start_ms
            elif kind.endswith("End"):
                at_ms = self.end_ms
            else:
                when = at.at
                if when.tzinfo is None:
                    when = when.replace(tzinfo=timezone.utc)
                at_ms = (when - _EPOCH) // timedelta(milliseconds=1)
            base = np.full(len(ts), at_ms, dtype=np.int64)
        return base - delta_ms(node.offset)

    # Selectors -------------------------------------------------------------------------------

    def vector_selector(self, vs: Any, ts: np.ndarray, want_times: bool = False) -> VectorFrame:
        te = self.times(vs, ts)
        n = len(ts)
        data = self.select(vs, int(te.min()) - self.lookback + 1, int(te.max()), last=n == 1)
        if n == 1 and not any(sd.histograms for sd in data):
            return self._vector_at_one_step(data, int(te[0]), want_times)
        labels: list[LabelSet] = []
        values = np.zeros((len(data), n))
        present = np.zeros((len(data), n), dtype=bool)
        hist: np.ndarray | None = None
        prev_t: np.ndarray | None = None
        for i, sd in enumerate(data):
            labels.append(series_labelset(sd))
            t = sd.timestamps_ms
            if len(t) == 0:
                continue
            if prev_t is None or not same_times(prev_t, t):  # series scraped together share these
                idx = np.searchsorted(t, te, side="right") - 1
                in_lookback = idx >= 0
                idx = np.maximum(idx, 0)
                tt = t[idx]
                in_lookback &= tt > te - self.lookback
                prev_t = t
            vv = sd.values[idx]
            ok = in_lookback & ~is_stale_array(vv)
            values[i] = tt / 1000.0 if want_times else vv
            present[i] = ok
            if sd.histograms and not want_times:
                if hist is None:
                    hist = np.full((len(data), n), None, dtype=object)
                for j in np.flatnonzero(ok).tolist():
                    hist[i, j] = sd.histograms.get(int(tt[j]))
        if hist is not None and not (hist != None).any():  # noqa: E711 (elementwise)
            hist = None
        return VectorFrame(labels, values, present, hist)

    def _vector_at_one_step(self, data: list[SeriesData], at: int, want_times: bool) -> VectorFrame:
        """`vector_selector` at one step: each series' last sample at or before `at`, the arrays built
        once for all series (read by `select_last`, a series holds just that sample)."""
        k = len(data)
        times = np.zeros(k, np.int64)
        vals = np.zeros(k)
        found = np.zeros(k, bool)
        for i, sd in enumerate(data):
            t = sd.timestamps_ms
            if not len(t):
                continue
            j = len(t) - 1 if t[-1] <= at else int(np.searchsorted(t, at, side="right")) - 1
            if j >= 0:
                times[i], vals[i], found[i] = t[j], sd.values[j], True
        ok = found & (times > at - self.lookback) & ~is_stale_array(vals)
        out = times / 1000.0 if want_times else vals
        return VectorFrame([series_labelset(sd) for sd in data], out[:, None], ok[:, None])

    def matrix_selector(self, ms: Any, ts: np.ndarray) -> RangeFrame:
        vs = ms.vector_selector
        rng = delta_ms(ms.range)
        ends = self.times(vs, ts)
        data = self.select(vs, int(ends.min()) - rng + 1, int(ends.max()))
        series = []
        # Staleness markers are rare: one test over all series' values first, not one per series, and
        # none where the source knows there are none (`SeriesData.is_stale_free`).
        any_stale = (
            len(data) > 0
            and not all(sd.is_stale_free for sd in data)
            and bool(is_stale_array(np.concatenate([sd.values for sd in data])).any())
        )
        for sd in data:
            keep = ~is_stale_array(sd.values) if any_stale else None
            if keep is None or keep.all():  # no staleness markers (the usual case): no copies
                times, kept = sd.timestamps_ms, sd.values
            else:
                times, kept = sd.timestamps_ms[keep], sd.values[keep]
            hist = None
            if sd.histograms:
                hist = np.isin(times, np.fromiter(sd.histograms, dtype=np.int64))
                if not hist.any():
                    hist = None
            series.append(RangeSeries(series_labelset(sd), times, kept, hist))
        return RangeFrame(series, rng, ends, from_selector=vs)
