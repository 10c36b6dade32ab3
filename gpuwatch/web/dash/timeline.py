"""The timeline `/timeline`: one time axis with XID, ECC and throttle events, alert transitions,
training loss spikes and inference P99 jumps; JSON twin `/api/ui/timeline`."""

from __future__ import annotations

from flask import Blueprint
from flask.typing import ResponseReturnValue

from gpuwatch.web.dash.page import page_json, render_page
from gpuwatch.web.dash.panel import Panel, check_unique

bp = Blueprint("dash_timeline", __name__)

STRINGS = {
    "timeline.title": ("Timeline", "时间线"),
    "timeline.events": ("Events", "事件"),
    "timeline.none": ("no events in this range", "此时间范围内无事件"),
    "timeline.gpu": ("XID, ECC and throttle events", "XID、ECC 与降频事件"),
    "timeline.alerts": ("Alert transitions", "告警状态变化"),
    "timeline.loss": (
        "Training loss spikes (> 1.5x its 15 min mean)",
        "训练损失突增（超过 15 分钟均值 1.5 倍）",
    ),
    "timeline.p99": (
        "Inference P99 latency jumps (> 2x its 15 min mean)",
        "推理 P99 延迟跳升（超过 15 分钟均值 2 倍）",
    ),
    "timeline.ttft": (
        "Inference P99 TTFT jumps (> 2x its 15 min mean)",
        "推理 P99 首字延迟跳升（超过 15 分钟均值 2 倍）",
    ),
}

_GPU_EVENTS = "gpuwatch_xid_errors_total|DCGM_FI_DEV_ECC_DBE_VOL_TOTAL|DCGM_FI_DEV_ECC_SBE_VOL_TOTAL|gpuwatch_clock_throttled"


def _jump(metric: str, factor: float) -> str:
    return f"{metric} > {factor} * avg_over_time({metric}[15m] offset 5m)"


PANELS: tuple[Panel, ...] = check_unique(
    [
        Panel("gpu", "XID, ECC and throttle events", f'{{__name__=~"{_GPU_EVENTS}"}}', "count", "events",
              legend="{{Hostname}}/{{gpu}} {{__name__}} {{reason}}{{xid}}", counter=True, width=12,
              title_key="timeline.gpu"),
        Panel("alerts", "Alert transitions", "ALERTS", "count", "events",
              legend="{{alertname}} {{alertstate}} {{Hostname}}/{{gpu}} {{job}}", counter=True, width=12,
              title_key="timeline.alerts"),
        Panel("loss", "Training loss spikes", "training_loss > 1.5 * avg_over_time(training_loss[15m] offset 1m)",
              "none", "events", legend="loss {{run}} {{job}}", counter=True, width=12, title_key="timeline.loss"),
        Panel("p99", "Inference P99 latency jumps", _jump("gpuwatch:inference_latency_seconds:p99", 2), "seconds",
              "events", legend="P99 {{job}} {{model_name}}", counter=True, width=12, title_key="timeline.p99"),
        Panel("ttft", "Inference P99 TTFT jumps", _jump("gpuwatch:inference_ttft_seconds:p99", 2), "seconds",
              "events", legend="TTFT P99 {{job}} {{model_name}}", counter=True, width=12, title_key="timeline.ttft"),
    ]
)  # fmt: skip


@bp.get("/timeline")
def timeline() -> ResponseReturnValue:
    return render_page("timeline.html", page="timeline", panels=PANELS, tables=[STRINGS], title="Timeline")


@bp.get("/api/ui/timeline")
def timeline_json() -> ResponseReturnValue:
    return page_json("timeline", PANELS, {}, {}, [STRINGS])
