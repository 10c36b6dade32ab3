"""NVML access per GPU, behind one choke point that maps errors (used by GpuCollector).

The same code runs on the real `pynvml` module and on `FakeNvml`: it only calls `nvml.<name>`.
Every per-GPU call goes through `NvmlDevices.query`, which maps errors in one place:

- NotSupported, NoPermission, FunctionNotFound, Deprecated, ArgumentVersionMismatch, and pynvml's
  `NVMLLibraryMismatchError` (not an NVMLError): the figure is absent for that GPU, logged once, not
  asked for again; an older variant of the call is tried where one exists.
- GpuIsLost, Unknown, ResetRequired: the GPU is lost. It emits `gpuwatch_gpu_lost 1` and nothing read
  from it until a re-probe (every `reprobe_interval_s`) finds it again; the other GPUs keep going.
- Anything else: absent for this tick only, logged once per (GPU, call, error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from gpuwatch.collect.gpm import GpmSampler, MigInstance, find_instances, read_instance
from gpuwatch.collect.gpu_metrics import THROTTLE_REASONS
from gpuwatch.collect.gpu_status import GpuIdentity
from gpuwatch.core.model import Labels, make_labels

MIB = 1 << 20
_PSTATE_UNKNOWN = 32


class GpuState:
    """What the collector keeps per GPU between ticks (mutable; guarded by the collector's lock)."""

    def __init__(self, index: int, hostname: str) -> None:
        self.index = index
        self.hostname = hostname
        self.handle: Any = None
        self.is_lost = False
        self.is_probing = False  # re-probing a lost GPU: do not announce the loss again
        self.next_probe_ms = 0
        self.skipped: set[str] = set()  # calls found unsupported; never asked again
        self.warned: set[tuple[str, str]] = set()
        self.fields: dict[int, str] = {}  # field id -> metric name, minus unsupported ones
        self.prev_counters: dict[str, tuple[int, float]] = {}  # for PCIe rates
        self.last_xid = 0
        self.xid_counts: dict[int, int] = {}
        self.gpm: GpmSampler | None = None  # GPM of the whole GPU (Hopper and later, not in MIG mode)
        self.mig: list[MigInstance] | None = None  # the GPU instances, when the GPU is in MIG mode
        self.mig_gpm = False  # whether the GPU instances' GPM figures are read
        self.mig_readings: list[tuple[Labels, dict[str, float]]] = []
        self.set_identity(GpuIdentity(index, "", "", ""))

    def set_identity(self, identity: GpuIdentity) -> None:
        self.identity = identity
        self.label_map = {
            "gpu": str(identity.index),
            "UUID": identity.uuid,
            "modelName": identity.name,
            "Hostname": self.hostname,
            "pci_bus_id": identity.pci_bus_id,
        }
        self.labels: Labels = make_labels(self.label_map)
        self.throttle_labels = [
            (bit, make_labels({**self.label_map, "reason": r})) for bit, r in THROTTLE_REASONS
        ]
        self.extra_labels: dict[tuple[str, str], Labels] = {}

    def labels_with(self, key: str, value: str) -> Labels:
        labels = self.extra_labels.get((key, value))
        if labels is None:
            labels = self.extra_labels[(key, value)] = make_labels({**self.label_map, key: value})
        return labels


# (key, function, extra positional args after the handle, keyword args)
_Call = tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class NvmlDevices:
    """The NVML calls made per GPU, their fallbacks, and the mapping of their errors."""

    def __init__(self, nvml: Any, logger: logging.Logger, reprobe_ms: int) -> None:
        self._nvml = nvml
        self._log = logger
        # (figure, reason) already announced at INFO: other GPUs giving the same answer (a fan-less
        # datacenter board has no fan on any GPU) are logged at DEBUG, so start-up stays one line a figure.
        self._announced: set[tuple[str, str]] = set()
        self._reprobe_ms = reprobe_ms
        self.now_ms = 0  # the current tick, for scheduling re-probes
        self.system_skipped: set[str] = set()  # calls without a GPU found unsupported
        self._absent_errors: tuple[type[BaseException], ...] = (
            nvml.NVMLError_NotSupported,
            nvml.NVMLError_NoPermission,
            nvml.NVMLError_FunctionNotFound,
            nvml.NVMLLibraryMismatchError,
            *tuple(
                getattr(nvml, n)
                for n in ("NVMLError_Deprecated", "NVMLError_ArgumentVersionMismatch")
                if hasattr(nvml, n)
            ),
        )
        self._lost_errors = (nvml.NVMLError_GpuIsLost, nvml.NVMLError_Unknown, nvml.NVMLError_ResetRequired)
        # per-field returns that mean "not here"; InvalidArgument: a field id this driver does not know
        self._absent_codes = {
            nvml.NVML_ERROR_NOT_SUPPORTED,
            nvml.NVML_ERROR_NO_PERMISSION,
            nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            nvml.NVML_ERROR_INVALID_ARGUMENT,
        }
        self._value_attr = {
            nvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
            nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
            nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
            nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        }
        self.field_table = {
            nvml.NVML_FI_DEV_MEMORY_TEMP: "DCGM_FI_DEV_MEMORY_TEMP",
            nvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            nvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            nvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            nvml.NVML_FI_DEV_REMAPPED_UNC: "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            nvml.NVML_FI_DEV_REMAPPED_COR: "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            nvml.NVML_FI_DEV_REMAPPED_PENDING: "DCGM_FI_DEV_ROW_REMAP_PENDING",
            nvml.NVML_FI_DEV_REMAPPED_FAILURE: "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            nvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            # ids are ABI-stable; older nvidia-ml-py releases lack these two names
            getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197): "gpuwatch_pcie_tx_bytes_total",
            getattr(nvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198): "gpuwatch_pcie_rx_bytes_total",
        }
        v2 = {"version": nvml.nvmlMemory_v2} if hasattr(nvml, "nvmlMemory_v2") else None
        self._memory_calls: list[_Call] = (
            [("memory_v2", nvml.nvmlDeviceGetMemoryInfo, (), v2)] if v2 else []
        ) + [("memory", nvml.nvmlDeviceGetMemoryInfo, (), {})]
        sensor = (nvml.NVML_TEMPERATURE_GPU,)
        self._temperature_calls: list[_Call] = (
            [("temperature_v", nvml.nvmlDeviceGetTemperatureV, sensor, {})]
            if hasattr(nvml, "nvmlDeviceGetTemperatureV")
            else []
        ) + [("temperature", nvml.nvmlDeviceGetTemperature, sensor, {})]
        self._reason_calls: list[_Call] = (
            [("clocks_event_reasons", nvml.nvmlDeviceGetCurrentClocksEventReasons, (), {})]
            if hasattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons")
            else []
        ) + [("clocks_throttle_reasons", nvml.nvmlDeviceGetCurrentClocksThrottleReasons, (), {})]
        self.has_gpm = hasattr(nvml, "nvmlGpmSampleAlloc") and hasattr(nvml, "c_nvmlGpmMetricsGet_t")
        self._process_calls: list[_Call] = [
            ("processes", nvml.nvmlDeviceGetComputeRunningProcesses, (), {}),
            ("processes_v2", nvml.nvmlDeviceGetComputeRunningProcesses_v2, (), {}),
        ]

    def _announce(self, key: str, reason: str, msg: str, *args: Any) -> None:
        level = logging.DEBUG if (key, reason) in self._announced else logging.INFO
        self._announced.add((key, reason))
        self._log.log(level, msg, *args)

    def query(self, gpu: GpuState | None, key: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call `fn`; return None where the figure is absent (see the module docstring)."""
        skipped = gpu.skipped if gpu is not None else self.system_skipped
        if key in skipped or (gpu is not None and gpu.is_lost):
            return None
        try:
            return fn(*args, **kwargs)
        except (self._nvml.NVMLError, self._nvml.NVMLLibraryMismatchError) as exc:
            where = f"GPU {gpu.index}" if gpu is not None else "NVML"
            if isinstance(exc, self._absent_errors):
                skipped.add(key)
                self._announce(
                    key,
                    type(exc).__name__,
                    "%s: %s is not available (%s: %s); not asking again",
                    where,
                    key,
                    type(exc).__name__,
                    exc,
                )
            elif gpu is not None and isinstance(exc, self._lost_errors):
                self.mark_lost(gpu, f"{key}: {type(exc).__name__}")
            elif gpu is None or (key, type(exc).__name__) not in gpu.warned:
                if gpu is not None:
                    gpu.warned.add((key, type(exc).__name__))
                self._log.warning("%s: %s failed (%s: %s)", where, key, type(exc).__name__, exc)
            return None

    def query_first(self, gpu: GpuState, calls: Sequence[_Call]) -> Any:
        """Try the variants of a call newest first, moving on only from an unsupported one."""
        for key, fn, args, kwargs in calls:
            if key in gpu.skipped:
                continue
            value = self.query(gpu, key, fn, gpu.handle, *args, **kwargs)
            if value is not None or key not in gpu.skipped:
                return value
        return None

    def mark_lost(self, gpu: GpuState, why: str) -> None:
        if not gpu.is_lost and not gpu.is_probing:
            self._log.warning(
                "GPU %d (%s) is lost (%s); re-probing every %d s",
                gpu.index,
                gpu.identity.uuid,
                why,
                self._reprobe_ms // 1000,
            )
        gpu.is_lost = True
        gpu.next_probe_ms = self.now_ms + self._reprobe_ms
        gpu.prev_counters.clear()
        for sampler in self.samplers(gpu):
            sampler.reset()

    def samplers(self, gpu: GpuState) -> list[GpmSampler]:
        return ([gpu.gpm] if gpu.gpm is not None else []) + [inst.gpm for inst in gpu.mig or ()]

    def free_gpm(self, gpu: GpuState) -> None:
        for sampler in self.samplers(gpu):
            sampler.free(self._nvml)

    def attach(self, gpu: GpuState) -> None:
        """Get the handle and identity of `gpu`; on failure it is lost (and re-probed later)."""
        nvml = self._nvml
        gpu.is_probing, gpu.is_lost = gpu.is_lost, False
        try:
            handle = self.query(gpu, "handle", nvml.nvmlDeviceGetHandleByIndex, gpu.index)
            if handle is None:
                gpu.skipped.discard("handle")  # never "unsupported": keep probing
                self.mark_lost(gpu, "no handle")
                return
            gpu.handle = handle
            uuid = self.query(gpu, "uuid", nvml.nvmlDeviceGetUUID, handle)
            name = self.query(gpu, "name", nvml.nvmlDeviceGetName, handle)
            pci = self.query(gpu, "pci_info", nvml.nvmlDeviceGetPciInfo, handle)
        finally:
            gpu.is_probing = False
        if gpu.is_lost:
            return
        bus_id = pci.busId if pci is not None else ""
        bus_id = bus_id.decode() if isinstance(bus_id, bytes) else str(bus_id)
        identity = GpuIdentity(gpu.index, str(uuid or ""), str(name or ""), bus_id)
        if identity != gpu.identity:
            gpu.set_identity(identity)
        self._attach_depth(gpu)

    def _attach_depth(self, gpu: GpuState) -> None:
        """Find the GPU instances (MIG mode) and whether GPM answers; on a re-probe, anew."""
        nvml, h = self._nvml, gpu.handle

        def q(key: str, fn: Callable[..., Any], *args: Any) -> Any:
            return self.query(gpu, key, fn, *args)

        def warn(msg: str) -> None:
            self._log.warning("GPU %d: %s", gpu.index, msg)

        self.free_gpm(gpu)
        gpu.gpm, gpu.mig, gpu.mig_gpm = None, None, False
        if hasattr(nvml, "nvmlDeviceGetMigDeviceHandleByIndex"):
            gpu.mig = find_instances(nvml, q, h, gpu.label_map, warn)
        if not self.has_gpm:
            return
        support = q("gpm_support", nvml.nvmlGpmQueryDeviceSupport, h)
        if support is None:
            return
        if not support.isSupportedDevice:
            gpu.skipped.add("gpm_support")
            self._announce(
                "gpm",
                "unsupported",
                "GPU %d: GPM (SM activity, tensor, DRAM) is not supported on this GPU (Hopper and later only)",
                gpu.index,
            )
        elif gpu.mig is None:
            gpu.gpm = GpmSampler()
        else:
            gpu.mig_gpm = True

    def read(self, gpu: GpuState, *, gpm: bool = True) -> tuple[dict[str, float], list[Any]] | None:
        """Read every figure of `gpu`; None if it is (or just became) lost.

        `gpm`: also take a GPM sample (figures over the time since the last one) and read the GPU
        instances of a GPU in MIG mode into `gpu.mig_readings`."""
        nvml, h, q = self._nvml, gpu.handle, self.query
        f: dict[str, float] = {}
        util = q(gpu, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            f["DCGM_FI_DEV_GPU_UTIL"] = util.gpu
            f["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.memory
        mem = self.query_first(gpu, self._memory_calls)
        if mem is not None:
            f["DCGM_FI_DEV_FB_USED"] = mem.used // MIB
            f["DCGM_FI_DEV_FB_FREE"] = mem.free // MIB
            f["DCGM_FI_DEV_FB_TOTAL"] = mem.total // MIB
            if hasattr(mem, "reserved"):
                f["DCGM_FI_DEV_FB_RESERVED"] = mem.reserved // MIB
        temp = self.query_first(gpu, self._temperature_calls)
        if temp is not None:
            f["DCGM_FI_DEV_GPU_TEMP"] = temp
        power = q(gpu, "power", nvml.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            f["DCGM_FI_DEV_POWER_USAGE"] = power / 1000.0
        limit = q(gpu, "power_limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        if limit is not None:
            f["DCGM_FI_DEV_ENFORCED_POWER_LIMIT"] = limit / 1000.0
        sm = q(gpu, "sm_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM)
        if sm is not None:
            f["DCGM_FI_DEV_SM_CLOCK"] = sm
        mclk = q(gpu, "mem_clock", nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM)
        if mclk is not None:
            f["DCGM_FI_DEV_MEM_CLOCK"] = mclk
        fan = q(gpu, "fan", nvml.nvmlDeviceGetFanSpeed, h)
        if fan is not None:
            f["DCGM_FI_DEV_FAN_SPEED"] = fan
        pstate = q(gpu, "pstate", nvml.nvmlDeviceGetPerformanceState, h)
        if pstate is not None and pstate != _PSTATE_UNKNOWN:
            f["DCGM_FI_DEV_PSTATE"] = pstate
        reasons = self.query_first(gpu, self._reason_calls)
        if reasons is not None:
            f["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] = reasons
        if gpu.fields:
            self.read_fields(gpu, f)
        if gpm:
            self.read_depth(gpu, f)
        procs = self.query_first(gpu, self._process_calls)
        if gpu.is_lost:
            return None
        return {name: float(value) for name, value in f.items()}, list(procs or ())

    def read_depth(self, gpu: GpuState, f: dict[str, float]) -> None:
        """GPM figures of the whole GPU, and the memory and GPM figures of its GPU instances."""
        nvml = self._nvml

        def q(key: str, fn: Callable[..., Any], *args: Any) -> Any:
            return self.query(gpu, key, fn, *args)

        if gpu.gpm is not None:
            for field in gpu.gpm.read(nvml, q, gpu.handle, f):
                self._announce(
                    field.name,
                    "gpm",
                    "GPU %d: %s (%s) is not available; not asking again",
                    gpu.index,
                    field.name,
                    field.nvml_name,
                )
        gpu.mig_readings = [
            (inst.labels, read_instance(nvml, q, gpu.handle, inst, gpu.mig_gpm)) for inst in gpu.mig or ()
        ]

    def read_fields(self, gpu: GpuState, f: dict[str, float]) -> None:
        nvml = self._nvml
        values = self.query(gpu, "field_values", nvml.nvmlDeviceGetFieldValues, gpu.handle, list(gpu.fields))
        for fv in values or ():
            name = gpu.fields.get(fv.fieldId)
            if name is None:
                continue
            ret = fv.nvmlReturn
            if ret == nvml.NVML_SUCCESS:
                attr = self._value_attr.get(fv.valueType)
                if attr is not None:
                    f[name] = getattr(fv.value, attr)
            elif ret in self._absent_codes:
                del gpu.fields[fv.fieldId]
                self._announce(
                    name,
                    str(ret),
                    "GPU %d: %s (field %d) is not available (NVML return %d); not asking again",
                    gpu.index,
                    name,
                    fv.fieldId,
                    ret,
                )
            elif ret == nvml.NVML_ERROR_GPU_IS_LOST:
                self.mark_lost(gpu, f"field {fv.fieldId}: GpuIsLost")
                return
            elif (name, str(ret)) not in gpu.warned:
                gpu.warned.add((name, str(ret)))
                self._log.warning(
                    "GPU %d: %s (field %d) failed (NVML return %d)", gpu.index, name, fv.fieldId, ret
                )
