"""Prometheus-compatible HTTP API (/api/v1/...): the same parameters, JSON shapes and error types.

Grafana's Prometheus data source and prometheus-api-client talk to these routes unchanged.
Dependencies come from `current_app.extensions["gpuwatch"]`: `store`, `clock`, `settings`
and optionally `metric_metadata()`.
"""

from __future__ import annotations

import math
import platform
import re
from datetime import datetime, timezone
from typing import Any

from flask import Blueprint, current_app, jsonify, request
from flask.typing import ResponseReturnValue

import gpuwatch
from gpuwatch.errors import GpuwatchError, QueryError
from gpuwatch.model import Matcher
from gpuwatch.query import (
    Engine,
    PromQLEvalError,
    PromQLParseError,
    QueryTimeout,
    QueryTooLarge,
    Unsupported,
    to_prometheus_json,
)
from gpuwatch.query.engine import MAX_POINTS
from gpuwatch.query.parse import selector_matchers
from gpuwatch.query.values import Matrix, Result, to_prometheus_json_bytes

bp = Blueprint("promapi", __name__)

# Prometheus's "min time" and "max time" defaults for series and label queries.
MIN_TIME_MS = -(2**62)
MAX_TIME_MS = 2**62
_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNITS_MS = (365 * 86400_000, 7 * 86400_000, 86400_000, 3600_000, 60_000, 1000, 1)


class BadData(Exception):
    """A request parameter is missing or malformed (HTTP 400, errorType bad_data)."""


def _runtime() -> Any:
    return current_app.extensions["gpuwatch"]


def _setting(name: str, default: float) -> float:
    return float(getattr(_runtime().settings, name, default))


def _params() -> dict[str, list[str]]:
    """GET query arguments and form-encoded POST bodies, merged (a GET's body is not read, as in
    Prometheus)."""
    out: dict[str, list[str]] = {}
    for source in (request.args, request.form) if request.method == "POST" else (request.args,):
        for key in source:
            out.setdefault(key, []).extend(source.getlist(key))
    return out


