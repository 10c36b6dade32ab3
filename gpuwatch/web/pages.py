"""/api/overview: the latest figures of every GPU and the scraped gpuwatch nodes, as JSON (the
dashboard's pages live in gpuwatch/web/dash/)."""

from __future__ import annotations

from dataclasses import asdict

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from gpuwatch.web.overview import read_nodes, read_overview
from gpuwatch.web.runtime import runtime

bp = Blueprint("pages", __name__)


def _overview() -> dict[str, object]:
    rt = runtime()
    window_ms = int(max(30.0, 5 * rt.settings.sample_interval + 2 * rt.settings.flush_interval) * 1000)
    rows = read_overview(rt.backend, rt.clock.now_ms(), window_ms)
    gpus = []
    for r in rows:
        d = asdict(r)
        d["is_lost"] = r.is_lost
        gpus.append(d)
    nodes = [{**asdict(n), "state": n.state} for n in read_nodes(rt.backend, rt.clock.now_ms())]
    return {**rt.status(), "now_ms": rt.clock.now_ms(), "gpus_seen": gpus, "nodes": nodes}


@bp.get("/api/overview")
def overview_json() -> ResponseReturnValue:
    return jsonify(_overview())
