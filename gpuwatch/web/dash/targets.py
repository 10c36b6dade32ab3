"""Scrape targets: `/targets` (health, last scrape, duration, samples, last error, grouped by job)
and its JSON twin `/api/ui/targets`."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, render_template
from flask.typing import ResponseReturnValue

from gpuwatch.web.runtime import runtime

bp = Blueprint("targets_page", __name__)


def group_targets(targets: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets by job (scrape pool), jobs by name, each with its count of targets up and down."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for t in targets:
        jobs.setdefault(str(t.get("scrapePool") or t.get("labels", {}).get("job", "")), []).append(t)
    out = []
    for job, rows in sorted(jobs.items()):
        rows.sort(key=lambda t: str(t.get("scrapeUrl", "")))
        out.append(
            {
                "job": job,
                "up": sum(1 for t in rows if t.get("health") == "up"),
                "down": sum(1 for t in rows if t.get("health") == "down"),
                "unknown": sum(1 for t in rows if t.get("health") not in ("up", "down")),
                "targets": rows,
            }
        )
    return out


def _targets() -> dict[str, Any]:
    rt = runtime()
    return {
        "now_ms": rt.clock.now_ms(),
        "jobs": group_targets(rt.targets()),
        "dropped": len(rt.dropped_targets()),
    }


@bp.get("/api/ui/targets")
def targets_json() -> ResponseReturnValue:
    return jsonify(_targets())


@bp.get("/targets")
def targets_page() -> ResponseReturnValue:
    return render_template("targets.html", data=_targets())
