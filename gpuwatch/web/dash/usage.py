"""The usage page `/usage`: who used the GPUs over the page's range (a week by default): GPU-hours
allocated, busy and idle-but-held, energy and cost per user, run, host, Slurm job or pod, top
idle-but-held first, the lab's allocation rate, and the same figures over time; its JSON twin is
`/api/ui/usage?start=&end=&by=&every=` (the report of `query/usage.py`, as `gpuwatch report` prints it)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort, request
from flask.typing import ResponseReturnValue

from gpuwatch.query.usage import EVERY, GROUPS, usage_report
from gpuwatch.web.dash.common import instant_query, time_arg
from gpuwatch.web.dash.page import page_json, render_page
from gpuwatch.web.dash.panel import Panel, check_unique
from gpuwatch.web.dash.usagepanels import STRINGS as PANEL_STRINGS
from gpuwatch.web.dash.usagepanels import allocation_chart, group_charts
from gpuwatch.web.runtime import runtime

bp = Blueprint("dash_usage", __name__)

DEFAULT_RANGE_MS = 7 * 86_400_000
DEFAULT_FROM = "now-7d"

STRINGS = {
    "usage.title": ("Usage", "用量"),
    "usage.help": (
        "Who held the GPUs over the range: a GPU is allocated while a compute process runs on it, busy "
        "when its utilization is at least {idle} %, idle but held when under. A GPU's holders share it.",
        "时间范围内谁占用了 GPU：GPU 上有计算进程即为已分配；利用率不低于 {idle}% 为忙碌，低于则为空占。"
        "多个占用者平分一块 GPU。",
    ),
    "usage.group_by": ("Group by", "分组"),
    "usage.every": ("Split", "拆分"),
    "usage.every.none": ("whole range", "整个范围"),
    "usage.every.day": ("per day", "按天"),
    "usage.every.week": ("per week", "按周"),
    "usage.every.month": ("per month", "按月"),
    "usage.gpu_hours": ("GPU-hours", "GPU 小时"),
    "usage.allocated": ("Allocated", "已分配"),
    "usage.allocation_rate": ("Allocation rate", "分配率"),
    "usage.busy": ("Busy", "忙碌"),
    "usage.idle_held": ("Idle but held", "空占"),
    "usage.idle_share": ("Idle share", "空占比例"),
    "usage.energy": ("Energy", "能耗"),
    "usage.cost": ("Cost", "费用"),
    "usage.period": ("Period", "时段"),
    "usage.no_price": ("set energy_price_per_kwh for a cost", "设置 energy_price_per_kwh 以显示费用"),
    "usage.none": ("No GPU was held in this range.", "该时间范围内没有 GPU 被占用。"),
    "usage.chart": ("GPU-hours busy and idle but held (top 15)", "忙碌与空占的 GPU 小时（前 15）"),
    "usage.no_group": ("(none)", "（无）"),
    "usage.no_util": ("held, utilization not reported", "已占用，无利用率数据"),
    "usage.unit_h": ("h", "小时"),
    "usage.of": ("of", "/"),
}


def _by() -> str:
    by = request.args.get("by") or "user"
    if by not in GROUPS:
        abort(400, f'invalid parameter "by": expected one of {", ".join(GROUPS)}, got "{by}"')
    return by


def _every() -> str | None:
    every = request.args.get("every") or None
    if every is not None and every not in EVERY:
        abort(400, f'invalid parameter "every": expected one of {", ".join(EVERY)}, got "{every}"')
    return every


def _panels(by: str) -> tuple[Panel, ...]:
    return check_unique([*group_charts(by, ", ".join(GROUPS[by])), allocation_chart()])


def _page_data(by: str, every: str | None) -> dict[str, Any]:
    s = runtime().settings
    return {
        "by": by,
        "every": every,
        "groups": list(GROUPS),
        "every_choices": list(EVERY),
        "idle_below": s.usage_idle_below,
        "price_per_kwh": s.energy_price_per_kwh,
        "currency": s.energy_currency,
    }


def usage_data(start_ms: int, end_ms: int, by: str, every: str | None) -> dict[str, Any]:
    """The twin's data: the page's choices and the report over [start, end]."""
    rt = runtime()
    try:
        report = usage_report(
            instant_query(rt),
            start_ms,
            end_ms,
            by=by,
            every=every,
            price_per_kwh=rt.settings.energy_price_per_kwh,
            currency=rt.settings.energy_currency,
        )
    except ValueError as exc:
        abort(400, str(exc))
    return {**_page_data(by, every), "report": report.to_json()}


@bp.get("/usage")
def usage_page() -> ResponseReturnValue:
    by, every = _by(), _every()
    return render_page(
        "usage.html",
        page="usage",
        panels=_panels(by),
        data=_page_data(by, every),
        variables={"by": by},
        tables=[STRINGS, PANEL_STRINGS],
        title="Usage",
        default_from=DEFAULT_FROM,
    )


@bp.get("/api/ui/usage")
def usage_json() -> ResponseReturnValue:
    by, every = _by(), _every()
    end = time_arg("end") or runtime().clock.now_ms()
    start = time_arg("start") or end - DEFAULT_RANGE_MS
    return page_json(
        "usage", _panels(by), usage_data(start, end, by, every), {"by": by}, [STRINGS, PANEL_STRINGS]
    )
