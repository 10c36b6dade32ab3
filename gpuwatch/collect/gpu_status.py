"""Plain data the GPU collector hands out: who a GPU is, its state now, its processes, XID events."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwatch.collect.attribution import NONE, Attribution


@dataclass(frozen=True)
class GpuIdentity:
    """Who a GPU is; uuid, name and bus id are "" for a GPU lost before it could be asked."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU; strings are "" where /proc could not tell."""

    pid: int
    name: str
    user: str
    container_id: str
    used_memory_bytes: int | None  # None where the driver does not report it
    gpu_instance: str = ""  # the GPU instance id (GPU_I_ID) under MIG
    attribution: Attribution = NONE  # the Slurm job or Kubernetes pod it runs in


@dataclass(frozen=True)
class GpuStatus:
    """One GPU's state now: figures maps metric names (GPU_METRICS) to values, absent if unsupported."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    is_lost: bool
    figures: dict[str, float] = field(default_factory=dict)
    processes: list[GpuProcess] = field(default_factory=list)


@dataclass(frozen=True)
class XidEvent:
    """An XID error reported by the driver; NVML gives no timestamp, so the caller may add one."""

    gpu_index: int
    xid: int
    timestamp_ms: int | None = None
