"""The PromQL engine: instant and range queries over a `Queryable`, the tree walked for all steps at once
(what its selectors read, and the vectors made of it: `reads.py`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import promql_parser as pp

from gpuwatch.query import aggregate, binary, tierpick
from gpuwatch.query.calls import RANGE_FUNCTIONS, evaluate_call
from gpuwatch.query.errors import PromQLEvalError, QueryTooLarge, Unsupported
from gpuwatch.query.frames import (
    RangeFrame,
    RangeSeries,
    ScalarFrame,
    StringFrame,
    VectorFrame,
    drop_histograms,
    drop_name,
    merge_same_labels,
)
from gpuwatch.query.functions import MATH
from gpuwatch.query.limits import MAX_DEPTH, MAX_LENGTH
from gpuwatch.query.nativehist import NativeHistogramUnsupported
from gpuwatch.query.parse import parse
from gpuwatch.query.reads import QueryReads, delta_ms
from gpuwatch.query.source import EngineSettings, Queryable
from gpuwatch.query.values import Matrix, Result, Sample, Scalar, Series, String, Vector

Frame = ScalarFrame | VectorFrame | RangeFrame | StringFrame

MAX_POINTS = 11_000


def _go_div(a: int, b: int) -> int:
    """Integer division truncating toward zero, as Go's `/` does."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


class Engine:
    """Evaluate PromQL over `source`; limits are per query."""

    def __init__(
        self,
        source: Queryable,
        *,
        lookback_ms: int = 300_000,
        max_samples: int = 50_000_000,
        timeout_s: float = 120.0,
        monotonic: Callable[[], float] = time.monotonic,
        subquery_step_ms: int = 60_000,
        max_points: int = MAX_POINTS,
        max_length: int = MAX_LENGTH,
        max_depth: int = MAX_DEPTH,
    ) -> None:
        self.source = source
        self.max_length = int(max_length)
        self.max_depth = int(max_depth)
        self.lookback_ms = int(lookback_ms)
        self.max_samples = int(max_samples)
        self.timeout_s = float(timeout_s)
        self.monotonic = monotonic
        self.subquery_step_ms = int(subquery_step_ms)
        self.max_points = int(max_points)

    @classmethod
    def configured(
        cls,
        source: Queryable,
        settings: EngineSettings,
        monotonic: Callable[[], float],
        *,
        timeout_s: float | None = None,
        lookback_ms: int | None = None,
    ) -> Engine:
        """An engine over `source` with the limits `settings` give (a request may shorten the
        timeout or set its own lookback)."""
        return cls(
            source,
            lookback_ms=int(settings.lookback * 1000) if lookback_ms is None else lookback_ms,
            max_samples=settings.query_max_samples,
            timeout_s=settings.query_timeout if timeout_s is None else timeout_s,
            monotonic=monotonic,
            max_length=settings.query_max_length,
            max_depth=settings.query_max_depth,
        )

    def instant(self, expr: str, time_ms: int, *, timeout_s: float | None = None) -> Result:
        """Evaluate `expr` at `time_ms`."""
        # kept per text by parse (rules evaluate the same expressions every round)
        query = parse(expr, max_length=self.max_length, max_depth=self.max_depth)
        ev = _Evaluation(self, int(time_ms), int(time_ms), timeout_s, query.invalid_utf8)
        ts = np.array([int(time_ms)], dtype=np.int64)
        try:
            frame = ev.eval(query.expr, ts)
        except RecursionError:  # deeper than the frames left (query_max_depth bounds it)
            raise QueryTooLarge("the query nests too deeply to evaluate (setting query_max_depth)") from None
        return _instant_result(frame, int(time_ms))

    def range(
        self, expr: str, start_ms: int, end_ms: int, step_ms: int, *, timeout_s: float | None = None
    ) -> Matrix:
        """Evaluate `expr` at start_ms, start_ms + step_ms, ... up to end_ms."""
        start_ms, end_ms, step_ms = int(start_ms), int(end_ms), int(step_ms)
        if step_ms <= 0:
            raise PromQLEvalError(
                "zero or negative query resolution step widths are not accepted. Try a positive integer"
            )
        if end_ms < start_ms:
            raise PromQLEvalError("end timestamp must not be before start time")
        if (end_ms - start_ms) // step_ms + 1 > self.max_points:
            raise QueryTooLarge(
                f"exceeded maximum resolution of {self.max_points:,} points per timeseries. "
                "Try decreasing the query resolution (?step=XX)"
            )
        query = parse(
            expr,
            step_ms=step_ms,
            range_ms=end_ms - start_ms,
            max_length=self.max_length,
            max_depth=self.max_depth,
        )
        ev = _Evaluation(self, start_ms, end_ms, timeout_s, query.invalid_utf8, step_ms)
        ts = np.arange(start_ms, end_ms + 1, step_ms, dtype=np.int64)
        try:
            frame = ev.eval(query.expr, ts)
        except RecursionError:  # deeper than the frames left (query_max_depth bounds it)
            raise QueryTooLarge("the query nests too deeply to evaluate (setting query_max_depth)") from None
        return _range_result(frame, ts)


