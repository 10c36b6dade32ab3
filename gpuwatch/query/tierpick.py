"""Where the engine answers from tier points instead of samples: range functions over a plain range
selector and instant selectors of a range query, when their windows are whole buckets of a tier.

A tier is used only where its answer is the raw one (tiered.py says how close: exact for counts,
extremes, first and last; rates and sums to within rounding): the steps' window ends (after `offset`
and `@`) and the range (or the lookback, for an instant selector) are whole multiples of its
resolution. The coarsest such tier is taken (the fewest points, and the longest kept), and only
where the query spans at least `MIN_SPAN_MS`: below that, samples are read about as fast. Anything else
(subqueries, a step or range off the grid, functions tier points cannot answer) reads samples, as
does a source without tiers. A tiered read decodes only the point columns its function reads
(`tiered.columns`, `tiered.instant_columns`): `avg_over_time` the sums and counts, `max_over_time` the
maxima, an instant selector the last samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import promql_parser as pp

from gpuwatch.core.tiers import RESOLUTIONS_MS
from gpuwatch.query import tiered
from gpuwatch.query.frames import VectorFrame, check_unique_labels, drop_name
from gpuwatch.query.reads import QueryReads, delta_ms, series_labelset

MIN_SPAN_MS = 6 * 3_600_000


def pick(ends: np.ndarray, range_ms: int, instant: bool = False) -> int | None:
    """The resolution of the coarsest tier whose buckets make up every window `(end - range_ms, end]`
    (with `instant`, that answers an instant selector of lookback `range_ms`), where the windows span
    at least `MIN_SPAN_MS`; else None."""
    if int(ends.max() - ends.min()) + range_ms < MIN_SPAN_MS:
        return None
    usable = tiered.usable_instant if instant else tiered.usable
    for res in sorted(RESOLUTIONS_MS, reverse=True):
        if usable(res, ends, range_ms):
            return res
    return None


def range_call(ev: QueryReads, name: str, node: Any, ts: np.ndarray, keep_name: bool) -> VectorFrame | None:
    """Range function `name` of the range selector `node` at steps `ts`, from tier points; None where a
    tier cannot answer it (the caller reads samples)."""
    if name not in tiered.FUNCTIONS or not isinstance(node, pp.MatrixSelector):
        return None
    vs = node.vector_selector
    rng = delta_ms(node.range)
    ends = ev.times(vs, ts)
    res = pick(ends, rng)
    if res is None:
        return None
    found = ev.select_tiers(vs, res, int(ends.min()) - rng, int(ends.max()), tiered.columns(name))
    if found is None:
        return None
    labels, values, present = [], [], []
    for s in found:
        ev.check_deadline()
        out = tiered.window(name, s.points, ends, rng)
        assert out is not None  # (name is one of tiered.FUNCTIONS)
        val, ok = out
        if not ok.any():
            continue
        ls = series_labelset(s)
        labels.append(ls if keep_name else drop_name(ls))
        values.append(val)
        present.append(ok)
    return _frame(len(ts), labels, values, present)


def vector(ev: QueryReads, vs: Any, ts: np.ndarray, want_times: bool) -> VectorFrame | None:
    """Instant selector `vs` at steps `ts` from tier points (newest sample within the lookback), or None."""
    if len(ts) < 2:
        return None
    te = ev.times(vs, ts)
    res = pick(te, ev.lookback, instant=True)
    if res is None:
        return None
    lo = int(te.min()) - max(ev.lookback, res)
    found = ev.select_tiers(vs, res, lo, int(te.max()), tiered.instant_columns(want_times))
    if found is None:
        return None
    labels = [series_labelset(s) for s in found]
    values = np.zeros((len(found), len(ts)))
    present = np.zeros((len(found), len(ts)), bool)
    for i, s in enumerate(found):
        values[i], present[i] = tiered.instant(s.points, te, ev.lookback, want_times)
    return VectorFrame(labels, values, present)


def _frame(n: int, labels: list[Any], values: list[np.ndarray], present: list[np.ndarray]) -> VectorFrame:
    if not labels:
        return VectorFrame.empty(n)
    out = VectorFrame(labels, np.array(values), np.array(present))
    check_unique_labels(out)
    return out
