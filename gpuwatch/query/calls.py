"""Function calls: dispatch to range-vector functions (windows) and instant-vector functions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import promql_parser as pp

from gpuwatch.query import functions, histogram, rates, tierpick, windows
from gpuwatch.query.errors import PromQLEvalError, Unsupported
from gpuwatch.query.frames import (
    NAME,
    LabelSet,
    RangeFrame,
    RangeSeries,
    ScalarFrame,
    StringFrame,
    VectorFrame,
    check_unique_labels,
    drop_name,
)
from gpuwatch.query.nativehist import NativeHistogramUnsupported

RangeFn = Callable[[windows.Window, list[np.ndarray], np.ndarray], windows.WindowResult]

RANGE_FUNCTIONS: dict[str, RangeFn] = {
    "rate": lambda w, a, ts: rates.extrapolated_rate(w, True, True),
    "increase": lambda w, a, ts: rates.extrapolated_rate(w, True, False),
    "delta": lambda w, a, ts: rates.extrapolated_rate(w, False, False),
    "irate": lambda w, a, ts: rates.instant_value(w, True),
    "idelta": lambda w, a, ts: rates.instant_value(w, False),
    "sum_over_time": lambda w, a, ts: windows.sum_over_time(w),
    "avg_over_time": lambda w, a, ts: windows.avg_over_time(w),
    "min_over_time": lambda w, a, ts: windows.min_over_time(w),
    "max_over_time": lambda w, a, ts: windows.max_over_time(w),
    "count_over_time": lambda w, a, ts: windows.count_over_time(w),
    "last_over_time": lambda w, a, ts: windows.last_over_time(w),
    "first_over_time": lambda w, a, ts: windows.first_over_time(w),
    "present_over_time": lambda w, a, ts: windows.present_over_time(w),
    "stddev_over_time": lambda w, a, ts: windows.stddev_over_time(w),
    "stdvar_over_time": lambda w, a, ts: windows.stdvar_over_time(w),
    "quantile_over_time": lambda w, a, ts: windows.quantile_over_time(w, a[0]),
    "mad_over_time": lambda w, a, ts: windows.mad_over_time(w),
    "ts_of_last_over_time": lambda w, a, ts: windows.ts_of_last_over_time(w),
    "ts_of_first_over_time": lambda w, a, ts: windows.ts_of_first_over_time(w),
    "ts_of_max_over_time": lambda w, a, ts: windows.ts_of_max_over_time(w),
    "ts_of_min_over_time": lambda w, a, ts: windows.ts_of_min_over_time(w),
    "changes": lambda w, a, ts: windows.changes(w),
    "resets": lambda w, a, ts: windows.resets(w),
    "deriv": lambda w, a, ts: windows.deriv(w),
    "predict_linear": lambda w, a, ts: windows.predict_linear(w, a[0], ts),
    "double_exponential_smoothing": lambda w, a, ts: windows.double_exponential_smoothing(w, a[0], a[1]),
}

KEEP_NAME = frozenset({"last_over_time", "first_over_time"})

# Over a window holding native histogram samples: these count samples of either kind ...
_HIST_COUNTING = frozenset({"count_over_time", "present_over_time", "absent_over_time"})
# ... these give no result where floats and histograms mix (Prometheus warns there) ...
_HIST_MIX_DROPS = frozenset({"rate", "increase", "delta", "sum_over_time", "avg_over_time"})
# ... and these use the float samples only (Prometheus adds an info annotation).
_HIST_IGNORED = frozenset(
    {
        "min_over_time", "max_over_time", "stddev_over_time", "stdvar_over_time", "quantile_over_time",
        "mad_over_time", "deriv", "predict_linear", "double_exponential_smoothing",
    }
)  # fmt: skip


def _split_histograms(
    name: str, rs: RangeSeries, ends: np.ndarray, range_ms: int
) -> tuple[RangeSeries, np.ndarray]:
    """Return the float samples of `rs` and the steps whose window mixes floats and histograms;
    fail where a window holds histogram samples that `name` would have to compute with."""
    assert rs.hist is not None
    hist_times = rs.times[rs.hist]
    in_window = np.searchsorted(hist_times, ends, side="right") - np.searchsorted(
        hist_times, ends - range_ms, side="right"
    )
    floats = RangeSeries(rs.labels, rs.times[~rs.hist], rs.values[~rs.hist])
    if name in _HIST_IGNORED:
        return floats, np.zeros(len(ends), dtype=bool)
    if name not in _HIST_MIX_DROPS:
        if (in_window > 0).any():
            raise NativeHistogramUnsupported(f"{name}() over histogram samples")
        return floats, np.zeros(len(ends), dtype=bool)
    w = windows.Window(floats.times, floats.values, ends, range_ms)
    if ((in_window > 0) & (w.count == 0)).any():
        raise NativeHistogramUnsupported(f"{name}() over histogram samples")
    return floats, (in_window > 0) & (w.count > 0)


def _unwrap(node: Any) -> Any:
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node


def absent_labels(node: Any) -> LabelSet:
    """Labels of absent()'s result: those fixed by equality matchers of a selector argument."""
    node = _unwrap(node)
    if isinstance(node, pp.MatrixSelector):
        node = node.vector_selector
    if not isinstance(node, pp.VectorSelector):
        return ()
    out: dict[str, str] = {}
    seen: set[str] = set()
    for m in node.matchers.matchers:
        if m.name == NAME:
            continue
        if str(m.op) == "MatchOp.Equal" and m.name not in seen:
            out[m.name] = m.value
            seen.add(m.name)
        else:
            out.pop(m.name, None)
    return tuple(sorted((k, v) for k, v in out.items() if v != ""))