def _instant_result(frame: Frame, time_ms: int) -> Result:
    if isinstance(frame, ScalarFrame):
        return Scalar(time_ms, float(frame.values[0]))
    if isinstance(frame, StringFrame):
        return String(time_ms, frame.value)
    if isinstance(frame, VectorFrame):
        return Vector(
            [
                Sample(dict(ls), time_ms, float(frame.values[i, 0]))
                for i, ls in enumerate(frame.labels)
                if frame.present[i, 0]
            ]
        )
    series = []
    end = int(frame.ends[0])
    for rs in frame.series:
        keep = (rs.times > end - frame.range_ms) & (rs.times <= end)
        if keep.any():
            series.append(Series(dict(rs.labels), rs.times[keep], rs.values[keep]))
    series.sort(key=lambda s: tuple(sorted(s.labels.items())))
    return Matrix(series)


def _range_result(frame: Frame, ts: np.ndarray) -> Matrix:
    if isinstance(frame, ScalarFrame):
        return Matrix([Series({}, ts.copy(), frame.values.astype(np.float64))])
    if not isinstance(frame, VectorFrame):
        kind = "range vector" if isinstance(frame, RangeFrame) else "string"
        raise PromQLEvalError(
            f'invalid expression type "{kind}" for range query, must be Scalar or instant Vector'
        )
    frame = merge_same_labels(frame)
    out = []
    for i, ls in enumerate(frame.labels):
        m = frame.present[i]
        if m.any():
            out.append((ls, Series(dict(ls), ts[m], frame.values[i][m])))
    out.sort(key=lambda p: p[0])
    return Matrix([s for _, s in out])


