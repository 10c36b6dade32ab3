"""The dashboard's UI strings in English and Chinese, chosen by the `language` setting.

A table maps a key to (English, Chinese). The framework's table is `STRINGS`; a page module keeps
its own table and passes it to `strings(lang, PAGE_STRINGS)`; the page gets the merged table as
JSON (gpuwatch.js `gw.t(key)`) and in its template (`t(key)`). A missing Chinese text falls back to
English, a missing key to the key itself.
"""

from __future__ import annotations

from collections.abc import Mapping

LANGUAGES = ("en", "zh")

STRINGS: Mapping[str, tuple[str, str]] = {
    # navigation
    "nav.cluster": ("Cluster", "集群"),
    "nav.usage": ("Usage", "用量"),
    "nav.training": ("Training", "训练"),
    "nav.inference": ("Inference", "推理"),
    "nav.alerts": ("Alerts", "告警"),
    "nav.explore": ("Explore", "查询"),
    "nav.targets": ("Targets", "采集目标"),
    "nav.logs": ("Logs", "日志"),
    "nav.timeline": ("Timeline", "时间线"),
    # time range and refresh
    "range.label": ("Range", "时间范围"),
    "range.custom": ("Custom", "自定义"),
    "range.from": ("From", "开始"),
    "range.to": ("To", "结束"),
    "range.apply": ("Apply", "应用"),
    "range.zoomed": ("zoomed: auto-refresh paused", "已缩放：自动刷新已暂停"),
    "refresh.label": ("Refresh", "刷新"),
    "refresh.off": ("off", "关闭"),
    "refresh.now": ("Refresh now", "立即刷新"),
    "theme.toggle": ("Dark / light", "深色 / 浅色"),
    "theme.dark": ("dark", "深色"),
    "theme.light": ("light", "浅色"),
    # honest absence
    "state.nodata": ("no data", "无数据"),
    "state.unsupported": ("not available on this GPU", "此 GPU 不支持"),
    "state.failed": ("collection failed", "采集失败"),
    "state.error": ("query failed", "查询失败"),
    "state.offline": ("gpuwatch is not answering", "gpuwatch 无响应"),
    "state.busy": ("busy, asking again…", "繁忙，正在重试…"),
    "state.loading": ("loading…", "加载中…"),
    "state.failing": ("collection failing now", "当前采集失败"),
    # panels
    "panel.explore": ("open in Explore", "在查询页打开"),
    "panel.logy": ("log scale", "对数坐标"),
    "panel.step": ("step", "步长"),
    "common.none": ("none", "无"),
    "common.ago": ("ago", "前"),
    "common.never": ("never", "从未"),
    "common.demo": ("demo: simulated GPUs", "演示：模拟 GPU"),
    # metric names in legends (`{{__name__}}`), where a chart holds several
    "metric.DCGM_FI_DEV_FB_USED": ("used", "已用"),
    "metric.DCGM_FI_DEV_FB_TOTAL": ("total", "总量"),
    "metric.DCGM_FI_DEV_GPU_TEMP": ("GPU", "GPU 核心"),
    "metric.DCGM_FI_DEV_MEMORY_TEMP": ("memory", "显存"),
    "metric.DCGM_FI_DEV_POWER_USAGE": ("power", "功率"),
    "metric.DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("limit", "功率上限"),
    "metric.DCGM_FI_DEV_SM_CLOCK": ("SM", "SM"),
    "metric.DCGM_FI_DEV_MEM_CLOCK": ("memory", "显存"),
    "metric.DCGM_FI_PROF_PCIE_TX_BYTES": ("TX", "发送"),
    "metric.DCGM_FI_PROF_PCIE_RX_BYTES": ("RX", "接收"),
    "metric.gpuwatch_xid_errors_total": ("XID", "XID"),
    "metric.DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ECC double-bit", "ECC 双比特"),
    "metric.DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("ECC single-bit", "ECC 单比特"),
    "metric.gpuwatch_clock_throttled": ("throttled", "降频"),
    "metric.ALERTS": ("alert", "告警"),
}


def strings(lang: str, *tables: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """The UI strings in `lang` (en or zh): the framework's table, then each of `tables` over it."""
    index = 1 if lang == "zh" else 0
    out: dict[str, str] = {}
    for table in (STRINGS, *tables):
        for key, texts in table.items():
            out[key] = texts[index] or texts[0]
    return out
