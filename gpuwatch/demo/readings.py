"""Every figure of a simulated GPU at many times at once: numpy twins of `workload.Workload`'s.

`WorkloadArrays(workload).readings(i, now)` gives, for an array of Unix times, the fields a
`Workload.reading` gives one time at a time, equal at every time (tests check it): the same hash, the
same value noise and incident schedule, in the same order of operations. The energy and PCIe byte
counters integrate on the same 10 s grid (`counters`), and `Workload.resume_counters` hands the
integrals at the end to the live simulation, so it goes on from there. Injected faults (`throttle`)
are not simulated here: a history is the demo's own workload.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuwatch.demo import nvmlnames
from gpuwatch.demo.incidents import IDLE, PCIE, STALL, THROTTLE, XID, Incident
from gpuwatch.demo.workload import ACTIVITY, EVAL_PERIOD_S, Workload

_C0, _C1, _C2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
GRID_S = 10.0  # workload._Integral.STEP
_HW = (
    nvmlnames.REASON_HW_SLOWDOWN
    | nvmlnames.REASON_HW_THERMAL_SLOWDOWN
    | nvmlnames.REASON_HW_POWER_BRAKE_SLOWDOWN
)
_GPM_FIELDS = (
    "gr_active",
    "sm_active",
    "sm_occupancy",
    "tensor_active",
    "dram_active",
    "fp64_active",
    "fp32_active",
    "fp16_active",
    "nvlink_tx_mib_s",
    "nvlink_rx_mib_s",
)


def mix_array(*keys: int | np.ndarray) -> np.ndarray:
    """`workload.mix` over arrays of keys (int64 keys wrap to 64 bits as `k & MASK` does)."""
    shape = np.broadcast_shapes(*(np.shape(k) for k in keys))
    x = np.full(shape or (1,), _C0, dtype=np.uint64)  # arrays, never scalars: they wrap without warning
    for k in keys:
        key = (
            np.asarray(k).astype(np.int64).astype(np.uint64)
            if np.ndim(k)
            else np.uint64(int(k) & (2**64 - 1))
        )
        x = (x ^ key) * _C1
        x ^= x >> np.uint64(31)
    x = x * _C2
    return (x ^ (x >> np.uint64(29))).reshape(shape)


def h01_array(*keys: int | np.ndarray) -> np.ndarray:
    """`workload._h01` over arrays of keys: numbers in [0, 1)."""
    return (mix_array(*keys) >> np.uint64(11)).astype(np.float64) / 9007199254740992.0


def round_half_even(x: np.ndarray, digits: int = 0) -> np.ndarray:
    """Python's `round(x, digits)`, as numpy rounds (half to even; a last-bit difference is possible
    where `x * 10**digits` is not exact)."""
    return np.round(x, digits)


@dataclass(frozen=True)
class Spans:
    """Incidents of one kind as sorted [start, end) seconds since the schedule's start, with their GPU."""

    start: np.ndarray
    end: np.ndarray
    gpu: np.ndarray
    xid: np.ndarray

    @classmethod
    def of(cls, incidents: list[Incident]) -> Spans:
        incidents = sorted(incidents, key=lambda x: x.start_s)
        return cls(
            np.array([x.start_s for x in incidents], dtype=np.float64),
            np.array([x.end_s for x in incidents], dtype=np.float64),
            np.array([x.gpu for x in incidents], dtype=np.int64),
            np.array([x.xid for x in incidents], dtype=np.int64),
        )

    def find(self, e: np.ndarray) -> np.ndarray:
        """The index of the incident active at each elapsed time `e` (-1 for none)."""
        k = np.searchsorted(self.start, e, side="right") - 1
        hit = (k >= 0) & (e >= 0)
        hit[hit] &= e[hit] < self.end[k[hit]]
        return np.where(hit, k, -1)


