"""The panels of the GPUs under a training run or an inference service, on the page's time axis.

Built per request around the PromQL matchers of those GPUs (`gpu=~"0|1", Hostname=~"node-1"` or
`UUID=~"..."`), which are PromQL written by gpuwatch, not page variables (a variable is filled in as
one quoted string)."""

from __future__ import annotations

from gpuwatch.web.dash.panel import Panel

STRINGS = {
    "gpu.util": ("GPU utilization", "GPU 利用率"),
    "gpu.memory": ("GPU memory used", "GPU 显存占用"),
    "gpu.power": ("GPU power", "GPU 功率"),
    "gpu.throttle": ("Clock throttling", "降频"),
    "gpu.xid": ("XID errors", "XID 错误"),
}


def gpu_panels(matchers: str | None, *, with_events: bool = True) -> tuple[Panel, ...]:
    """Utilization, memory and power of the GPUs `matchers` select, with throttle and XID events;
    none without matchers (the page says why)."""
    if not matchers:
        return ()
    sel = "{" + matchers + "}"
    legend = "{{Hostname}}/{{gpu}}"
    panels = [
        Panel("gpu_util", "GPU utilization", f"DCGM_FI_DEV_GPU_UTIL{sel}", "percent", legend=legend, min=0, max=100,
              width=4, title_key="gpu.util", failed_if="gpuwatch_nvml_up == 0"),
        Panel("gpu_memory", "GPU memory used", f"DCGM_FI_DEV_FB_USED{sel} * 1048576", "bytes", legend=legend,
              min=0, width=4, title_key="gpu.memory"),
        Panel("gpu_power", "GPU power", f"DCGM_FI_DEV_POWER_USAGE{sel}", "watts", legend=legend, min=0, width=4,
              title_key="gpu.power"),
    ]  # fmt: skip
    if with_events:
        panels += [
            Panel("gpu_throttle", "Clock throttling", f"gpuwatch_clock_throttled{sel}",
                  "count", "events", legend=legend + " {{reason}}", width=6, height=180, title_key="gpu.throttle"),
            Panel("gpu_xid", "XID errors", f"gpuwatch_xid_errors_total{sel}", "count", "events",
                  legend=legend + " XID {{xid}}", counter=True, width=6, height=180, title_key="gpu.xid"),
        ]  # fmt: skip
    return tuple(panels)
