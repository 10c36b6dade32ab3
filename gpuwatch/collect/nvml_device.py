"""NVML access per GPU, behind one choke point that maps errors (used by GpuCollector).

The same code runs on the real `pynvml` module (any nvidia-ml-py from 12.535.77 on: every name newer
than that is looked up with a fallback) and on `FakeNvml`. Every per-GPU call goes through
`NvmlDevices.query`, which maps errors in one place, as nvitop and nvidia-smi do:

- NotSupported, NoPermission, FunctionNotFound, Deprecated, ArgumentVersionMismatch, and pynvml's
  `NVMLLibraryMismatchError` (not an NVMLError): the figure is absent for that GPU, logged once, not
  asked for again; an older variant of the call is tried where one exists.
- GpuIsLost, ResetRequired: the GPU is lost. It emits `gpuwatch_gpu_lost 1` and nothing read from it
  until a re-probe (every `reprobe_interval_s`) finds it again; the other GPUs keep going.
- Anything else, Unknown included (drivers return it for one figure of a working GPU: nvidia-smi's
  `ERR!`): absent for this tick only, logged once per (GPU, call, error).

At the handle, NoPermission and InsufficientPower leave the GPU unavailable, not lost: it is not
sampled, says why once, and is asked again every re-probe interval.
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

from gpuwatch.collect.gpm import GpmSampler
from gpuwatch.collect.gpu_state import GpuState
from gpuwatch.collect.gpu_status import GpuIdentity
from gpuwatch.collect.mig import MigInstance, add_memory, find_instances, read_instance
from gpuwatch.collect.nvml_processes import DriverProcesses, NvmlProcess, binding_processes

__all__ = ["GpuState", "NvmlDevices", "Reading"]

_PSTATE_UNKNOWN = 32


class _Missing(Exception):
    """Stands in for an exception class an older binding lacks (nothing raises it)."""


class Reading(NamedTuple):
    """One GPU's figures this tick and its processes, each with its GPU instance under MIG."""

    figures: dict[str, float]
    processes: list[tuple[NvmlProcess, MigInstance | None]]


