"""The GPU page `/gpus/<hostname>/<gpu>`: health first (throttle reasons, ECC, last XID, remapped
rows), then utilization, memory, temperature, power, clocks and PCIe over time, each chart marked with
the XID, ECC, throttle and alert events of the events chart, and the GPU's processes; JSON twin
`/api/ui/gpus/<hostname>/<gpu>`."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from flask import Blueprint
from flask.typing import ResponseReturnValue

from gpuwatch.web.dash.page import page_json, render_page
from gpuwatch.web.dash.panel import Panel, Thresholds, check_unique
from gpuwatch.web.overview import read_overview
from gpuwatch.web.runtime import runtime

bp = Blueprint("dash_gpu", __name__)

STRINGS = {
    "gpu.title": ("GPU", "GPU"),
    "gpu.health": ("Health", "健康状况"),
    "gpu.throttle": ("Throttle reasons now", "当前降频原因"),
    "gpu.ecc": ("ECC errors (volatile SBE / DBE)", "ECC 错误（易失 SBE / DBE）"),
    "gpu.xid": ("Last XID", "最近 XID"),
    "gpu.remap": ("Remapped rows (correctable / uncorrectable)", "已重映射行（可纠正 / 不可纠正）"),
    "gpu.remap_state": ("Row remap pending / failed", "行重映射待定 / 失败"),
    "gpu.util": ("Utilization", "利用率"),
    "gpu.memory": ("Memory used / total", "显存 已用 / 总量"),
    "gpu.membw": ("Memory bandwidth utilization", "显存带宽利用率"),
    "gpu.temp": ("Temperature (GPU, memory)", "温度（GPU、显存）"),
    "gpu.power": ("Power and its limit", "功率与功率上限"),
    "gpu.clocks": ("SM and memory clocks", "SM 与显存频率"),
    "gpu.pcie": ("PCIe throughput", "PCIe 吞吐"),
    "gpu.events": ("XID, ECC, throttle and alert events", "XID、ECC、降频与告警事件"),
    "gpu.processes": ("Processes now", "当前进程"),
    "gpu.users": ("Who used this GPU over the range (peak memory)", "时间范围内的使用者（显存峰值）"),
    "gpu.none": ("none", "无"),
    "gpu.no_process": ("no process", "无进程"),
    "gpu.since_start": ("none since gpuwatch started", "gpuwatch 启动以来无"),
    "gpu.not_seen": ("This GPU sent no figures in the last minutes.", "此 GPU 最近几分钟没有数据。"),
    "gpu.back": ("all GPUs", "全部 GPU"),
}

_G = '{Hostname="$hostname",gpu="$gpu"}'
# The GPU answers (it sent its lost flag): an absent figure is then "not available on this GPU".
PRESENT = f"gpuwatch_gpu_lost{_G} == 0"
LOST = f"gpuwatch_gpu_lost{_G} == 1"


def _names(*names: str) -> str:
    return '{__name__=~"' + "|".join(names) + '",Hostname="$hostname",gpu="$gpu"}'


def _p(id: str, title: str, query: str, unit: str, key: str, **kw: Any) -> Panel:
    if kw.get("kind", "timeseries") == "timeseries":
        kw["marks"] = "events"  # every chart shows the events panel's XIDs, ECC errors, throttling, alerts
    return Panel(id, title, query, unit, title_key=key, unsupported_if=PRESENT, failed_if=LOST, **kw)


PANELS: tuple[Panel, ...] = check_unique(
    [
        _p("util", "Utilization", f"DCGM_FI_DEV_GPU_UTIL{_G}", "percent", "gpu.util", min=0, max=100),
        _p("memory", "Memory used / total", _names("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_TOTAL"), "mib",
           "gpu.memory", legend="{{__name__}}", min=0),
        _p("membw", "Memory bandwidth utilization", f"DCGM_FI_DEV_MEM_COPY_UTIL{_G}", "percent", "gpu.membw",
           min=0, max=100),
        _p("temp", "Temperature", _names("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP"), "celsius",
           "gpu.temp", legend="{{__name__}}", thresholds=Thresholds(warn=80, crit=85)),
        _p("power", "Power and its limit", _names("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
           "watts", "gpu.power", legend="{{__name__}}", min=0),
        _p("clocks", "SM and memory clocks", _names("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK"), "mhz",
           "gpu.clocks", legend="{{__name__}}", min=0),
        _p("pcie", "PCIe throughput", _names("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"),
           "bytes_per_second", "gpu.pcie", legend="{{__name__}}", min=0),
        _p("events", "XID, ECC, throttle and alert events",
           # One selector keeps each name (`or` would drop series that differ only by name).
           _names("gpuwatch_xid_errors_total", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                  "gpuwatch_clock_throttled") + f" or ALERTS{_G}",
           "count", "gpu.events", kind="events", width=12, height=200, counter=True,
           legend="{{__name__}} {{xid}}{{reason}}{{alertname}} {{alertstate}}", empty="gpu.none",
           description="the moments a counter rose, a throttle reason began or an alert changed state"),
        _p("processes", "Processes now", f"gpuwatch_process_gpu_memory_bytes{_G}", "bytes", "gpu.processes",
           kind="table", columns=("pid", "user", "container_id", "process_name"), empty="gpu.no_process"),
        # `max without ()` drops the metric name, as Prometheus's max_over_time does and
        # VictoriaMetrics' does not (docs/scale.md): the same table from either store.
        _p("users", "Who used this GPU",
           f"max without () (max_over_time(gpuwatch_process_gpu_memory_bytes{_G}[$__range]))",
           "bytes", "gpu.users", kind="table", columns=("user", "container_id", "process_name", "pid"),
           empty="gpu.no_process"),
    ]
)  # fmt: skip

# The health cards' figures: one instant query at the range's end (every name at once, split by name
# in static/js/gpu.js; twelve queries a tick made the GPU page the heaviest of the soak's clients), and
# the XID counter over the range, asked only when an XID was seen, for when it last rose.
HEALTH_NAMES: tuple[str, ...] = (
    "gpuwatch_gpu_lost",  # 0: the GPU answers (an absent figure is "not available"); 1: collection failed
    "gpuwatch_clock_throttled",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)
HEALTH = _names(*HEALTH_NAMES)
XID_TOTAL = f"sum(gpuwatch_xid_errors_total{_G})"


def gpu_data(hostname: str, gpu: str) -> dict[str, Any]:
    rt = runtime()
    now = rt.clock.now_ms()
    s = rt.settings
    fresh_ms = int(max(30.0, 5 * s.sample_interval + 2 * s.flush_interval) * 1000)
    rows = [r for r in read_overview(rt.backend, now, fresh_ms) if r.hostname == hostname and r.gpu == gpu]
    info: dict[str, Any] | None = None
    if rows:
        info = asdict(rows[0])
        info["is_lost"] = rows[0].is_lost
    return {
        "hostname": hostname,
        "gpu": gpu,
        "info": info,
        "health_query": HEALTH,
        "xid_total_query": XID_TOTAL,
    }


@bp.get("/gpus/<hostname>/<gpu>")
def gpu_page(hostname: str, gpu: str) -> ResponseReturnValue:
    return render_page(
        "gpu.html",
        page="gpu",
        panels=PANELS,
        data=gpu_data(hostname, gpu),
        variables={"hostname": hostname, "gpu": gpu},
        tables=[STRINGS],
        title=f"GPU {gpu} on {hostname}",
    )


@bp.get("/api/ui/gpus/<hostname>/<gpu>")
def gpu_json(hostname: str, gpu: str) -> ResponseReturnValue:
    return page_json("gpu", PANELS, gpu_data(hostname, gpu), {"hostname": hostname, "gpu": gpu}, [STRINGS])
