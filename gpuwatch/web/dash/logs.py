"""Logs: `/logs`, a search of the tailed log lines by run, level, text and time. The page reads
`/api/v1/logs`; the runs and files it offers come from `/api/ui/logs`."""

from __future__ import annotations

from typing import Any

from flask import Blueprint
from flask.typing import ResponseReturnValue

from gpuwatch.web.dash.page import page_json, render_page
from gpuwatch.web.dash.training import STRINGS as TRAINING_STRINGS
from gpuwatch.web.runtime import runtime

bp = Blueprint("dash_logs", __name__)
LEVELS = ("ERROR", "WARN", "INFO", "DEBUG")

STRINGS = {
    "logs.title": ("Logs", "日志"),
    "logs.run": ("Run", "任务"),
    "logs.any": ("any", "全部"),
    "logs.limit": ("At most", "最多"),
    "logs.search": ("Search", "搜索"),
    "logs.lines": ("lines", "行"),
    "logs.file": ("File", "文件"),
    "logs.none": ("No log lines match in the range.", "该时间范围内没有匹配的日志。"),
    "logs.help": (
        "Lines of the tailed log files (log_files), newest first, within the page's time range; the text "
        "search ignores case.",
        "被跟踪的日志文件（log_files）中的行，最新在前，限于页面时间范围；文本搜索不区分大小写。",
    ),
}


def _logs() -> dict[str, Any]:
    rt = runtime()
    runs = sorted({r.name for r in rt.store.runs()} | {x.run for x in rt.store.log_lines(limit=500) if x.run})
    return {"runs": runs, "levels": list(LEVELS)}


@bp.get("/api/ui/logs")
def logs_json() -> ResponseReturnValue:
    return page_json("logs", (), _logs(), {}, [TRAINING_STRINGS, STRINGS])


@bp.get("/logs")
def logs_page() -> ResponseReturnValue:
    return render_page(
        "logs.html", page="logs", data=_logs(), tables=[TRAINING_STRINGS, STRINGS], title="Logs"
    )
