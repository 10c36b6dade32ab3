"""/api/v1/query and /api/v1/query_range: their parameters, answers and errors, and a WSGI layer that
serves them in front of Flask.

Dashboards send these two requests far more often than any other, each refresh one per panel. Flask
wraps every request in a request context, a werkzeug `Request` and `Response`, URL matching and its
hooks: ~0.27 ms, a tenth of a one-series day query's time over HTTP (bench/README.md, "Query").
`QueryRoutes` answers a GET, or a form-encoded POST, for these two paths itself, with the same
functions the Flask routes in `promapi` call, so both give the same bytes (tests/test_promql_api.py
runs every API test both ways). Anything else goes on to Flask: other paths and methods, other
bodies or a body over Flask's MAX_CONTENT_LENGTH.
"""

from __future__ import annotations

import codecs
import json
import logging
import math
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl

from werkzeug.http import HTTP_STATUS_CODES

from gpuwatch.errors import GpuwatchError, QueryError
from gpuwatch.query import (
    Engine,
    PromQLEvalError,
    PromQLParseError,
    QueryTimeout,
    QueryTooLarge,
    Unsupported,
)
from gpuwatch.query.engine import MAX_POINTS
from gpuwatch.query.values import Result, to_prometheus_json_bytes

log = logging.getLogger("gpuwatch.web")

Params = dict[str, list[str]]

_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNITS_MS = (365 * 86400_000, 7 * 86400_000, 86400_000, 3600_000, 60_000, 1000, 1)
_SUCCESS_HEAD = '{"status":"success","data":'
NOT_UTF8 = "invalid query string: not UTF-8"


class BadData(Exception):
    """A request parameter is missing or malformed (HTTP 400, errorType bad_data)."""


# gpuwatch's errors as Prometheus answers them: HTTP status and errorType, first match wins.
ERRORS: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int, str], ...] = (
    ((BadData, PromQLParseError), 400, "bad_data"),
    (QueryTimeout, 503, "timeout"),
    ((Unsupported, QueryTooLarge, PromQLEvalError, QueryError, GpuwatchError), 422, "execution"),
)
KNOWN_ERRORS = tuple(t for kinds, _, _ in ERRORS for t in (kinds if isinstance(kinds, tuple) else (kinds,)))


def error_status(exc: Exception) -> tuple[int, str]:
    """The HTTP status and errorType for one of `KNOWN_ERRORS`."""
    for kinds, status, error_type in ERRORS:
        if isinstance(exc, kinds):
            return status, error_type
    raise TypeError(f"not a query error: {exc!r}")


def error_body(error_type: str, message: str) -> bytes:
    """An error answer's JSON, as Flask's `jsonify` writes it."""
    return (
        json.dumps({"status": "error", "errorType": error_type, "error": message}, separators=(",", ":"))
        + "\n"
    ).encode()


def internal_error_text(exc: BaseException) -> str:
    """The message of an unexpected error's 500 answer."""
    return f"internal error: {type(exc).__name__}: {exc}"


def one(params: Params, name: str) -> str | None:
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


def _setting(runtime: Any, name: str, default: float) -> float:
    return float(getattr(runtime.settings, name, default))


def _engine(runtime: Any, params: Params) -> Engine:
    timeout_s = _setting(runtime, "query_timeout_s", 120.0)
    text = one(params, "timeout")
    if text:
        timeout_s = min(timeout_s, parse_duration(text, "timeout") / 1000)
    lookback_ms = int(_setting(runtime, "lookback_s", 300.0) * 1000)
    text = one(params, "lookback_delta")
    if text:
        lookback_ms = parse_duration(text, "lookback_delta")
    return Engine(
        runtime.store,
        lookback_ms=lookback_ms,
        max_samples=int(_setting(runtime, "query_max_samples", 50_000_000)),
        timeout_s=timeout_s,
        monotonic=runtime.clock.monotonic,
    )


def _query_text(params: Params) -> str:
    text = one(params, "query")
    if text is None or not text.strip():
        raise BadData('invalid parameter "query": empty query')
    return text


def instant_query(runtime: Any, params: Params) -> Result:
    """Evaluate /api/v1/query's `query` at `time` (default: now)."""
    text = _query_text(params)
    t = one(params, "time")
    time_ms = parse_time(t, "time") if t else runtime.clock.now_ms()
    return _engine(runtime, params).instant(text, time_ms)


