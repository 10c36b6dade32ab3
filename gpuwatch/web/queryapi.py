"""What the Prometheus API's routes (web/promapi.py) share: the request's parameters, time and duration
parameters, errors as Prometheus answers them, and the evaluation of /api/v1/query and
/api/v1/query_range with their JSON answer.
"""

from __future__ import annotations

from typing import NamedTuple

from flask import Response, current_app, request

from gpuwatch.core.errors import GpuwatchError, QueryError
from gpuwatch.core.units import parse_duration_ms, parse_time_ms
from gpuwatch.query import (
    PromQLEvalError,
    PromQLParseError,
    QueryTimeout,
    QueryTooLarge,
    Unsupported,
)
from gpuwatch.query.engine import MAX_POINTS
from gpuwatch.query.errors import RemoteUnavailable
from gpuwatch.query.values import Result
from gpuwatch.web.runtime import WebRuntime

Params = dict[str, list[str]]


class BadData(Exception):
    """A request parameter is missing or malformed (HTTP 400, errorType bad_data)."""


# gpuwatch's errors as Prometheus answers them: HTTP status and errorType, first match wins.
ERRORS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int, str], ...] = (
    ((BadData, PromQLParseError), 400, "bad_data"),
    (QueryTimeout, 503, "timeout"),
    (RemoteUnavailable, 503, "unavailable"),
    ((Unsupported, QueryTooLarge, PromQLEvalError, QueryError, GpuwatchError), 422, "execution"),
)
KNOWN_ERRORS = tuple(t for kinds, _, _ in ERRORS for t in (kinds if isinstance(kinds, tuple) else (kinds,)))


def error_status(exc: Exception) -> tuple[int, str]:
    """The HTTP status and errorType for one of `KNOWN_ERRORS`."""
    for kinds, status, error_type in ERRORS:
        if isinstance(exc, kinds):
            return status, error_type
    raise TypeError(f"not a query error: {exc!r}")


def request_params() -> Params:
    """GET query arguments and form-encoded POST bodies, merged (a GET's body is not read, as in
    Prometheus). BadData: a query string that is not UTF-8."""
    out: Params = {}
    try:
        sources = (request.args, request.form) if request.method == "POST" else (request.args,)
    except UnicodeDecodeError:  # werkzeug decodes the query string strictly
        raise BadData("invalid query string: not UTF-8") from None
    for source in sources:
        for key in source:
            out.setdefault(key, []).extend(source.getlist(key))
    return out


def one(params: Params, name: str) -> str | None:
    """The first value of parameter `name`, None where absent."""
    values = params.get(name)
    return values[0] if values else None


def time_ms(text: str, name: str) -> int:
    """Parameter `name`'s time (Unix seconds or RFC 3339 with a zone) in Unix milliseconds."""
    try:
        return parse_time_ms(text)
    except ValueError:
        raise BadData(f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp') from None


def duration_ms(text: str, name: str) -> int:
    """Parameter `name`'s duration (`1m30s` or seconds, negative ones too, as Prometheus reads them) in
    milliseconds."""
    try:
        return parse_duration_ms(text, signed=True)
    except ValueError:
        raise BadData(f'invalid parameter "{name}": cannot parse "{text}" to a valid duration') from None


def _limits(runtime: WebRuntime, params: Params) -> tuple[float, int | None]:
    """The request's timeout (at most `query_timeout`) and its own lookback, if it gives one."""
    timeout_s = runtime.settings.query_timeout
    text = one(params, "timeout")
    if text:
        timeout_s = min(timeout_s, duration_ms(text, "timeout") / 1000)
    text = one(params, "lookback_delta")
    return timeout_s, duration_ms(text, "lookback_delta") if text else None


def _query_text(params: Params) -> str:
    text = one(params, "query")
    if text is None or not text.strip():
        raise BadData('invalid parameter "query": empty query')
    return text


class InstantArgs(NamedTuple):
    """/api/v1/query's arguments, checked."""

    expr: str
    time_ms: int
    timeout_s: float
    lookback_ms: int | None


class RangeArgs(NamedTuple):
    """/api/v1/query_range's arguments, checked."""

    expr: str
    start_ms: int
    end_ms: int
    step_ms: int
    timeout_s: float
    lookback_ms: int | None


def instant_args(runtime: WebRuntime, params: Params) -> InstantArgs:
    """/api/v1/query's `query` and `time` (default: now), its timeout and lookback; BadData if amiss."""
    text = _query_text(params)
    t = one(params, "time")
    at = time_ms(t, "time") if t else runtime.clock.now_ms()
    timeout_s, lookback_ms = _limits(runtime, params)
    return InstantArgs(text, at, timeout_s, lookback_ms)


def instant_query(runtime: WebRuntime, params: Params) -> Result:
    """Evaluate /api/v1/query's `query` at `time` (default: now)."""
    a = instant_args(runtime, params)
    return runtime.backend.instant(a.expr, a.time_ms, timeout_s=a.timeout_s, lookback_ms=a.lookback_ms)


def instant_body(runtime: WebRuntime, params: Params) -> bytes:
    """/api/v1/query's success answer (a remote store's own bytes where they need no reading)."""
    a = instant_args(runtime, params)
    return runtime.backend.instant_body(a.expr, a.time_ms, timeout_s=a.timeout_s, lookback_ms=a.lookback_ms)


def range_query(runtime: WebRuntime, params: Params) -> Result:
    """Evaluate /api/v1/query_range's `query` from `start` to `end` every `step`."""
    a = range_args(runtime, params)
    return runtime.backend.range(
        a.expr, a.start_ms, a.end_ms, a.step_ms, timeout_s=a.timeout_s, lookback_ms=a.lookback_ms
    )


def range_body(runtime: WebRuntime, params: Params) -> bytes:
    """/api/v1/query_range's success answer (a remote store's own bytes where they need no reading)."""
    a = range_args(runtime, params)
    return runtime.backend.range_body(
        a.expr, a.start_ms, a.end_ms, a.step_ms, timeout_s=a.timeout_s, lookback_ms=a.lookback_ms
    )


def range_args(runtime: WebRuntime, params: Params) -> RangeArgs:
    """/api/v1/query_range's `query`, `start`, `end` and `step`, its timeout and lookback; BadData if
    amiss."""
    text = _query_text(params)
    for name in ("start", "end", "step"):
        if not one(params, name):
            raise BadData(f'invalid parameter "{name}": missing')
    start = time_ms(one(params, "start") or "", "start")
    end = time_ms(one(params, "end") or "", "end")
    if end < start:
        raise BadData('invalid parameter "end": end timestamp must not be before start time')
    step = duration_ms(one(params, "step") or "", "step")
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
    timeout_s, lookback_ms = _limits(runtime, params)
    return RangeArgs(text, start, end, step, timeout_s, lookback_ms)


def body_response(body: bytes) -> Response:
    """A success answer already written (`success_body`, or a remote store's own)."""
    return current_app.response_class(body, mimetype="application/json")
