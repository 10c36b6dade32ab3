"""GpuCollector: every GPU of a host, sampled through NVML into dcgm-exporter-named samples.

Runs unchanged on the real `pynvml` module and on `FakeNvml`; error mapping lives in `nvml_device`.
Metric names, units and labels: `gpu_metrics.GPU_METRICS` (and docs/metrics.md).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path, PurePath
from typing import Any

from gpuwatch.collect.allocation import IDLE_BELOW_PERCENT, AllocationMeter, GpuUse, Holder
from gpuwatch.collect.gpu_metrics import GPU_METRICS
from gpuwatch.collect.gpu_status import GpuIdentity, GpuProcess, GpuStatus, XidEvent
from gpuwatch.collect.mig import MigInstance
from gpuwatch.collect.nvml_device import GpuState, NvmlDevices
from gpuwatch.collect.nvml_events import XidEvents
from gpuwatch.collect.nvml_processes import NvmlProcess
from gpuwatch.collect.processes import ProcessInfo, read_process_info
from gpuwatch.collect.usage import UsageMeter
from gpuwatch.core.bindings import binding_problem
from gpuwatch.core.errors import NvmlUnavailable
from gpuwatch.core.model import Batch, Labels, Sample, make_labels

__all__ = [
    "DEMO_HINT",
    "EXPECT_GPUS_HINT",
    "GPU_METRICS",
    "GpuCollector",
    "GpuIdentity",
    "GpuProcess",
    "GpuStatus",
    "XidEvent",
    "load_nvml",
]

DEMO_HINT = "run `gpuwatch serve --demo` to try gpuwatch with simulated GPUs"
# With `expect_gpus` (the Docker image): a container without GPUs was almost always started without them.
EXPECT_GPUS_HINT = (
    "GPUs were expected here: start the container with `--gpus all` "
    "(the host needs the NVIDIA driver and the NVIDIA Container Toolkit)"
)
# NVML says the PCIe byte counters "can be wrapped"; a 32-bit wrap is taken as one, anything else that
# goes down (a 64-bit wrap, a reset) skips one tick's rate. A rate above this is not a PCIe link's.
_PCIE_MAX_BYTES_PER_S = 1 << 40


def _holder(p: GpuProcess) -> Holder:
    a = p.attribution
    return Holder(p.user, a.slurm_job, a.pod, a.pod_uid, a.namespace)


def load_nvml() -> Any:
    """Return the real `pynvml` module (from nvidia-ml-py); nvmlInit is left to GpuCollector.open."""
    try:
        import pynvml
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise NvmlUnavailable(f"no NVIDIA GPU found (nvidia-ml-py is not installed); {DEMO_HINT}") from exc
    problem = binding_problem(pynvml)
    if problem is not None:
        raise NvmlUnavailable(problem)
    return pynvml


class GpuCollector:
    """Samples all GPUs of one host; `collect` runs every tick, `wait_events` on its own thread."""

    def __init__(
        self,
        nvml: Any,
        *,
        hostname: str,
        proc_root: Path = Path("/proc"),
        logger: logging.Logger | None = None,
        reprobe_interval_s: float = 30.0,
        pcie_throughput_fallback: bool = False,
        no_gpu_hint: str = DEMO_HINT,
        idle_below: float = IDLE_BELOW_PERCENT,
        max_gap_s: float = 60.0,
    ) -> None:
        """`pcie_throughput_fallback`: where the PCIe byte counters are unsupported, call
        nvmlDeviceGetPcieThroughput instead (it blocks ~20 ms per call and direction).
        `no_gpu_hint`: what the NvmlUnavailable of `open` suggests when no GPU is found.
        `idle_below`, `max_gap_s`: what the usage counters take as idle (utilization percent) and the
        longest time between two samples they charge (see `collect.allocation`)."""
        self._hint = no_gpu_hint
        self._nvml = nvml
        self._hostname = hostname
        self._proc_root = proc_root
        self._log = logger or logging.getLogger(__name__)
        self._reprobe_ms = int(reprobe_interval_s * 1000)
        self._pcie_fallback = pcie_throughput_fallback
        self._gpus: list[GpuState] = []
        self._lock = threading.Lock()  # GPU state: collect, snapshot
        self._events_lock = threading.Lock()  # XID state, shared with wait_events
        self._stopping = threading.Event()
        self._events = XidEvents(nvml, self._log, self._stopping)
        self._is_open = False
        self._proc_info: dict[int, ProcessInfo] = {}
        self._usage = UsageMeter(max_gap_s=max_gap_s)
        self._allocation = AllocationMeter(idle_below=idle_below, max_gap_s=max_gap_s)
        self.driver_version: str | None = None
        self._dev = NvmlDevices(nvml, self._log, self._reprobe_ms)

    @property
    def gpus(self) -> list[GpuIdentity]:
        """The GPUs open() found, in index order (identities refresh when a lost GPU comes back)."""
        return [gpu.identity for gpu in self._gpus]

    # -- life cycle ------------------------------------------------------------------------------

    def open(self) -> list[GpuIdentity]:
        """Initialise NVML and enumerate the GPUs; raise NvmlUnavailable if there are none."""
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise NvmlUnavailable(f"no NVIDIA GPU found (NVML: {self._describe(exc)}); {self._hint}") from exc
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self._shutdown()
            raise NvmlUnavailable(f"no NVIDIA GPU found (NVML: {self._describe(exc)}); {self._hint}") from exc
        if count == 0:
            self._shutdown()
            raise NvmlUnavailable(f"no NVIDIA GPU found (NVML reports 0 GPUs); {self._hint}")
        self._is_open = True
        self._stopping.clear()
        self._dev.use_driver_processes()
        self.driver_version = self._dev.query(None, "driver_version", nvml.nvmlSystemGetDriverVersion)
        self._gpus = [GpuState(i, self._hostname) for i in range(count)]
        for gpu in self._gpus:
            gpu.fields = dict(self._dev.field_table)
            self._dev.attach(gpu)
        self._events = XidEvents(nvml, self._log, self._stopping)
        self._events.open(self._gpus)
        return [gpu.identity for gpu in self._gpus]

    @property
    def events_state(self) -> str:
        """Whether XID events are registered (for `gpuwatch doctor`)."""
        return self._events.state

    @property
    def field_table(self) -> dict[int, str]:
        """The NVML field ids read each tick -> their metric names."""
        return dict(self._dev.field_table)

    def handles(self) -> list[tuple[int, Any]]:
        """(index, NVML handle) of each GPU being sampled (for `gpuwatch doctor`'s own calls)."""
        with self._lock:
            return [(g.index, g.handle) for g in self._gpus if g.is_sampled]

    def unavailable(self) -> dict[int, str]:
        """GPUs that cannot be opened (NoPermission, InsufficientPower at the handle), and why."""
        with self._lock:
            return {g.index: g.unavailable for g in self._gpus if g.unavailable is not None}

    def mig_layout(self) -> dict[int, list[str]]:
        """Per GPU in MIG mode, its GPU instances: "GI 1 3g.40gb: 2 compute instance(s)"."""
        with self._lock:
            return {
                g.index: [f"GI {i.gi_id} {i.profile}: {len(i.devices)} compute instance(s)" for i in g.mig]
                for g in self._gpus
                if g.mig is not None
            }

    @property
    def process_layout(self) -> str:
        """How process lists are read: the driver symbol and struct size, or the binding's call."""
        reader = self._dev.driver_processes
        return reader.layout if reader is not None else "the binding's nvmlDeviceGetComputeRunningProcesses"

    def _describe(self, exc: BaseException) -> str:
        nvml = self._nvml
        if isinstance(exc, nvml.NVMLError_LibraryNotFound):
            return "driver library not found"
        if isinstance(exc, nvml.NVMLError_DriverNotLoaded):
            return "driver not loaded"
        if isinstance(exc, nvml.NVMLError_NoPermission):
            return "no permission to open the GPU devices"
        if isinstance(exc, nvml.NVMLError_LibRmVersionMismatch):
            return "driver library and kernel module differ; reload the nvidia module or reboot"
        return str(exc)

    def _reprobe(self, gpu: GpuState) -> None:
        was_lost = gpu.is_lost
        self._dev.attach(gpu)
        if gpu.is_sampled:
            if was_lost:
                self._log.warning("GPU %d (%s) answers again", gpu.index, gpu.identity.uuid)
            self._events.request(gpu)  # registered by the thread that waits on the set

    def close(self) -> None:
        """Free the event set and shut NVML down; stop the wait_events thread first (or it returns within its timeout)."""
        self._stopping.set()
        self._events.close()
        with self._lock:
            if self._is_open:
                for gpu in self._gpus:
                    self._dev.free_gpm(gpu)
                self._shutdown()
                self._is_open = False

    def _shutdown(self) -> None:
        self._dev.query(None, "shutdown", self._nvml.nvmlShutdown)

    # -- sampling --------------------------------------------------------------------------------
    def _pcie_rates(self, gpu: GpuState, f: dict[str, float], timestamp_ms: int) -> None:
        """PCIe B/s gauges (dcgm-exporter's DCGM_FI_PROF_PCIE_*) and byte counters that only go up.

        NVML's byte counters (fields 197/198) are 32 bits on an H200 (driver 580): they wrap every
        4 GiB, six times a second under a 27 GB/s copy. So the rate comes from GPM (metrics 20/21)
        where GPM answers; else from the counters, taking one wrap a tick (right below 4 GiB a tick).
        The counters gpuwatch exports are the sum of rate x time since it started."""
        prev_ms = gpu.pcie_ms
        gpu.pcie_ms = timestamp_ms
        for counter, rate in (
            ("gpuwatch_pcie_tx_bytes_total", "DCGM_FI_PROF_PCIE_TX_BYTES"),
            ("gpuwatch_pcie_rx_bytes_total", "DCGM_FI_PROF_PCIE_RX_BYTES"),
        ):
            raw = f.pop(counter, None)
            prev = gpu.prev_counters.get(counter)
            if raw is not None:
                gpu.prev_counters[counter] = (timestamp_ms, raw)
            if rate not in f and raw is not None and prev is not None and timestamp_ms > prev[0]:
                delta = raw - prev[1]
                if delta < 0 and prev[1] < 1 << 32 and raw < 1 << 32:
                    delta += 1 << 32  # the 32-bit counter wrapped
                per_s = delta * 1000.0 / (timestamp_ms - prev[0])
                if 0 <= per_s <= _PCIE_MAX_BYTES_PER_S:
                    f[rate] = per_s
            if raw is None and rate not in f:
                continue
            total = gpu.pcie_totals.get(counter, 0.0)
            if rate in f and prev_ms is not None and timestamp_ms > prev_ms:
                total += f[rate] * (timestamp_ms - prev_ms) / 1000.0
            gpu.pcie_totals[counter] = f[counter] = total
        if self._pcie_fallback and not any(n.startswith("gpuwatch_pcie_") for n in gpu.fields.values()):
            nvml = self._nvml
            for key, direction, rate in (
                ("pcie_tx_throughput", nvml.NVML_PCIE_UTIL_TX_BYTES, "DCGM_FI_PROF_PCIE_TX_BYTES"),
                ("pcie_rx_throughput", nvml.NVML_PCIE_UTIL_RX_BYTES, "DCGM_FI_PROF_PCIE_RX_BYTES"),
            ):
                kib = self._dev.query(gpu, key, nvml.nvmlDeviceGetPcieThroughput, gpu.handle, direction)
                if kib is not None:
                    f[rate] = kib * 1024.0

    def _process(self, pid: int, used: int | None, gpu_instance: str = "") -> GpuProcess:
        info = self._proc_info.get(pid)
        if info is None:
            info = read_process_info(self._proc_root, pid)
            if not info.name:  # not in our /proc (another PID namespace) or already gone
                name = self._dev.query(None, "process_name", self._nvml.nvmlSystemGetProcessName, pid)
                if name:
                    info = ProcessInfo(
                        PurePath(str(name)).name, info.user, info.container_id, info.attribution
                    )
            self._proc_info[pid] = info
        return GpuProcess(pid, info.name, info.user, info.container_id, used, gpu_instance, info.attribution)

    def collect(self, timestamp_ms: int) -> Batch:
        """Sample every GPU once; one sample per (metric, GPU), all stamped `timestamp_ms`."""
        samples: list[Sample] = []
        seen: set[int] = set()
        uses: list[GpuUse] = []
        with self._lock:
            if not self._is_open:
                raise RuntimeError("GpuCollector.collect() before open()")
            self._dev.now_ms = timestamp_ms
            for gpu in self._gpus:
                if not gpu.is_sampled and timestamp_ms >= gpu.next_probe_ms:
                    self._reprobe(gpu)
                if gpu.unavailable is not None:
                    continue  # cannot be opened (said once): nothing to report, not lost
                reading = None if gpu.is_lost else self._dev.read(gpu)
                ident = gpu.identity
                if reading is None:
                    samples.append(Sample("gpuwatch_gpu_lost", gpu.labels, 1.0))
                    uses.append(GpuUse(self._hostname, str(ident.index), ident.uuid, None, None))
                else:
                    self._pcie_rates(gpu, reading.figures, timestamp_ms)
                    self._gpu_samples(gpu, reading.figures, samples)
                    procs = self._process_samples(gpu, reading.processes, samples, seen)
                    samples.append(Sample("gpuwatch_gpu_lost", gpu.labels, 0.0))
                    energy = reading.figures.get("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
                    self._usage.observe(
                        self._hostname, gpu.index, timestamp_ms, {p.user for p in procs}, energy
                    )
                    holders = frozenset(_holder(p) for p in procs)
                    util = reading.figures.get("DCGM_FI_DEV_GPU_UTIL")
                    uses.append(GpuUse(self._hostname, str(ident.index), ident.uuid, util, energy, holders))
                with self._events_lock:
                    samples.append(Sample("DCGM_FI_DEV_XID_ERRORS", gpu.labels, float(gpu.last_xid)))
                    for xid, n in gpu.xid_counts.items():
                        samples.append(
                            Sample("gpuwatch_xid_errors_total", gpu.labels_with("xid", str(xid)), float(n))
                        )
            for pid in self._proc_info.keys() - seen:
                del self._proc_info[pid]
            self._allocation.observe(timestamp_ms, uses)
        return Batch(timestamp_ms, samples)

    @staticmethod
    def _gpu_samples(gpu: GpuState, figures: dict[str, float], samples: list[Sample]) -> None:
        labels = gpu.labels
        samples.extend([Sample(name, labels, value) for name, value in figures.items()])
        for mig_labels, mig_figures in gpu.mig_readings:  # GPU instances (MIG mode)
            samples.extend([Sample(n, mig_labels, v) for n, v in mig_figures.items()])
        mask = figures.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
        if mask is not None:
            bits = int(mask)
            samples.extend(
                [
                    Sample("gpuwatch_clock_throttled", rl, 1.0 if bits & bit else 0.0)
                    for bit, rl in gpu.throttle_labels
                ]
            )

    def _process_samples(
        self,
        gpu: GpuState,
        procs: list[tuple[NvmlProcess, MigInstance | None]],
        samples: list[Sample],
        seen: set[int],
    ) -> list[GpuProcess]:
        """One memory sample a process (NaN where the driver does not know it, as under MIG); the processes."""
        found = []
        for p, inst in procs:
            seen.add(p.pid)
            proc = self._process(p.pid, p.used_bytes, str(inst.gi_id) if inst is not None else "")
            found.append(proc)
            used = float("nan") if p.used_bytes is None else float(p.used_bytes)
            samples.append(
                Sample("gpuwatch_process_gpu_memory_bytes", self._process_labels(gpu, proc, inst), used)
            )
        return found

    def usage_samples(self) -> list[Sample]:
        """Per-user GPU seconds and kWh counters, and each holder's allocated, busy and idle-held GPU
        seconds and energy, as of the last `collect` (see `collect.usage`, `collect.allocation`)."""
        with self._lock:
            return self._usage.samples() + self._allocation.samples()

    def resume(self, t_ms: int, samples: list[Sample]) -> None:
        """Go on from an imported history whose last tick was `t_ms`: the PCIe byte totals, the XIDs and
        the usage counters continue from `samples` (each of its series' newest value), not from 0."""
        with self._lock, self._events_lock:
            by_gpu = {(gpu.hostname, str(gpu.index), gpu.identity.uuid): gpu for gpu in self._gpus}
            for s in samples:
                d = dict(s.labels)
                gpu = by_gpu.get((d.get("Hostname", ""), d.get("gpu", ""), d.get("UUID", "")))
                if gpu is None:
                    continue
                if s.name in ("gpuwatch_pcie_tx_bytes_total", "gpuwatch_pcie_rx_bytes_total"):
                    gpu.pcie_totals[s.name] = s.value
                elif s.name == "DCGM_FI_DEV_XID_ERRORS":
                    gpu.last_xid = int(s.value)
                elif s.name == "gpuwatch_xid_errors_total" and d.get("xid", "").isdigit():
                    gpu.xid_counts[int(d["xid"])] = int(s.value)
            self._usage.resume(t_ms, samples)
            self._allocation.resume(t_ms, samples)

    def assign_runs(self, runs: dict[tuple[str, str, str], list[str]]) -> None:
        """Say which training runs each GPU (Hostname, gpu, UUID) belongs to now (the `runs` job's map),
        for the usage counters' `run` label."""
        with self._lock:
            self._allocation.assign_runs(runs)

    def _process_labels(self, gpu: GpuState, proc: GpuProcess, inst: MigInstance | None) -> Labels:
        key = f"{proc.pid}\0{proc.name}\0{proc.user}\0{proc.container_id}\0{proc.gpu_instance}\0{proc.attribution}"
        labels = gpu.extra_labels.get(("process", key))
        if labels is None:
            labels = make_labels(
                {
                    **(gpu.label_map if inst is None else dict(inst.labels)),
                    "pid": str(proc.pid),
                    "process_name": proc.name,
                    "user": proc.user,
                    "container_id": proc.container_id,
                    **proc.attribution.labels(),
                }
            )
            if len(gpu.extra_labels) > 4096:  # PIDs come and go; keep the cache bounded
                gpu.extra_labels.clear()
            gpu.extra_labels[("process", key)] = labels
        return labels

    def snapshot(self) -> list[GpuStatus]:
        """Read every GPU now, for `gpuwatch smi` and status pages (no PCIe rates: they need two ticks)."""
        out: list[GpuStatus] = []
        with self._lock:
            if not self._is_open:
                raise RuntimeError("GpuCollector.snapshot() before open()")
            for gpu in self._gpus:
                if not gpu.is_sampled:
                    self._reprobe(gpu)
                if gpu.unavailable is not None:
                    continue
                reading = None if gpu.is_lost else self._dev.read(gpu, gpm=False)  # GPM: collect()'s
                ident = gpu.identity
                if reading is None:
                    out.append(GpuStatus(ident.index, ident.uuid, ident.name, ident.pci_bus_id, True))
                    continue
                figures = reading.figures
                with self._events_lock:
                    figures["DCGM_FI_DEV_XID_ERRORS"] = float(gpu.last_xid)
                processes = [
                    self._process(p.pid, p.used_bytes, str(inst.gi_id) if inst is not None else "")
                    for p, inst in reading.processes
                ]
                out.append(
                    GpuStatus(
                        ident.index, ident.uuid, ident.name, ident.pci_bus_id, False, figures, processes
                    )
                )
        return out

    # -- XID events ------------------------------------------------------------------------------

    def wait_events(self, timeout_ms: int) -> list[XidEvent]:
        """Block up to `timeout_ms` for XID events and return them; they also go into the next collect().

        Run it in a loop on one dedicated thread (the only one that touches the event set after open);
        after close() it returns [] at once.
        """
        events = self._events.wait(timeout_ms, self._gpus)
        with self._events_lock:
            for ev in events:
                if 0 <= ev.gpu_index < len(self._gpus):
                    gpu = self._gpus[ev.gpu_index]
                    gpu.last_xid = ev.xid
                    gpu.xid_counts[ev.xid] = gpu.xid_counts.get(ev.xid, 0) + 1
                self._log.warning("GPU %d: XID %d", ev.gpu_index, ev.xid)
        return events
