"""The GPU metric table: name, type, unit, labels and NVML source of every sample the GPU collector emits.

Names and units follow dcgm-exporter wherever it has the field, so rules and dashboards written for
dcgm-exporter work unchanged; what dcgm-exporter lacks is named `gpuwatch_*`.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuwatch.core.model import MetricInfo

# Labels on every per-GPU sample, as dcgm-exporter writes them (`Hostname` as in release 4.5.3-4.8.2).
GPU_LABELS: tuple[str, ...] = ("gpu", "UUID", "modelName", "Hostname", "pci_bus_id")
PROCESS_LABELS: tuple[str, ...] = (
    "pid",
    "process_name",
    "user",
    "container_id",
    "slurm_job",
    "pod_uid",
    "pod",
    "namespace",
    "container",
)

# NVML clocks-event ("throttle") reason bits, in mask order.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
# The reasons that lower the clock of a loaded GPU; each gets a 0/1 `gpuwatch_clock_throttled` series.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = tuple(
    (bit, name)
    for bit, name in CLOCK_EVENT_REASONS
    if name
    in (
        "sw_power_cap",
        "hw_slowdown",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    )
)


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Return the names of the reason bits set in `mask`."""
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


class GpuMetric(NamedTuple):
    """One row of the metric table."""

    name: str
    type: str
    unit: str
    help: str
    source: str  # the NVML call or field it comes from
    dcgm: str  # the dcgm-exporter equivalent, "" if none
    extra_labels: tuple[str, ...] = ()

    @property
    def info(self) -> MetricInfo:
        return MetricInfo(self.name, self.type, self.help, self.unit, GPU_LABELS + self.extra_labels)


_SAME = "same name"


def GpmRow(name: str, help: str, gpm: str, *, default: bool = False) -> GpuMetric:
    """A GPM-backed ratio: GPM gives a percentage over the interval between two samples."""
    return GpuMetric(
        name, "gauge", "ratio", help + " GPM, Hopper and later; absent where not supported.",
        f"GPM {gpm} / 100 (per GPU instance on a MIG GPU)",
        _SAME if default else "same name (commented out in the default CSV)",
    )  # fmt: skip


