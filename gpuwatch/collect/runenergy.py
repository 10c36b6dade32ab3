"""Energy per training run: the increase of its GPUs' energy counters while it held them.

A run holds a GPU for `HOLD_MS` after each `gpuwatch_run_gpu_info` sample (written every 15 s while
it runs). Its energy is the sum, over those GPUs, of the increases of
`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` (mJ since the driver loaded) between consecutive samples that
end inside a held stretch; a counter that went down (driver reloaded) counts from zero. Two runs
sharing a GPU are each charged the whole GPU. The figure is exact to within one job interval at
either end of each stretch.

`RunEnergy` keeps what it summed per run, so each call reads only what is new, at most every 15 s
for a running run; a finished run is read once. It holds at most `max_runs` runs (then starts over, costing one re-read each).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpuwatch.collect.rungpus import INFO_METRIC, GpuRef
from gpuwatch.core.model import Matcher, MetricInfo, RunRecord, Sample, SeriesData, is_stale, stable_labels

ENERGY_METRIC = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
MJ_PER_KWH = 3.6e9
HOLD_MS = 20_000  # an info sample (every 15 s) covers the next 20 s
MAX_GAP_MS = 60_000  # counter samples further apart than this, across a gap in holding, are not summed
SETTLE_MS = 30_000  # samples younger than this may still wait in the store's queue: read them next time
REREAD_MS = 15_000  # a running run is read again at most this often (info samples come every 15 s)

RUN_ENERGY_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "gpuwatch_run_energy_kwh",
        "gauge",
        "Energy a training run's GPUs used while it held them, from their energy counters (kWh).",
        "kWh",
        ("run",),
    ),
)


class RangeSource(Protocol):
    """What summing energy reads from the store."""

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...


@dataclass
class _Sum:
    start_ms: int | None
    upto_ms: int
    mj: float = 0.0
    held_any: bool = False
    last: dict[GpuRef, tuple[int, float]] = field(default_factory=dict)  # the newest counter sample read


def held_stretches(series: Sequence[SeriesData]) -> dict[GpuRef, list[tuple[int, int]]]:
    """Return, per GPU, the merged [start, end) stretches its info samples say the run held it."""
    out: dict[GpuRef, list[tuple[int, int]]] = {}
    for s in series:
        labels = dict(s.labels)
        ref = GpuRef(labels.get("Hostname", ""), labels.get("gpu", ""), labels.get("UUID", ""))
        spans = out.setdefault(ref, [])
        for t, v in zip(s.timestamps_ms, s.values, strict=True):
            if is_stale(float(v)) or not float(v) > 0:
                continue
            t = int(t)
            if spans and t <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], t + HOLD_MS))
            else:
                spans.append((t, t + HOLD_MS))
    return {k: v for k, v in out.items() if v}


def increase_within(
    samples: Sequence[tuple[int, float]], spans: Sequence[tuple[int, int]], after_ms: int, upto_ms: int
) -> float:
    """Sum counter increases between consecutive samples that end in (after_ms, upto_ms] inside a span."""
    total = 0.0
    for (t0, v0), (t1, v1) in itertools.pairwise(samples):
        if not after_ms < t1 <= upto_ms:
            continue
        for a, b in spans:
            if a <= t1 < b and t0 >= a - MAX_GAP_MS:
                total += v1 - v0 if v1 >= v0 else v1
                break
    return total


class RunEnergy:
    """Energy per run, summed incrementally (thread-safe; one per reader: the web, the runs job)."""

    def __init__(self, max_runs: int = 10_000) -> None:
        self.max_runs = max_runs
        self._sums: dict[str, _Sum] = {}
        self._lock = threading.Lock()

    def kwh(self, source: RangeSource, record: RunRecord, now_ms: int) -> float | None:
        """Return the run's energy so far in kWh, or None when it never held a GPU whose energy counter
        gpuwatch samples."""
        with self._lock:
            acc = self._sums.get(record.name)
            if acc is None or acc.start_ms != record.start_ms:
                if len(self._sums) >= self.max_runs:
                    self._sums.clear()
                begin = (record.start_ms or now_ms) - HOLD_MS
                acc = self._sums[record.name] = _Sum(record.start_ms, begin)
            end = now_ms - SETTLE_MS
            if record.end_ms is not None:
                end = min(end, record.end_ms)
            finished = record.end_ms is not None and end >= record.end_ms
            if end > acc.upto_ms and (finished or end - acc.upto_ms >= REREAD_MS):
                self._add(source, record.name, acc, end)
            return acc.mj / MJ_PER_KWH if acc.held_any else None

    def _add(self, source: RangeSource, run: str, acc: _Sum, end_ms: int) -> None:
        info = source.select(
            [Matcher("__name__", "=", INFO_METRIC), Matcher("run", "=", run)], acc.upto_ms - HOLD_MS, end_ms
        )
        for ref, spans in held_stretches(info).items():
            prev = acc.last.get(ref)
            start = prev[0] if prev is not None else spans[0][0] - MAX_GAP_MS
            found = source.select(
                [
                    Matcher("__name__", "=", ENERGY_METRIC),
                    Matcher("Hostname", "=", ref.hostname),
                    Matcher("gpu", "=", ref.gpu),
                    Matcher("UUID", "=", ref.uuid),
                ],
                start,
                end_ms,
            )
            samples = [
                (int(t), float(v))
                for s in found[:1]
                for t, v in zip(s.timestamps_ms, s.values, strict=True)
                if math.isfinite(float(v))
            ]
            if samples:
                acc.held_any = True  # a GPU without an energy counter (before Volta) shows no energy
            if prev is not None and (not samples or samples[0][0] > prev[0]):
                samples.insert(0, prev)
            acc.mj += increase_within(samples, spans, acc.upto_ms, end_ms)
            newest = [s for s in samples if s[0] <= end_ms]
            if newest:
                acc.last[ref] = newest[-1]
        acc.upto_ms = end_ms


def energy_samples(
    energy: RunEnergy, records: Sequence[RunRecord], source: RangeSource, now_ms: int, keep_ms: int
) -> list[Sample]:
    """`gpuwatch_run_energy_kwh{run}` for running runs and those finished within `keep_ms`."""
    out = []
    for r in records:
        if r.status != "running" and now_ms - (r.end_ms or 0) > keep_ms:
            continue
        kwh = energy.kwh(source, r, now_ms)
        if kwh is not None:
            out.append(Sample("gpuwatch_run_energy_kwh", stable_labels({"run": r.name}), kwh))
    return out
