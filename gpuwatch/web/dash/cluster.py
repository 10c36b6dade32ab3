"""The cluster page `/`: totals, one utilization heatmap of every GPU, memory per GPU, node tiles,
idle-but-held GPUs, GPUs allocated over time, host network and disk; its JSON twin is `/api/ui/cluster`."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from gpuwatch.core.model import Matcher
from gpuwatch.web.dash.page import page_json, render_page
from gpuwatch.web.dash.panel import Panel, check_unique
from gpuwatch.web.dash.usagepanels import STRINGS as USAGE_STRINGS
from gpuwatch.web.dash.usagepanels import allocated_stat, allocation_chart
from gpuwatch.web.overview import GpuRow, NodeRow, Selectable, read_nodes, read_overview
from gpuwatch.web.runtime import runtime

bp = Blueprint("dash_cluster", __name__)

STRINGS = {
    **USAGE_STRINGS,
    "cluster.title": ("Cluster", "集群"),
    "cluster.gpus": ("GPUs", "GPU 数"),
    "cluster.nodes": ("Nodes", "节点"),
    "cluster.util": ("Mean utilization", "平均利用率"),
    "cluster.power": ("Power now", "当前功率"),
    "cluster.energy": ("Energy today", "今日能耗"),
    "cluster.util_heatmap": ("GPU utilization", "GPU 利用率"),
    "cluster.memory": ("Memory used per GPU", "每块 GPU 显存占用"),
    "cluster.idle_held": (
        "Idle but held (a process, ~0 % utilization for 10 min)",
        "空占（有进程但 10 分钟利用率约为 0）",
    ),
    "cluster.net": ("Host network", "主机网络"),
    "cluster.disk": ("Disk IOPS", "磁盘 IOPS"),
    "cluster.power_chart": ("Power per node", "各节点功率"),
    "cluster.tiles": ("Nodes", "节点"),
    "cluster.gpu_table": ("GPUs", "GPU 列表"),
    "cluster.hottest": ("hottest", "最高温"),
    "cluster.alerts": ("firing alerts", "告警中"),
    "cluster.all_nodes": ("all nodes", "全部节点"),
    "cluster.waiting": ("Waiting for the first samples of", "等待首批采样："),
    "cluster.none_seen": ("No GPU figures stored in the last minute.", "最近一分钟没有 GPU 数据。"),
    "cluster.lost": (
        "lost: the GPU fell off the bus (NVML GPU_IS_LOST)",
        "丢失：GPU 已从总线掉线（NVML GPU_IS_LOST）",
    ),
    "state.Ready": ("Ready", "正常"),
    "state.NotReady": ("NotReady", "未就绪"),
    "state.Unreachable": ("Unreachable", "不可达"),
}

# `$host_re` is a regex of the chosen node (`.+`: all nodes).
_GPU = '{Hostname=~"$host_re"}'
PANELS: tuple[Panel, ...] = check_unique(
    [
        Panel("gpus", "GPUs", f"count(DCGM_FI_DEV_GPU_UTIL{_GPU})", "count", "stat", width=2, title_key="cluster.gpus",
              min_interval=10),
        Panel("nodes", "Nodes", f"count(count by (Hostname) (DCGM_FI_DEV_GPU_UTIL{_GPU}))", "count", "stat", width=2,
              title_key="cluster.nodes", min_interval=10),
        allocated_stat(_GPU),
        Panel("util_mean", "Mean utilization", f"avg(DCGM_FI_DEV_GPU_UTIL{_GPU})", "percent", "stat", width=2,
              title_key="cluster.util"),
        Panel("power_now", "Power now", f"sum(DCGM_FI_DEV_POWER_USAGE{_GPU})", "watts", "stat", width=2,
              title_key="cluster.power"),
        Panel("energy_today", "Energy today",
              f"sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{_GPU}[$__today])) / 3.6e9", "kwh", "stat",
              width=2, title_key="cluster.energy", description="kWh since local midnight (the counter is in mJ)",
              min_interval=60),
        Panel("util", "GPU utilization", f"DCGM_FI_DEV_GPU_UTIL{_GPU}", "percent", "heatmap",
              legend="{{Hostname}}/{{gpu}}", min=0, max=100, width=12, title_key="cluster.util_heatmap"),
        Panel("memory", "Memory used per GPU", f"DCGM_FI_DEV_FB_USED{_GPU} * 1048576", "bytes", "bars",
              legend="{{Hostname}}/{{gpu}}", width=6, title_key="cluster.memory", min_interval=5),
        Panel("power", "Power per node", f"sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE{_GPU})", "watts",
              legend="{{Hostname}}", width=6, min=0, title_key="cluster.power_chart"),
        Panel("idle_held", "Idle but held",
              f"gpuwatch_process_gpu_memory_bytes{_GPU} and on (Hostname, UUID) "
              f"(max_over_time(DCGM_FI_DEV_GPU_UTIL{_GPU}[10m]) < 5)",
              "bytes", "table", columns=("Hostname", "gpu", "process_name", "pid", "user", "container_id"),
              width=12, title_key="cluster.idle_held", min_interval=15),
        allocation_chart(_GPU),
        Panel("net", "Host network",
              'sum by (instance) (rate(node_network_receive_bytes_total{instance=~"$host_re",device!~"lo|veth.*|docker.*|ifb.*"}[$__rate]))'
              ' + sum by (instance) (rate(node_network_transmit_bytes_total{instance=~"$host_re",device!~"lo|veth.*|docker.*|ifb.*"}[$__rate]))',
              "bytes_per_second", legend="{{instance}}", width=6, min=0, title_key="cluster.net",
              description="received + sent, all interfaces but loopback and virtual ones"),
        Panel("disk", "Disk IOPS",
              'sum by (instance) (rate(node_disk_reads_completed_total{instance=~"$host_re"}[$__rate])'
              ' + rate(node_disk_writes_completed_total{instance=~"$host_re"}[$__rate]))',
              "per_second", legend="{{instance}}", width=6, min=0, title_key="cluster.disk"),
    ]
)  # fmt: skip


# How long a node whose GPU figures stopped stays on the page (as NotReady).
STALE_WINDOW_MS = 600_000


@dataclass(frozen=True)
class Tile:
    """One node: Ready, NotReady (answers, but its GPU samples are stale) or Unreachable (scrape down)."""

    name: str
    state: str
    instance: str
    gpus: int
    hottest_gpu: str
    hottest_c: float | None
    firing: int
    last_seen_ms: int


def host_regex(hostname: str) -> str:
    """An RE2 pattern that matches exactly `hostname` (`.+`: every node)."""
    return re.escape(hostname) if hostname else ".+"


def node_tiles(
    gpus: Sequence[GpuRow],
    nodes: Sequence[NodeRow],
    firing: Iterable[dict[str, str]],
    *,
    local_host: str,
    local_ok: bool,
    now_ms: int,
    stale_ms: int,
) -> list[Tile]:
    """One tile per node: each host with GPU figures, the local host, and each scraped gpuwatch node."""
    by_host: dict[str, list[GpuRow]] = {}
    for g in gpus:
        by_host.setdefault(g.hostname, []).append(g)
    scraped = {n.instance.rsplit(":", 1)[0]: n for n in nodes}
    names = sorted({*by_host, *scraped, *([local_host] if local_host else [])})
    alerts = list(firing)
    tiles = []
    for name in names:
        rows = by_host.get(name, [])
        node = scraped.get(name)
        last = max((g.last_seen_ms for g in rows), default=0)
        fresh = bool(rows) and now_ms - last <= stale_ms
        if node is not None and node.state != "Ready":  # the scrape's view: Unreachable or NotReady
            state = node.state
        elif not fresh or (name == local_host and not local_ok and not rows):
            state = "NotReady"
        else:
            state = "Ready"
        temps = [
            (g.figures["DCGM_FI_DEV_GPU_TEMP"], g.gpu) for g in rows if "DCGM_FI_DEV_GPU_TEMP" in g.figures
        ]
        hottest = max(temps, default=None)
        instance = node.instance if node is not None else ""
        count = sum(
            1 for a in alerts if a.get("Hostname") == name or (instance and a.get("instance") == instance)
        )
        n_gpus = len(rows) or int(node.gpus or 0) if node is not None else len(rows)
        tiles.append(
            Tile(name, state, instance, n_gpus, hottest[1] if hottest else "", hottest[0] if hottest else None,
                 count, last)
        )  # fmt: skip
    return tiles


def stale_gpus(store: Selectable, fresh: Sequence[GpuRow], now_ms: int, window_ms: int) -> list[GpuRow]:
    """GPUs seen within `window_ms` but not among `fresh` (their node is NotReady), without figures:
    one metric's samples are read, not every figure's."""
    have = {(r.hostname, r.uuid) for r in fresh}
    out: dict[tuple[str, str], GpuRow] = {}
    for s in store.select([Matcher("__name__", "=", "DCGM_FI_DEV_GPU_UTIL")], now_ms - window_ms, now_ms):
        labels = dict(s.labels)
        key = (labels.get("Hostname", ""), labels.get("UUID", ""))
        if key in have or not len(s.timestamps_ms):
            continue
        seen = int(s.timestamps_ms[-1])
        row = out.get(key)
        if row is None or seen > row.last_seen_ms:
            out[key] = GpuRow(labels.get("gpu", "?"), key[1], labels.get("modelName", ""), key[0],
                              labels.get("pci_bus_id", ""), seen)  # fmt: skip
    return list(out.values())


def _firing() -> list[dict[str, str]]:
    rules = runtime().rules
    if rules is None:
        return []
    return [dict(a.labels) for _, a in rules.active_alerts() if a.state == "firing"]


def cluster_data(hostname: str = "") -> dict[str, Any]:
    """The page's server-side figures: status, node tiles and the GPU table."""
    rt = runtime()
    now = rt.clock.now_ms()
    s = rt.settings
    fresh_ms = int(max(30.0, 5 * s.sample_interval + 2 * s.flush_interval) * 1000)
    rows = read_overview(rt.backend, now, fresh_ms)
    rows += stale_gpus(rt.backend, rows, now, STALE_WINDOW_MS)
    status = rt.status()
    # A face on a remote store is not one of the lab's nodes: only GPUs found there make tiles.
    is_face = rt.backend.name != "local"
    tiles = node_tiles(
        rows,
        read_nodes(rt.backend, now),
        _firing(),
        local_host="" if is_face else str(status.get("hostname", "")),
        local_ok=not status.get("gpu_problem"),
        now_ms=now,
        stale_ms=fresh_ms,
    )
    current = [
        r for r in rows if now - r.last_seen_ms <= fresh_ms and (not hostname or r.hostname == hostname)
    ]
    gpus = []
    for r in current:
        d = asdict(r)
        d["is_lost"] = r.is_lost
        gpus.append(d)
    # This machine's own GPU problem ("no NVIDIA GPU found; run --demo") is news on a node, not on a
    # face or a hub without GPUs that draws other machines' GPUs.
    local = str(status.get("hostname", ""))
    others = any(r.hostname != local for r in rows)
    return {
        **status,
        "gpu_problem": None if is_face or others else status.get("gpu_problem"),
        "now_ms": now,
        "hostname_filter": hostname,
        "tiles": [asdict(t) for t in tiles],
        "gpus_seen": gpus,
    }


def _variables(hostname: str) -> dict[str, str]:
    return {"hostname": hostname, "host_re": host_regex(hostname)}


@bp.get("/")
def index() -> ResponseReturnValue:
    hostname = request.args.get("hostname", "")
    return render_page(
        "cluster.html",
        page="cluster",
        panels=PANELS,
        data=cluster_data(hostname),
        variables=_variables(hostname),
        tables=[STRINGS],
        title="Cluster",
    )


@bp.get("/api/ui/cluster")
def cluster_json() -> ResponseReturnValue:
    hostname = request.args.get("hostname", "")
    return page_json("cluster", PANELS, cluster_data(hostname), _variables(hostname), [STRINGS])