def _one(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[0] if values else None


def parse_time(text: str, name: str) -> int:
    """Parse a time parameter (Unix seconds, possibly fractional, or RFC3339) into milliseconds."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = None
    if seconds is not None:
        if not math.isfinite(seconds):
            raise BadData(f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp')
        return int(round(seconds * 1000))
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadData(f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp') from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(round(when.timestamp() * 1000))


def parse_duration(text: str, name: str) -> int:
    """Parse a duration parameter (float seconds or `1m30s`) into milliseconds."""
    try:
        seconds = float(text)
    except ValueError:
        m = _DURATION.match(text.strip())
        if not text.strip() or m is None or not any(m.groups()):
            raise BadData(f'invalid parameter "{name}": cannot parse "{text}" to a valid duration') from None
        return sum(int(g) * u for g, u in zip(m.groups(), _UNITS_MS, strict=True) if g)
    if not math.isfinite(seconds):
        raise BadData(f'invalid parameter "{name}": cannot parse "{text}" to a valid duration')
    return int(round(seconds * 1000))


def _success(data: Any, warnings: list[str] | None = None) -> ResponseReturnValue:
    body: dict[str, Any] = {"status": "success", "data": data}
    if warnings:
        body["warnings"] = warnings
    return jsonify(body)


def _success_result(result: Result) -> ResponseReturnValue:
    """A query result as `_success` would send it, byte for byte, with its JSON text built directly
    (per-point lists and Flask's encoder cost seconds on results of ~10^6 points)."""
    provider = current_app.json
    compact = getattr(provider, "compact", None)
    if (
        not isinstance(result, Matrix)
        or compact is False
        or (compact is None and current_app.debug)  # indented
        or getattr(provider, "sort_keys", True)
        or not getattr(provider, "ensure_ascii", False)
    ):
        return _success(to_prometheus_json(result))
    body = to_prometheus_json_bytes(result, '{"status":"success","data":', "}\n")
    return current_app.response_class(body, mimetype=getattr(provider, "mimetype", "application/json"))


def _error(error_type: str, message: str, status: int) -> ResponseReturnValue:
    return jsonify({"status": "error", "errorType": error_type, "error": message}), status


def _engine(params: dict[str, list[str]]) -> tuple[Engine, float]:
    runtime = _runtime()
    timeout_s = _setting("query_timeout_s", 120.0)
    text = _one(params, "timeout")
    if text:
        timeout_s = min(timeout_s, parse_duration(text, "timeout") / 1000)
    lookback_ms = int(_setting("lookback_s", 300.0) * 1000)
    text = _one(params, "lookback_delta")
    if text:
        lookback_ms = parse_duration(text, "lookback_delta")
    engine = Engine(
        runtime.store,
        lookback_ms=lookback_ms,
        max_samples=int(_setting("query_max_samples", 50_000_000)),
        timeout_s=timeout_s,
        monotonic=runtime.clock.monotonic,
    )
    return engine, timeout_s


def _run(fn: Any) -> ResponseReturnValue:
    """Call `fn()` and map gpuwatch's errors onto Prometheus's error types."""
    try:
        return fn()
    except BadData as exc:
        return _error("bad_data", str(exc), 400)
    except PromQLParseError as exc:
        return _error("bad_data", str(exc), 400)
    except QueryTimeout as exc:
        return _error("timeout", str(exc), 503)
    except (Unsupported, QueryTooLarge, PromQLEvalError) as exc:
        return _error("execution", str(exc), 422)
    except (QueryError, GpuwatchError) as exc:
        return _error("execution", str(exc), 422)


def _query_text(params: dict[str, list[str]]) -> str:
    text = _one(params, "query")
    if text is None or not text.strip():
        raise BadData('invalid parameter "query": empty query')
    return text


@bp.route("/api/v1/query", methods=["GET", "POST"])
def query() -> ResponseReturnValue:
    """Evaluate an instant query."""

    def run() -> ResponseReturnValue:
        params = _params()
        text = _query_text(params)
        t = _one(params, "time")
        time_ms = parse_time(t, "time") if t else _runtime().clock.now_ms()
        engine, _ = _engine(params)
        return _success_result(engine.instant(text, time_ms))

    return _run(run)


@bp.route("/api/v1/query_range", methods=["GET", "POST"])
def query_range() -> ResponseReturnValue:
    """Evaluate a range query."""

    def run() -> ResponseReturnValue:
        params = _params()
        text = _query_text(params)
        for name in ("start", "end", "step"):
            if not _one(params, name):
                raise BadData(f'invalid parameter "{name}": missing')
        start = parse_time(_one(params, "start") or "", "start")
        end = parse_time(_one(params, "end") or "", "end")
        if end < start:
            raise BadData('invalid parameter "end": end timestamp must not be before start time')
        step = parse_duration(_one(params, "step") or "", "step")
        if step <= 0:
            raise BadData(
                'invalid parameter "step": zero or negative query resolution step widths are not accepted. '
                "Try a positive integer"
            )
        if (end - start) // step + 1 > MAX_POINTS:
            raise BadData(
                f"exceeded maximum resolution of {MAX_POINTS:,} points per timeseries. "
                "Try decreasing the query resolution (?step=XX)"
            )
        engine, _ = _engine(params)
        return _success_result(engine.range(text, start, end, step))

    return _run(run)


def _range(params: dict[str, list[str]]) -> tuple[int, int]:
    start = _one(params, "start")
    end = _one(params, "end")
    return (
        parse_time(start, "start") if start else MIN_TIME_MS,
        parse_time(end, "end") if end else MAX_TIME_MS,
    )


def _match_sets(params: dict[str, list[str]], required: bool) -> list[list[Matcher]]:
    texts = params.get("match[]", [])
    if required and not texts:
        raise BadData("no match[] parameter provided")
    return [selector_matchers(t) for t in texts]


def _limit(params: dict[str, list[str]]) -> int | None:
    text = _one(params, "limit")
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise BadData(f'invalid parameter "limit": cannot parse "{text}" to an integer') from None
    if value < 0:
        raise BadData('invalid parameter "limit": limit must be non-negative')
    return value or None


def _limited(items: list[Any], limit: int | None) -> tuple[list[Any], list[str]]:
    if limit is not None and len(items) > limit:
        return items[:limit], ["results truncated due to limit"]
    return items, []


@bp.route("/api/v1/series", methods=["GET", "POST"])
def series() -> ResponseReturnValue:
    """List the label sets of series matching any of the match[] selectors."""

    def run() -> ResponseReturnValue:
        params = _params()
        start, end = _range(params)
        seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        for matchers in _match_sets(params, required=True):
            for labels in _runtime().store.series(matchers, start, end):
                seen.setdefault(tuple(sorted(labels.items())), dict(labels))
        items, warnings = _limited([seen[k] for k in sorted(seen)], _limit(params))
        return _success(items, warnings)

    return _run(run)


@bp.route("/api/v1/labels", methods=["GET", "POST"])
def labels() -> ResponseReturnValue:
    """List label names."""

    def run() -> ResponseReturnValue:
        params = _params()
        start, end = _range(params)
        store = _runtime().store
        names: set[str] = set()
        sets = _match_sets(params, required=False) or [[]]
        for matchers in sets:
            names.update(store.label_names(matchers, start, end))
        items, warnings = _limited(sorted(names), _limit(params))
        return _success(items, warnings)

    return _run(run)


@bp.route("/api/v1/label/<name>/values", methods=["GET"])
def label_values(name: str) -> ResponseReturnValue:
    """List the values of one label."""

    def run() -> ResponseReturnValue:
        params = _params()
        start, end = _range(params)
        store = _runtime().store
        values: set[str] = set()
        sets = _match_sets(params, required=False) or [[]]
        for matchers in sets:
            values.update(store.label_values(name, matchers, start, end))
        items, warnings = _limited(sorted(values), _limit(params))
        return _success(items, warnings)

    return _run(run)


@bp.route("/api/v1/metadata", methods=["GET"])
def metadata() -> ResponseReturnValue:
    """Return HELP/TYPE/UNIT per metric name."""

    def run() -> ResponseReturnValue:
        params = _params()
        source = getattr(_runtime(), "metric_metadata", None)
        data: dict[str, list[dict[str, Any]]] = dict(source()) if callable(source) else {}
        metric = _one(params, "metric")
        if metric:
            data = {metric: data[metric]} if metric in data else {}
        per_metric = _one(params, "limit_per_metric")
        if per_metric:
            n = int(per_metric) if per_metric.lstrip("-").isdigit() else 0
            if n > 0:
                data = {k: v[:n] for k, v in data.items()}
        limit = _limit(params)
        if limit is not None:
            data = dict(list(data.items())[:limit])
        return _success(data)

    return _run(run)


@bp.route("/api/v1/query_exemplars", methods=["GET", "POST"])
def query_exemplars() -> ResponseReturnValue:
    """gpuwatch stores no exemplars; answer with an empty list as Prometheus does without any."""
    return _success([])


@bp.route("/api/v1/status/buildinfo", methods=["GET"])
def buildinfo() -> ResponseReturnValue:
    """Version information, shaped like Prometheus's."""
    return _success(
        {
            "version": gpuwatch.__version__,
            "revision": "",
            "branch": "",
            "buildUser": "gpuwatch",
            "buildDate": "",
            "goVersion": f"python{platform.python_version()}",
        }
    )
