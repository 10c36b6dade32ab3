"""Scrape targets: `/targets` (health, last scrape, duration, samples, last error, grouped by job),
each remote_write destination's state, and their JSON twin `/api/ui/targets`."""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from flask.typing import ResponseReturnValue

from gpuwatch.web.dash.page import page_json, render_page
from gpuwatch.web.runtime import runtime

bp = Blueprint("dash_targets", __name__)

STRINGS = {
    "targets.title": ("Scrape targets", "采集目标"),
    "targets.none": (
        "No scrape targets (scrape_configs or --scrape add them; see docs/scrape.md).",
        "没有采集目标（通过 scrape_configs 或 --scrape 添加，见 docs/scrape.md）。",
    ),
    "targets.dropped": ("targets dropped by relabelling", "个目标被 relabel 丢弃"),
    "targets.up": ("up", "在线"),
    "targets.endpoint": ("Endpoint", "地址"),
    "targets.state": ("State", "状态"),
    "targets.health.up": ("up", "在线"),
    "targets.health.down": ("down", "离线"),
    "targets.health.unknown": ("unknown", "未知"),
    "targets.labels": ("Labels", "标签"),
    "targets.last_scrape": ("Last scrape", "上次采集"),
    "targets.duration": ("Duration", "耗时"),
    "targets.samples": ("Samples", "样本数"),
    "targets.error": ("Last error", "最近错误"),
    "targets.remote_write": ("Remote write", "远程写入"),
    "targets.remote_name": ("Destination", "目的地"),
    "targets.sent": ("Samples sent", "已发送样本"),
    "targets.pending": ("Pending", "待发送"),
    "targets.behind_live": ("behind live samples", "排在实时样本之后"),
    "targets.failed": ("Dropped (4xx)", "已丢弃 (4xx)"),
    "targets.newest_sent": ("Newest sent", "最新已发送"),
}


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
        "remote_write": rt.remote_write_states(),
    }


@bp.get("/api/ui/targets")
def targets_json() -> ResponseReturnValue:
    return page_json("targets", (), _targets(), {}, [STRINGS])


@bp.get("/targets")
def targets_page() -> ResponseReturnValue:
    return render_page("targets.html", page="targets", data=_targets(), tables=[STRINGS], title="Targets")
