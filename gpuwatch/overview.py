"""Read the GPU overview (latest figures per GPU, processes) from the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from gpuwatch.model import Matcher, SeriesData, is_stale

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
    rows: dict[str, GpuRow] = {}
    procs: dict[str, list[tuple[int, ProcessRow]]] = {}
    for s in series:
        labels = dict(s.labels)
        uuid = labels.get("UUID")
        last = _last(s)
        if uuid is None or last is None:
            continue
        t, v = last
        row = rows.get(uuid)
        if row is None:
            row = rows[uuid] = GpuRow(
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
            procs.setdefault(uuid, []).append((t, proc))
        else:
            row.figures[s.name] = v
    for uuid, found in procs.items():
        # A process is current only if it was seen in the GPU's newest tick.
        row = rows[uuid]
        row.processes = sorted(
            (p for t, p in found if t == row.last_seen_ms), key=lambda p: -p.used_memory_mib
        )
    return sorted(rows.values(), key=lambda r: (r.hostname, int(r.gpu) if r.gpu.isdigit() else 10**9, r.uuid))