def range_query(runtime: Any, params: Params) -> Result:
    """Evaluate /api/v1/query_range's `query` from `start` to `end` every `step`."""
    text = _query_text(params)
    for name in ("start", "end", "step"):
        if not one(params, name):
            raise BadData(f'invalid parameter "{name}": missing')
    start = parse_time(one(params, "start") or "", "start")
    end = parse_time(one(params, "end") or "", "end")
    if end < start:
        raise BadData('invalid parameter "end": end timestamp must not be before start time')
    step = parse_duration(one(params, "step") or "", "step")
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
    return _engine(runtime, params).range(text, start, end, step)


ROUTES: dict[str, Callable[[Any, Params], Result]] = {
    "/api/v1/query": instant_query,
    "/api/v1/query_range": range_query,
}


def answer(route: Callable[[Any, Params], Result], runtime: Any, params: Params) -> tuple[int, bytes]:
    """HTTP status and JSON body of one query request; unexpected errors propagate."""
    try:
        result = route(runtime, params)
    except KNOWN_ERRORS as exc:
        status, error_type = error_status(exc)
        return status, error_body(error_type, str(exc))
    return 200, to_prometheus_json_bytes(result, _SUCCESS_HEAD, "}\n")


# werkzeug's own decoding of query strings and form bodies: invalid %-escapes stay escaped.
_QS_ERRORS = "werkzeug.url_quote"
try:
    codecs.lookup_error(_QS_ERRORS)
except LookupError:  # pragma: no cover - a werkzeug without it: its own decoding differs anyway
    _QS_ERRORS = "replace"

_FORM = "application/x-www-form-urlencoded"


def _decode_pairs(raw: bytes, params: Params) -> None:
    for key, value in parse_qsl(raw.decode(), keep_blank_values=True, errors=_QS_ERRORS):
        params.setdefault(key, []).append(value)


class QueryRoutes:
    """WSGI middleware: answers GET and form-encoded POST requests for `ROUTES` without Flask; passes
    every other request to `app` (the Flask app's `wsgi_app`). `flask_app` gives the body-size limit
    (`MAX_CONTENT_LENGTH`), as Flask applies it."""

    def __init__(self, app: Callable[..., Iterable[bytes]], runtime: Any, flask_app: Any) -> None:
        self.app = app
        self.runtime = runtime
        self.flask_app = flask_app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        route = ROUTES.get(environ.get("PATH_INFO", ""))
        if route is None:
            return self.app(environ, start_response)
        try:
            params = self._params(environ)
            if params is None:
                return self.app(environ, start_response)
            status, body = answer(route, self.runtime, params)
        except BadData as exc:
            status, body = 400, error_body("bad_data", str(exc))
        except Exception as exc:  # as Flask's last error handler (web/errors.py) answers
            log.exception("unhandled error on %s", environ.get("PATH_INFO"))
            status, body = 500, error_body("internal", internal_error_text(exc))
        start_response(
            f"{status} {HTTP_STATUS_CODES[status].upper()}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    def _params(self, environ: dict[str, Any]) -> Params | None:
        """The request's parameters as promapi reads them through werkzeug, or None where Flask
        should take the request: another method or body type, no Content-Length or a body over
        MAX_CONTENT_LENGTH. BadData: a query string that is not UTF-8."""
        method = environ.get("REQUEST_METHOD")
        if method != "GET" and method != "POST":
            return None
        params: Params = {}
        try:
            _decode_pairs(environ.get("QUERY_STRING", "").encode("latin-1"), params)
        except UnicodeError:
            raise BadData(NOT_UTF8) from None
        if method == "GET":  # a GET's body is not read, as in Prometheus
            return params
        if environ.get("CONTENT_TYPE", "").partition(";")[0].strip().lower() != _FORM:
            return None
        try:
            length = int(environ.get("CONTENT_LENGTH") or "-1")
        except ValueError:
            return None
        limit = self.flask_app.config.get("MAX_CONTENT_LENGTH")
        if length < 0 or (limit is not None and length > limit):
            return None
        body = environ["wsgi.input"].read(length)
        try:
            _decode_pairs(body, params)
        except ValueError:  # werkzeug drops a form it cannot decode
            pass
        return params