class WorkloadArrays:
    """The figures of `workload`'s GPUs at arrays of times (see the module docstring)."""

    def __init__(self, workload: Workload, until: float) -> None:
        """`until`: the last Unix time asked about (the incident schedule is read up to it)."""
        self.w = workload
        sched = workload.incidents
        self._spans: dict[str, Spans] = {}
        if sched is not None:
            hours = int(max(0.0, sched.elapsed(until)) // 3600.0) + 2
            every = [x for h in range(hours) for x in sched.hour(h)]
            for kind in (THROTTLE, IDLE, STALL, XID, PCIE):
                self._spans[kind] = Spans.of([x for x in every if x.kind == kind])

    # -- the schedule ----------------------------------------------------------------------------

    def elapsed(self, t: np.ndarray) -> np.ndarray:
        """Seconds since the schedule's start at workload time `t`, as `IncidentSchedule.active` computes it."""
        sched = self.w.incidents
        assert sched is not None
        return (self.w.start + t) - sched.start

    def active(self, kind: str, t: np.ndarray, gpu: int | None = None) -> np.ndarray:
        """Whether an incident of `kind` (on `gpu`, where given) is going on at workload times `t`."""
        spans = self._spans.get(kind)
        if spans is None or spans.start.size == 0:
            return np.zeros(np.shape(t), dtype=bool)
        k = spans.find(self.elapsed(t))
        hit = k >= 0
        if gpu is not None:
            hit &= spans.gpu[np.maximum(k, 0)] == gpu
        return hit

    def spans(self, kind: str) -> Spans | None:
        """The schedule's incidents of `kind` (None without a schedule)."""
        return self._spans.get(kind)

    # -- signals (workload.Workload's, one for one) ----------------------------------------------

    def knot(self, i: int, channel: int, k: int | np.ndarray) -> np.ndarray:
        return h01_array(self.w.seed, i, channel, k)

    def smooth(self, i: int, channel: int, t: np.ndarray, period: float) -> np.ndarray:
        x = t / period
        k = np.floor(x)
        fr = x - k
        fr = fr * fr * (3.0 - 2.0 * fr)
        ki = k.astype(np.int64)
        a = self.knot(i, channel, ki)
        return a + (self.knot(i, channel, ki + 1) - a) * fr

    def stalled(self, i: int, t: np.ndarray) -> np.ndarray:
        if self.w.roles[i] not in ("training", "warmup"):
            return np.zeros(t.shape, dtype=bool)
        return self.active(STALL, t)

    def train_util(self, i: int, t: np.ndarray) -> np.ndarray:
        busy = np.minimum(100.0, np.maximum(85.0, 93.0 + 7.0 * (2.0 * self.smooth(i, 1, t, 3.0) - 1.0)))
        pause = np.mod(t + 120.0, EVAL_PERIOD_S) < 20.0
        out = np.where(pause, 20.0 + 20.0 * self.knot(i, 101, np.trunc(t).astype(np.int64)), busy)
        return np.where(self.stalled(i, t), 100.0, out)

    def util(self, i: int, t: np.ndarray) -> np.ndarray:
        role = self.w.roles[i]
        if role == "training":
            return self.train_util(i, t)
        if role == "inference":
            burst = np.maximum(0.0, (self.smooth(i, 2, t, 4.0) - 0.3) / 0.7)
            return 25.0 + 72.0 * burst**0.8
        if role == "notebook":
            used = 15.0 + 40.0 * self.smooth(i, 11, t, 45.0) ** 2
            return np.where(self.active(IDLE, t), 0.0, used)
        if role == "warmup":
            ramp = np.minimum(1.0, 0.1 + (t - 45.0) / 240.0) * self.train_util(i, t)
            return np.where(t >= 45.0, ramp, 0.0)
        return np.zeros(t.shape)

    def throttle(self, i: int, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(clock-event reasons, temperature floor) of GPU `i` from the schedule's overheating."""
        mask = np.zeros(t.shape, dtype=np.int64)
        floor = np.zeros(t.shape)
        spans = self._spans.get(THROTTLE)
        if spans is None:
            return mask, floor
        now = self.elapsed(t)
        hot = 89.0 + 2.0 * float(self.knot(i, 108, 0))
        for start, end, gpu in zip(spans.start, spans.end, spans.gpu, strict=True):
            if gpu != i:
                continue
            # IncidentSchedule.during(now - 90, now + 1e-3): overlapping, then active or cooling down
            near = (start < now + 1e-3) & (end > now - 90.0)
            if not near.any():
                continue
            on = near & (start <= now) & (now < end)
            u = now - start
            floor = np.where(on, np.maximum(floor, 72.0 + (hot - 72.0) * np.minimum(1.0, u / 60.0)), floor)
            mask = np.where(on & (u >= 60.0), mask | nvmlnames.REASON_HW_THERMAL_SLOWDOWN, mask)
            cool = near & ~on & (now >= end)
            floor = np.where(cool, np.maximum(floor, hot - (hot - 72.0) * (now - end) / 90.0), floor)
        return mask, floor

    def app_used_mib(self, i: int, t: np.ndarray) -> np.ndarray:
        spec, role = self.w.spec, self.w.roles[i]
        usable = spec.memory_mib - spec.reserved_mib
        idle = 0.005 * spec.memory_mib * (1.0 + float(self.knot(i, 103, 0)))
        k104 = float(self.knot(i, 104, 0))
        if role == "training":
            frac = 0.62 + 0.24 * k104 + 0.004 * (self.smooth(i, 4, t, 30.0) - 0.5)
        elif role == "inference":
            frac = np.full(t.shape, 0.895 + 0.002 * k104)
        elif role == "notebook":
            frac = np.full(t.shape, 0.24 + 0.05 * k104)
        elif role == "warmup":
            frac = np.maximum(idle / usable, 0.85 * np.minimum(1.0, (t - 20.0) / 180.0))
            return np.where(t >= 20.0, frac * usable, idle)
        else:
            return np.full(t.shape, idle)
        return frac * usable

    def power(self, i: int, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Power draw in W, and whether the software power cap holds it down."""
        spec = self.w.spec
        u = self.util(i, t) / 100.0
        wobble = 2.0 * self.smooth(i, 5, t, 2.0) - 1.0
        busy = 8.0 if self.w.roles[i] != "idle" else 0.0
        resting = spec.idle_power_w + busy + 1.5 * wobble
        p = spec.idle_power_w + (0.99 * spec.power_limit_w - spec.idle_power_w) * np.maximum(u, 0.0) ** 1.25
        p += 0.01 * spec.power_limit_w * wobble
        cap = 0.965 * spec.power_limit_w
        capped = (u > 0.0) & (p >= cap)
        return np.where(u <= 0.0, resting, np.where(capped, cap, p)), capped

    def pcie_rate(self, i: int, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """PCIe (TX, RX) bytes per second."""
        role, u = self.w.roles[i], self.util(i, t) / 100.0
        jitter = 0.5 + self.smooth(i, 6, t, 5.0)
        if role in ("training", "warmup"):
            tx, rx = 0.4e9 * u * jitter, 1.5e9 * u * jitter
            if role == "warmup":
                loading = (t >= 20.0) & (t < 60.0)
                tx, rx = np.where(loading, 0.05e9, tx), np.where(loading, 11e9 * jitter, rx)
            return tx, rx
        if role == "inference":
            return 0.12e9 * u * jitter, 0.25e9 * u * jitter
        return 2e3 * jitter, 3e3 * jitter

    # -- counters on the 10 s grid ---------------------------------------------------------------

    def integral(self, rate: np.ndarray, t: np.ndarray, rate_at_t: np.ndarray) -> np.ndarray:
        """`_Integral.at(t)` for all `t` at once, given `rate` on the grid (0, 10 s, ...) past max(t)."""
        values = np.concatenate(([0.0], np.cumsum(rate * GRID_S)))
        k = np.floor_divide(t, GRID_S).astype(np.int64)
        out = values[np.maximum(k, 0)] + rate_at_t * (t - k * GRID_S)
        return np.where(t <= 0, 0.0, out)

    def counters(self, i: int, t: np.ndarray) -> dict[str, np.ndarray]:
        """The energy (mJ) and PCIe byte counters at workload times `t` (ascending), and the integrals
        at the last grid point at or before t[-1] (`*_grid`, for `Workload.resume_counters`)."""
        last = int(np.floor_divide(t[-1], GRID_S)) if t.size else 0
        grid = np.arange(last + 1, dtype=np.int64) * GRID_S
        k = np.floor_divide(t, GRID_S).astype(np.int64)
        at_k = np.maximum(k, 0) * GRID_S
        spec = self.w.spec
        p_grid, p_k = self.power(i, grid)[0] * 1000.0, self.power(i, at_k)[0] * 1000.0
        tx_grid, rx_grid = self.pcie_rate(i, grid)
        tx_k, rx_k = self.pcie_rate(i, at_k)
        energy = self.integral(p_grid[:-1], t, p_k)
        tx = self.integral(tx_grid[:-1], t, tx_k)
        rx = self.integral(rx_grid[:-1], t, rx_k)
        base_e = spec.idle_power_w * 3.6e6 * (2 + 20 * float(self.knot(i, 111, 0)))
        return {
            "energy_mj": np.trunc(base_e + energy),
            "pcie_tx": np.trunc(1e12 * float(self.knot(i, 112, 0)) + tx),
            "pcie_rx": np.trunc(4e12 * float(self.knot(i, 113, 0)) + rx),
            "energy_grid": np.concatenate(([0.0], np.cumsum(p_grid[:-1] * GRID_S))),
            "tx_grid": np.concatenate(([0.0], np.cumsum(tx_grid[:-1] * GRID_S))),
            "rx_grid": np.concatenate(([0.0], np.cumsum(rx_grid[:-1] * GRID_S))),
        }

    def pcie_replays(self, i: int, now: np.ndarray) -> np.ndarray:
        """PCIe replays of GPU `i` at Unix times `now`: 40 over each of its PCIe incidents' 2 minutes."""
        total = np.zeros(now.shape, dtype=np.int64)
        spans = self._spans.get(PCIE)
        if spans is None or self.w.incidents is None:
            return total
        e = now - self.w.incidents.start
        for start, end, gpu in zip(spans.start, spans.end, spans.gpu, strict=True):
            if gpu == i:
                part = np.minimum(1.0, (e - start) / (end - start))
                total += np.where(e > start, np.trunc(40 * part), 0).astype(np.int64)
        return total

    # -- the reading -----------------------------------------------------------------------------

    def readings(self, i: int, now: np.ndarray) -> dict[str, np.ndarray]:
        """`Workload.reading(i, now)`'s fields at each Unix time of `now` (ascending), as arrays."""
        w, spec = self.w, self.w.spec
        if w.throttle[i]:
            raise ValueError("a history simulates the demo's workload, not injected faults")
        t = now - w.start
        throttle, temp_floor = self.throttle(i, t)
        util = self.util(i, t)
        power, capped = self.power(i, t)
        lagged = (
            0.5 * self.power(i, t - 10)[0] + 0.3 * self.power(i, t - 40)[0] + 0.2 * self.power(i, t - 120)[0]
        )
        temp = 27.0 + 48.0 * lagged / spec.power_limit_w + 1.5 * (self.smooth(i, 7, t, 20.0) - 0.5)
        hot = (throttle & (nvmlnames.REASON_HW_THERMAL_SLOWDOWN | nvmlnames.REASON_HW_SLOWDOWN)) != 0
        temp = np.where(hot, np.maximum(temp, 89.0 + 3.0 * float(self.knot(i, 108, 0))), temp)
        temp = np.maximum(temp, temp_floor)
        role = w.roles[i]
        resting = np.full(t.shape, role == "idle") | ((t < 20.0) if role == "warmup" else False)
        pstate = np.where(resting, 8, 0)
        reasons = throttle | np.where(util < 0.5, nvmlnames.REASON_GPU_IDLE, 0)
        reasons |= np.where(capped, nvmlnames.REASON_SW_POWER_CAP, 0)
        steps = np.trunc(4 * self.smooth(i, 9, t, 7.0))
        sm = np.where(util < 0.5, 0.9 * spec.max_sm_mhz, spec.max_sm_mhz - 15.0 * steps)
        sm = np.where(resting, float(spec.idle_sm_mhz), sm)
        sm = np.where(capped, sm * 0.93, sm)
        sm = np.where((throttle & _HW) != 0, sm * 0.45, sm)
        share = 0.6 if role == "inference" else 0.45
        mem_util = util * share * (0.8 + 0.4 * self.smooth(i, 10, t, 3.0))
        out = {
            "util": round_half_even(util),
            "mem_util": round_half_even(mem_util),
            "app_used_mib": self.app_used_mib(i, t),
            "power_w": round_half_even(power, 3),
            "temp": round_half_even(temp),
            "mem_temp": round_half_even(temp + 4.0),
            "sm_mhz": 15 * round_half_even(sm / 15),
            "mem_mhz": np.where(resting, spec.idle_mem_mhz, spec.mem_mhz).astype(np.float64),
            "pstate": pstate.astype(np.float64),
            "reasons": reasons,
            "fan": np.minimum(100, np.trunc(30 + 0.45 * util + np.maximum(0.0, temp - 50.0) * 0.5)),
        }
        out.update(self.activity(i, t, util / 100.0, sm / spec.max_sm_mhz))
        out.update(self.counters(i, t))
        return out

    def activity(self, i: int, t: np.ndarray, u: np.ndarray, clock: np.ndarray) -> dict[str, np.ndarray]:
        """The GPM figures (0 where the GPU does no work or its role has none)."""
        role = self.w.roles[i]
        if role not in ACTIVITY:
            return {name: np.zeros(t.shape) for name in _GPM_FIELDS}
        per_util, tensor_share, occupancy, dram = ACTIVITY[role]
        wobble = 0.95 + 0.1 * self.smooth(i, 12, t, 5.0)
        stalled = self.stalled(i, t)
        per_util_a = np.where(stalled, 0.03, per_util)
        tensor_a = np.where(stalled, 0.0, tensor_share)
        occupancy_a = np.where(stalled, 0.02, occupancy)
        dram_a = np.where(stalled, 0.01, dram)
        sm = np.minimum(1.0, u * per_util_a * wobble * np.minimum(1.0, 0.4 + 0.6 * clock))
        nvlink = np.zeros(t.shape)
        if role in ("training", "warmup"):
            nvlink = np.where(stalled, 0.0, 90_000.0 * u * (0.5 + self.smooth(i, 13, t, 6.0)))
        figures = {
            "gr_active": round_half_even(np.minimum(1.0, u * (0.97 + 0.03 * self.smooth(i, 14, t, 3.0))), 4),
            "sm_active": round_half_even(sm, 4),
            "sm_occupancy": round_half_even(
                np.minimum(1.0, sm * occupancy_a / np.maximum(per_util_a, 0.01) * 0.9), 4
            ),
            "tensor_active": round_half_even(sm * tensor_a, 4),
            "dram_active": round_half_even(np.minimum(1.0, u * dram_a * wobble), 4),
            "fp64_active": np.zeros(t.shape),
            "fp32_active": round_half_even(sm * (0.30 if role == "notebook" else 0.12), 4),
            "fp16_active": round_half_even(sm * 0.08, 4),
            "nvlink_tx_mib_s": round_half_even(nvlink, 1),
            "nvlink_rx_mib_s": round_half_even(nvlink * 0.98, 1),
        }
        idle = u <= 0.0
        return {name: np.where(idle, 0.0, v) for name, v in figures.items()}
