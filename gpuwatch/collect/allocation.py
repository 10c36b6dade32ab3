"""Who held each GPU, and how: allocated, busy and idle-but-held GPU seconds and energy, as counters.

A GPU is allocated while NVML lists a compute process on it. Its holders are the distinct (user, Slurm
job, Kubernetes pod, training run) of those processes: the job and pod come from each process's cgroup
(`attribution.py`), the run from the run-to-GPU map the `runs` job works out (`rungpus.py`), handed
over with `assign_runs`. At each sample the time since the GPU's previous sample is charged to its
holders, shared equally so that a GPU's holders add up to the GPU:

- allocated: always;
- busy: when the utilization reading (the share of the past sample period in which a kernel ran) is
  at least `idle_below` percent; idle-but-held when under it; neither where the GPU reports no
  utilization (MIG mode), so busy + idle-held may fall short of allocated there;
- energy: the increase of `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` over the same time, in kWh.

Every GPU sampled also counts its seconds per host (`gpuwatch_usage_gpu_seconds_total`, the allocation
rate's denominator), and `gpuwatch_gpus_allocated` says how many GPUs are allocated now. A gap of more
than `max_gap_s` between two samples of a GPU is charged to nobody. Counters start at 0 when gpuwatch
starts or a holder first appears (PromQL's `increase()` takes the restart); a holder not seen for
`forget_ms` is dropped (its series ends; it starts from 0 if it comes back). No pid label: a holder's
series live as long as its job, pod or run, not as long as each process.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuwatch.core.model import MetricInfo, Sample, stable_labels

MJ_PER_KWH = 3.6e9
IDLE_BELOW_PERCENT = 5.0  # the GPUMemoryHeldIdle rule's and the cluster page's "idle" line
FORGET_MS = 600_000

HOLDER_LABELS = ("user", "Hostname", "gpu", "UUID", "slurm_job", "pod", "pod_uid", "namespace", "run")
ALLOCATED = "gpuwatch_usage_allocated_gpu_seconds_total"
BUSY = "gpuwatch_usage_busy_gpu_seconds_total"
IDLE_HELD = "gpuwatch_usage_idle_held_gpu_seconds_total"
ENERGY = "gpuwatch_usage_energy_kwh_total"
GPU_SECONDS = "gpuwatch_usage_gpu_seconds_total"
GPUS_ALLOCATED = "gpuwatch_gpus_allocated"
ENERGY_COUNTER = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
GPU_LOST = "gpuwatch_gpu_lost"
_HOLDER_FIELDS = {ALLOCATED: "allocated_s", BUSY: "busy_s", IDLE_HELD: "idle_s", ENERGY: "kwh"}

ALLOCATION_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        ALLOCATED,
        "counter",
        "Seconds a GPU was held by a compute process of this holder (user, Slurm job, pod, run), shared "
        "equally among a GPU's holders.",
        "seconds",
        HOLDER_LABELS,
    ),
    MetricInfo(
        BUSY,
        "counter",
        "Allocated GPU seconds at or above the idle threshold's utilization (usage_idle_below).",
        "seconds",
        HOLDER_LABELS,
    ),
    MetricInfo(
        IDLE_HELD,
        "counter",
        "Allocated GPU seconds under the idle threshold's utilization (usage_idle_below): held, not used.",
        "seconds",
        HOLDER_LABELS,
    ),
    MetricInfo(
        ENERGY,
        "counter",
        "Energy of the GPUs this holder held (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION's increase), shared "
        "equally among a GPU's holders (kWh).",
        "kWh",
        HOLDER_LABELS,
    ),
    MetricInfo(
        GPU_SECONDS,
        "counter",
        "Seconds of every GPU sampled on the host, allocated or not: the allocation rate's denominator.",
        "seconds",
        ("Hostname",),
    ),
    MetricInfo(
        GPUS_ALLOCATED,
        "gauge",
        "GPUs of the host with at least one compute process now.",
        "",
        ("Hostname",),
    ),
)


@dataclass(frozen=True, order=True)
class Holder:
    """Whose a GPU is: a user, and the Slurm job, pod and training run where there is one ("" if none)."""

    user: str = ""
    slurm_job: str = ""
    pod: str = ""
    pod_uid: str = ""
    namespace: str = ""
    run: str = ""


@dataclass(frozen=True)
class GpuUse:
    """One GPU at one sample: its holders now, its utilization (percent, None where it reports none)
    and its energy counter (mJ since the driver loaded, None where it has none)."""

    hostname: str
    gpu: str
    uuid: str
    utilization: float | None
    energy_mj: float | None
    holders: frozenset[Holder] = frozenset()


@dataclass
class _Figures:
    allocated_s: float = 0.0
    busy_s: float = 0.0
    idle_s: float = 0.0
    kwh: float = 0.0
    last_ms: int = 0


@dataclass
class _Prev:
    t_ms: int
    energy_mj: float | None


@dataclass
class AllocationMeter:
    """Accumulates the holders' counters; `observe` every GPU once a sample, then `samples()`."""

    idle_below: float = IDLE_BELOW_PERCENT
    max_gap_s: float = 60.0
    forget_ms: int = FORGET_MS
    max_holders: int = 10_000  # holder-GPU pairs kept; past it a new pair is charged to nobody
    _prev: dict[tuple[str, str, str], _Prev] = field(default_factory=dict)
    _figures: dict[tuple[str, str, str, Holder], _Figures] = field(default_factory=dict)
    _gpu_seconds: dict[str, float] = field(default_factory=dict)
    _allocated_now: dict[str, int] = field(default_factory=dict)
    _runs: dict[tuple[str, str, str], str] = field(default_factory=dict)
    _swept_ms: int = 0

    def assign_runs(self, runs: Mapping[tuple[str, str, str], Iterable[str]]) -> None:
        """Say which run each GPU (Hostname, gpu, UUID) belongs to now; where two runs name one GPU,
        the first by name is charged."""
        self._runs = {gpu: min(names) for gpu, names in runs.items() if names}

    def resume(self, t_ms: int, samples: Iterable[Sample]) -> None:
        """Go on from counters already written: `samples` holds each series' newest value at `t_ms` (an
        imported history's), and the GPUs' energy counters and `gpuwatch_gpu_lost` then."""
        energy: dict[tuple[str, str, str], float] = {}
        lost: dict[tuple[str, str, str], bool] = {}
        for s in samples:
            d = dict(s.labels)
            gpu = (d.get("Hostname", ""), d.get("gpu", ""), d.get("UUID", ""))
            field_name = _HOLDER_FIELDS.get(s.name)
            if field_name is not None:
                holder = Holder(
                    *(d.get(k, "") for k in ("user", "slurm_job", "pod", "pod_uid", "namespace", "run"))
                )
                f = self._figures.setdefault((*gpu, holder), _Figures(last_ms=t_ms))
                setattr(f, field_name, s.value)
            elif s.name == GPU_SECONDS:
                self._gpu_seconds[gpu[0]] = s.value
            elif s.name == ENERGY_COUNTER:
                energy[gpu] = s.value
            elif s.name == GPU_LOST:
                lost[gpu] = s.value > 0
        for gpu, is_lost in lost.items():
            self._prev[gpu] = _Prev(t_ms, None if is_lost else energy.get(gpu))

    def observe(self, t_ms: int, gpus: Sequence[GpuUse]) -> None:
        """Charge each GPU's holders for the time (and energy) since that GPU's previous sample."""
        allocated: dict[str, int] = {}
        for use in gpus:
            allocated[use.hostname] = allocated.get(use.hostname, 0) + (1 if use.holders else 0)
            self._gpu_seconds.setdefault(use.hostname, 0.0)
            key = (use.hostname, use.gpu, use.uuid)
            prev = self._prev.get(key)
            self._prev[key] = _Prev(t_ms, use.energy_mj)
            run = self._runs.get(key, "")
            holders = sorted({_with_run(h, run) for h in use.holders})
            figures = [self._entry(key, h, t_ms) for h in holders]
            if prev is None:
                continue
            dt_s = (t_ms - prev.t_ms) / 1000.0
            if not 0 < dt_s <= self.max_gap_s:
                continue
            self._gpu_seconds[use.hostname] += dt_s
            if not holders:
                continue
            kwh = 0.0
            if use.energy_mj is not None and prev.energy_mj is not None:
                used = use.energy_mj - prev.energy_mj if use.energy_mj >= prev.energy_mj else use.energy_mj
                kwh = used / MJ_PER_KWH
            share_s, share_kwh = dt_s / len(holders), kwh / len(holders)
            for f in figures:
                if f is None:
                    continue
                f.allocated_s += share_s
                f.kwh += share_kwh
                if use.utilization is not None:
                    if use.utilization >= self.idle_below:
                        f.busy_s += share_s
                    else:
                        f.idle_s += share_s
        self._allocated_now = allocated
        if t_ms - self._swept_ms >= 60_000:
            self._swept_ms = t_ms
            self._forget(t_ms)

    def _entry(self, gpu: tuple[str, str, str], holder: Holder, t_ms: int) -> _Figures | None:
        key = (*gpu, holder)
        f = self._figures.get(key)
        if f is None:
            if len(self._figures) >= self.max_holders:
                return None
            f = self._figures[key] = _Figures()
        f.last_ms = t_ms
        return f

    def _forget(self, t_ms: int) -> None:
        for key in [k for k, f in self._figures.items() if t_ms - f.last_ms > self.forget_ms]:
            del self._figures[key]
        for gpu in [k for k, p in self._prev.items() if t_ms - p.t_ms > self.forget_ms]:
            del self._prev[gpu]

    def samples(self) -> list[Sample]:
        """The counters and the gauge as of the last `observe`."""
        out = []
        for (hostname, gpu, uuid, h), f in self._figures.items():
            labels = stable_labels(
                {
                    "user": h.user,
                    "Hostname": hostname,
                    "gpu": gpu,
                    "UUID": uuid,
                    "slurm_job": h.slurm_job,
                    "pod": h.pod,
                    "pod_uid": h.pod_uid,
                    "namespace": h.namespace,
                    "run": h.run,
                }
            )
            out.append(Sample(ALLOCATED, labels, f.allocated_s))
            out.append(Sample(BUSY, labels, f.busy_s))
            out.append(Sample(IDLE_HELD, labels, f.idle_s))
            out.append(Sample(ENERGY, labels, f.kwh))
        for hostname, seconds in self._gpu_seconds.items():
            out.append(Sample(GPU_SECONDS, stable_labels({"Hostname": hostname}), seconds))
        for hostname, n in self._allocated_now.items():
            out.append(Sample(GPUS_ALLOCATED, stable_labels({"Hostname": hostname}), float(n)))
        return out


def _with_run(holder: Holder, run: str) -> Holder:
    if holder.run == run:
        return holder
    return Holder(holder.user, holder.slurm_job, holder.pod, holder.pod_uid, holder.namespace, run)
