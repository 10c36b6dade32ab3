"""Read the GPU overview (latest figures per GPU, processes, scraped gpuwatch nodes) from the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpuwatch.core.model import Matcher, SeriesData, is_stale

# Figures the overview shows, by metric name.
OVERVIEW_METRICS = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_XID_ERRORS",
    "gpuwatch_gpu_lost",
)
PROCESS_METRIC = "gpuwatch_process_gpu_memory_bytes"


class Selectable(Protocol):
    def select(self, matchers: list[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...


@dataclass
class ProcessRow:
    pid: str
    name: str
    user: str
    container_id: str
    used_memory_mib: float


@dataclass
class GpuRow:
    gpu: str
    uuid: str
    model: str
    hostname: str
    pci_bus_id: str
    last_seen_ms: int
    figures: dict[str, float] = field(default_factory=dict)
    processes: list[ProcessRow] = field(default_factory=list)

    @property
    def is_lost(self) -> bool:
        return self.figures.get("gpuwatch_gpu_lost", 0.0) >= 1.0


def _last(series: SeriesData) -> tuple[int, float] | None:
    for i in range(len(series.values) - 1, -1, -1):
        v = float(series.values[i])
        if not is_stale(v):
            return int(series.timestamps_ms[i]), v
    return None


def read_overview(store: Selectable, now_ms: int, window_ms: int = 30_000) -> list[GpuRow]:
    """Return one row per GPU seen in the last `window_ms`, with its latest figures."""
    names = "|".join((*OVERVIEW_METRICS, PROCESS_METRIC))
    series = store.select([Matcher("__name__", "=~", names)], now_ms - window_ms, now_ms)
    # Keyed by host too: simulated GPUs of two demo nodes share UUIDs (real ones never do).
    rows: dict[tuple[str, str], GpuRow] = {}
    procs: dict[tuple[str, str], list[tuple[int, ProcessRow]]] = {}
    for s in series:
        labels = dict(s.labels)
        uuid = labels.get("UUID")
        last = _last(s)
        if uuid is None or last is None:
            continue
        t, v = last
        key = (labels.get("Hostname", ""), uuid)
        row = rows.get(key)
        if row is None:
            row = rows[key] = GpuRow(
                gpu=labels.get("gpu", "?"),
                uuid=uuid,
                model=labels.get("modelName", ""),
                hostname=labels.get("Hostname", ""),
                pci_bus_id=labels.get("pci_bus_id", ""),
                last_seen_ms=t,
            )
        row.last_seen_ms = max(row.last_seen_ms, t)
        if s.name == PROCESS_METRIC:
            proc = ProcessRow(
                pid=labels.get("pid", ""),
                name=labels.get("process_name", ""),
                user=labels.get("user", ""),
                container_id=labels.get("container_id", ""),
                used_memory_mib=v / 2**20,
            )
            procs.setdefault(key, []).append((t, proc))
        else:
            row.figures[s.name] = v
    for key, found in procs.items():
        # A process is current only if it was seen in the GPU's newest tick.
        row = rows[key]
        row.processes = sorted(
            (p for t, p in found if t == row.last_seen_ms), key=lambda p: -p.used_memory_mib
        )
    return sorted(rows.values(), key=lambda r: (r.hostname, int(r.gpu) if r.gpu.isdigit() else 10**9, r.uuid))


NODE_STALE_MS = 30_000  # a node whose newest own sample is older than this at the last scrape: NotReady


@dataclass
class NodeRow:
    """Another gpuwatch scraped by this one, in one of three states:

    - `Unreachable`: the last scrape failed (`up` is 0) or the target was removed;
    - `NotReady`: it answers, but its own samples (`gpuwatch_gpus`, written with every GPU sample) were
      older than `NODE_STALE_MS` at the last scrape: its sampler is stuck (a hung NVML call, a full
      queue). Only a `/federate` scrape can tell (it keeps the samples' timestamps);
    - `Ready`: otherwise.
    """

    job: str
    instance: str
    version: str
    gpus: float | None
    is_ready: bool
    last_scrape_ms: int
    is_up: bool = False
    last_sample_ms: int | None = None  # the newest of the node's own samples the hub has

    @property
    def state(self) -> str:
        if not self.is_up:
            return "Unreachable"
        return "Ready" if self.is_ready else "NotReady"


def read_nodes(
    store: Selectable, now_ms: int, window_ms: int = 3_600_000, stale_ms: int = NODE_STALE_MS
) -> list[NodeRow]:
    """Return the scrape targets that are gpuwatch nodes (their page had `gpuwatch_build_info` within
    `window_ms`), each Ready, NotReady or Unreachable (NodeRow) by its latest `up` and own samples."""
    names = "up|gpuwatch_build_info|gpuwatch_gpus"
    series = store.select(
        [Matcher("__name__", "=~", names), Matcher("job", "!=", "")], now_ms - window_ms, now_ms
    )
    info: dict[tuple[str, str], str] = {}
    gpus: dict[tuple[str, str], tuple[int, float]] = {}
    up: dict[tuple[str, str], tuple[int, float]] = {}
    for s in series:
        labels = dict(s.labels)
        key = (labels.get("job", ""), labels.get("instance", ""))
        last = _last(s)
        if last is None and s.name != "up":
            continue
        if s.name == "gpuwatch_build_info":
            info[key] = labels.get("version", "")
        elif s.name == "gpuwatch_gpus" and last is not None:
            if key not in gpus or last[0] > gpus[key][0]:
                gpus[key] = last
        elif s.name == "up" and len(s.timestamps_ms):
            # A staleness marker after `up` (target removed) counts as not reachable.
            t, v = int(s.timestamps_ms[-1]), float(s.values[-1])
            up[key] = (t, 0.0 if is_stale(v) else v)
    rows = []
    for key, version in info.items():
        t, v = up.get(key, (0, 0.0))
        sample = gpus.get(key)
        is_up = v == 1.0
        is_fresh = sample is not None and t - sample[0] <= stale_ms
        rows.append(
            NodeRow(
                key[0],
                key[1],
                version,
                sample[1] if sample is not None else None,
                is_up and is_fresh,
                t,
                is_up=is_up,
                last_sample_ms=sample[0] if sample is not None else None,
            )
        )
    return sorted(rows, key=lambda r: (r.job, r.instance))
