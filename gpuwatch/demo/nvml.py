"""A simulated NVML: an object that answers the pynvml calls gpuwatch makes, for the demo and tests.

`FakeNvml(...)` behaves like the `pynvml` module: same function names, argument names and return
shapes; constants and exception classes are pynvml's own, so `except pynvml.NVMLError_GpuIsLost`
catches the fake's errors. Figures come from `workload.Workload`, a deterministic function of the
seed and the clock's time (`FakeClock.advance` moves them), plus the faults injected with the methods
under "faults".

GPM (`nvmlGpmQueryDeviceSupport`, `nvmlGpmSampleAlloc/Get/Free`, `nvmlGpmMigSampleGet`,
`nvmlGpmMetricsGet` with a simulated `c_nvmlGpmMetricsGet_t`) answers on the Hopper models (H100,
H200) and says NotSupported on the others; `mig={index: profiles}` puts GPUs in MIG mode (tests only:
the demo's GPUs are not), with the MIG calls NVML has and utilization NotSupported on them. With an
`incidents` schedule, XIDs are queued when their time comes and XID 79 makes the GPU lost for a while.

`nvmlEventSetWait_v2(es, timeoutms)` waits on a threading.Condition for up to `timeoutms` when nothing
is queued (so a demo's event thread does not spin), then raises NVMLError_Timeout; with
`timeoutms=0`, or `blocking_event_wait=False`, it raises at once. Tests pass 0.

This module holds the constructor, the faults, the system calls, events and GPM; the calls on one
device handle (identity, MIG devices, figures, field values, processes) are `DeviceCalls`, its base,
in nvmldevice.py.
"""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any

import pynvml

from gpuwatch.core.clock import Clock, SystemClock
from gpuwatch.demo.incidents import XID, IncidentSchedule
from gpuwatch.demo.nvmldevice import DeviceCalls
from gpuwatch.demo.nvmlstructs import (
    CONSUMER_UNSUPPORTED_CALLS,
    CONSUMER_UNSUPPORTED_FIELDS,
    DATACENTER_UNSUPPORTED_CALLS,
    GPM_FIGURES,
    NVLINK_GPM,
    ZERO_GPM,
    FakeEventData,
    FakeEventSet,
    FakeGpmMetricsGet,
    FakeGpmSample,
    FakeGpmSupport,
    FakeHandle,
    FakeMigHandle,
    profile_memory_mib,
)
from gpuwatch.demo.workload import MODELS, GpuModelSpec, Workload, mix

__all__ = ["MODELS", "FakeNvml", "GpuModelSpec"]


