"""Logs: `/logs`, a search of the tailed log lines by run, level, text and time. The page reads
`/api/v1/logs`; the runs and files it offers come from `/api/ui/logs`."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, render_template
from flask.typing import ResponseReturnValue

from gpuwatch.web.runtime import runtime

bp = Blueprint("logs_page", __name__)
LEVELS = ("ERROR", "WARN", "INFO", "DEBUG")


def _logs() -> dict[str, Any]:
    rt = runtime()
    runs = sorted({r.name for r in rt.store.runs()} | {x.run for x in rt.store.log_lines(limit=500) if x.run})
    return {"now_ms": rt.clock.now_ms(), "runs": runs, "levels": list(LEVELS)}


@bp.get("/api/ui/logs")
def logs_json() -> ResponseReturnValue:
    return jsonify(_logs())


@bp.get("/logs")
def logs_page() -> ResponseReturnValue:
    return render_template("logs.html", data=_logs())
