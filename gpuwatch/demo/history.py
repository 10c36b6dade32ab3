"""A week of the demo before it starts: the simulated history that `gpuwatch serve --demo` imports
into an empty store, so every page, the long ranges and the Usage page have something to show.

The demo is started `days` days in the past (its incident schedule and workload with it) and what
gpuwatch would have stored since is computed at once (readings.py, historygpu.py, historyusage.py,
historyruns.py) and written through the store's bulk path, a GPU at a time: every GPU series, the
processes, the usage counters and the training run, a sample every `step_s` but over the last hour,
which is at the live sampler's interval (`fine_s`), so the 1-hour charts look the same from the start
and the live demo's memory does not climb for an hour as its own samples replace coarser ones
(bench/README.md, "Demo history", says why 15 s before). Series names and labels are the live
collector's own: it samples a calm copy of the same GPUs first (`learn_series`).

The history ends one step before the live sampler's first tick, and the live demo goes on from it:
the GPUs' energy and PCIe counters (`Workload.resume_counters`), the collector's byte totals, XIDs
and usage counters (`GpuCollector.resume`, from `Imported.last`) and the training run's step.
Not simulated: the host's figures (they are the real machine's), the simulated vLLM and SGLang
servers' scrapes (their figures are random draws per request), the trainer's log lines, the rules'
outputs and gpuwatch's own figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gpuwatch.collect.allocation import ALLOCATED, GPU_SECONDS
from gpuwatch.collect.nvml import GpuCollector
from gpuwatch.core.clock import Clock, FakeClock
from gpuwatch.core.model import Labels, Sample, stable_labels
from gpuwatch.demo.historygpu import LOST, PROCESS, THROTTLED, XID_TOTAL, GpuSeries, Series, gpu_history
from gpuwatch.demo.historyruns import training_history
from gpuwatch.demo.historyusage import USER_ENERGY, USER_SECONDS, Holding, usage_history
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.demo.readings import WorkloadArrays
from gpuwatch.demo.training import TRAINING_RUN
from gpuwatch.store import Store

DAYS = 7
STEP_S = 15.0  # the last day's
RECENT_DAYS = 1.0
FINE_SPAN_S = 3600.0  # the last hour: at the live sampler's interval
GPUS_AT_STEP = 8  # older days: a step 15 s longer for every 8 GPUs more, up to a minute (see `old_step_s`)
MAX_STEP_S = 60.0  # run energy sums counter samples at most a minute apart (collect/runenergy.py)
RUNS_EVERY_S = 15.0  # the runs job's interval (collect/runs.py RUN_STATUS_INTERVAL_S)
WRITE_SAMPLES = 1_000_000  # a bulk write's size: the writer's copies of it stay tens of MB
_NOT_FIGURES = {PROCESS, XID_TOTAL, USER_SECONDS, USER_ENERGY, GPU_SECONDS, "gpuwatch_gpus_allocated"}


@dataclass(frozen=True)
class Imported:
    """What a history wrote: counts, time taken, and where the live demo goes on from."""

    series: int
    samples: int
    seconds: float
    last_ms: int  # the last tick
    last: list[Sample]  # each series' newest value
    run_step: int  # the training run's last step (0: none going on)


@dataclass(frozen=True)
class LearnedSeries:
    """The live collector's series for each GPU, and its holders' and users' labels."""

    gpus: list[GpuSeries]
    holders: dict[int, Labels]
    users: dict[int, Labels]
    host: Labels


