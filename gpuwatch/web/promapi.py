"""Prometheus-compatible HTTP API (/api/v1/...): the same parameters, JSON shapes and error types.

Grafana's Prometheus data source and prometheus-api-client talk to these routes unchanged.
Dependencies come from `current_app.extensions["gpuwatch"]`: `backend` (what answers: the local
engine, or the remote store of `storage.remote`), `clock`, `settings` and optionally `metric_metadata()`.
A query's answer is the backend's body (`range_body`, `instant_body`): a remote store's answer is
passed on as it came where its bytes show a success within gpuwatch's limits.
"""

from __future__ import annotations

import platform
from typing import Any

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

import gpuwatch
from gpuwatch.core.model import Matcher
from gpuwatch.core.units import MAX_TIME_MS, MIN_TIME_MS
from gpuwatch.query.parse import selector_matchers
from gpuwatch.web.queryapi import (
    KNOWN_ERRORS,
    BadData,
    body_response,
    error_status,
    instant_body,
    one,
    range_body,
    request_params,
    time_ms,
)
from gpuwatch.web.runtime import runtime

bp = Blueprint("promapi", __name__)


def _success(data: Any, warnings: list[str] | None = None) -> ResponseReturnValue:
    body: dict[str, Any] = {"status": "success", "data": data}
    if warnings:
        body["warnings"] = warnings
    return jsonify(body)


def _error(error_type: str, message: str, status: int) -> ResponseReturnValue:
    return jsonify({"status": "error", "errorType": error_type, "error": message}), status


def _run(fn: Any) -> ResponseReturnValue:
    """Call `fn()` and map gpuwatch's errors onto Prometheus's error types."""
    try:
        return fn()
    except KNOWN_ERRORS as exc:
        status, error_type = error_status(exc)
        return _error(error_type, str(exc), status)


@bp.route("/api/v1/query", methods=["GET", "POST"])
def query() -> ResponseReturnValue:
    """Evaluate an instant query."""
    return _run(lambda: body_response(instant_body(runtime(), request_params())))


@bp.route("/api/v1/query_range", methods=["GET", "POST"])
def query_range() -> ResponseReturnValue:
    """Evaluate a range query."""
    return _run(lambda: body_response(range_body(runtime(), request_params())))


def _range(params: dict[str, list[str]]) -> tuple[int, int]:
    start = one(params, "start")
    end = one(params, "end")
    return (
        time_ms(start, "start") if start else MIN_TIME_MS,
        time_ms(end, "end") if end else MAX_TIME_MS,
    )


def _match_sets(params: dict[str, list[str]], required: bool) -> list[list[Matcher]]:
    texts = params.get("match[]", [])
    if required and not texts:
        raise BadData("no match[] parameter provided")
    return [selector_matchers(t) for t in texts]


def _limit(params: dict[str, list[str]]) -> int | None:
    text = one(params, "limit")
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
        params = request_params()
        start, end = _range(params)
        found = runtime().backend.series(_match_sets(params, required=True), start, end)
        items, warnings = _limited(found, _limit(params))
        return _success(items, warnings)

    return _run(run)


@bp.route("/api/v1/labels", methods=["GET", "POST"])
def labels() -> ResponseReturnValue:
    """List label names."""

    def run() -> ResponseReturnValue:
        params = request_params()
        start, end = _range(params)
        names = runtime().backend.label_names(_match_sets(params, required=False), start, end)
        items, warnings = _limited(names, _limit(params))
        return _success(items, warnings)

    return _run(run)


@bp.route("/api/v1/label/<name>/values", methods=["GET"])
def label_values(name: str) -> ResponseReturnValue:
    """List the values of one label."""

    def run() -> ResponseReturnValue:
        params = request_params()
        start, end = _range(params)
        values = runtime().backend.label_values(name, _match_sets(params, required=False), start, end)
        items, warnings = _limited(values, _limit(params))
        return _success(items, warnings)

    return _run(run)


@bp.route("/api/v1/metadata", methods=["GET"])
def metadata() -> ResponseReturnValue:
    """Return HELP/TYPE/UNIT per metric name."""

    def run() -> ResponseReturnValue:
        params = request_params()
        data: dict[str, list[dict[str, Any]]] = dict(runtime().metric_metadata())
        metric = one(params, "metric")
        if metric:
            data = {metric: data[metric]} if metric in data else {}
        per_metric = one(params, "limit_per_metric")
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
