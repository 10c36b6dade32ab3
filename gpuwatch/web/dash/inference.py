"""Inference services: `/inference` (the list) and `/inference/<job>` (one page per service: tiles,
charts, the serving GPUs), with their JSON twins under `/api/ui/inference`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flask import Blueprint, abort, jsonify, render_template
from flask.typing import ResponseReturnValue

from gpuwatch.web.dash.common import instant_query
from gpuwatch.web.dash.inferencedata import engine_of, services, serving_gpus, tiles
from gpuwatch.web.runtime import runtime

bp = Blueprint("inference", __name__)
PROC_ROOT = Path("/proc")


def _services() -> dict[str, Any]:
    rt = runtime()
    now = rt.clock.now_ms()
    return {"now_ms": now, "services": services(instant_query(rt), now)}


def _service(job: str) -> dict[str, Any]:
    rt = runtime()
    now = rt.clock.now_ms()
    query = instant_query(rt)
    engine = engine_of(query, job, now)
    if engine is None:
        abort(404, f"no inference service (vLLM, SGLang or TGI) with job {job!r} in the last hour")
    hostname = str(rt.status().get("hostname") or "")
    serving = serving_gpus(query, rt.targets(), job, now, PROC_ROOT, frozenset({hostname} - {""}))
    return {
        "now_ms": now,
        "job": job,
        "engine": engine,
        "tiles": tiles(query, engine, job, now),
        "serving": serving,
    }


@bp.get("/api/ui/inference")
def services_json() -> ResponseReturnValue:
    return jsonify(_services())


@bp.get("/api/ui/inference/<path:job>")
def service_json(job: str) -> ResponseReturnValue:
    return jsonify(_service(job))


@bp.get("/inference")
def services_page() -> ResponseReturnValue:
    return render_template("inference.html", data=_services())


@bp.get("/inference/<path:job>")
def service_page(job: str) -> ResponseReturnValue:
    return render_template("inference_service.html", data=_service(job))
