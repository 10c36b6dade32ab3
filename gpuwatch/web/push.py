"""Pushes: the Pushgateway API (`/metrics/job/...`), JSON training pushes and training-run metadata.

- `PUT`/`POST`/`DELETE /metrics/job/<job>{/<label>/<value>}`: as a Pushgateway (see `gpuwatch.collect.push`).
  Bodies in Prometheus text format (or OpenMetrics by Content-Type), gzip allowed.
- `POST /api/v1/push`: `{"run", "step", "metrics": {...}, "time", "labels"}` or a list of them.
- `GET /api/v1/runs`: runs with progress and ETA; `POST /api/v1/runs`: the SDK's init and finish.

Bodies are untrusted: at most 8 MiB (413), and anything malformed gets a 400 JSON error naming the
problem. A push that would make more new series than `max_new_series_per_request` (413) or
`max_new_series_per_minute` (429) allow is refused whole, naming the setting; its group is unchanged.
Dependencies come from `runtime()`: `store`, `clock`, `pushes`.
"""

from __future__ import annotations

import json
import zlib
from collections import defaultdict
from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from flask.blueprints import BlueprintSetupState
from flask.typing import ResponseReturnValue

from gpuwatch.collect.push import PushError, families_from, parse_grouping_key, parse_training
from gpuwatch.collect.runenergy import RunEnergy
from gpuwatch.collect.runs import SeenThrottle, list_runs, parse_run_request
from gpuwatch.core.errors import SeriesLimitExceeded, StoreError
from gpuwatch.core.model import Batch, RunUpdate, Sample
from gpuwatch.promtext.formats import is_openmetrics_content_type
from gpuwatch.promtext.parser import Parser
from gpuwatch.web.runtime import runtime

bp = Blueprint("push", __name__)

MAX_BODY_BYTES = 8 * 1024 * 1024


@bp.record_once
def _setup(state: BlueprintSetupState) -> None:
    state.app.extensions["gpuwatch.collect.push.seen"] = SeenThrottle()
    state.app.extensions["gpuwatch.collect.runenergy"] = RunEnergy()


class _TooLarge(Exception):
    pass


def _error(message: str, status: int = 400, error_type: str = "bad_data") -> ResponseReturnValue:
    return jsonify({"status": "error", "errorType": error_type, "error": message}), status


