"""Alertmanager's API v2 on gpuwatch's port: silences, firing alerts, groups, receivers and status.

Errors answer as Alertmanager does: the status code and the message as a JSON string.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from flask.blueprints import BlueprintSetupState
from flask.typing import ResponseReturnValue

from gpuwatch.core import regex
from gpuwatch.core.errors import StoreError
from gpuwatch.notify import api as amapi
from gpuwatch.notify.matchers import MatcherError
from gpuwatch.notify.silences import SilenceError, Silences, parse_postable
from gpuwatch.web.runtime import runtime

bp = Blueprint("alertmanager", __name__, url_prefix="/api/v2")


@bp.record
def _remember_start(state: BlueprintSetupState) -> None:
    state.app.extensions["gpuwatch.started_ms"] = state.app.extensions["gpuwatch"].clock.now_ms()


def _silences() -> Silences:
    silences = runtime().silences
    if silences is None:
        raise StoreError("silences are not available in this process")
    return silences


@bp.errorhandler(SilenceError)
@bp.errorhandler(MatcherError)
def _bad(e: SilenceError | MatcherError) -> tuple[Response, int]:
    return jsonify(str(e)), e.http_status


@bp.errorhandler(StoreError)
def _store(e: StoreError) -> tuple[Response, int]:
    return jsonify(str(e)), 500


@bp.get("/status")
def status() -> ResponseReturnValue:
    started = int(current_app.extensions.get("gpuwatch.started_ms", 0))
    return jsonify(amapi.status_json(started, amapi.config_text(runtime().settings.notify)))


@bp.get("/receivers")
def receivers() -> ResponseReturnValue:
    return jsonify([{"name": n} for n in amapi.receiver_names(runtime().settings.notify)])


@bp.get("/silences")
def silences() -> ResponseReturnValue:
    wanted = amapi.parse_filter(request.args.getlist("filter"))
    creators = set(request.args.getlist("creator"))
    now_ms = runtime().clock.now_ms()
    found = [
        s.to_json(now_ms)
        for s in _silences().list()
        if all(w in s.matchers for w in wanted) and (not creators or s.created_by in creators)
    ]
    return jsonify(found)


@bp.post("/silences")
def post_silence() -> ResponseReturnValue:
    body = request.get_json(force=True, silent=True)  # curl -d sends a form content type
    if body is None:
        raise SilenceError("the body must be a JSON postableSilence")
    return jsonify({"silenceID": _silences().set(parse_postable(body))})


@bp.get("/silence/<silence_id>")
def get_silence(silence_id: str) -> ResponseReturnValue:
    return jsonify(_silences().get(silence_id).to_json(runtime().clock.now_ms()))


@bp.delete("/silence/<silence_id>")
def delete_silence(silence_id: str) -> ResponseReturnValue:
    _silences().expire(silence_id)
    return Response(status=200)


def _alerts() -> list[dict[str, Any]]:
    rt = runtime()
    args = request.args
    receiver = None
    if args.get("receiver"):
        try:
            pattern = regex.compile_anchored(args["receiver"], dot_all=False)
        except regex.RegexError as e:
            raise SilenceError(f"failed to parse receiver param: {e.reason}") from None
        receiver = lambda name: pattern.fullmatch(name) is not None  # noqa: E731
    manager = rt.rules
    received = rt.received
    now_ms = rt.clock.now_ms()
    route = rt.settings.notify.route
    return amapi.select_alerts(
        [
            *amapi.firing_alerts(manager.groups() if manager is not None else [], request.host_url),
            *(received.firing(now_ms) if received is not None else []),
        ],
        lambda labels: amapi.suppression(rt.silences, rt.notifier, labels, now_ms),
        lambda labels: amapi.receivers_for(route, labels),
        matchers=amapi.parse_filter(args.getlist("filter")),
        active=amapi.parse_bool("active", args.get("active")),
        silenced=amapi.parse_bool("silenced", args.get("silenced")),
        inhibited=amapi.parse_bool("inhibited", args.get("inhibited")),
        receiver=receiver,
    )


@bp.get("/alerts")
def alerts() -> ResponseReturnValue:
    amapi.parse_bool("unprocessed", request.args.get("unprocessed"))  # none are: checked, then unused
    return jsonify(_alerts())


@bp.post("/alerts")
def post_alerts() -> ResponseReturnValue:
    received = runtime().received
    if received is None:
        raise StoreError("receiving alerts is not available in this process")
    received.put(request.get_json(force=True, silent=True))
    return Response(status=200)


@bp.get("/alerts/groups")
def alert_groups() -> ResponseReturnValue:
    return jsonify(amapi.alert_groups(_alerts()))
