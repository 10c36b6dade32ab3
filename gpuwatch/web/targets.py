"""`/api/v1/targets` in Prometheus's JSON shape, read from the runtime's scrape pool."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request

bp = Blueprint("targets", __name__)


@bp.get("/api/v1/targets")
def targets():  # type: ignore[no-untyped-def]
    state = request.args.get("state", "any")
    pools = request.args.getlist("scrapePool")
    active = [] if state == "dropped" else current_app.extensions["gpuwatch"].targets()
    if pools:
        active = [t for t in active if t["scrapePool"] in pools]
    data: dict[str, list[dict[str, object]]] = {}
    if state != "dropped":
        data["activeTargets"] = active
    if state != "active":
        data["droppedTargets"] = []
    return jsonify({"status": "success", "data": data})
