"""Pages and their JSON twins."""

from __future__ import annotations

from dataclasses import asdict

from flask import Blueprint, current_app, jsonify, render_template

from gpuwatch.web.overview import read_nodes, read_overview

bp = Blueprint("pages", __name__)


def _overview() -> dict[str, object]:
    runtime = current_app.extensions["gpuwatch"]
    window_ms = int(
        max(30.0, 5 * runtime.settings.sample_interval + 2 * runtime.settings.flush_interval) * 1000
    )
    rows = read_overview(runtime.store, runtime.clock.now_ms(), window_ms)
    gpus = []
    for r in rows:
        d = asdict(r)
        d["is_lost"] = r.is_lost
        gpus.append(d)
    nodes = [{**asdict(n), "state": n.state} for n in read_nodes(runtime.store, runtime.clock.now_ms())]
    return {**runtime.status(), "now_ms": runtime.clock.now_ms(), "gpus_seen": gpus, "nodes": nodes}


@bp.get("/")
def index():  # type: ignore[no-untyped-def]
    return render_template("overview.html", data=_overview())


@bp.get("/api/overview")
def overview_json():  # type: ignore[no-untyped-def]
    return jsonify(_overview())
