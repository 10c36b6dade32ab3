"""XID errors through NVML's event set, owned by one waiting thread.

NVML's operations on one event set are not thread safe, and after UNKNOWN from a registration the set
is undefined (nvml.h). So the set is created and first registered in `open`, before the waiting thread
starts; after that only the waiting thread registers (a GPU that answers again is queued by the
sampler with `request`), waits and, in `close`, frees it. A registration that fails with anything but
"not supported" makes a new set, with every GPU registered again.

NVML gives each event the device as a new pointer object (pynvml's `c_nvmlEventData_t.device`), never
the handle object gpuwatch holds, so events are matched to GPUs by the handle's address; only an
address no GPU has falls back to `nvmlDeviceGetIndex`.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any

from gpuwatch.collect.gpu_state import GpuState
from gpuwatch.collect.gpu_status import XidEvent

MAX_EVENTS_PER_WAIT = 256
_MAX_BACKOFF_S = 60.0
_RETRY_EVERY_WAITS = 30  # without a usable set, make one again every 30 waits (a minute at 2 s)


def handle_key(handle: Any) -> int:
    """The device a handle points to: its address (a ctypes pointer), else the object's identity."""
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return id(handle)
    return int(value or 0)


class XidEvents:
    """The XID event set of one NVML session; see the module docstring for who may touch it."""

    def __init__(self, nvml: Any, logger: logging.Logger, stopping: threading.Event) -> None:
        self._nvml = nvml
        self._log = logger
        self._stopping = stopping
        self._set: Any = None
        self._wait_lock = threading.Lock()  # held by the waiting thread (and close)
        self._pending: set[int] = set()  # GPU indexes to register, queued by the sampler
        self._pending_lock = threading.Lock()
        self._warned: set[str] = set()
        self._backoff_s = 0.0
        self._waits_without_set = 0
        self.state = "not opened"  # for `gpuwatch doctor`: "registered", "not supported: ...", "failed: ..."

    @property
    def is_open(self) -> bool:
        return self._set is not None

    def open(self, gpus: Sequence[GpuState]) -> None:
        """Create the set and register every sampled GPU (before any thread waits on it)."""
        self._make_set(gpus)

    def request(self, gpu: GpuState) -> None:
        """Register `gpu` again on the waiting thread (it was lost and answers again)."""
        with self._pending_lock:
            self._pending.add(gpu.index)

    def _make_set(self, gpus: Sequence[GpuState]) -> None:
        nvml = self._nvml
        self._free()
        try:
            self._set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self.state = f"not supported: {type(exc).__name__}"
            self._log.info("XID events are not available (%s: %s)", type(exc).__name__, exc)
            return
        with self._pending_lock:
            self._pending.clear()
        registered = 0
        for gpu in gpus:
            if gpu.is_sampled and "xid_events" not in gpu.skipped:
                outcome = self._register(gpu)
                if outcome == "broken":
                    self._free()
                    self.state = (
                        f"failed: registering GPU {gpu.index} left the event set undefined; trying again"
                    )
                    return
                registered += outcome == "ok"
        self.state = f"registered on {registered} GPU(s)"

    def _register(self, gpu: GpuState) -> str:
        """Register one GPU: "ok", "skipped" (unsupported, lost) or "broken" (the set is now undefined)."""
        nvml = self._nvml
        try:
            nvml.nvmlDeviceRegisterEvents(gpu.handle, nvml.nvmlEventTypeXidCriticalError, self._set)
        except (
            nvml.NVMLError_NotSupported,
            nvml.NVMLError_NoPermission,
            nvml.NVMLError_FunctionNotFound,
        ) as exc:
            gpu.skipped.add("xid_events")
            self._log.info(
                "GPU %d: XID events are not available (%s: %s)", gpu.index, type(exc).__name__, exc
            )
            return "skipped"
        except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_ResetRequired):
            return "skipped"  # the sampler sees it too, and asks again when the GPU answers
        except nvml.NVMLError as exc:
            self._log.warning(
                "GPU %d: registering for XID events failed (%s: %s); making a new event set",
                gpu.index,
                type(exc).__name__,
                exc,
            )
            return "broken"
        return "ok"

    def _register_pending(self, gpus: Sequence[GpuState]) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, set()
        todo = [g for g in gpus if g.index in pending and g.is_sampled and "xid_events" not in g.skipped]
        if not todo:
            return
        if self._set is None:
            self._make_set(gpus)
            return
        for gpu in todo:
            if self._register(gpu) == "broken":
                self._make_set(gpus)  # once; if that fails too, events stay off until the next request
                return

    def wait(self, timeout_ms: int, gpus: Sequence[GpuState]) -> list[XidEvent]:
        """Register what is queued, then block up to `timeout_ms` for XID events and return them."""
        nvml = self._nvml
        events: list[XidEvent] = []
        with self._wait_lock:
            if self._stopping.is_set():
                return events
            if self._set is None and self.state.startswith("failed"):
                self._waits_without_set += 1
                if self._waits_without_set >= _RETRY_EVERY_WAITS:
                    self._waits_without_set = 0
                    self._make_set(gpus)
            self._register_pending(gpus)
            wait = timeout_ms
            while self._set is not None and not self._stopping.is_set() and len(events) < MAX_EVENTS_PER_WAIT:
                try:
                    data = nvml.nvmlEventSetWait_v2(self._set, wait)
                except nvml.NVMLError_Timeout:
                    self._backoff_s = 0.0
                    break
                except nvml.NVMLError as exc:
                    self._wait_failed(exc, timeout_ms)
                    break
                self._backoff_s = 0.0
                wait = 0  # drain what else is queued without blocking
                if data.eventType & nvml.nvmlEventTypeXidCriticalError:
                    events.append(XidEvent(self._index_of(data.device, gpus), int(data.eventData)))
            if self._set is None and not self._stopping.is_set():
                self._stopping.wait(timeout_ms / 1000.0)  # no event support: behave like a quiet wait
        return events

    def _wait_failed(self, exc: BaseException, timeout_ms: int) -> None:
        """Log a wait error once per kind (then at DEBUG) and back off, doubling up to a minute."""
        kind = type(exc).__name__
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        self._log.log(level, "waiting for XID events failed (%s: %s)", kind, exc)
        self._backoff_s = min(_MAX_BACKOFF_S, max(timeout_ms / 1000.0, self._backoff_s * 2))
        self._stopping.wait(self._backoff_s)

    def _index_of(self, device: Any, gpus: Sequence[GpuState]) -> int:
        key = handle_key(device)
        for gpu in gpus:
            if gpu.handle is not None and (gpu.handle is device or handle_key(gpu.handle) == key):
                return gpu.index
        try:
            return int(self._nvml.nvmlDeviceGetIndex(device))
        except self._nvml.NVMLError as exc:
            if "index" not in self._warned:
                self._warned.add("index")
                self._log.warning("an XID event names a device gpuwatch cannot find (%s)", exc)
            return -1

    def _free(self) -> None:
        if self._set is not None:
            try:
                self._nvml.nvmlEventSetFree(self._set)
            except self._nvml.NVMLError as exc:
                self._log.debug("freeing the event set: %s", exc)
            self._set = None

    def close(self) -> None:
        """Free the set once the waiting thread is out of its wait (set `stopping` first)."""
        with self._wait_lock:
            self._free()
            self.state = "closed"