def learn_series(nvml: FakeNvml, hostname: str, proc_root: Path) -> LearnedSeries:
    """Sample a calm copy of `nvml`'s GPUs with the live collector (twice, so that the figures of two
    samples show) and note which series it writes for each GPU."""
    clock = FakeClock(1_700_000_000.0)
    copy = nvml.calm_copy(clock)
    clock.advance(60.0)  # past every GPU's warm-up
    collector = GpuCollector(copy, hostname=hostname, proc_root=proc_root)
    collector.open()
    try:
        collector.collect(clock.now_ms())
        clock.advance(1.0)
        samples = [*collector.collect(clock.now_ms()).samples, *collector.usage_samples()]
    finally:
        collector.close()
    gpus: dict[str, GpuSeries] = {}
    holders: dict[int, Labels] = {}
    users: dict[int, Labels] = {}
    host: Labels = stable_labels({"Hostname": hostname})
    for s in samples:
        d = dict(s.labels)
        i = d.get("gpu", "")
        if not i.isdigit():
            continue
        g = gpus.setdefault(i, GpuSeries(int(i), (), {}, None, ""))
        if s.name == LOST:
            gpus[i] = g = GpuSeries(g.index, s.labels, g.figures, g.process, g.user)
        elif s.name == PROCESS:
            gpus[i] = GpuSeries(g.index, g.labels, g.figures, s.labels, d.get("user", ""))
            users[int(i)] = stable_labels({"user": d.get("user", ""), "Hostname": hostname})
        elif s.name == ALLOCATED:
            holders[int(i)] = s.labels
        elif s.name not in _NOT_FIGURES and s.name != THROTTLED and not s.name.startswith("gpuwatch_usage_"):
            g.figures[s.name] = s.labels
    return LearnedSeries([gpus[k] for k in sorted(gpus, key=int)], holders, users, host)