# (key, function, extra positional args after the handle, keyword args)
_Call = tuple[str, Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def _calls(nvml: Any, *variants: tuple[str, str, tuple[Any, ...], dict[str, Any]]) -> list[_Call]:
    """The variants of a call this binding has, newest first: (key, pynvml name, args, kwargs)."""
    return [(key, getattr(nvml, name), args, kw) for key, name, args, kw in variants if hasattr(nvml, name)]


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
        self.mismatch_error: type[BaseException] = getattr(nvml, "NVMLLibraryMismatchError", _Missing)
        self._absent_errors: tuple[type[BaseException], ...] = (
            nvml.NVMLError_NotSupported,
            nvml.NVMLError_NoPermission,
            nvml.NVMLError_FunctionNotFound,
            self.mismatch_error,
            *tuple(
                getattr(nvml, n)
                for n in ("NVMLError_Deprecated", "NVMLError_ArgumentVersionMismatch")
                if hasattr(nvml, n)
            ),
        )
        self._lost_errors = (nvml.NVMLError_GpuIsLost, nvml.NVMLError_ResetRequired)
        self._unavailable_errors = (nvml.NVMLError_NoPermission, nvml.NVMLError_InsufficientPower)
        # per-field returns that mean "not here"; InvalidArgument: a field id this driver does not know
        self._absent_codes = {
            nvml.NVML_ERROR_NOT_SUPPORTED,
            nvml.NVML_ERROR_NO_PERMISSION,
            nvml.NVML_ERROR_FUNCTION_NOT_FOUND,
            nvml.NVML_ERROR_INVALID_ARGUMENT,
        }
        self._lost_codes = {nvml.NVML_ERROR_GPU_IS_LOST, nvml.NVML_ERROR_RESET_REQUIRED}
        # value type -> union member; ids are ABI-stable (5 = signed int is missing from old bindings)
        self._value_attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
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
        memory = [("memory_v2", "nvmlDeviceGetMemoryInfo", (), v2)] if v2 else []
        self._memory_calls = _calls(nvml, *memory, ("memory", "nvmlDeviceGetMemoryInfo", (), {}))
        self._mig_memory_calls = [(f"mig_{key}", fn, args, kw) for key, fn, args, kw in self._memory_calls]
        sensor = (nvml.NVML_TEMPERATURE_GPU,)
        self._temperature_calls = _calls(
            nvml,
            ("temperature_v", "nvmlDeviceGetTemperatureV", sensor, {}),
            ("temperature", "nvmlDeviceGetTemperature", sensor, {}),  # marked for removal in 13.x
        )
        self._reason_calls = _calls(
            nvml,
            ("clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", (), {}),
            ("clocks_throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", (), {}),
        )
        self.has_gpm = hasattr(nvml, "nvmlGpmSampleAlloc") and hasattr(nvml, "c_nvmlGpmMetricsGet_t")
        self._process_calls = _calls(
            nvml,
            ("processes", "nvmlDeviceGetComputeRunningProcesses", (), {}),
            ("processes_v2", "nvmlDeviceGetComputeRunningProcesses_v2", (), {}),
        )
        self.driver_processes: DriverProcesses | None = None

    def use_driver_processes(self) -> None:
        """Read process lists from the driver library in its own layout (real pynvml only; after nvmlInit)."""
        if not isinstance(self._nvml, types.ModuleType):
            return  # the simulated NVML has no library
        try:
            self.driver_processes = DriverProcesses(self._nvml)
        except (OSError, AttributeError) as exc:
            self._log.warning("process lists through the binding: the driver library did not open (%s)", exc)
            return
        self._log.debug("process lists: %s", self.driver_processes.layout)

    def _announce(self, key: str, reason: str, msg: str, *args: Any) -> None:
        level = logging.DEBUG if (key, reason) in self._announced else logging.INFO
        self._announced.add((key, reason))
        self._log.log(level, msg, *args)

    def query(
        self,
        gpu: GpuState | None,
        key: str,
        fn: Callable[..., Any],
        *args: Any,
        sticky: bool = True,
        **kwargs: Any,
    ) -> Any:
        """Call `fn`; return None where the figure is absent (see the module docstring).

        `sticky=False`: an unsupported answer is not remembered (the caller retries on its own terms)."""
        skipped = gpu.skipped if gpu is not None else self.system_skipped
        if key in skipped or (gpu is not None and gpu.is_lost):
            return None
        try:
            return fn(*args, **kwargs)
        except (self._nvml.NVMLError, self.mismatch_error) as exc:
            where = f"GPU {gpu.index}" if gpu is not None else "NVML"
            if isinstance(exc, self._absent_errors):
                if sticky:
                    skipped.add(key)
                self._announce(
                    key,
                    type(exc).__name__,
                    "%s: %s is not available (%s: %s)%s",
                    where,
                    key,
                    type(exc).__name__,
                    exc,
                    "; not asking again" if sticky else "",
                )
            elif gpu is not None and isinstance(exc, self._lost_errors):
                self.mark_lost(gpu, f"{key}: {type(exc).__name__}")
            elif gpu is None or (key, type(exc).__name__) not in gpu.warned:
                if gpu is not None:
                    gpu.warned.add((key, type(exc).__name__))
                self._log.warning("%s: %s failed (%s: %s)", where, key, type(exc).__name__, exc)
            return None

    def query_first(self, gpu: GpuState, calls: Sequence[_Call], handle: Any = None) -> Any:
        """Try the variants of a call newest first, moving on only from an unsupported one."""
        for key, fn, args, kwargs in calls:
            if key in gpu.skipped:
                continue
            value = self.query(gpu, key, fn, gpu.handle if handle is None else handle, *args, **kwargs)
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
        gpu.pcie_ms = None
        for sampler in self.samplers(gpu):
            sampler.reset()

    def samplers(self, gpu: GpuState) -> list[GpmSampler]:
        return ([gpu.gpm] if gpu.gpm is not None else []) + [inst.gpm for inst in gpu.mig or ()]

    def free_gpm(self, gpu: GpuState) -> None:
        for sampler in self.samplers(gpu):
            sampler.free(self._nvml)

    def attach(self, gpu: GpuState) -> None:
        """Get the handle and identity of `gpu`; on failure it is lost or unavailable (and re-probed later)."""
        nvml = self._nvml
        gpu.is_probing, gpu.is_lost = gpu.is_lost, False
        gpu.next_probe_ms = self.now_ms + self._reprobe_ms
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
        except self._unavailable_errors as exc:
            why = f"{type(exc).__name__}: {exc}"
            if gpu.unavailable != why:
                hint = (
                    "check its power cables"
                    if isinstance(exc, nvml.NVMLError_InsufficientPower)
                    else "this user or container may not open it"
                )
                self._log.warning("GPU %d cannot be opened (%s): %s; not sampled", gpu.index, why, hint)
            gpu.unavailable = why
            gpu.is_probing = False
            return
        except (nvml.NVMLError, self.mismatch_error) as exc:
            gpu.unavailable = None
            self.mark_lost(gpu, f"handle: {type(exc).__name__}")
            gpu.is_probing = False
            return
        if gpu.unavailable is not None:
            self._log.warning("GPU %d can be opened again", gpu.index)
            gpu.unavailable = None
        try:
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

    def _bound(self, gpu: GpuState) -> Callable[..., Any]:
        def q(key: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return self.query(gpu, key, fn, *args, **kwargs)

        return q

    def _attach_depth(self, gpu: GpuState) -> None:
        """Find the GPU instances (MIG mode) and whether GPM answers; on a re-probe, anew."""
        nvml, h = self._nvml, gpu.handle
        self.free_gpm(gpu)
        gpu.gpm, gpu.mig, gpu.has_gpm = None, None, False
        self._refresh_mig(gpu)
        if not self.has_gpm:
            return
        support = self.query(gpu, "gpm_support", nvml.nvmlGpmQueryDeviceSupport, h)
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
            return
        gpu.has_gpm = True
        if gpu.mig is None:
            gpu.gpm = GpmSampler()

    def _refresh_mig(self, gpu: GpuState) -> None:
        """Read the MIG layout (now and every re-probe interval); keep the instances that did not change."""
        nvml = self._nvml
        gpu.mig_next_ms = self.now_ms + self._reprobe_ms
        if not hasattr(nvml, "nvmlDeviceGetMigDeviceHandleByIndex"):
            return

        def warn(msg: str) -> None:
            self._log.warning("GPU %d: %s", gpu.index, msg)

        found = find_instances(nvml, self._bound(gpu), gpu.handle, gpu.label_map, warn)
        old = {inst.layout: inst for inst in gpu.mig or ()}
        new = [old.pop(inst.layout, inst) for inst in found] if found is not None else None
        for inst in old.values():
            inst.gpm.free(nvml)
        if gpu.mig is not None and new is not None and {i.layout for i in gpu.mig} != {i.layout for i in new}:
            self._log.info(
                "GPU %d: MIG layout now %s",
                gpu.index,
                ", ".join(f"GI {i.gi_id} {i.profile} ({len(i.devices)} CI)" for i in new or ()) or "empty",
            )
        if (gpu.mig is None) != (new is None):  # MIG switched on or off (after a GPU reset)
            if gpu.gpm is not None:
                gpu.gpm.free(nvml)
            gpu.gpm = GpmSampler() if new is None and gpu.has_gpm else None
        gpu.mig = new

    def read(self, gpu: GpuState, *, gpm: bool = True) -> Reading | None:
        """Read every figure of `gpu`; None if it is (or just became) lost.

        `gpm`: also take a GPM sample (figures over the time since the last one) and read the GPU
        instances of a GPU in MIG mode into `gpu.mig_readings`."""
        nvml, h, q = self._nvml, gpu.handle, self.query
        if self.now_ms >= gpu.mig_next_ms:
            self._refresh_mig(gpu)
        f: dict[str, float] = {}
        util = q(gpu, "utilization", nvml.nvmlDeviceGetUtilizationRates, h, sticky=gpu.mig is None)
        if util is not None:
            f["DCGM_FI_DEV_GPU_UTIL"] = util.gpu
            f["DCGM_FI_DEV_MEM_COPY_UTIL"] = util.memory
        add_memory(f, self.query_first(gpu, self._memory_calls))
        temp = self.query_first(gpu, self._temperature_calls)
        if temp is not None:
            f["DCGM_FI_DEV_GPU_TEMP"] = temp
        self._read_power_clocks(gpu, f)
        reasons = self.query_first(gpu, self._reason_calls)
        if reasons is not None:
            f["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] = reasons
        if gpu.fields:
            self.read_fields(gpu, f)
        if gpm:
            self.read_depth(gpu, f)
        procs = self.processes(gpu)
        if gpu.is_lost:
            return None
        return Reading({name: float(value) for name, value in f.items()}, procs)

    def _read_power_clocks(self, gpu: GpuState, f: dict[str, float]) -> None:
        nvml, h, q = self._nvml, gpu.handle, self.query
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

    def _process_list(self, gpu: GpuState, handle: Any, key: str) -> list[NvmlProcess]:
        if self.driver_processes is not None:
            return self.query(gpu, key, self.driver_processes.read, handle) or []
        calls: list[_Call] = [
            (f"{key}{k[9:]}", partial(binding_processes, fn), (), {}) for k, fn, _, _ in self._process_calls
        ]
        return self.query_first(gpu, calls, handle) or []

    def processes(self, gpu: GpuState) -> list[tuple[NvmlProcess, MigInstance | None]]:
        """The GPU's compute processes; under MIG, those of each compute instance (no privilege needed)."""
        if gpu.mig is None:
            return [(p, None) for p in self._process_list(gpu, gpu.handle, "processes")]
        out: list[tuple[NvmlProcess, MigInstance | None]] = []
        seen: set[int] = set()
        for inst in gpu.mig:
            for dev in inst.devices:
                for p in self._process_list(gpu, dev.handle, "mig_processes"):
                    if p.pid not in seen:
                        seen.add(p.pid)
                        out.append((p, inst))
        return out

    def read_depth(self, gpu: GpuState, f: dict[str, float]) -> None:
        """GPM figures of the whole GPU, and the memory and GPM figures of its GPU instances."""
        nvml = self._nvml
        q = self._bound(gpu)
        if gpu.gpm is not None:
            for field in gpu.gpm.read(nvml, q, gpu.handle, f, self.now_ms):
                self._announce(
                    field.name,
                    "gpm",
                    "GPU %d: %s (%s) is not available; not asking again",
                    gpu.index,
                    field.name,
                    field.nvml_name,
                )

        def memory(handle: Any) -> Any:
            mem = self.query_first(gpu, self._mig_memory_calls, handle)
            if mem is None:  # a destroyed instance's handle, most likely: read the layout next tick
                gpu.mig_next_ms = self.now_ms
            return mem

        gpu.mig_readings = [
            (inst.labels, read_instance(nvml, q, memory, gpu.handle, inst, gpu.has_gpm, self.now_ms))
            for inst in gpu.mig or ()
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
            elif ret in self._lost_codes:
                self.mark_lost(gpu, f"field {fv.fieldId}: NVML return {ret}")
                return
            elif (name, str(ret)) not in gpu.warned:
                gpu.warned.add((name, str(ret)))
                self._log.warning(
                    "GPU %d: %s (field %d) failed (NVML return %d)", gpu.index, name, fv.fieldId, ret
                )
