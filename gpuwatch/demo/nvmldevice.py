"""The per-device calls of the simulated NVML: identity and MIG devices, figures, field values and
process tables, each read from the workload and the injected faults of one GPU.

`DeviceCalls` is `FakeNvml`'s base (nvml.py), which sets the state declared here and adds the rest of
the call surface: nvmlInit and the system calls, events, GPM and the faults a test injects. Every call
first makes NVML's checks (`_dev`): initialised, a valid handle, the GPU not lost, no injected error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pynvml

from gpuwatch.core.clock import Clock
from gpuwatch.demo import nvmlnames
from gpuwatch.demo.incidents import XID, IncidentSchedule
from gpuwatch.demo.nvmlstructs import (
    FakeFieldValue,
    FakeHandle,
    FakeMemory,
    FakeMemoryV2,
    FakeMigHandle,
    FakePciInfo,
    FakeProcessInfo,
    FakeUtilization,
    FakeValue,
)
from gpuwatch.demo.workload import MIB, GpuModelSpec, Reading, Workload, mix


class DeviceCalls:
    """The pynvml calls on one device handle, over the state below (set by `FakeNvml.__init__`)."""

    spec: GpuModelSpec
    gpu_count: int
    clock: Clock
    incidents: IncidentSchedule | None
    workload: Workload
    mig: dict[int, list[FakeMigHandle]]
    calls: dict[str, int]
    _init_count: int
    _gen: int
    _lost: set[int]
    _call_errors: dict[tuple[int, str], BaseException]
    _unsupported_fields: set[tuple[int, int]]
    _sbe: list[int]
    _dbe: list[int]
    _remapped_unc: list[int]
    _remapped_pending: list[int]
    _remap_failure: list[int]
    _pcie_replays: list[int]
    _fields: dict[int, tuple[int, Callable[[int, Reading], int]]]

    # -- the checks every call makes, and the reading it answers from ----------------------------

    def _check_init(self, call: str) -> None:
        self.calls[call] = self.calls.get(call, 0) + 1
        if self._init_count <= 0:
            raise pynvml.NVMLError_Uninitialized()

    def _dev(self, handle: Any, call: str) -> int:
        """Return the index of `handle`, raising what NVML would for `call` on it."""
        self._check_init(call)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < self.gpu_count:
            raise pynvml.NVMLError_InvalidArgument()
        i = handle.index
        if i in self._lost or (self.incidents is not None and self._fell_off(i)):
            raise pynvml.NVMLError_GpuIsLost()
        if self._call_errors:  # faults are rare: skip building the key when there are none
            exc = self._call_errors.get((i, call))
            if exc is not None:
                raise exc.with_traceback(None)
        return i

    def _now(self) -> float:
        # Readings move in 100 ms steps, so the ~10 calls a collector makes per GPU and tick share one
        # cached reading instead of recomputing the simulation for every call (a 64-GPU demo paid 3x).
        return math.floor(self.clock.now() * 10.0) / 10.0

    def _fell_off(self, i: int) -> bool:
        """Whether GPU `i` is off the bus now: the scheduled XID 79 incidents."""
        assert self.incidents is not None
        incident = self.incidents.active(self._now(), XID)
        return incident is not None and incident.gpu == i and incident.xid == 79

    def _reading(self, i: int) -> Reading:
        return self.workload.reading(i, self._now(), self._gen)

    # -- identity --------------------------------------------------------------------------------

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        return self._dev(handle, "nvmlDeviceGetIndex")

    def nvmlDeviceGetName(self, handle: Any) -> str:
        if isinstance(handle, FakeMigHandle):
            return self._mig_name(self._mig(handle, "nvmlDeviceGetName"))
        self._dev(handle, "nvmlDeviceGetName")
        return self.spec.name

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self.workload.uuid(self._dev(handle, "nvmlDeviceGetUUID"))

    def nvmlDeviceGetPciInfo_v3(self, handle: Any) -> FakePciInfo:
        domain, bus = self.workload.pci_bus(self._dev(handle, "nvmlDeviceGetPciInfo_v3"))
        return FakePciInfo(
            busIdLegacy=f"{domain:04X}:{bus:02X}:00.0",
            domain=domain,
            bus=bus,
            device=0,
            pciDeviceId=self.spec.pci_device_id,
            pciSubSystemId=0x16C110DE,
            busId=f"{domain:08X}:{bus:02X}:00.0",
        )

    def nvmlDeviceGetPciInfo(self, handle: Any) -> FakePciInfo:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        i = self._dev(device, "nvmlDeviceGetMigMode")
        if not self.spec.is_datacenter:
            raise pynvml.NVMLError_NotSupported()
        on = pynvml.NVML_DEVICE_MIG_ENABLE if i in self.mig else pynvml.NVML_DEVICE_MIG_DISABLE
        return [on, on]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        self._dev(device, "nvmlDeviceGetMaxMigDeviceCount")
        if not self.spec.is_datacenter:
            raise pynvml.NVMLError_NotSupported()
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> FakeMigHandle:
        i = self._dev(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if i not in self.mig:
            raise pynvml.NVMLError_InvalidArgument()
        if not 0 <= index < 7:
            raise pynvml.NVMLError_InvalidArgument()
        if index >= len(self.mig[i]):
            raise pynvml.NVMLError_NotFound()  # an empty slot
        return self.mig[i][index]

    def _mig(self, device: Any, call: str) -> FakeMigHandle:
        if not isinstance(device, FakeMigHandle):
            self._dev(device, call)
            raise pynvml.NVMLError_InvalidArgument()  # not a MIG device handle
        self._dev(device.parent, call)
        return device

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        return self._mig(device, "nvmlDeviceGetGpuInstanceId").gi_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        self._mig(device, "nvmlDeviceGetComputeInstanceId")
        return 0  # one compute instance a GPU instance

    def _mig_name(self, mig: FakeMigHandle) -> str:
        return f"{self.spec.name} MIG {mig.profile}"

    def _mig_memory(self, mig: FakeMigHandle, version: Any) -> FakeMemory | FakeMemoryV2:
        total = mig.memory_mib * MIB
        share = 0.3 + 0.6 * (mix(self.workload.seed, mig.parent.index, mig.gi_id) % 1000) / 1000
        used = int(total * share) // MIB * MIB
        if version:
            return FakeMemoryV2(version, total, 0, total - used, used)
        return FakeMemory(total, total - used, used)

    # -- figures ---------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> FakeUtilization:
        i = self._dev(handle, "nvmlDeviceGetUtilizationRates")
        if i in self.mig:  # "not currently supported" on MIG-enabled GPUs
            raise pynvml.NVMLError_NotSupported()
        r = self._reading(i)
        return FakeUtilization(r.util, r.mem_util)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> FakeMemory | FakeMemoryV2:
        if isinstance(handle, FakeMigHandle):
            return self._mig_memory(self._mig(handle, "nvmlDeviceGetMemoryInfo"), version)
        i = self._dev(handle, "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo")
        total = self.spec.memory_mib * MIB
        reserved = self.spec.reserved_mib * MIB
        used = int(self._reading(i).app_used_mib * MIB)
        if version:
            return FakeMemoryV2(version, total, reserved, total - reserved - used, used)
        return FakeMemory(total, total - reserved - used, reserved + used)

    def nvmlDeviceGetTemperatureV(
        self, handle: Any, sensor: int, version: int = nvmlnames.TEMPERATURE_V1
    ) -> int:
        return self._temperature(handle, sensor, "nvmlDeviceGetTemperatureV")

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._temperature(handle, sensor, "nvmlDeviceGetTemperature")

    def _temperature(self, handle: Any, sensor: int, call: str) -> int:
        i = self._dev(handle, call)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return self._reading(i).temp

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(self._reading(self._dev(handle, "nvmlDeviceGetPowerUsage")).power_w * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        self._dev(handle, "nvmlDeviceGetEnforcedPowerLimit")
        return int(self.spec.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        self._dev(handle, "nvmlDeviceGetPowerManagementLimit")
        return int(self.spec.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        self._dev(handle, "nvmlDeviceGetPowerManagementDefaultLimit")
        return int(self.spec.power_limit_w * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._reading(self._dev(handle, "nvmlDeviceGetTotalEnergyConsumption")).energy_mj

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        r = self._reading(self._dev(handle, "nvmlDeviceGetClockInfo"))
        if type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return r.sm_mhz
        if type == pynvml.NVML_CLOCK_MEM:
            return r.mem_mhz
        raise pynvml.NVMLError_NotSupported()

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        self._dev(handle, "nvmlDeviceGetMaxClockInfo")
        if type in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return self.spec.max_sm_mhz
        if type == pynvml.NVML_CLOCK_MEM:
            return self.spec.mem_mhz
        raise pynvml.NVMLError_NotSupported()

    def nvmlDeviceGetFanSpeed(self, handle: Any) -> int:
        return self._reading(self._dev(handle, "nvmlDeviceGetFanSpeed")).fan

    def nvmlDeviceGetNumFans(self, device: Any) -> int:
        self._dev(device, "nvmlDeviceGetNumFans")
        return 1

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        return self._reading(self._dev(handle, "nvmlDeviceGetPerformanceState")).pstate

    def nvmlDeviceGetPowerState(self, handle: Any) -> int:
        return self._reading(self._dev(handle, "nvmlDeviceGetPowerState")).pstate

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._reading(self._dev(handle, "nvmlDeviceGetCurrentClocksEventReasons")).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._reading(self._dev(handle, "nvmlDeviceGetCurrentClocksThrottleReasons")).reasons

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        self._dev(handle, "nvmlDeviceGetEccMode")
        on = 1 if self.spec.is_datacenter else 0
        return [on, on]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        i = self._dev(handle, "nvmlDeviceGetTotalEccErrors")
        double = errorType == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        return self._dbe[i] if double else self._sbe[i]

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        i = self._dev(device, "nvmlDeviceGetRemappedRows")
        return (0, self._remapped_unc[i], self._remapped_pending[i], self._remap_failure[i])

    def _replays(self, i: int) -> int:
        return self._pcie_replays[i] + self.workload.pcie_replays(i, self._now())

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._replays(self._dev(handle, "nvmlDeviceGetPcieReplayCounter"))

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        """KB/s (the real call measures over 20 ms and blocks that long; the fake does not)."""
        tx, rx = self.workload.pcie_rate(self._dev(device, "nvmlDeviceGetPcieThroughput"), self._now())
        return int((tx if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else rx) / 1024)

    def _field_table(self) -> dict[int, tuple[int, Callable[[int, Reading], int]]]:
        """Field id -> (value type, value of GPU i given its reading)."""
        ull, ui = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        limit_mw = int(self.spec.power_limit_w * 1000)
        return {
            pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (ull, lambda i, r: self._sbe[i]),
            pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (ull, lambda i, r: self._dbe[i]),
            pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (ull, lambda i, r: self._sbe[i]),
            pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (ull, lambda i, r: self._dbe[i]),
            pynvml.NVML_FI_DEV_MEMORY_TEMP: (ui, lambda i, r: r.mem_temp),
            pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (ull, lambda i, r: r.energy_mj),
            pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (ui, lambda i, r: self._replays(i)),
            pynvml.NVML_FI_DEV_REMAPPED_COR: (ui, lambda i, r: 0),
            pynvml.NVML_FI_DEV_REMAPPED_UNC: (ui, lambda i, r: self._remapped_unc[i]),
            pynvml.NVML_FI_DEV_REMAPPED_PENDING: (ui, lambda i, r: self._remapped_pending[i]),
            pynvml.NVML_FI_DEV_REMAPPED_FAILURE: (ui, lambda i, r: self._remap_failure[i]),
            nvmlnames.FI_POWER_INSTANT: (ui, lambda i, r: int(r.power_w * 1000)),
            nvmlnames.FI_POWER_AVERAGE: (ui, lambda i, r: int(r.power_w * 1000)),
            nvmlnames.FI_POWER_CURRENT_LIMIT: (ui, lambda i, r: limit_mw),
            nvmlnames.FI_PCIE_COUNT_TX_BYTES: (ull, lambda i, r: r.pcie_tx),
            nvmlnames.FI_PCIE_COUNT_RX_BYTES: (ull, lambda i, r: r.pcie_rx),
        }

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> list[FakeFieldValue]:
        i = self._dev(handle, "nvmlDeviceGetFieldValues")
        r = self._reading(i)
        now_us = int(self._now() * 1e6)
        out = []
        unsupported = self._unsupported_fields
        for item in fieldIds:
            field_id, scope = item if isinstance(item, tuple) else (item, 0)
            value = FakeValue()
            found = self._fields.get(field_id)
            if found is None or (unsupported and (i, field_id) in unsupported):
                ret, vtype = pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            else:
                ret, (vtype, get) = pynvml.NVML_SUCCESS, found
                if vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
                    value.ullVal = get(i, r)
                else:
                    value.uiVal = get(i, r)
            out.append(FakeFieldValue(field_id, scope, now_us, 0, vtype, ret, value))
        return out

    # -- processes -------------------------------------------------------------------------------

    def _processes(self, handle: Any, call: str) -> list[FakeProcessInfo]:
        if isinstance(handle, FakeMigHandle):  # the GPU's processes run in its first GPU instance
            mig = self._mig(handle, call)
            if mig is not self.mig[mig.parent.index][0]:
                return []
            handle = mig.parent
        i = self._dev(handle, call)
        return [
            FakeProcessInfo(pid, used) for pid, _, used in self.workload.processes(i, self._now(), self._gen)
        ]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[FakeProcessInfo]:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses")

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[FakeProcessInfo]:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v3")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[FakeProcessInfo]:
        return self._processes(handle, "nvmlDeviceGetComputeRunningProcesses_v2")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[FakeProcessInfo]:
        self._dev(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return []
