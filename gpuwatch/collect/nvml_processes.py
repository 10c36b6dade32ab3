"""A GPU's compute processes read straight from the driver library, in the layout that driver writes.

Why not the binding's `nvmlDeviceGetComputeRunningProcesses`: the struct behind `_v3` changed size
twice. Drivers 535.43-535.86 write a 5-field struct (with `usedGpuCcProtectedMemory`, 32 bytes a
process); earlier and later drivers write 4 fields (24 bytes). nvidia-ml-py 12.535.77 reads 5 fields
and every later release reads 4, so on the mismatched pairs every process after the first is garbage
(nvitop #75/#79/#88). Which layout a driver writes shows in the symbols it exports, as nvitop probes
them: `nvmlDeviceGetConfComputeMemSizeInfo` without `nvmlDeviceGetRunningProcessDetailList` is that
535 window. This module calls NVML's public C ABI (nvml.h) through ctypes on the library pynvml has
already loaded, and raises the binding's own `NVMLError(code)`, so errors map as every other call's.
"""

from __future__ import annotations

import ctypes
from typing import Any, NamedTuple

_NOT_AVAILABLE = (1 << 64) - 1  # NVML_VALUE_NOT_AVAILABLE as unsigned long long
_NO_INSTANCE = 0xFFFFFFFF
_SUCCESS = 0
_INSUFFICIENT_SIZE = 7


class NvmlProcess(NamedTuple):
    """One compute process as NVML reports it; `used_bytes` None where the driver does not know."""

    pid: int
    used_bytes: int | None
    gpu_instance_id: int  # 0xFFFFFFFF outside MIG
    compute_instance_id: int


class _V1(ctypes.Structure):
    _fields_ = (("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong))


class _V2(ctypes.Structure):  # also _v3 on every driver but 535.43-535.86
    _fields_ = (
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    )


class _V3Cc(ctypes.Structure):  # _v3 on drivers 535.43-535.86
    _fields_ = (
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
        ("usedGpuCcProtectedMemory", ctypes.c_ulonglong),
    )


def choose_layout(has_symbol: Any) -> tuple[str, type[ctypes.Structure]]:
    """The process-list symbol and struct this driver writes; `has_symbol(name) -> bool`."""
    if has_symbol("nvmlDeviceGetComputeRunningProcesses_v3"):
        if has_symbol("nvmlDeviceGetConfComputeMemSizeInfo") and not has_symbol(
            "nvmlDeviceGetRunningProcessDetailList"
        ):
            return "nvmlDeviceGetComputeRunningProcesses_v3", _V3Cc
        return "nvmlDeviceGetComputeRunningProcesses_v3", _V2
    if has_symbol("nvmlDeviceGetComputeRunningProcesses_v2"):
        return "nvmlDeviceGetComputeRunningProcesses_v2", _V2
    return "nvmlDeviceGetComputeRunningProcesses", _V1


class DriverProcesses:
    """`read(handle)`: the compute processes of a GPU (or MIG device) handle, from the driver library."""

    def __init__(self, nvml: Any, library: str = "libnvidia-ml.so.1") -> None:
        """`nvml`: the binding, for its `NVMLError`; `library`: the soname pynvml loads (the same copy)."""
        self._nvml = nvml
        lib = ctypes.CDLL(library)
        self.symbol, self._struct = choose_layout(lambda name: hasattr(lib, name))
        self._fn = getattr(lib, self.symbol)
        self._fn.restype = ctypes.c_int
        self.layout = f"{self.symbol} ({ctypes.sizeof(self._struct)} bytes a process)"

    def read(self, handle: Any) -> list[NvmlProcess]:
        count = ctypes.c_uint(0)
        ret = self._fn(handle, ctypes.byref(count), None)
        if ret == _SUCCESS:
            return []
        for _attempt in range(3):  # processes may start between the two calls
            if ret != _INSUFFICIENT_SIZE:
                raise self._nvml.NVMLError(ret)
            count.value = count.value * 2 + 5
            buf = (self._struct * count.value)()
            ret = self._fn(handle, ctypes.byref(count), buf)
            if ret == _SUCCESS:
                return [self._info(buf[i]) for i in range(count.value)]
        raise self._nvml.NVMLError(ret)

    @staticmethod
    def _info(p: Any) -> NvmlProcess:
        used = int(p.usedGpuMemory)
        return NvmlProcess(
            int(p.pid),
            None if used == _NOT_AVAILABLE else used,
            int(getattr(p, "gpuInstanceId", _NO_INSTANCE)),
            int(getattr(p, "computeInstanceId", _NO_INSTANCE)),
        )


def binding_processes(fn: Any, handle: Any) -> list[NvmlProcess]:
    """The processes through the binding's own call `fn` (the simulated NVML; no driver library)."""
    return [
        NvmlProcess(
            int(p.pid),
            None if p.usedGpuMemory is None else int(p.usedGpuMemory),
            int(getattr(p, "gpuInstanceId", _NO_INSTANCE)),
            int(getattr(p, "computeInstanceId", _NO_INSTANCE)),
        )
        for p in fn(handle)
    ]