def old_step_s(gpus: int) -> float:
    """The step of a history's older days: 15 s up to 8 GPUs, then longer with the GPU count (30 s at
    16, a minute from 32), so a big demo imports in seconds, not minutes; the tiers' 1-minute points
    are as fine either way."""
    return min(MAX_STEP_S, STEP_S * -(-gpus // GPUS_AT_STEP))


def _parts(chunk: list[Series], samples: int) -> Iterator[list[Series]]:
    """`chunk` in runs of whole series of about `samples` samples."""
    part: list[Series] = []
    n = 0
    for series in chunk:
        part.append(series)
        n += series[2].size
        if n >= samples:
            yield part
            part, n = [], 0
    if part:
        yield part


def history_ticks(
    end_ms: int,
    days: float,
    step_s: float = STEP_S,
    old_s: float = STEP_S,
    recent_days: float = RECENT_DAYS,
    fine_s: float | None = None,
    fine_span_s: float = FINE_SPAN_S,
) -> np.ndarray:
    """The sample times (ms) of a history of `days` ending one step before `end_ms`: every `fine_s`
    over the last `fine_span_s` (none: no such part), every `step_s` before that over the last
    `recent_days`, every `old_s` before."""

    def before(first: int, start_ms: int, every_ms: int) -> np.ndarray:
        """Every `every_ms` from `start_ms` up to (not including) `first`."""
        t = start_ms + every_ms * np.arange(max(0, -(-(first - start_ms) // every_ms)), dtype=np.int64)
        return t[t < first]

    start_ms = end_ms - int(round(days * 86_400_000))
    fine = np.empty(0, np.int64)
    if fine_s is not None:
        fine_ms = int(round(fine_s * 1000))
        n = int(min(days * 86_400_000, fine_span_s * 1000) // fine_ms)
        fine = end_ms - fine_ms * np.arange(n, 0, -1, dtype=np.int64)
    first = int(fine[0]) if fine.size else end_ms
    step_ms, old_ms = int(round(step_s * 1000)), int(round(old_s * 1000))
    recent_start = max(start_ms, end_ms - int(round(recent_days * 86_400_000)))
    # the recent part's ticks stay on their own grid (one step apart, the last one step before the
    # fine part or the end), as the older part's stay on theirs from the start
    n = int((first - recent_start) // step_ms)
    recent = first - step_ms * np.arange(n, 0, -1, dtype=np.int64)
    first = int(recent[0]) if recent.size else first
    return np.concatenate((before(first, start_ms, old_ms), recent, fine))


@dataclass
class DemoHistory:
    """The history of `nvml`'s simulation (started `days` before `end_ms`) up to one step before `end_ms`."""

    nvml: FakeNvml
    hostname: str
    proc_root: Path
    end_ms: int
    days: float = DAYS
    step_s: float = STEP_S
    old_s: float | None = None  # the older days' step (None: `old_step_s` of the GPU count)
    fine_s: float | None = None  # the last hour's step, the live sampler's interval (None: `step_s` too)
    idle_below: float = 5.0
    max_gap_s: float = 60.0
    run_gpus: list[int] = field(default_factory=list)  # the training run's GPUs; none: no run
    last: dict[tuple[str, Labels], float] = field(default_factory=dict)

    def ticks(self) -> np.ndarray:
        """The history's sample times (ms)."""
        old = self.old_s if self.old_s is not None else old_step_s(self.nvml.gpu_count)
        return history_ticks(self.end_ms, self.days, self.step_s, old, fine_s=self.fine_s)

    def chunks(self) -> Iterator[list[Series]]:
        """The history's series, a GPU at a time, then the usage counters, then the training run."""
        w = self.nvml.workload
        t_ms = self.ticks()
        arrays = WorkloadArrays(w, float(t_ms[-1]) / 1000.0)
        learned = learn_series(self.nvml, self.hostname, self.proc_root)
        holdings: list[Holding] = []
        self._run_gpus: list[tuple[str, str, str]] = []
        for g in learned.gpus:
            out, state = gpu_history(arrays, g.index, t_ms, g)
            holder = learned.holders.get(g.index)
            uuid = dict(g.labels).get("UUID", "")
            if holder is not None and g.index in self.run_gpus:
                holder = stable_labels({**dict(holder), "run": TRAINING_RUN})
                self._run_gpus.append((self.hostname, str(g.index), uuid))
            holdings.append(Holding(state, holder, learned.users.get(g.index)))
            w.resume_counters(g.index, *state.integrals)
            yield out
        # a sampler at the history's step would charge gaps of up to three of its steps (build.py)
        max_gap_s = max(self.max_gap_s, 3 * float(np.diff(t_ms).max(initial=0)) / 1000.0)
        yield usage_history(t_ms, holdings, learned.host, idle_below=self.idle_below, max_gap_s=max_gap_s)
        self.run_step = 0
        if self.run_gpus:
            run = training_history(
                w.start,
                self.end_ms / 1000.0,
                incidents=w.incidents,
                gpus=self._run_gpus,
                runs_ticks_ms=history_ticks(self.end_ms, self.days, RUNS_EVERY_S, RUNS_EVERY_S),
            )
            self.run_updates = run.updates
            self.run_step = run.step
            yield run.series

    def write(self, store: Store, clock: Clock) -> Imported:
        """Write the history into `store` (its bulk path: the writer encodes a GPU's series while the
        next is computed), hand the live simulation its counters, and return what was written."""
        began = clock.monotonic()
        n_series = n_samples = 0
        self.run_updates = []
        for chunk in self.chunks():
            chunk = [c for c in chunk if c[2].size]
            for name, labels, t, values in chunk:
                self.last[(name, labels)] = float(values[-1])
                n_samples += t.size
            for part in _parts(chunk, WRITE_SAMPLES):
                store.flush()  # the previous part written (while this one was computed): bounded memory
                store.append_many(part)
            n_series += len(chunk)
        for update in self.run_updates:
            store.upsert_run(update)
        store.flush()
        t_ms = self.ticks()
        return Imported(
            series=n_series,
            samples=n_samples,
            seconds=clock.monotonic() - began,
            last_ms=int(t_ms[-1]),
            last=[Sample(name, labels, value) for (name, labels), value in self.last.items()],
            run_step=self.run_step,
        )