GPU_METRIC_TABLE: tuple[GpuMetric, ...] = (
    GpuMetric("DCGM_FI_DEV_GPU_UTIL", "gauge", "%", "GPU utilization (in %).",
              "nvmlDeviceGetUtilizationRates().gpu", _SAME),
    GpuMetric("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "%", "Memory utilization (in %).",
              "nvmlDeviceGetUtilizationRates().memory", _SAME),
    GpuMetric("DCGM_FI_DEV_FB_USED", "gauge", "MiB",
              "Framebuffer memory used (in MiB); on a MIG GPU also per GPU instance (GPU_I_ID, GPU_I_PROFILE).",
              "nvmlDeviceGetMemoryInfo(v2).used (v1 .used, which includes reserved, on old drivers)", _SAME),
    GpuMetric("DCGM_FI_DEV_FB_FREE", "gauge", "MiB", "Framebuffer memory free (in MiB).",
              "nvmlDeviceGetMemoryInfo().free", _SAME),
    GpuMetric("DCGM_FI_DEV_FB_TOTAL", "gauge", "MiB", "Framebuffer memory total (in MiB).",
              "nvmlDeviceGetMemoryInfo().total", "same name (not in the default CSV)"),
    GpuMetric("DCGM_FI_DEV_FB_RESERVED", "gauge", "MiB", "Framebuffer memory reserved (in MiB).",
              "nvmlDeviceGetMemoryInfo(v2).reserved (absent where v2 is not available)", _SAME),
    GpuMetric("DCGM_FI_DEV_GPU_TEMP", "gauge", "C", "GPU temperature (in C).",
              "nvmlDeviceGetTemperatureV(NVML_TEMPERATURE_GPU) (nvmlDeviceGetTemperature on old bindings)", _SAME),
    GpuMetric("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "C", "Memory temperature (in C).",
              "field NVML_FI_DEV_MEMORY_TEMP (82)", _SAME),
    GpuMetric("DCGM_FI_DEV_POWER_USAGE", "gauge", "W", "Power draw (in W).",
              "nvmlDeviceGetPowerUsage() mW / 1000", _SAME),
    GpuMetric("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "gauge", "W",
              "Effective power limit the driver enforces, after all limiters (in W).",
              "nvmlDeviceGetEnforcedPowerLimit() mW / 1000", "same name (not in the default CSV)"),
    GpuMetric("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "mJ",
              "Total energy consumption since the driver was loaded (in mJ).",
              "field NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION (83)", _SAME),
    GpuMetric("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "errors",
              "Total number of single-bit volatile ECC errors.",
              "field NVML_FI_DEV_ECC_SBE_VOL_TOTAL (3)", "same name (commented out in the default CSV)"),
    GpuMetric("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "errors",
              "Total number of double-bit volatile ECC errors.",
              "field NVML_FI_DEV_ECC_DBE_VOL_TOTAL (4)", "same name (commented out in the default CSV)"),
    GpuMetric("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "rows",
              "Number of remapped rows for uncorrectable errors.", "field NVML_FI_DEV_REMAPPED_UNC (143)", _SAME),
    GpuMetric("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "rows",
              "Number of remapped rows for correctable errors.", "field NVML_FI_DEV_REMAPPED_COR (142)", _SAME),
    GpuMetric("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "bool",
              "Whether remapping of rows is pending (a GPU reset is needed).",
              "field NVML_FI_DEV_REMAPPED_PENDING (144)", "same name (not in the default CSV)"),
    GpuMetric("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "bool", "Whether remapping of rows has failed.",
              "field NVML_FI_DEV_REMAPPED_FAILURE (145)", _SAME),
    GpuMetric("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "B/s",
              "Rate of data transmitted over the PCIe bus, headers included (in bytes per second).",
              "GPM NVML_GPM_METRIC_PCIE_TX_PER_SEC (20) x 2^20; without GPM, difference of field 197 (32-bit) between two samples", _SAME),
    GpuMetric("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "B/s",
              "Rate of data received over the PCIe bus, headers included (in bytes per second).",
              "GPM NVML_GPM_METRIC_PCIE_RX_PER_SEC (21) x 2^20; without GPM, difference of field 198 (32-bit) between two samples", _SAME),
    GpuMetric("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "ratio",
              "Ratio of time the graphics engine is active (GPM, Hopper and later).",
              "GPM NVML_GPM_METRIC_GRAPHICS_UTIL (1) / 100", _SAME),
    GpmRow("DCGM_FI_PROF_SM_ACTIVE", "Ratio of cycles an SM has at least one warp assigned.",
           "NVML_GPM_METRIC_SM_UTIL (2)"),
    GpmRow("DCGM_FI_PROF_SM_OCCUPANCY", "Ratio of warps resident on an SM to the maximum it can hold.",
           "NVML_GPM_METRIC_SM_OCCUPANCY (3)"),
    GpmRow("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles any tensor pipe is active.",
           "NVML_GPM_METRIC_ANY_TENSOR_UTIL (5)", default=True),
    GpmRow("DCGM_FI_PROF_PIPE_TENSOR_DFMA_ACTIVE", "Ratio of cycles the FP64 (DFMA) tensor pipe is active.",
           "NVML_GPM_METRIC_DFMA_TENSOR_UTIL (6)"),
    GpmRow("DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE", "Ratio of cycles the FP16/BF16 (HMMA) tensor pipe is active.",
           "NVML_GPM_METRIC_HMMA_TENSOR_UTIL (7)"),
    GpmRow("DCGM_FI_PROF_PIPE_TENSOR_IMMA_ACTIVE", "Ratio of cycles the integer (IMMA) tensor pipe is active.",
           "NVML_GPM_METRIC_IMMA_TENSOR_UTIL (9)"),
    GpmRow("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of the device memory bandwidth in use (GPM: of the theoretical maximum).",
           "NVML_GPM_METRIC_DRAM_BW_UTIL (10)", default=True),
    GpmRow("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "Ratio of cycles the FP64 pipe is active (not tensor).",
           "NVML_GPM_METRIC_FP64_UTIL (11)"),
    GpmRow("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "Ratio of cycles the FP32 pipe is active (not tensor).",
           "NVML_GPM_METRIC_FP32_UTIL (12)"),
    GpmRow("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "Ratio of cycles the FP16 pipe is active (not tensor).",
           "NVML_GPM_METRIC_FP16_UTIL (13)"),
    GpuMetric("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "B/s",
              "Rate of data received over all NVLink links (in bytes per second; GPM, Hopper and later).",
              "GPM NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC (60) MiB/s * 2^20", "same name (not in the default CSV)"),
    GpuMetric("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "B/s",
              "Rate of data transmitted over all NVLink links (in bytes per second; GPM, Hopper and later).",
              "GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC (61) MiB/s * 2^20", "same name (not in the default CSV)"),
    GpuMetric("gpuwatch_pcie_tx_bytes_total", "counter", "bytes",
              "Bytes transmitted over the PCIe bus since gpuwatch started (the sum of the rate over time).",
              "DCGM_FI_PROF_PCIE_TX_BYTES x seconds, summed", "DCGM_FI_PROF_PCIE_TX_BYTES (rate)"),
    GpuMetric("gpuwatch_pcie_rx_bytes_total", "counter", "bytes",
              "Bytes received over the PCIe bus since gpuwatch started (the sum of the rate over time).",
              "DCGM_FI_PROF_PCIE_RX_BYTES x seconds, summed", "DCGM_FI_PROF_PCIE_RX_BYTES (rate)"),
    GpuMetric("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "retries", "Total number of PCIe retries.",
              "field NVML_FI_DEV_PCIE_REPLAY_COUNTER (94)", _SAME),
    GpuMetric("DCGM_FI_DEV_SM_CLOCK", "gauge", "MHz", "SM clock frequency (in MHz).",
              "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", _SAME),
    GpuMetric("DCGM_FI_DEV_MEM_CLOCK", "gauge", "MHz", "Memory clock frequency (in MHz).",
              "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)", _SAME),
    GpuMetric("DCGM_FI_DEV_FAN_SPEED", "gauge", "%",
              "Fan speed (in % of the maximum); absent on passively cooled boards.",
              "nvmlDeviceGetFanSpeed()", "same name (not in the default CSV)"),
    GpuMetric("DCGM_FI_DEV_PSTATE", "gauge", "P-state",
              "Performance state, 0 (highest) to 15 (lowest).", "nvmlDeviceGetPerformanceState()",
              "same name (not in the default CSV)"),
    GpuMetric("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "bitmask",
              "Current reasons for clock events (throttling), as NVML's bitmask.",
              "nvmlDeviceGetCurrentClocksEventReasons()", "same name (not in the default CSV)"),
    GpuMetric("gpuwatch_clock_throttled", "gauge", "bool",
              "1 while the clock is lowered for this reason (one series per throttling reason).",
              "bits 0x4, 0x8, 0x20, 0x40, 0x80 of nvmlDeviceGetCurrentClocksEventReasons()",
              "DCGM_EXP_CLOCK_EVENTS_COUNT (counts, label clock_event)", ("reason",)),
    GpuMetric("DCGM_FI_DEV_XID_ERRORS", "gauge", "XID", "Value of the last XID error encountered (0: none yet).",
              "nvmlEventSetWait_v2() events of type nvmlEventTypeXidCriticalError", _SAME),
    GpuMetric("gpuwatch_xid_errors_total", "counter", "events",
              "XID errors seen since gpuwatch started, by XID code (a series appears with its first event).",
              "nvmlEventSetWait_v2() events of type nvmlEventTypeXidCriticalError",
              "DCGM_EXP_XID_ERRORS_COUNT (windowed, labels err_code, err_msg)", ("xid",)),
    GpuMetric("gpuwatch_process_gpu_memory_bytes", "gauge", "bytes",
              "GPU memory used by a compute process (in bytes; NaN where the driver does not know, as under MIG).",
              "nvmlDeviceGetComputeRunningProcesses_v3 (each MIG device's under MIG); name, user, container, Slurm job and pod from /proc/<pid>",
              "", PROCESS_LABELS),
    GpuMetric("gpuwatch_gpu_lost", "gauge", "bool",
              "1 while the GPU does not answer NVML (fell off the bus: GpuIsLost/ResetRequired), else 0.",
              "NVMLError_GpuIsLost / NVMLError_ResetRequired from any call", ""),
)  # fmt: skip

GPU_METRICS: tuple[MetricInfo, ...] = tuple(m.info for m in GPU_METRIC_TABLE)


def render_markdown_table() -> str:
    """Return the metric table as Markdown, as docs/metrics.md carries it."""
    rows = [
        "| Metric | Type | Unit | Labels (besides the GPU labels) | NVML source | dcgm-exporter equivalent |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in GPU_METRIC_TABLE:
        extra = ", ".join(f"`{label}`" for label in m.extra_labels) or "-"
        dcgm = m.dcgm or "-"
        rows.append(f"| `{m.name}` | {m.type} | {m.unit} | {extra} | {m.source} | {dcgm} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render_markdown_table(), end="")
