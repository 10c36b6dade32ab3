"""Which GPUs a training run uses: the SDK's process report joined with NVML's process table.

A run's GPUs are those where NVML lists its process, one of that process's descendants (DataLoader or
`mp.spawn` workers) or, under torchrun, one of the launcher's descendants (the other ranks). The
process tree is read from this host's `/proc` only; a run on another host (its GPUs scraped from that
host's gpuwatch) is matched by its reported pids alone. Where no process matches (the trainer runs in
a container of its own PID namespace, or it never reported one: a run from pushes), the GPUs the run
named in its init (`gpus`: NVML indexes or UUIDs, as CUDA_VISIBLE_DEVICES holds them) are taken.

The `runs` job writes `gpuwatch_run_gpu_info{run, Hostname, gpu, UUID} 1` for each such GPU of each
running run, every 15 s: the run-to-GPU map over time that energy per run and the pages join on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from gpuwatch.collect.proctree import parent_map, with_descendants
from gpuwatch.collect.runs import RUN_STATUS_MAX_SILENCE_MS
from gpuwatch.core.model import Matcher, MetricInfo, RunRecord, Sample, SeriesData, is_stale, stable_labels

INFO_METRIC = "gpuwatch_run_gpu_info"
PROCESS_METRIC = "gpuwatch_process_gpu_memory_bytes"
GPU_METRIC = "gpuwatch_gpu_lost"  # written for every GPU at every sample: its labels name each GPU
RECENT_MS = 60_000  # a process or GPU sampled within the last minute is current

RUN_GPU_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        INFO_METRIC,
        "gauge",
        "1 for each GPU a running training run uses (its processes in NVML's table, else the GPUs it named).",
        "",
        ("run", "Hostname", "gpu", "UUID"),
    ),
)


@dataclass(frozen=True, order=True)
class GpuRef:
    """One GPU as its samples label it."""

    hostname: str
    gpu: str
    uuid: str


@dataclass(frozen=True)
class GpuProcessRow:
    """One row of NVML's process table: a pid on a GPU."""

    gpu: GpuRef
    pid: int


class LatestSource(Protocol):
    """What the join reads from the store: each series' newest sample."""

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...


def same_host(a: str | None, b: str | None) -> bool:
    """Host names as a trainer and gpuwatch may spell them: case and domain do not matter."""
    return bool(a) and bool(b) and str(a).split(".")[0].lower() == str(b).split(".")[0].lower()


def _current(series: Iterable[SeriesData]) -> list[dict[str, str]]:
    return [s.label_dict() for s in series if len(s.values) and not is_stale(float(s.values[-1]))]


def _ref(labels: dict[str, str]) -> GpuRef:
    return GpuRef(labels.get("Hostname", ""), labels.get("gpu", ""), labels.get("UUID", ""))


def current_table(source: LatestSource, now_ms: int) -> tuple[list[GpuProcessRow], list[GpuRef]]:
    """Return NVML's process table and the GPUs as sampled in the last minute, on every host stored."""
    rows = []
    for labels in _current(
        source.select_last([Matcher("__name__", "=", PROCESS_METRIC)], now_ms - RECENT_MS, now_ms)
    ):
        pid = labels.get("pid", "")
        if pid.isdigit():
            rows.append(GpuProcessRow(_ref(labels), int(pid)))
    gpus = sorted(
        {
            _ref(labels)
            for labels in _current(
                source.select_last([Matcher("__name__", "=", GPU_METRIC)], now_ms - RECENT_MS, now_ms)
            )
        }
    )
    return rows, gpus


def root_pids(process: dict[str, Any] | None) -> list[int]:
    """The pids whose process trees are the run's: its own and a torchrun launcher's."""
    process = process or {}
    return [p for p in (process.get("pid"), process.get("launcher_pid")) if isinstance(p, int) and p > 0]


def declared(record: RunRecord, gpus: Sequence[GpuRef], local_hostname: str) -> set[GpuRef]:
    """The GPUs a run named (`gpus`: indexes or UUIDs, UUID prefixes as CUDA_VISIBLE_DEVICES allows)."""
    host = record.host or local_hostname
    on_host = [g for g in gpus if same_host(g.hostname, host)]
    found: set[GpuRef] = set()
    for item in record.gpus or []:
        name = str(item).strip()
        for g in on_host:
            if name == g.gpu or name == g.uuid or (name.startswith("GPU-") and g.uuid.startswith(name)):
                found.add(g)
    return found


def run_gpus(
    record: RunRecord,
    rows: Sequence[GpuProcessRow],
    gpus: Sequence[GpuRef],
    local_hostname: str,
    parents: dict[int, int] | None,
) -> set[GpuRef]:
    """Return the GPUs `record` uses now: by process where any matches, else as it declared."""
    roots = root_pids(record.process)
    if roots:
        host = record.host or local_hostname
        local = same_host(host, local_hostname) and parents is not None
        pids = with_descendants(roots, parents) if local and parents is not None else set(roots)
        found = {r.gpu for r in rows if same_host(r.gpu.hostname, host) and r.pid in pids}
        if found:
            return found
    return declared(record, gpus, local_hostname)


def is_current(record: RunRecord, now_ms: int) -> bool:
    """A running run seen within a day (as the run-status gauges count them)."""
    seen = record.last_seen_ms or record.start_ms or now_ms
    return record.status == "running" and now_ms - seen <= RUN_STATUS_MAX_SILENCE_MS


def runs_by_gpu(info: Iterable[Sample]) -> dict[tuple[str, str, str], list[str]]:
    """The runs each GPU (Hostname, gpu, UUID) belongs to, from `gpuwatch_run_gpu_info` samples."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for s in info:
        labels = dict(s.labels)
        if s.name == INFO_METRIC and labels.get("run"):
            key = (labels.get("Hostname", ""), labels.get("gpu", ""), labels.get("UUID", ""))
            out.setdefault(key, []).append(labels["run"])
    return out


class RunGpus:
    """Write `gpuwatch_run_gpu_info` for the running runs (the `runs` job calls `samples`).

    `hostname` is this gpuwatch's `Hostname` label; a run whose host is `machine_name` (the name the
    operating system gives, which the SDK reports) is this host too, when the two differ."""

    def __init__(self, hostname: str, proc_root: Path = Path("/proc"), machine_name: str = "") -> None:
        self.hostname = hostname
        self.proc_root = proc_root
        self.machine_name = machine_name

    def _local(self, record: RunRecord) -> RunRecord:
        if self.machine_name and same_host(record.host, self.machine_name):
            return replace(record, host=self.hostname)
        return record

    def samples(self, records: Sequence[RunRecord], source: LatestSource, now_ms: int) -> list[Sample]:
        running = [self._local(r) for r in records if is_current(r, now_ms) and (r.process or r.gpus)]
        if not running:
            return []
        rows, gpus = current_table(source, now_ms)
        needs_tree = any(
            root_pids(r.process) and same_host(r.host or self.hostname, self.hostname) for r in running
        )
        parents = parent_map(self.proc_root) if needs_tree and rows else None
        out = []
        for r in running:
            for g in sorted(run_gpus(r, rows, gpus, self.hostname, parents)):
                labels = stable_labels({"run": r.name, "Hostname": g.hostname, "gpu": g.gpu, "UUID": g.uuid})
                out.append(Sample(INFO_METRIC, labels, 1.0))
        return out