class _Evaluation(QueryReads):
    """One query's tree walk, evaluated for all its steps at once, over what it reads (`QueryReads`)."""

    engine: Engine

    def __init__(
        self,
        engine: Engine,
        start_ms: int,
        end_ms: int,
        timeout_s: float | None,
        invalid_utf8: frozenset[str] = frozenset(),
        step_ms: int = 0,
    ) -> None:
        super().__init__(engine, start_ms, end_ms, timeout_s)
        self.step_ms = step_ms  # 0 in an instant query, as step() is in Prometheus
        self.invalid_utf8 = invalid_utf8
        self.node: Any = None  # the node being evaluated (the parent of what `eval` is given)

    def vector_selector(self, vs: Any, ts: np.ndarray, want_times: bool = False) -> VectorFrame:
        """An instant selector at steps `ts`: from tier points where they answer it (tierpick.py)."""
        from_tiers = tierpick.vector(self, vs, ts, want_times)
        return from_tiers if from_tiers is not None else super().vector_selector(vs, ts, want_times)

    # Evaluation ------------------------------------------------------------------------------

    def eval(self, node: Any, ts: np.ndarray) -> Frame:
        """Evaluate `node` at steps `ts`; native histogram samples may only reach the few
        operations that handle them (`_hist_ok`), anything else fails naming the operation."""
        parent = self.node
        self.node = node
        try:
            frame = self._eval(node, ts)
        finally:
            self.node = parent
        if not isinstance(frame, (ScalarFrame, StringFrame)) and frame.hist is not None:
            mode = _hist_mode(parent)
            if mode == "drop" and isinstance(frame, VectorFrame):
                return drop_histograms(frame)
            if mode != "keep":
                raise NativeHistogramUnsupported(f"{_describe(parent)} over histogram samples")
        return frame

    def _eval(self, node: Any, ts: np.ndarray) -> Frame:
        self.check_deadline()
        if isinstance(node, pp.ParenExpr):
            return self.eval(node.expr, ts)
        if isinstance(node, pp.NumberLiteral):
            return ScalarFrame(np.full(len(ts), float(node.val)))
        if isinstance(node, pp.StringLiteral):
            return StringFrame(node.val)
        if isinstance(node, pp.VectorSelector):
            return self.vector_selector(node, ts)
        if isinstance(node, pp.MatrixSelector):
            return self.matrix_selector(node, ts)
        if isinstance(node, pp.SubqueryExpr):
            return self.subquery(node, ts)
        if isinstance(node, pp.UnaryExpr):
            return self.negate(self.eval(node.expr, ts))
        if isinstance(node, pp.BinaryExpr):
            return self.binary(node, ts)
        if isinstance(node, pp.AggregateExpr):
            return self.aggregate(node, ts)
        if isinstance(node, pp.Call):
            return self.call(node, ts)
        raise Unsupported(f"expression type {type(node).__name__}")

    def subquery(self, sq: Any, ts: np.ndarray) -> RangeFrame:
        step = delta_ms(sq.step) or self.engine.subquery_step_ms
        rng = delta_ms(sq.range)
        ends = self.times(sq, ts)
        lo = int(ends.min()) - rng
        start = step * _go_div(lo, step)
        if start <= lo:
            start += step
        steps = (int(ends.max()) - start) // step + 1
        if steps > self.engine.max_samples:
            raise QueryTooLarge(
                f"the subquery would be evaluated at {steps} steps, more than query_max_samples "
                f"({self.engine.max_samples}); use a coarser step"
            )
        inner_ts = np.arange(start, int(ends.max()) + 1, step, dtype=np.int64)
        if len(inner_ts) == 0:
            return RangeFrame([], rng, ends)
        inner = self.eval(sq.expr, inner_ts)
        if isinstance(inner, ScalarFrame):
            inner = VectorFrame([()], inner.values[None, :], np.ones((1, len(inner_ts)), dtype=bool))
        if not isinstance(inner, VectorFrame):
            raise PromQLEvalError("subquery is only allowed on instant vector or scalar expressions")
        series = []
        for i, ls in enumerate(inner.labels):
            m = inner.present[i]
            if m.any():
                series.append(RangeSeries(ls, inner_ts[m], inner.values[i][m]))
        return RangeFrame(series, rng, ends)

    def negate(self, frame: Frame) -> Frame:
        if isinstance(frame, ScalarFrame):
            return ScalarFrame(-frame.values)
        if isinstance(frame, VectorFrame):
            return merge_same_labels(
                VectorFrame([drop_name(ls) for ls in frame.labels], -frame.values, frame.present)
            )
        raise PromQLEvalError("unary minus is only allowed on scalars and instant vectors")

    def binary(self, node: Any, ts: np.ndarray) -> Frame:
        op = str(node.op)
        mod = node.modifier
        return_bool = bool(mod is not None and mod.return_bool)
        lhs = self.eval(node.lhs, ts)
        rhs = self.eval(node.rhs, ts)
        if (isinstance(lhs, VectorFrame) and lhs.hist is not None) or (
            isinstance(rhs, VectorFrame) and rhs.hist is not None
        ):
            lhs, rhs = _binary_histograms(op, return_bool, lhs, rhs)
        if isinstance(lhs, ScalarFrame) and isinstance(rhs, ScalarFrame):
            return ScalarFrame(binary.scalar_scalar(op, lhs.values, rhs.values, return_bool))
        if isinstance(lhs, VectorFrame) and isinstance(rhs, ScalarFrame):
            return binary.vector_scalar(op, lhs, rhs.values, False, return_bool)
        if isinstance(lhs, ScalarFrame) and isinstance(rhs, VectorFrame):
            return binary.vector_scalar(op, rhs, lhs.values, True, return_bool)
        if not (isinstance(lhs, VectorFrame) and isinstance(rhs, VectorFrame)):
            raise PromQLEvalError(
                f"binary expression must contain only scalar and instant vector types ({op})"
            )
        matching = _matching(mod, op)
        if op in binary.SET_OPS:
            return binary.set_operation(op, lhs, rhs, matching)
        return binary.vector_vector(op, lhs, rhs, matching, return_bool)

    def check_label_name(self, name: str, message: str) -> None:
        """Reject empty names and names whose bytes are not valid UTF-8."""
        if not name or name in self.invalid_utf8:
            raise PromQLEvalError(message.format(name).replace("'", '"'))

    def scalar_arg(self, node: Any, ts: np.ndarray) -> np.ndarray:
        frame = self.eval(node, ts)
        if not isinstance(frame, ScalarFrame):
            raise PromQLEvalError("expected a scalar argument")
        return frame.values

    def vector_arg(self, node: Any, ts: np.ndarray) -> VectorFrame:
        frame = self.eval(node, ts)
        if not isinstance(frame, VectorFrame):
            raise PromQLEvalError("expected an instant vector argument")
        return frame

    def aggregate(self, node: Any, ts: np.ndarray) -> VectorFrame:
        op = str(node.op).lower()
        grouping: list[str] = []
        without = False
        if node.modifier is not None:
            grouping = list(node.modifier.labels)
            without = str(node.modifier.type).endswith("Without")
        if op == "count_values":
            label = self.eval(node.param, ts)
            if not isinstance(label, StringFrame):
                raise PromQLEvalError("count_values requires a string parameter")
            self.check_label_name(label.value, "invalid label name {!r}")
            return aggregate.count_values(self.vector_arg(node.expr, ts), label.value, grouping, without)
        param = self.scalar_arg(node.param, ts) if op in ("topk", "bottomk", "quantile") else None
        frame = self.vector_arg(node.expr, ts)
        if op in ("topk", "bottomk"):
            assert param is not None
            if np.isnan(param).any():
                raise PromQLEvalError("Parameter value is NaN")
            if (param <= -(2.0**63)).any():
                raise PromQLEvalError(f"Scalar value {float(param.min())} underflows int64")
            if (param >= 2.0**63).any():
                raise PromQLEvalError(f"Scalar value {float(param.max())} overflows int64")
            return aggregate.topk(op, frame, grouping, without, param)
        return aggregate.aggregate(op, frame, grouping, without, param)

    def call(self, node: Any, ts: np.ndarray) -> Frame:
        return evaluate_call(self, node, ts)