def _body() -> bytes:
    """Read the body, inflating gzip; raise _TooLarge past the cap, PushError for a bad encoding."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise _TooLarge
    data = request.stream.read(MAX_BODY_BYTES + 1)
    if len(data) > MAX_BODY_BYTES:
        raise _TooLarge
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding == "gzip":
        try:
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            data = inflater.decompress(data, MAX_BODY_BYTES + 1)
        except zlib.error as exc:
            raise PushError(f"cannot decompress the gzip body: {exc}") from None
        if len(data) > MAX_BODY_BYTES or inflater.unconsumed_tail:
            raise _TooLarge
    elif encoding not in ("", "identity"):
        raise PushError(f"unsupported Content-Encoding {encoding!r}; send plain or gzip")
    return data


def _too_large() -> ResponseReturnValue:
    return _error(f"request body larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB", 413)


@bp.route("/metrics/<path:grouping>", methods=["PUT", "POST", "DELETE"])
def pushgateway(grouping: str) -> ResponseReturnValue:
    """Replace (PUT), update (POST) or delete (DELETE) one push group, as a Pushgateway does."""
    rt = runtime()
    try:
        key = parse_grouping_key(grouping, rt.settings.label_limits)
        now_ms = rt.clock.now_ms()
        if request.method == "DELETE":
            samples = rt.pushes.delete(key)
        else:
            content_type = request.headers.get("Content-Type", "")
            if "protobuf" in content_type.lower():
                return _error("the protobuf push format is not supported; push the text format", 415)
            result = Parser().parse(_body(), openmetrics=is_openmetrics_content_type(content_type))
            families = families_from(result, key, rt.settings.label_limits)
            keys = [series for family in families.values() for series in family]
            rt.store.admit_series([*keys, ("push_time_seconds", key)], rt.settings.series_limits)
            samples = rt.pushes.push(key, families, now_ms, replace_all=request.method == "PUT")
    except _TooLarge:
        return _too_large()
    except PushError as exc:
        return _error(str(exc))
    except SeriesLimitExceeded as exc:
        return _error(str(exc), exc.http_status)
    except StoreError as exc:
        return _error(str(exc), 503, "unavailable")
    if samples:
        rt.store.append(Batch(now_ms, samples))
    return Response(status=200)


@bp.route("/api/v1/push", methods=["POST"])
def push_json() -> ResponseReturnValue:
    """Store training metrics sent as JSON (one object or a list) and note each run's last step."""
    rt = runtime()
    try:
        body = _json_body()
        points = parse_training(body, rt.clock.now_ms(), rt.settings.label_limits)
        rt.store.admit_series(
            {(s.name, s.labels) for p in points for s in p.samples}, rt.settings.series_limits
        )
    except _TooLarge:
        return _too_large()
    except PushError as exc:
        return _error(str(exc))
    except SeriesLimitExceeded as exc:
        return _error(str(exc), exc.http_status)
    except StoreError as exc:
        return _error(str(exc), 503, "unavailable")
    by_time: dict[int, list[Sample]] = defaultdict(list)
    latest: dict[str, tuple[int, float | None]] = {}
    for p in points:
        by_time[p.time_ms].extend(p.samples)
        seen = latest.get(p.run)
        if seen is None or p.time_ms >= seen[0]:
            step = p.step if p.step is not None else (seen[1] if seen else None)
            latest[p.run] = (p.time_ms, step)
    for t in sorted(by_time):
        rt.store.append(Batch(t, by_time[t]))
    throttle: SeenThrottle = current_app.extensions["gpuwatch.collect.push.seen"]
    now_ms = rt.clock.now_ms()
    try:
        for run, (t, step) in latest.items():
            if throttle.admit(run, now_ms):
                rt.store.upsert_run(RunUpdate(run, "seen", t, last_step=step))
    except StoreError as exc:
        return _error(str(exc), 503, "unavailable")
    return jsonify(
        {
            "status": "success",
            "data": {"points": len(points), "samples": sum(len(s) for s in by_time.values())},
        }
    )


def _json_body() -> Any:
    data = _body()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise PushError("the body is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise PushError(f"the body is not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise PushError(f"the body has a number gpuwatch cannot read: {exc}") from None
    except RecursionError:
        raise PushError("the body is nested too deeply") from None


@bp.route("/api/v1/runs", methods=["GET"])
def runs_list() -> ResponseReturnValue:
    """List training runs with progress (last step / total steps), an ETA from the recent step rate,
    and the energy their GPUs used (with its cost where `energy_price_per_kwh` is set)."""
    rt = runtime()
    now_ms = rt.clock.now_ms()
    energy: RunEnergy = current_app.extensions["gpuwatch.collect.runenergy"]
    try:
        data = list_runs(
            rt.store,
            now_ms,
            lambda record: energy.kwh(rt.store, record, now_ms),
            rt.settings.energy_price_per_kwh,
            rt.settings.energy_currency,
        )
    except StoreError as exc:
        return _error(str(exc), 503, "unavailable")
    return jsonify({"status": "success", "data": data})


@bp.route("/api/v1/runs", methods=["POST"])
def runs_update() -> ResponseReturnValue:
    """Start (`action: init`) or finish (`action: finish`, `status: ok|failed`) a training run."""
    rt = runtime()
    try:
        update = parse_run_request(_json_body(), rt.clock.now_ms())
    except _TooLarge:
        return _too_large()
    except PushError as exc:
        return _error(str(exc))
    try:
        rt.store.upsert_run(update)
    except StoreError as exc:
        return _error(str(exc), 503, "unavailable")
    if "runs" in rt.jobs.names():
        rt.jobs.run("runs")  # the run gauges now, not up to 15 s later: a hub learns of the run at once
    return jsonify({"status": "success", "data": {"run": update.name, "action": update.action}})
