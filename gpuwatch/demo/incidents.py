"""The demo's incident schedule: a mostly healthy lab with one incident every quarter of an hour.

A deterministic function of the seconds since `start` (the demo's start), so the simulated GPUs, the
simulated inference servers and the simulated training run, each asking with its own clock reading,
agree on what is going on. Every hour (`CYCLE_S`) runs the same four slots, varied by the hour's number:

    3:00 - 10:00   a GPU overheats: its temperature climbs past 85 C in a minute, then the clock is
                   throttled (hw_thermal_slowdown); a different training GPU each hour
    12:00 - 15:00  the notebook's user steps away: the kernel keeps its GPU memory at 0 % utilization,
                   idle but held (GPUUtilizationLow and GPUMemoryHeldIdle pending, far from their 30 min)
    15:00 - 22:00  an inference latency spike: load 2x, requests 3.5x slower, half as many running, so the
                   queue grows to hundreds and P99 latency and TTFT go to tens of seconds (vLLM in even
                   hours, SGLang in odd ones)
    31:00 - 44:00  the training run stalls: no step logged for 13 minutes (the GPUs still show 100 %
                   utilization, as a hung NCCL collective does, but SM activity drops to nothing)
    48:00          hardware: in even hours an XID (79 "fell off the bus" with the GPU lost for 90 s in
                   hours 0, 4, ...; 31 "memory page fault" in hours 2, 6, ...), in odd hours a burst of
                   PCIe replays on one GPU

Outside these windows every figure stays inside the built-in rules' limits, so no alert is pending.
`EXPECTED` lists, per kind, the built-in alerts an incident raises and how long after its end they may
last (a rule's `for`, rate window or lookback: the XID rules look back an hour).
"""

from __future__ import annotations

from dataclasses import dataclass

CYCLE_S = 3600.0
TRAINING_GPUS = (0, 4, 5, 7)  # the "mixed" workload's training GPUs (workload._MIXED_ROLES)
NOTEBOOK_GPU = 2  # and its notebook's

THROTTLE, IDLE, LATENCY, STALL = "gpu_throttle", "idle_held", "latency_spike", "training_stall"
XID, PCIE = "xid", "pcie_replays"
KINDS = (THROTTLE, IDLE, LATENCY, STALL, XID, PCIE)

# kind -> (alerts it may raise, seconds after its end they may still be active)
EXPECTED: dict[str, tuple[frozenset[str], float]] = {
    THROTTLE: (frozenset({"GPUTemperatureHigh", "GPUThrottled", "GPUMemoryTemperatureHigh"}), 120.0),
    IDLE: (frozenset({"GPUUtilizationLow", "GPUMemoryHeldIdle"}), 0.0),  # pending; gone once it is used
    LATENCY: (
        frozenset(
            {
                "InferenceLatencyHigh",
                "InferenceTTFTHigh",
                "InferenceQueueBacklog",
                "InferenceErrorRateHigh",
                "InferenceKVCacheFull",
                "InferencePreemptions",
            }
        ),
        480.0,  # a 5m rate window, a 30 s quantile round, the queue draining
    ),
    # the first step after the stall logs its throughput over the whole gap: one low sample
    STALL: (frozenset({"TrainingRunStalled", "TrainingThroughputDrop"}), 60.0),
    XID: (frozenset({"GPUXidErrorCritical", "GPUXidError", "GPULost"}), 3660.0),  # "within the hour"
    PCIE: (frozenset({"GPUPCIeReplays"}), 960.0),  # increase over 15m
}


@dataclass(frozen=True)
class Incident:
    """One incident: `start_s` and `end_s` are seconds since the schedule's start."""

    kind: str
    start_s: float
    end_s: float
    gpu: int = -1  # the GPU it happens on, -1 for none
    engine: str = ""  # "vllm" or "sglang" for a latency spike
    xid: int = 0

    def is_active(self, t: float) -> bool:
        return self.start_s <= t < self.end_s


class IncidentSchedule:
    """The incidents of a demo that started at Unix time `start`, on `gpu_count` simulated GPUs."""

    def __init__(self, start: float, gpu_count: int = 8) -> None:
        self.start = start
        self.gpu_count = max(1, gpu_count)
        self._hours: dict[int, tuple[Incident, ...]] = {}

    def _gpu(self, index: int) -> int:
        return index % self.gpu_count

    def hour(self, h: int) -> tuple[Incident, ...]:
        """The incidents of hour `h` (0: the first hour of the demo)."""
        found = self._hours.get(h)
        if found is None:
            base = h * CYCLE_S
            hot = self._gpu(TRAINING_GPUS[h % len(TRAINING_GPUS)])
            hw_gpu = self._gpu(TRAINING_GPUS[(h + 2) % len(TRAINING_GPUS)])
            found = (
                Incident(THROTTLE, base + 180, base + 600, gpu=hot),
                Incident(IDLE, base + 720, base + 900, gpu=self._gpu(NOTEBOOK_GPU)),
                Incident(LATENCY, base + 900, base + 1320, engine="vllm" if h % 2 == 0 else "sglang"),
                Incident(STALL, base + 1860, base + 2640),
                Incident(XID, base + 2880, base + 2970, gpu=hw_gpu, xid=79 if h % 4 == 0 else 31)
                if h % 2 == 0
                else Incident(PCIE, base + 2880, base + 3000, gpu=hw_gpu),
            )
            if len(self._hours) > 64:
                self._hours.clear()
            self._hours[h] = found
        return found

    def elapsed(self, now: float) -> float:
        return now - self.start

    def active(self, now: float, kind: str) -> Incident | None:
        """The incident of `kind` going on at Unix time `now`, if any."""
        t = self.elapsed(now)
        if t < 0:
            return None
        for incident in self.hour(int(t // CYCLE_S)):
            if incident.kind == kind and incident.is_active(t):
                return incident
        return None

    def started_between(self, t0: float, t1: float, kind: str) -> list[Incident]:
        """The incidents of `kind` that started in (t0, t1], Unix times."""
        a, b = self.elapsed(t0), self.elapsed(t1)
        if b < 0 or b <= a:
            return []
        first, last = int(max(a, 0) // CYCLE_S), int(b // CYCLE_S)
        return [
            incident
            for h in range(first, last + 1)
            for incident in self.hour(h)
            if incident.kind == kind and a < incident.start_s <= b
        ]

    def during(self, t0: float, t1: float) -> list[Incident]:
        """The incidents overlapping the seconds-since-start interval [t0, t1)."""
        first, last = int(max(t0, 0) // CYCLE_S), int(max(t1, 0) // CYCLE_S)
        return [
            incident
            for h in range(max(0, first - 1), last + 1)
            for incident in self.hour(h)
            if incident.start_s < t1 and incident.end_s > t0
        ]