# What an operation does with native histogram samples in its argument (see nativehist.py):
# "keep" (it handles them: counts them, writes their text, checks range windows itself in
# calls._range_call, or the binary operator decides in binary()), "drop" (Prometheus ignores
# them there, with an info annotation), anything else fails naming the operation.
_HIST_KEEP_AGGREGATIONS = frozenset({"count", "group", "count_values"})
_HIST_DROP_AGGREGATIONS = frozenset({"max", "min", "stddev", "stdvar", "quantile", "topk", "bottomk"})
_HIST_KEEP_CALLS = frozenset({"absent", "absent_over_time", "timestamp", *RANGE_FUNCTIONS})
_HIST_DROP_CALLS = frozenset(
    {*MATH, "clamp", "clamp_min", "clamp_max", "round", "scalar", "sort", "sort_desc"}
    | {"day_of_month", "day_of_week", "day_of_year", "days_in_month", "hour", "minute", "month", "year"}
)


def _hist_mode(parent: Any) -> str:
    if isinstance(parent, (pp.ParenExpr, pp.BinaryExpr)):
        return "keep"
    if isinstance(parent, pp.AggregateExpr):
        op = str(parent.op).lower()
        return "keep" if op in _HIST_KEEP_AGGREGATIONS else "drop" if op in _HIST_DROP_AGGREGATIONS else ""
    if isinstance(parent, pp.Call):
        name = parent.func.name
        return "keep" if name in _HIST_KEEP_CALLS else "drop" if name in _HIST_DROP_CALLS else ""
    return ""


def _binary_histograms(op: str, return_bool: bool, lhs: Frame, rhs: Frame) -> tuple[Frame, Frame]:
    """A filtering comparison of a vector with a scalar ignores histogram samples, as Prometheus
    does (with an info annotation); any other binary operation on them is not supported."""
    scalar_side = isinstance(lhs, ScalarFrame) or isinstance(rhs, ScalarFrame)
    if op in binary.COMPARISON and not return_bool and scalar_side:
        return (
            drop_histograms(lhs) if isinstance(lhs, VectorFrame) else lhs,
            drop_histograms(rhs) if isinstance(rhs, VectorFrame) else rhs,
        )
    raise NativeHistogramUnsupported(f"the {op} operator over histogram samples")


def _describe(parent: Any) -> str:
    if parent is None:
        return "a query result"
    if isinstance(parent, pp.AggregateExpr):
        return f"{str(parent.op).lower()}()"
    if isinstance(parent, pp.Call):
        return f"{parent.func.name}()"
    if isinstance(parent, pp.BinaryExpr):
        return f"the {parent.op} operator"
    if isinstance(parent, pp.UnaryExpr):
        return "unary minus"
    if isinstance(parent, pp.SubqueryExpr):
        return "a subquery"
    return type(parent).__name__


def _matching(mod: Any, op: str) -> binary.Matching:
    if op in binary.SET_OPS:
        card = "many-to-many"
    elif mod is None:
        card = "one-to-one"
    else:
        card = {
            "OneToOne": "one-to-one",
            "ManyToOne": "many-to-one",
            "OneToMany": "one-to-many",
            "ManyToMany": "many-to-many",
        }[str(mod.card).rsplit(".", 1)[-1]]
    if mod is None or mod.matching is None:
        return binary.Matching(card, False, (), tuple(mod.group_labels or ()) if mod is not None else ())
    on = str(mod.matching.type).endswith("Include")
    return binary.Matching(card, on, tuple(mod.matching.labels), tuple(mod.group_labels or ()))


__all__ = ["Engine", "Queryable"]
