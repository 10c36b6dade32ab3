"""The structs the simulated NVML returns: pynvml's shapes (memory, utilization, PCI, field values,
processes, events, MIG handles, GPM samples and metrics), and the constants of what each model lacks."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import pynvml

from gpuwatch.demo.workload import GpuModelSpec

NO_INSTANCE = 0xFFFFFFFF
DATACENTER_UNSUPPORTED_CALLS = ("nvmlDeviceGetFanSpeed", "nvmlDeviceGetNumFans")
CONSUMER_UNSUPPORTED_CALLS = ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows")
CONSUMER_UNSUPPORTED_FIELDS = (3, 4, 5, 6, 82, 142, 143, 144, 145)


class FakeHandle:
    """A device handle; compare with `is`."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"FakeHandle({self.index})"


@dataclass(slots=True)
class FakeMemory:
    total: int
    free: int
    used: int


@dataclass(slots=True)
class FakeMemoryV2:
    version: int
    total: int
    reserved: int
    free: int
    used: int


@dataclass(slots=True)
class FakeUtilization:
    gpu: int
    memory: int


@dataclass(slots=True)
class FakePciInfo:
    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int
    busId: str


@dataclass(slots=True)
class FakeValue:
    """The value union: only the member named by valueType is set."""

    dVal: float = 0.0
    uiVal: int = 0
    ulVal: int = 0
    ullVal: int = 0
    sllVal: int = 0
    siVal: int = 0
    usVal: int = 0


@dataclass(slots=True)
class FakeFieldValue:
    fieldId: int
    scopeId: int
    timestamp: int  # microseconds
    latencyUsec: int
    valueType: int
    nvmlReturn: int
    value: FakeValue


@dataclass(slots=True)
class FakeProcessInfo:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = NO_INSTANCE
    computeInstanceId: int = NO_INSTANCE


@dataclass(slots=True)
class FakeEventData:
    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = NO_INSTANCE
    computeInstanceId: int = NO_INSTANCE


class FakeMigHandle:
    """A MIG device handle: one GPU instance of a parent GPU; compare with `is`."""

    __slots__ = ("gi_id", "memory_mib", "parent", "profile", "slot")

    def __init__(self, parent: FakeHandle, slot: int, gi_id: int, profile: str, memory_mib: int) -> None:
        self.parent = parent
        self.slot = slot
        self.gi_id = gi_id
        self.profile = profile
        self.memory_mib = memory_mib

    def __repr__(self) -> str:
        return f"FakeMigHandle({self.parent.index}, gi={self.gi_id}, {self.profile})"


@dataclass(slots=True)
class FakeGpmSupport:
    version: int
    isSupportedDevice: int


class FakeGpmSample:
    """What nvmlGpmSampleAlloc returns; nvmlGpmSampleGet / nvmlGpmMigSampleGet fill it in."""

    __slots__ = ("gi_id", "index", "is_freed", "time")

    def __init__(self) -> None:
        self.index = -1
        self.gi_id = -1  # -1: the whole GPU
        self.time: float | None = None
        self.is_freed = False


@dataclass(slots=True)
class FakeGpmMetric:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


class FakeGpmMetricsGet:
    """pynvml's c_nvmlGpmMetricsGet_t: set version, numMetrics, sample1, sample2, metrics[i].metricId."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [FakeGpmMetric() for _ in range(pynvml.NVML_GPM_METRIC_MAX)]


# GPM metric id -> Reading attribute and scale (GPM reports percentages; NVLink in MiB/s)
GPM_FIGURES: dict[int, tuple[str, float]] = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: ("gr_active", 100.0),
    pynvml.NVML_GPM_METRIC_SM_UTIL: ("sm_active", 100.0),
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: ("sm_occupancy", 100.0),
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: ("tensor_active", 100.0),
    pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL: ("tensor_active", 100.0),
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: ("dram_active", 100.0),
    pynvml.NVML_GPM_METRIC_FP64_UTIL: ("fp64_active", 100.0),
    pynvml.NVML_GPM_METRIC_FP32_UTIL: ("fp32_active", 100.0),
    pynvml.NVML_GPM_METRIC_FP16_UTIL: ("fp16_active", 100.0),
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: ("nvlink_tx_mib_s", 1.0),
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: ("nvlink_rx_mib_s", 1.0),
}
ZERO_GPM = (pynvml.NVML_GPM_METRIC_DFMA_TENSOR_UTIL, pynvml.NVML_GPM_METRIC_IMMA_TENSOR_UTIL)
NVLINK_GPM = (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC)


def profile_memory_mib(profile: str, spec: GpuModelSpec) -> int:
    """Memory of a MIG profile like "3g.40gb": its slices' share of the board (7 compute, 8 memory slices)."""
    try:
        gb = int(profile.split(".")[1].removesuffix("gb").split("+")[0])
    except (IndexError, ValueError):
        raise ValueError(f"bad MIG profile {profile!r}; expected something like '1g.10gb'") from None
    return int(spec.memory_mib * min(1.0, gb / max(1, round(spec.memory_mib / 1024 / 10) * 10)) * 0.97)


class FakeEventSet:
    """What each device registered for, and the events not yet delivered."""

    def __init__(self) -> None:
        self.masks: dict[int, int] = {}
        self.queue: deque[FakeEventData] = deque()
        self.cond = threading.Condition()
        self.is_freed = False
