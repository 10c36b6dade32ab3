"""Training runs: `/training` (the list) and `/training/<run>` (curves, checkpoints, GPUs, logs), with
their JSON twins under `/api/ui/training`."""

from __future__ import annotations

from flask import Blueprint, abort, jsonify, render_template, request
from flask.typing import ResponseReturnValue

from gpuwatch.web.dash.common import float_arg, instant_query, time_arg
from gpuwatch.web.dash.smoothing import DEFAULT_WEIGHT, MAX_POINTS
from gpuwatch.web.dash.trainingdata import parse_compare, run_detail, runs_table
from gpuwatch.web.runtime import runtime

bp = Blueprint("training", __name__)


def _runs() -> dict[str, object]:
    rt = runtime()
    now = rt.clock.now_ms()
    return {"now_ms": now, "runs": runs_table(rt.store, instant_query(rt), now)}


def _run(name: str) -> dict[str, object]:
    rt = runtime()
    now = rt.clock.now_ms()
    weight = float_arg("smoothing", DEFAULT_WEIGHT, 0.0, 1.0, hi_open=True)
    max_points = int(float_arg("max_points", MAX_POINTS, 10, 20_000))
    start, end = time_arg("start"), time_arg("end")
    query = instant_query(rt)
    runs = []
    for i, n in enumerate(parse_compare(request.args.get("compare"), name)):
        detail = run_detail(
            rt.store, query, n, now, start_ms=start, end_ms=end, weight=weight, max_points=max_points
        )
        if detail is None:
            if i == 0:
                abort(404, f"no training run named {name!r}")
            continue
        runs.append(detail)
    return {"now_ms": now, "run": name, "weight": weight, "runs": runs}


@bp.get("/api/ui/training")
def runs_json() -> ResponseReturnValue:
    return jsonify(_runs())


@bp.get("/api/ui/training/<path:name>")
def run_json(name: str) -> ResponseReturnValue:
    return jsonify(_run(name))


@bp.get("/training")
def runs_page() -> ResponseReturnValue:
    return render_template("training.html", data=_runs())


@bp.get("/training/<path:name>")
def run_page(name: str) -> ResponseReturnValue:
    # the curves come from the JSON twin (the page fetches them with the range and smoothing it shows)
    return render_template("training_run.html", run=name, compare=request.args.get("compare", ""))