class FakeNvml(DeviceCalls):
    """Simulated GPUs behind the pynvml call surface; see the module docstring."""

    def __init__(
        self,
        gpu_count: int = 8,
        model: str = "NVIDIA H100 80GB HBM3",
        workload: str = "mixed",
        seed: int = 0,
        clock: Clock | None = None,
        driver_version: str = "570.133.20",
        *,
        driver_present: bool = True,
        blocking_event_wait: bool = True,
        hostname: str = "",
        incidents: IncidentSchedule | None = None,
        mig: dict[int, tuple[str, ...]] | None = None,
        serving_pid: int | None = None,
        start: float | None = None,
    ) -> None:
        """`hostname`: mixed into the UUIDs, so two demo hosts never share one. `incidents`: the demo's
        schedule (throttling, XIDs, PCIe replays, a stalled run); None: only injected faults. `mig`: GPU
        index -> the MIG profiles of its GPU instances, e.g. {1: ("3g.40gb", "1g.10gb")} (tests).
        `serving_pid`: the pid the inference GPUs' process reports (the demo passes its own, as its
        simulated vLLM and SGLang listen in it), so the serving-GPU lookup finds them; None: made up.
        `start`: the Unix time the simulation started (default: the clock's now; a demo with a history
        started that long before)."""
        if model not in MODELS:
            raise ValueError(f"unknown GPU model {model!r}; choose one of: {', '.join(MODELS)}")
        self.spec = MODELS[model]
        self.gpu_count = gpu_count
        self.clock: Clock = clock or SystemClock()
        self.driver_version = driver_version
        self.driver_present = driver_present
        self.blocking_event_wait = blocking_event_wait
        self.incidents = incidents
        self.hostname = hostname
        self.workload = Workload(
            gpu_count,
            self.spec,
            workload,
            seed,
            start=self.clock.now() if start is None else start,
            hostname=hostname,
            incidents=incidents,
            serving_pid=serving_pid,
        )
        self.handles = [FakeHandle(i) for i in range(gpu_count)]
        self.mig: dict[int, list[FakeMigHandle]] = {}
        for i, profiles in (mig or {}).items():
            if not self.spec.is_datacenter or not 0 <= i < gpu_count:
                raise ValueError(f"GPU {i} of a {self.spec.name} cannot be put in MIG mode")
            self.mig[i] = [
                FakeMigHandle(self.handles[i], slot, slot + 1, p, profile_memory_mib(p, self.spec))
                for slot, p in enumerate(profiles)
            ]
        self._xids_checked = self.clock.now()
        self.gpm_samples: list[FakeGpmSample] = []  # every buffer handed out, for tests
        self.calls: dict[str, int] = {}  # call name -> how often it was made, for tests
        self._init_count = 0
        self._gen = 0  # bumped by every fault, so cached readings are recomputed
        self._lost: set[int] = set()
        self._call_errors: dict[tuple[int, str], BaseException] = {}
        self._unsupported_fields: set[tuple[int, int]] = set()
        self._sbe = [0] * gpu_count
        self._dbe = [0] * gpu_count
        self._remapped_unc = [0] * gpu_count
        self._remapped_pending = [0] * gpu_count
        self._remap_failure = [0] * gpu_count
        self._pcie_replays = [0] * gpu_count
        self._event_sets: list[FakeEventSet] = []
        self._events_lock = threading.Lock()
        self._fields = self._field_table()
        calls = DATACENTER_UNSUPPORTED_CALLS if self.spec.is_datacenter else CONSUMER_UNSUPPORTED_CALLS
        for i in range(gpu_count):
            for call in calls:
                self._call_errors[(i, call)] = pynvml.NVMLError_NotSupported()
            if not self.spec.is_datacenter:
                self._unsupported_fields.update((i, f) for f in CONSUMER_UNSUPPORTED_FIELDS)

    def calm_copy(self, clock: Clock) -> FakeNvml:
        """Return simulated GPUs like these (identities, roles, processes) on `clock`, started at its
        now, without incidents or faults: what a demo's history learns the live series from."""
        w = self.workload
        return FakeNvml(
            self.gpu_count,
            self.spec.name,
            seed=w.seed,
            clock=clock,
            driver_version=self.driver_version,
            blocking_event_wait=False,
            hostname=self.hostname,
            serving_pid=w.serving_pid,
            workload=w.workload,
        )

    @classmethod
    def no_driver(cls, **kwargs: Any) -> FakeNvml:
        """A host without the NVIDIA driver: nvmlInit raises NVMLError_LibraryNotFound."""
        return cls(driver_present=False, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """Lend pynvml's constants and exception classes; refuse pynvml functions the fake lacks."""
        if name.startswith("__"):
            raise AttributeError(name)
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            raise AttributeError(f"FakeNvml does not simulate {name}")
        self.__dict__[name] = value  # later lookups skip __getattr__
        return value

    # -- faults ----------------------------------------------------------------------------------

    def lose_gpu(self, i: int) -> None:
        """Make every call on GPU `i`, nvmlDeviceGetHandleByIndex included, raise NVMLError_GpuIsLost."""
        self._lost.add(i)
        self._gen += 1

    def recover_gpu(self, i: int) -> None:
        self._lost.discard(i)
        self._gen += 1

    def set_unsupported(self, i: int, call_or_field: str | int) -> None:
        """Make a call (by name) raise NVMLError_NotSupported, or a field id return NOT_SUPPORTED."""
        if isinstance(call_or_field, int):
            self._unsupported_fields.add((i, call_or_field))
        else:
            self._call_errors[(i, call_or_field)] = pynvml.NVMLError_NotSupported()
        self._gen += 1

    def set_call_error(self, i: int, call: str, exc: BaseException | None) -> None:
        """Make `call` on GPU `i` raise `exc`; None clears it."""
        if exc is None:
            self._call_errors.pop((i, call), None)
        else:
            self._call_errors[(i, call)] = exc
        self._gen += 1

    def set_process_list_error(self, i: int, exc: BaseException | None) -> None:
        """Make nvmlDeviceGetComputeRunningProcesses raise `exc` (e.g. pynvml.NVMLLibraryMismatchError)."""
        self.set_call_error(i, "nvmlDeviceGetComputeRunningProcesses", exc)

    def add_ecc_errors(self, i: int, n: int, double_bit: bool = True) -> None:
        """Count `n` volatile ECC errors; double-bit ones also remap rows and leave a remap pending."""
        if double_bit:
            self._dbe[i] += n
            self._remapped_unc[i] += n
            self._remapped_pending[i] = 1
        else:
            self._sbe[i] += n
        self._gen += 1

    def fail_row_remap(self, i: int) -> None:
        """Make GPU `i` report a failed row remapping (the card needs replacing)."""
        self._remap_failure[i] = 1
        self._gen += 1

    def add_pcie_replays(self, i: int, n: int) -> None:
        """Count `n` PCIe replays (link-level retries) on GPU `i`."""
        self._pcie_replays[i] += n
        self._gen += 1

    def throttle(self, i: int, reason_mask: int) -> None:
        """Set clock-event reasons (e.g. pynvml.nvmlClocksEventReasonHwThermalSlowdown); 0 clears them.

        Thermal reasons raise the temperature; slowdown reasons lower the SM clock; power brake halves power.
        """
        self.workload.throttle[i] = reason_mask
        self._gen += 1

    def inject_xid(self, i: int, xid: int) -> None:
        """Queue an XID event on each event set where GPU `i` registered for XIDs (none registered: lost, as in NVML)."""
        with self._events_lock:
            sets = list(self._event_sets)
        for es in sets:
            if es.masks.get(i, 0) & pynvml.nvmlEventTypeXidCriticalError:
                with es.cond:
                    es.queue.append(FakeEventData(self.handles[i], pynvml.nvmlEventTypeXidCriticalError, xid))
                    es.cond.notify_all()

    def _queue_due_xids(self) -> None:
        """Queue the scheduled XIDs whose time has come since the last look."""
        if self.incidents is None:
            return
        now = self.clock.now()
        due = self.incidents.started_between(self._xids_checked, now, XID)
        self._xids_checked = max(self._xids_checked, now)
        for incident in due:
            if 0 <= incident.gpu < self.gpu_count:
                self.inject_xid(incident.gpu, incident.xid)

    def write_proc_root(self, root: Path) -> None:
        """Write `<root>/<pid>/{comm,status,cgroup}` for the simulated processes (GpuCollector's proc_root)."""
        self.workload.write_proc_root(root)

    # -- system ----------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.calls["nvmlInit"] = self.calls.get("nvmlInit", 0) + 1
        if not self.driver_present:
            raise pynvml.NVMLError_LibraryNotFound()
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._check_init("nvmlShutdown")
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._check_init("nvmlSystemGetNVMLVersion")
        return "12." + self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check_init("nvmlSystemGetCudaDriverVersion")
        return 12080

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check_init("nvmlSystemGetProcessName")
        for i in range(self.gpu_count):
            for p, name, _ in self.workload.processes(i, self._now(), self._gen):
                if p == pid:
                    return name
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetCount(self) -> int:
        self._check_init("nvmlDeviceGetCount")
        return self.gpu_count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < self.gpu_count:
            raise pynvml.NVMLError_InvalidArgument()
        if index in self._lost or (self.incidents is not None and self._fell_off(index)):
            raise pynvml.NVMLError_GpuIsLost()
        return self.handles[index]

    # -- events ----------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        self._check_init("nvmlEventSetCreate")
        es = FakeEventSet()
        with self._events_lock:
            self._event_sets.append(es)
        return es

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._dev(handle, "nvmlDeviceGetSupportedEventTypes")
        return pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: FakeEventSet) -> None:
        i = self._dev(handle, "nvmlDeviceRegisterEvents")
        if eventSet.is_freed:
            raise pynvml.NVMLError_InvalidArgument()
        eventSet.masks[i] = eventSet.masks.get(i, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: FakeEventSet, timeoutms: int) -> FakeEventData:
        self._check_init("nvmlEventSetWait_v2")
        self._queue_due_xids()
        with eventSet.cond:
            if not eventSet.queue and timeoutms > 0 and self.blocking_event_wait and not eventSet.is_freed:
                eventSet.cond.wait(timeoutms / 1000.0)
            if eventSet.is_freed:
                raise pynvml.NVMLError_InvalidArgument()
            if not eventSet.queue:
                raise pynvml.NVMLError_Timeout()
            return eventSet.queue.popleft()

    def nvmlEventSetWait(self, eventSet: FakeEventSet, timeoutms: int) -> FakeEventData:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: FakeEventSet) -> None:
        self._check_init("nvmlEventSetFree")
        with eventSet.cond:
            eventSet.is_freed = True
            eventSet.cond.notify_all()
        with self._events_lock:
            if eventSet in self._event_sets:
                self._event_sets.remove(eventSet)

    # -- GPM (GPU Performance Monitoring, Hopper and later) --------------------------------------

    # pynvml's ctypes structure, simulated: the collector builds it with `nvml.c_nvmlGpmMetricsGet_t()`
    c_nvmlGpmMetricsGet_t = FakeGpmMetricsGet

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> FakeGpmSupport:
        self._dev(device, "nvmlGpmQueryDeviceSupport")
        return FakeGpmSupport(pynvml.NVML_GPM_SUPPORT_VERSION, 1 if self.spec.has_gpm else 0)

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self._check_init("nvmlGpmSampleAlloc")
        sample = FakeGpmSample()
        self.gpm_samples.append(sample)
        return sample

    def nvmlGpmSampleFree(self, gpmSample: FakeGpmSample) -> None:
        self._check_init("nvmlGpmSampleFree")
        gpmSample.is_freed = True

    def _fill(self, i: int, gi_id: int, sample: Any) -> FakeGpmSample:
        if not isinstance(sample, FakeGpmSample) or sample.is_freed:
            raise pynvml.NVMLError_InvalidArgument()
        if not self.spec.has_gpm:
            raise pynvml.NVMLError_NotSupported()
        sample.index, sample.gi_id, sample.time = i, gi_id, self._now()
        return sample

    def nvmlGpmSampleGet(self, device: Any, gpmSample: FakeGpmSample) -> FakeGpmSample:
        i = self._dev(device, "nvmlGpmSampleGet")
        if i in self.mig:  # a MIG-enabled GPU is sampled per GPU instance
            raise pynvml.NVMLError_NotSupported()
        return self._fill(i, -1, gpmSample)

    def nvmlGpmMigSampleGet(self, device: Any, gpuInstanceId: int, gpmSample: FakeGpmSample) -> FakeGpmSample:
        i = self._dev(device, "nvmlGpmMigSampleGet")
        if i not in self.mig:
            raise pynvml.NVMLError_NotSupported()
        if gpuInstanceId not in {m.gi_id for m in self.mig[i]}:
            raise pynvml.NVMLError_NotFound()
        return self._fill(i, gpuInstanceId, gpmSample)

    def nvmlGpmMetricsGet(self, metricsGet: FakeGpmMetricsGet) -> FakeGpmMetricsGet:
        self._check_init("nvmlGpmMetricsGet")
        s1, s2 = metricsGet.sample1, metricsGet.sample2
        if (
            metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION
            or not isinstance(s1, FakeGpmSample)
            or not isinstance(s2, FakeGpmSample)
            or s1.time is None
            or s2.time is None
            or (s1.index, s1.gi_id) != (s2.index, s2.gi_id)
            or not 0 < metricsGet.numMetrics <= pynvml.NVML_GPM_METRIC_MAX
        ):
            raise pynvml.NVMLError_InvalidArgument()
        if s1.index in self._lost:
            raise pynvml.NVMLError_GpuIsLost()
        r = self.workload.reading(s2.index, s2.time, self._gen)
        # a GPU instance of `g` slices of 7 carries its share of the work (figures of the whole GPU)
        share = 1.0
        if s2.gi_id >= 0:
            mig = next(m for m in self.mig[s2.index] if m.gi_id == s2.gi_id)
            share = 0.5 + 0.5 * (mix(self.workload.seed, s2.index, mig.gi_id, 7) % 1000) / 1000
        for m in metricsGet.metrics[: metricsGet.numMetrics]:
            found = GPM_FIGURES.get(m.metricId)
            if s2.gi_id >= 0 and m.metricId in NVLINK_GPM:  # a GPU instance has no NVLink of its own
                m.nvmlReturn, m.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
            elif found is not None:
                attr, scale = found
                m.nvmlReturn, m.value = pynvml.NVML_SUCCESS, getattr(r, attr) * scale * share
            elif m.metricId in ZERO_GPM:
                m.nvmlReturn, m.value = pynvml.NVML_SUCCESS, 0.0
            else:
                m.nvmlReturn, m.value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0.0
        return metricsGet
