"""Steering the NVML mock from inside the subprocess that loads it (see README.md).

`MockDriver()` opens libnvidia-ml.so.1 by its soname: once pynvml has loaded the mock, that is the same
library (dlopen hands back the loaded one), so its state is the one pynvml sees. Every method raises
`MockControlError` when the mock rejects the call (an unknown GPU index or scenario, a full table).
"""

from __future__ import annotations

import ctypes
from ctypes import c_char_p, c_int, c_uint, c_ulonglong

NO_ID = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process outside MIG
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # NVML_VALUE_NOT_AVAILABLE (usedGpuMemory unknown)

_SIGNATURES: dict[str, list[type]] = {
    "mock_reset_scenario": [c_char_p],
    "mock_set_lost": [c_int, c_int],
    "mock_set_error": [c_int, c_char_p, c_int],
    "mock_fail_after": [c_char_p, c_int, c_int],
    "mock_set_util": [c_int, c_int, c_int],
    "mock_set_power": [c_int, c_int],
    "mock_set_memory": [c_int, c_ulonglong, c_ulonglong, c_ulonglong],
    "mock_set_pcie_counters": [c_int, c_ulonglong, c_ulonglong],
    "mock_set_pcie_rates": [c_int, c_ulonglong, c_ulonglong],
    "mock_set_handle_error": [c_int, c_int],
    "mock_add_process": [c_int, c_uint, c_ulonglong, c_uint, c_uint],
    "mock_clear_processes": [c_int],
    "mock_inject_xid": [c_int, c_ulonglong],
    "mock_violations": [],
    "mock_call_count": [c_char_p],
    "mock_mig_create": [c_int, c_uint, c_char_p, c_uint],
    "mock_mig_destroy": [c_int, c_uint, c_uint],
    "mock_set_gpm": [c_int, c_int, c_int, c_int, c_int],
    "mock_gpm_samples_in_use": [],
}


class MockControlError(RuntimeError):
    """A control function returned an NVML error code."""


class MockDriver:
    """Typed access to the mock's `mock_*` control functions."""

    def __init__(self, soname: str = "libnvidia-ml.so.1") -> None:
        self.lib = ctypes.CDLL(soname)
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes = argtypes
            fn.restype = c_int

    def _call(self, name: str, *args: object) -> None:
        ret = getattr(self.lib, name)(*args)
        if ret != 0:
            raise MockControlError(f"{name}{args!r} returned NVML error {ret}")

    def reset_scenario(self, name: str) -> None:
        """Re-apply a scenario: devices, processes, MIG devices, injected errors (not counts or events)."""
        self._call("mock_reset_scenario", name.encode())

    def set_lost(self, gpu: int, lost: bool = True) -> None:
        self._call("mock_set_lost", gpu, int(lost))

    def set_error(self, gpu: int, call: str, nvml_return: int) -> None:
        """`call` without version suffix ("nvmlDeviceGetFanSpeed"); gpu -1: any GPU and system calls; 0 clears."""
        self._call("mock_set_error", gpu, call.encode(), nvml_return)

    def fail_after(self, call: str, n_ok: int, nvml_return: int) -> None:
        """`call` succeeds `n_ok` more times, then returns `nvml_return` (0 clears)."""
        self._call("mock_fail_after", call.encode(), n_ok, nvml_return)

    def set_util(self, gpu: int, gpu_pct: int, mem_pct: int) -> None:
        self._call("mock_set_util", gpu, gpu_pct, mem_pct)

    def set_power(self, gpu: int, mw: int) -> None:
        self._call("mock_set_power", gpu, mw)

    def set_memory(self, gpu: int, total: int, reserved: int, used: int) -> None:
        """Bytes; free = total - reserved - used."""
        self._call("mock_set_memory", gpu, total, reserved, used)

    def set_pcie_counters(self, gpu: int, tx: int, rx: int) -> None:
        """Fields 197/198 (bytes); they keep rising from these values."""
        self._call("mock_set_pcie_counters", gpu, tx, rx)

    def set_pcie_rates(self, gpu: int, tx_bps: int, rx_bps: int) -> None:
        self._call("mock_set_pcie_rates", gpu, tx_bps, rx_bps)

    def set_handle_error(self, gpu: int, nvml_return: int) -> None:
        """What nvmlDeviceGetHandleByIndex returns for `gpu` (0: its handle again)."""
        self._call("mock_set_handle_error", gpu, nvml_return)

    def add_process(self, gpu: int, pid: int, used: int | None, gi: int = NO_ID, ci: int = NO_ID) -> None:
        """`used` None: NVML_VALUE_NOT_AVAILABLE."""
        self._call("mock_add_process", gpu, pid, NOT_AVAILABLE if used is None else used, gi, ci)

    def clear_processes(self, gpu: int) -> None:
        self._call("mock_clear_processes", gpu)

    def inject_xid(self, gpu: int, xid: int) -> None:
        self._call("mock_inject_xid", gpu, xid)

    def violations(self) -> int:
        """RegisterEvents/EventSetFree calls on a set while another thread waited on it."""
        return int(self.lib.mock_violations())

    def call_count(self, call: str) -> int:
        """Calls of a C entry point ("nvmlEventSetWait_v2"); without suffix, of all its versions."""
        return int(self.lib.mock_call_count(call.encode()))

    def mig_create(self, gpu: int, gi: int, profile: str, ci: int = 0) -> None:
        self._call("mock_mig_create", gpu, gi, profile.encode(), ci)

    def mig_destroy(self, gpu: int, gi: int, ci: int = 0) -> None:
        self._call("mock_mig_destroy", gpu, gi, ci)

    def set_gpm(self, gpu: int, supported: bool, sm_pct: int, tensor_pct: int, dram_pct: int) -> None:
        self._call("mock_set_gpm", gpu, int(supported), sm_pct, tensor_pct, dram_pct)

    def gpm_samples_in_use(self) -> int:
        """GPM sample buffers allocated and not freed."""
        return int(self.lib.mock_gpm_samples_in_use())
