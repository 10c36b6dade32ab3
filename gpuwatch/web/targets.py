"""`/api/v1/targets` in Prometheus's JSON shape, read from the runtime's scrape pool."""

from __future__ import annotations

from flask import Blueprint, jsonify, request
from flask.typing import ResponseReturnValue

from gpuwatch.web.runtime import runtime

bp = Blueprint("targets", __name__)


@bp.get("/api/v1/targets")
def targets() -> ResponseReturnValue:
    state = request.args.get("state", "any")
    pools = request.args.getlist("scrapePool")
    rt = runtime()
    data: dict[str, list[dict[str, object]]] = {}
    if state != "dropped":
        active = rt.targets()
        data["activeTargets"] = [t for t in active if t["scrapePool"] in pools] if pools else active
    if state != "active":
        dropped = rt.dropped_targets()
        if pools:
            dropped = [t for t in dropped if t["discoveredLabels"].get("job") in pools]
        data["droppedTargets"] = dropped
    return jsonify({"status": "success", "data": data})