def _range_call(ev: Any, name: str, node: Any, ts: np.ndarray) -> VectorFrame:
    args = list(node.args)
    midx = next(i for i, a in enumerate(args) if isinstance(_unwrap(a), (pp.MatrixSelector, pp.SubqueryExpr)))
    if len(args) == 1:
        from_tiers = tierpick.range_call(ev, name, _unwrap(args[0]), ts, name in KEEP_NAME)
        if from_tiers is not None:
            return from_tiers
    others = [ev.scalar_arg(a, ts) for i, a in enumerate(args) if i != midx]
    frame = ev.eval(_unwrap(args[midx]), ts)
    assert isinstance(frame, RangeFrame)
    n = len(ts)
    if name == "absent_over_time":
        any_present = np.zeros(n, dtype=bool)
        for rs in frame.series:
            any_present |= windows.Window(rs.times, rs.values, frame.ends, frame.range_ms).count > 0
        return VectorFrame([absent_labels(args[midx])], np.ones((1, n)), ~any_present[None, :])
    if name == "double_exponential_smoothing":
        sf, tf = others
        if ((sf <= 0) | (sf >= 1)).any():
            raise PromQLEvalError(f"invalid smoothing factor. Expected: 0 < sf < 1, got: {float(sf[0]):f}")
        if ((tf <= 0) | (tf >= 1)).any():
            raise PromQLEvalError(f"invalid trend factor. Expected: 0 < tf < 1, got: {float(tf[0]):f}")
    if name in _RATES and frame.hist is None:
        return _rates(ev, name, frame, n)
    fn = RANGE_FUNCTIONS[name]
    labels: list[LabelSet] = []
    values: list[np.ndarray] = []
    present: list[np.ndarray] = []
    w: windows.Window | None = None
    for rs in frame.series:
        ev.check_deadline()
        mixed = None
        if rs.hist is not None and name not in _HIST_COUNTING:
            rs, mixed = _split_histograms(name, rs, frame.ends, frame.range_ms)
        w = windows.Window(rs.times, rs.values, frame.ends, frame.range_ms, like=w)
        if not (w.count > 0).any():
            continue
        val, ok = fn(w, others, ts)
        if mixed is not None:
            ok = ok & ~mixed
        if not ok.any():
            continue
        labels.append(rs.labels if name in KEEP_NAME else drop_name(rs.labels))
        values.append(val)
        present.append(ok)
    return _unique_frame(n, labels, values, present)


def _unique_frame(n: int, labels: list[Any], values: list[Any], present: list[Any]) -> VectorFrame:
    """The rows built by a range function, as one frame; an error if two rows have the same labels."""
    if not labels:
        return VectorFrame.empty(n)
    out = VectorFrame(labels, np.array(values), np.array(present))
    check_unique_labels(out)
    return out


_RATES = {"rate": (True, True), "increase": (True, False), "delta": (False, False)}


def _rates(ev: Any, name: str, frame: RangeFrame, n: int) -> VectorFrame:
    """rate/increase/delta, computed for each run of series with the same timestamps at once."""
    is_counter, is_rate = _RATES[name]
    labels: list[LabelSet] = []
    values: list[np.ndarray] = []
    present: list[np.ndarray] = []
    series = frame.series
    i = 0
    while i < len(series):
        ev.check_deadline()
        w = windows.Window(series[i].times, series[i].values, frame.ends, frame.range_ms)
        j = i + 1
        while j < len(series) and windows.same_times(series[j].times, w.times):
            j += 1
        group = series[i:j]
        i = j
        if not (w.count > 0).any():
            continue
        rows = np.stack([rs.values for rs in group]) if len(group) > 1 else w.values[None, :]
        val, ok = rates.extrapolated_rate_rows(w, rows, is_counter, is_rate)
        if not ok.any():
            continue
        for r, rs in enumerate(group):
            labels.append(drop_name(rs.labels))
            values.append(val[r])
            present.append(ok)
    return _unique_frame(n, labels, values, present)


def _string_arg(ev: Any, node: Any, ts: np.ndarray) -> str:
    frame = ev.eval(node, ts)
    if not isinstance(frame, StringFrame):
        raise PromQLEvalError("expected a string argument")
    return frame.value


