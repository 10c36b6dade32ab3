"""GPM (GPU Performance Monitoring, Hopper and later) and MIG instances, read through NVML.

NVML's utilization says only that some kernel ran in the sample period; GPM measures what the SMs did
between two samples: SM activity and occupancy, tensor-core and FP pipe activity, DRAM bandwidth, NVLink
traffic. Each GPU keeps two sample buffers: every tick takes a new sample and asks
`nvmlGpmMetricsGet(previous, new)`, so the figures cover one tick and the first tick has none. Devices
without GPM (`nvmlGpmQueryDeviceSupport` says no, or a call is NotSupported) have no such series.

A GPU in MIG mode shows each GPU instance: its memory (`nvmlDeviceGetMemoryInfo` on the MIG handle) and
its GPM figures (`nvmlGpmMigSampleGet`), labelled `GPU_I_ID` and `GPU_I_PROFILE` as dcgm-exporter does;
the whole-GPU utilization NVML does not give under MIG stays absent.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from gpuwatch.core.model import Labels, make_labels

MIB = 1 << 20
MIG_LABELS: tuple[str, ...] = ("GPU_I_ID", "GPU_I_PROFILE")
_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+\w+)?)\s*$")


class GpmField(NamedTuple):
    metric_id: int  # NVML_GPM_METRIC_* (ABI-stable numbers)
    nvml_name: str
    name: str  # dcgm-exporter's field name
    scale: float  # GPM value -> dcgm-exporter's unit


# GPM reports percentages (0-100) and MiB/s; dcgm-exporter's DCGM_FI_PROF_* are ratios and bytes/s.
GPM_FIELDS: tuple[GpmField, ...] = (
    GpmField(1, "NVML_GPM_METRIC_GRAPHICS_UTIL", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.01),
    GpmField(2, "NVML_GPM_METRIC_SM_UTIL", "DCGM_FI_PROF_SM_ACTIVE", 0.01),
    GpmField(3, "NVML_GPM_METRIC_SM_OCCUPANCY", "DCGM_FI_PROF_SM_OCCUPANCY", 0.01),
    GpmField(5, "NVML_GPM_METRIC_ANY_TENSOR_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.01),
    GpmField(6, "NVML_GPM_METRIC_DFMA_TENSOR_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", 0.01),
    GpmField(7, "NVML_GPM_METRIC_HMMA_TENSOR_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", 0.01),
    GpmField(9, "NVML_GPM_METRIC_IMMA_TENSOR_UTIL", "DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", 0.01),
    GpmField(10, "NVML_GPM_METRIC_DRAM_BW_UTIL", "DCGM_FI_PROF_DRAM_ACTIVE", 0.01),
    GpmField(11, "NVML_GPM_METRIC_FP64_UTIL", "DCGM_FI_PROF_PIPE_FP64_ACTIVE", 0.01),
    GpmField(12, "NVML_GPM_METRIC_FP32_UTIL", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", 0.01),
    GpmField(13, "NVML_GPM_METRIC_FP16_UTIL", "DCGM_FI_PROF_PIPE_FP16_ACTIVE", 0.01),
    GpmField(60, "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "DCGM_FI_PROF_NVLINK_RX_BYTES", float(MIB)),
    GpmField(61, "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "DCGM_FI_PROF_NVLINK_TX_BYTES", float(MIB)),
)

Query = Callable[..., Any]  # NvmlDevices.query bound to one GPU: (key, fn, *args) -> value or None


class GpmSampler:
    """Two GPM sample buffers of one GPU (or one GPU instance) and the metrics still asked for."""

    def __init__(self, gi_id: int | None = None) -> None:
        self.gi_id = gi_id  # None: the whole GPU
        self.prev: Any = None
        self.cur: Any = None
        self.has_prev = False
        self.fields = {f.metric_id: f for f in GPM_FIELDS}

    def reset(self) -> None:
        """Forget the previous sample (the GPU was lost): the next tick starts a new interval."""
        self.has_prev = False

    def free(self, nvml: Any) -> None:
        for buf in (self.prev, self.cur):
            if buf is not None:
                with contextlib.suppress(nvml.NVMLError):  # shutting down: nothing to do about it
                    nvml.nvmlGpmSampleFree(buf)
        self.prev = self.cur = None
        self.has_prev = False

    def read(self, nvml: Any, query: Query, handle: Any, f: dict[str, float]) -> list[GpmField]:
        """Take a sample; with the previous one, add the figures to `f`. Return the fields found unsupported."""
        if self.prev is None:
            self.prev = query("gpm_alloc", nvml.nvmlGpmSampleAlloc)
            self.cur = query("gpm_alloc", nvml.nvmlGpmSampleAlloc)
            if self.prev is None or self.cur is None:
                return []
        if self.gi_id is None:
            got = query("gpm_sample", nvml.nvmlGpmSampleGet, handle, self.cur)
        else:
            got = query("gpm_mig_sample", nvml.nvmlGpmMigSampleGet, handle, self.gi_id, self.cur)
        if got is None:
            self.has_prev = False
            return []
        dropped: list[GpmField] = []
        if self.has_prev and self.fields:
            fields = list(self.fields.values())
            mg = nvml.c_nvmlGpmMetricsGet_t()
            mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(fields)
            mg.sample1 = self.prev
            mg.sample2 = self.cur
            for k, field in enumerate(fields):
                mg.metrics[k].metricId = field.metric_id
            if query("gpm_metrics", nvml.nvmlGpmMetricsGet, mg) is not None:
                for k, field in enumerate(fields):
                    m = mg.metrics[k]
                    if m.nvmlReturn == nvml.NVML_SUCCESS:
                        f[field.name] = float(m.value) * field.scale
                    elif m.nvmlReturn in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                        del self.fields[field.metric_id]
                        dropped.append(field)
        self.prev, self.cur = self.cur, self.prev
        self.has_prev = True
        return dropped


class MigInstance:
    """One GPU instance of a GPU in MIG mode."""

    def __init__(self, gi_id: int, profile: str, handle: Any, labels: Labels) -> None:
        self.gi_id = gi_id
        self.profile = profile
        self.handle = handle
        self.labels = labels
        self.gpm = GpmSampler(gi_id)


def mig_profile(name: str) -> str:
    """The profile ("3g.40gb") at the end of a MIG device's name ("NVIDIA H100 80GB HBM3 MIG 3g.40gb")."""
    found = _PROFILE.search(name)
    return found.group(1) if found else ""


