"""A `QueryBackend` over a remote's Prometheus HTTP API (VictoriaMetrics, Prometheus, Mimir, Thanos):
the query text is sent as written, with gpuwatch's limits checked first and its timeout passed on,
and the answer read back into gpuwatch's result types; or, for the HTTP API (`range_body`,
`instant_body`), passed on as it came where its bytes show a success within gpuwatch's limits
(`passthrough.py`).

Errors take gpuwatch's shapes: a query the remote refuses (400 or 422 with Prometheus's error body)
is a `PromQLParseError` (`bad_data`) or `PromQLEvalError` (`execution`), a remote timeout a
`QueryTimeout`; a remote that cannot be reached, refuses gpuwatch's credentials or fails (5xx) is a
`RemoteUnavailable` (503), one line: `remote query backend http://... unreachable: ...`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import numpy as np
import requests
import urllib3
from requests.adapters import HTTPAdapter

from gpuwatch.core.model import Matcher, SeriesData, stable_labels
from gpuwatch.core.units import MAX_TIME_MS, MIN_TIME_MS
from gpuwatch.query.backend import MatchSets
from gpuwatch.query.engine import MAX_POINTS
from gpuwatch.query.errors import (
    PromQLEvalError,
    PromQLParseError,
    QueryTimeout,
    QueryTooLarge,
    RemoteUnavailable,
)
from gpuwatch.query.limits import check_text
from gpuwatch.query.passthrough import points_at_most, result_type
from gpuwatch.query.source import EngineSettings
from gpuwatch.query.values import Matrix, Result, Sample, Scalar, Series, String, Vector, success_body
from gpuwatch.remote.httpauth import failure, request_options
from gpuwatch.remote.storage import RemoteStorage

_orjson: Any
try:  # reads a range query's answer in ~0.6x the time `json` takes (a declared dependency)
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None

CONNECT_TIMEOUT_S = 5.0
# The remote stops a query at the timeout gpuwatch passes on; its answer may take a moment more
# (at most this, and at most the timeout again).
ANSWER_GRACE_S = 2.0
_MAX_TEXT = 300  # of a remote's error text in a message
_LOOKBACK_DEFAULT_S = 300.0  # Prometheus's and gpuwatch's; another `lookback` is passed on


def selector_text(matchers: Sequence[Matcher]) -> str:
    """`matchers` as a PromQL selector, `{__name__="up",job=~"a.*"}`."""
    return "{" + ",".join(f"{m.name}{m.op}{json.dumps(m.value, ensure_ascii=False)}" for m in matchers) + "}"


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}"


def _ms(t: Any) -> int:
    return int(round(float(t) * 1000))


def _line(text: str) -> str:
    """The first line of `text`, at most `_MAX_TEXT` characters."""
    lines = text.strip().splitlines()
    return lines[0][:_MAX_TEXT] if lines else ""


def _labels(metric: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in (metric or {}).items()}


def _dropped(exc: requests.ConnectionError) -> bool:
    """Whether a request failed on a connection that was open (closed or reset under it: urllib3's
    ProtocolError), not on opening one (refused, unresolved, no route)."""
    return bool(exc.args) and isinstance(exc.args[0], urllib3.exceptions.ProtocolError)


class RemoteBackend:
    """Answer PromQL, series and label questions by the remote at `remote.query_url`."""

    def __init__(
        self,
        remote: RemoteStorage,
        settings: EngineSettings,
        *,
        session: requests.Session | None = None,
        max_points: int = MAX_POINTS,
    ) -> None:
        self.remote = remote
        self.name = remote.query_url
        self.settings = settings
        self.max_points = max_points
        if session is None:
            session = requests.Session()
            # the web's workers and the rules ask at once; urllib3 keeps 10 connections a host by default
            session.mount("http://", HTTPAdapter(pool_maxsize=32))
            session.mount("https://", HTTPAdapter(pool_maxsize=32))
        self.session = session

    # -- PromQL ----------------------------------------------------------------------------------------
    def instant(
        self, expr: str, time_ms: int, *, timeout_s: float | None = None, lookback_ms: int | None = None
    ) -> Result:
        """Evaluate `expr` at `time_ms` on the remote."""
        return self._result(self._data(self._ask_instant(expr, time_ms, timeout_s, lookback_ms)))

    def instant_body(
        self, expr: str, time_ms: int, *, timeout_s: float | None = None, lookback_ms: int | None = None
    ) -> bytes:
        """`instant`'s answer as /api/v1/query sends it: the remote's bytes where they pass
        (`_passed`), else read and written again."""
        r = self._ask_instant(expr, time_ms, timeout_s, lookback_ms)
        passed = self._passed(r, ("vector", "matrix"))
        return passed if passed is not None else success_body(self._result(self._data(r)))

    def _ask_instant(
        self, expr: str, time_ms: int, timeout_s: float | None, lookback_ms: int | None
    ) -> requests.Response:
        self._check(expr)
        timeout = self._timeout(timeout_s)
        params = {"query": expr, "time": _seconds(int(time_ms)), **self._common(timeout, lookback_ms)}
        return self._ask("POST", "/api/v1/query", params, timeout)

    def range(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        *,
        timeout_s: float | None = None,
        lookback_ms: int | None = None,
    ) -> Matrix:
        """Evaluate `expr` from `start_ms` to `end_ms` every `step_ms` on the remote."""
        r = self._ask_range(expr, start_ms, end_ms, step_ms, timeout_s, lookback_ms)
        return self._matrix(self._result(self._data(r)))

    def range_body(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        *,
        timeout_s: float | None = None,
        lookback_ms: int | None = None,
    ) -> bytes:
        """`range`'s answer as /api/v1/query_range sends it: the remote's bytes where they pass
        (`_passed`), else read and written again."""
        r = self._ask_range(expr, start_ms, end_ms, step_ms, timeout_s, lookback_ms)
        passed = self._passed(r, ("matrix",))
        return passed if passed is not None else success_body(self._matrix(self._result(self._data(r))))

    def _ask_range(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        timeout_s: float | None,
        lookback_ms: int | None,
    ) -> requests.Response:
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
        self._check(expr)
        timeout = self._timeout(timeout_s)
        params = {
            "query": expr,
            "start": _seconds(int(start_ms)),
            "end": _seconds(int(end_ms)),
            "step": _seconds(int(step_ms)),
            **self._common(timeout, lookback_ms),
        }
        return self._ask("POST", "/api/v1/query_range", params, timeout)

    def _matrix(self, result: Result) -> Matrix:
        if isinstance(result, Scalar):  # a remote that answers a range query's scalar as one point
            return Matrix([Series({}, np.array([result.time_ms]), np.array([result.value]))])
        if not isinstance(result, Matrix):
            raise RemoteUnavailable(
                f"remote query backend {self.name} answered a range query with a {type(result).__name__}"
            )
        return result

    # -- series and labels ---------------------------------------------------------------------------
    def series(self, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        """The label sets of series any of `match_sets` selects, without duplicates, sorted."""
        params: list[tuple[str, str]] = [("match[]", selector_text(m)) for m in match_sets]
        data = self._call(
            "POST", "/api/v1/series", params + self._span(start_ms, end_ms), self._timeout(None)
        )
        seen = {tuple(sorted(_labels(x).items())) for x in data or []}
        return [dict(k) for k in sorted(seen)]

    def label_names(self, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[str]:
        """Label names of the series any of `match_sets` selects (no sets: every series), sorted."""
        params: list[tuple[str, str]] = [("match[]", selector_text(m)) for m in match_sets]
        data = self._call(
            "POST", "/api/v1/labels", params + self._span(start_ms, end_ms), self._timeout(None)
        )
        return sorted({str(x) for x in data or []})

    def label_values(self, name: str, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[str]:
        """Values of label `name` on the series any of `match_sets` selects (no sets: all), sorted."""
        params: list[tuple[str, str]] = [("match[]", selector_text(m)) for m in match_sets]
        path = f"/api/v1/label/{quote(name, safe='')}/values"
        data = self._call("GET", path, params + self._span(start_ms, end_ms), self._timeout(None))
        return sorted({str(x) for x in data or []})

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """The raw samples in [start_ms, end_ms] of the series `matchers` select: a range selector
        evaluated at `end_ms` (its window, (end - range, end], is widened by 1 ms to take in start)."""
        span = int(end_ms) - int(start_ms) + 1
        if span <= 0:
            return []
        result = self.instant(f"{selector_text(matchers)}[{span}ms]", int(end_ms))
        if not isinstance(result, Matrix):
            return []
        out = []
        for s in result.series:
            labels = dict(s.labels)
            name = labels.pop("__name__", "")
            out.append(SeriesData(name, stable_labels(labels), s.timestamps_ms, s.values))
        return out

    # -- the wire ------------------------------------------------------------------------------------
    def _check(self, expr: str) -> None:
        if not expr.strip():
            raise PromQLParseError("empty query")
        check_text(expr, max_length=self.settings.query_max_length, max_depth=self.settings.query_max_depth)

    def _timeout(self, timeout_s: float | None) -> float:
        limit = float(self.settings.query_timeout)
        return limit if timeout_s is None else max(0.001, min(limit, float(timeout_s)))

    def _common(self, timeout_s: float, lookback_ms: int | None) -> dict[str, str]:
        out = {"timeout": f"{timeout_s:g}"}
        if lookback_ms is None and self.settings.lookback != _LOOKBACK_DEFAULT_S:
            lookback_ms = int(self.settings.lookback * 1000)
        if lookback_ms is not None:
            out["lookback_delta"] = _seconds(lookback_ms)  # Prometheus's name for it
            out["max_lookback"] = _seconds(lookback_ms)  # VictoriaMetrics'
        return out

    @staticmethod
    def _span(start_ms: int, end_ms: int) -> list[tuple[str, str]]:
        """start and end where given (gpuwatch's API passes its extremes when they were not): else
        the remote's defaults apply."""
        out = []
        if start_ms > MIN_TIME_MS:
            out.append(("start", _seconds(start_ms)))
        if end_ms < MAX_TIME_MS:
            out.append(("end", _seconds(end_ms)))
        return out

    def _call(
        self, method: str, path: str, params: dict[str, str] | list[tuple[str, str]], timeout_s: float
    ) -> Any:
        """Ask the remote; return its answer's `data`, or raise the error gpuwatch answers for it."""
        return self._data(self._ask(method, path, params, timeout_s))

    def _ask(
        self, method: str, path: str, params: dict[str, str] | list[tuple[str, str]], timeout_s: float
    ) -> requests.Response:
        """Ask the remote; return its answer, or raise the error gpuwatch answers for no answer."""
        where = f"remote query backend {self.name}"
        wait_s = timeout_s + min(ANSWER_GRACE_S, timeout_s)
        connect_s = min(CONNECT_TIMEOUT_S, wait_s)
        try:
            opts = request_options(self.remote.headers, self.remote.auth, self.remote.tls)
        except OSError as exc:
            raise RemoteUnavailable(f"{where} unreachable: cannot read the credentials file: {exc}") from None

        def send() -> requests.Response:
            return self.session.request(
                method,
                self.name + path,
                params=params if method == "GET" else None,
                data=params if method == "POST" else None,
                headers={**opts.headers, "Accept": "application/json"},
                auth=opts.auth,
                verify=opts.verify,
                cert=opts.cert,
                timeout=(connect_s, wait_s),
                allow_redirects=False,
            )

        try:
            try:
                r = send()
            except requests.ConnectionError as exc:
                if not _dropped(exc):
                    raise
                # A kept-alive connection the remote closed or reset before answering (it restarted,
                # or died as it was asked): a query changes nothing, so ask once more on a new one.
                r = send()
        except requests.Timeout as exc:
            if isinstance(exc, requests.ConnectTimeout):
                raise RemoteUnavailable(
                    f"{where} unreachable: no connection within {connect_s:g} s"
                ) from None
            raise QueryTimeout(
                f"{where} did not answer within {timeout_s:g} s (setting query_timeout)"
            ) from None
        except requests.RequestException as exc:
            raise RemoteUnavailable(f"{where} unreachable: {_line(failure(exc))}") from None
        return r

    def _passed(self, r: requests.Response, kinds: tuple[str, ...]) -> bytes | None:
        """The answer's bytes where they are a success of one of `kinds` with at most
        `query_max_samples` points (an upper bound counted on the bytes), else None (then it is read:
        errors, other shapes and the limit's exact count as before)."""
        if not 200 <= r.status_code < 300:
            return None
        body = r.content
        if result_type(body) not in kinds or points_at_most(body) > self.settings.query_max_samples:
            return None
        return body

    def _data(self, r: requests.Response) -> Any:
        """The answer's `data`, or raise the error gpuwatch answers for it."""
        where = f"remote query backend {self.name}"
        try:
            body = _orjson.loads(r.content) if _orjson is not None else json.loads(r.content)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            text = _line(r.text) or "an empty answer"
            raise RemoteUnavailable(f"{where} unreachable: HTTP {r.status_code}: {text}")
        if 200 <= r.status_code < 300 and body.get("status") == "success":
            return body.get("data")
        message = _line(str(body.get("error") or "")) or f"HTTP {r.status_code}"
        kind = str(body.get("errorType") or "")
        if kind == "timeout":
            raise QueryTimeout(message)
        if r.status_code in (400, 422):  # the query's own fault, as the remote judged it
            if kind == "bad_data":
                raise PromQLParseError(message)
            raise PromQLEvalError(message)
        raise RemoteUnavailable(f"{where} unreachable: HTTP {r.status_code}: {message}")

    def _result(self, data: Any) -> Result:
        """The remote's `data` as gpuwatch's result; QueryTooLarge past `query_max_samples` points."""
        if not isinstance(data, dict):
            raise RemoteUnavailable(f"remote query backend {self.name} answered without a result")
        kind, result = data.get("resultType"), data.get("result")
        if result is None:
            result = []
        try:
            if kind == "scalar":
                return Scalar(_ms(result[0]), float(result[1]))
            if kind == "string":
                return String(_ms(result[0]), str(result[1]))
            if kind == "vector":
                self._count(len(result))
                return Vector(
                    [
                        Sample(_labels(x.get("metric")), _ms(x["value"][0]), float(x["value"][1]))
                        for x in result
                        if "value" in x  # a native histogram sample ("histogram") is left out
                    ]
                )
            if kind == "matrix":
                self._count(sum(len(x.get("values") or []) for x in result))
                series = [_series(x) for x in result]
                series.sort(key=lambda s: tuple(sorted(s.labels.items())))
                return Matrix(series)
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise RemoteUnavailable(
                f"remote query backend {self.name} answered a {kind} gpuwatch cannot read: {exc}"
            ) from None
        raise RemoteUnavailable(f"remote query backend {self.name} answered an unknown result type {kind!r}")

    def _count(self, points: int) -> None:
        if points > self.settings.query_max_samples:
            raise QueryTooLarge(
                f"the remote answered {points:,} samples, more than query_max_samples "
                f"({self.settings.query_max_samples:,}); narrow the query"
            )


def _series(x: dict[str, Any]) -> Series:
    values = x.get("values") or []
    if not values:
        return Series(_labels(x.get("metric")), np.zeros(0, dtype=np.int64), np.zeros(0))
    times, texts = zip(*values, strict=True)  # one pass in C: half the time of a loop a point
    ts = np.rint(np.array(times, dtype=np.float64) * 1000).astype(np.int64)
    return Series(_labels(x.get("metric")), ts, np.array(texts, dtype=np.float64))