def evaluate_call(ev: Any, node: Any, ts: np.ndarray) -> Any:  # noqa: C901 - one dispatch per PromQL function family
    """Evaluate a function call node at steps `ts`."""
    name = node.func.name
    args = list(node.args)
    n = len(ts)
    if name in RANGE_FUNCTIONS or name == "absent_over_time":
        return _range_call(ev, name, node, ts)
    if name in functions.MATH:
        return functions.apply_math(name, ev.vector_arg(args[0], ts))
    if name == "time":
        return ScalarFrame(ts / 1000.0)
    if name in ("start", "end", "range", "step"):
        # The query's own bounds, in seconds: start() and end() are the first and last step.
        value = {
            "start": ev.start_ms,
            "end": ev.end_ms,
            "range": ev.end_ms - ev.start_ms,
            "step": ev.step_ms,
        }[name]
        return ScalarFrame(np.full(n, value / 1000.0))
    if name in ("min_of", "max_of"):
        a, b = ev.scalar_arg(args[0], ts), ev.scalar_arg(args[1], ts)
        return ScalarFrame(np.minimum(a, b) if name == "min_of" else np.maximum(a, b))
    if name == "pi":
        return ScalarFrame(np.full(n, np.pi))
    if name == "vector":
        return VectorFrame([()], ev.scalar_arg(args[0], ts)[None, :].copy(), np.ones((1, n), dtype=bool))
    if name == "scalar":
        frame = ev.vector_arg(args[0], ts)
        count = frame.present.sum(axis=0)
        pick = frame.present.argmax(axis=0) if len(frame.labels) else np.zeros(n, dtype=np.int64)
        vals = frame.values[pick, np.arange(n)] if len(frame.labels) else np.full(n, np.nan)
        return ScalarFrame(np.where(count == 1, vals, np.nan))
    if name == "timestamp":
        target = _unwrap(args[0])
        if isinstance(target, pp.VectorSelector):
            frame = ev.vector_selector(target, ts, want_times=True)
            return functions.map_values(frame, frame.values)
        frame = ev.vector_arg(args[0], ts)
        return functions.map_values(frame, np.broadcast_to(ts / 1000.0, frame.values.shape).copy())
    if name == "absent":
        frame = ev.vector_arg(args[0], ts)
        any_present = frame.present.any(axis=0)
        return VectorFrame([absent_labels(args[0])], np.ones((1, n)), ~any_present[None, :])
    if name in ("clamp", "clamp_min", "clamp_max"):
        frame = ev.vector_arg(args[0], ts)
        if name == "clamp":
            lo, hi = ev.scalar_arg(args[1], ts), ev.scalar_arg(args[2], ts)
        elif name == "clamp_min":
            lo, hi = ev.scalar_arg(args[1], ts), np.full(n, np.inf)
        else:
            lo, hi = np.full(n, -np.inf), ev.scalar_arg(args[1], ts)
        return functions.clamp(frame, lo, hi)
    if name == "round":
        frame = ev.vector_arg(args[0], ts)
        to = ev.scalar_arg(args[1], ts) if len(args) > 1 else np.ones(n)
        return functions.round_values(frame, to)
    if functions.is_date_function(name):
        if not args:
            return VectorFrame(
                [()], functions.date_part(name, ts / 1000.0)[None, :], np.ones((1, n), dtype=bool)
            )
        frame = ev.vector_arg(args[0], ts)
        return functions.map_values(frame, functions.date_part(name, frame.values))
    if name in ("sort", "sort_desc"):
        return functions.sort_rows(ev.vector_arg(args[0], ts), name == "sort_desc")
    if name in ("sort_by_label", "sort_by_label_desc"):
        frame = ev.vector_arg(args[0], ts)
        names = [_string_arg(ev, a, ts) for a in args[1:]]
        return functions.sort_by_label(frame, names, name.endswith("_desc"))
    if name == "label_replace":
        frame = ev.vector_arg(args[0], ts)
        dst, repl, src, regex = (_string_arg(ev, a, ts) for a in args[1:5])
        ev.check_label_name(dst, "invalid destination label name in label_replace(): {}")
        return functions.label_replace(frame, dst, repl, src, regex)
    if name == "label_join":
        frame = ev.vector_arg(args[0], ts)
        dst, sep = _string_arg(ev, args[1], ts), _string_arg(ev, args[2], ts)
        ev.check_label_name(dst, "invalid destination label name in label_join(): {}")
        for a in args[3:]:
            ev.check_label_name(_string_arg(ev, a, ts), "invalid source label name in label_join(): {}")
        return functions.label_join(frame, dst, sep, [_string_arg(ev, a, ts) for a in args[3:]])
    if name == "histogram_quantile":
        q = ev.scalar_arg(args[0], ts)
        return histogram.histogram_quantile(q, ev.vector_arg(args[1], ts))
    raise Unsupported(f"function {name}()")


__all__ = ["RANGE_FUNCTIONS", "ScalarFrame", "evaluate_call"]
