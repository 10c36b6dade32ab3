"""GPM (GPU Performance Monitoring, Hopper and later): what the SMs did between two samples.

NVML's utilization says only that some kernel ran in the sample period; GPM measures what the SMs did
between two samples: SM activity and occupancy, tensor-core and FP pipe activity, DRAM bandwidth, NVLink
traffic. Each GPU keeps two sample buffers: every tick takes a new sample and asks
`nvmlGpmMetricsGet(previous, new)`, so the figures cover one tick and the first tick has none. Devices
without GPM (`nvmlGpmQueryDeviceSupport` says no, or a call is NotSupported) have no such series.

Failures are local and retried: a sample buffer that cannot be allocated, or a sample the driver
refuses (NotSupported while a profiler such as Nsight or DCGM holds the counters), stop the figures of
that one sampler (a GPU, or one GPU instance under MIG) for `RETRY_MS`, then it tries again. Only a
metric id the driver does not know is dropped for good.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, NamedTuple

MIB = 1 << 20
RETRY_MS = 60_000  # a sampler that failed waits this long before trying again


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
    GpmField(20, "NVML_GPM_METRIC_PCIE_TX_PER_SEC", "DCGM_FI_PROF_PCIE_TX_BYTES", float(MIB)),
    GpmField(21, "NVML_GPM_METRIC_PCIE_RX_PER_SEC", "DCGM_FI_PROF_PCIE_RX_BYTES", float(MIB)),
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
        self.retry_at_ms = 0
        self.fields = {f.metric_id: f for f in GPM_FIELDS}
        self.key = "gpm_sample" if gi_id is None else f"gpm_mig_sample:{gi_id}"

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

    def _pause(self, nvml: Any, now_ms: int) -> list[GpmField]:
        self.free(nvml)
        self.retry_at_ms = now_ms + RETRY_MS
        return []

    def read(self, nvml: Any, query: Query, handle: Any, f: dict[str, float], now_ms: int) -> list[GpmField]:
        """Take a sample; with the previous one, add the figures to `f`. Return the fields found unsupported.

        `query(key, fn, *args, sticky=False)` calls NVML (None on failure, without giving up for good)."""
        if now_ms < self.retry_at_ms:
            return []
        if self.prev is None or self.cur is None:
            self.prev = self.prev or query("gpm_alloc", nvml.nvmlGpmSampleAlloc, sticky=False)
            self.cur = self.cur or query("gpm_alloc", nvml.nvmlGpmSampleAlloc, sticky=False)
            if self.prev is None or self.cur is None:
                return self._pause(nvml, now_ms)
        if self.gi_id is None:
            got = query(self.key, nvml.nvmlGpmSampleGet, handle, self.cur, sticky=False)
        else:
            got = query(self.key, nvml.nvmlGpmMigSampleGet, handle, self.gi_id, self.cur, sticky=False)
        if got is None:
            return self._pause(nvml, now_ms)
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
            if query("gpm_metrics", nvml.nvmlGpmMetricsGet, mg, sticky=False) is not None:
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