def find_instances(
    nvml: Any, query: Query, handle: Any, label_map: dict[str, str], warn: Callable[[str], None]
) -> list[MigInstance] | None:
    """The GPU instances of a GPU in MIG mode; None when MIG is off or unsupported."""
    mode = query("mig_mode", nvml.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return None
    count = query("mig_count", nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    out: list[MigInstance] = []
    for slot in range(int(count)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError_NotFound:  # an empty slot
            continue
        except nvml.NVMLError as exc:
            warn(f"MIG device {slot}: {type(exc).__name__}: {exc}")
            continue
        gi_id = query("mig_gi_id", nvml.nvmlDeviceGetGpuInstanceId, mig)
        if gi_id is None:
            continue
        name = query("mig_name", nvml.nvmlDeviceGetName, mig)
        profile = mig_profile(str(name or ""))
        labels = make_labels({**label_map, "GPU_I_ID": str(gi_id), "GPU_I_PROFILE": profile})
        out.append(MigInstance(int(gi_id), profile, mig, labels))
    return out


def read_instance(nvml: Any, query: Query, parent: Any, inst: MigInstance, gpm: bool) -> dict[str, float]:
    """Memory (MiB) and, where GPM answers, the GPM figures of one GPU instance."""
    f: dict[str, float] = {}
    mem = query("mig_memory", nvml.nvmlDeviceGetMemoryInfo, inst.handle)
    if mem is not None:
        f["DCGM_FI_DEV_FB_USED"] = mem.used // MIB
        f["DCGM_FI_DEV_FB_FREE"] = mem.free // MIB
        f["DCGM_FI_DEV_FB_TOTAL"] = mem.total // MIB
    if gpm:
        inst.gpm.read(nvml, query, parent, f)
    return f
