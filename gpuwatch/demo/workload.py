"""The simulated GPUs behind FakeNvml: model specs and a deterministic workload over time.

Every figure is a function of (seed, GPU index, seconds since start), the throttle mask and the
demo's incident schedule (incidents.py), except the energy and PCIe byte counters, which integrate
power and traffic on a 10 s grid. The GPM figures (SM activity, tensor, DRAM, NVLink) follow the role:
a stalled training run keeps its GPUs at 100 % utilization with idle SMs, as a hung collective does.
"""

from __future__ import annotations

import math
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from gpuwatch.demo import nvmlnames
from gpuwatch.demo.incidents import IDLE, PCIE, STALL, THROTTLE, Incident, IncidentSchedule

MIB = 1 << 20
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class GpuModelSpec:
    """Published figures of one GPU model (reserved memory and idle figures approximate)."""

    name: str
    memory_mib: int
    reserved_mib: int
    power_limit_w: float
    idle_power_w: float
    max_sm_mhz: int
    idle_sm_mhz: int
    mem_mhz: int
    idle_mem_mhz: int
    is_datacenter: bool  # HBM with ECC, memory temperature and row remapping; passively cooled (no fan)
    pci_device_id: int
    has_gpm: bool = False  # GPU Performance Monitoring (Hopper and later): SM activity, tensor, DRAM


MODELS: dict[str, GpuModelSpec] = {
    m.name: m
    for m in (
        GpuModelSpec(
            "NVIDIA H100 80GB HBM3", 81559, 525, 700.0, 72.0, 1980, 345, 2619, 2619, True, 0x233010DE, True
        ),
        GpuModelSpec(
            "NVIDIA A100-SXM4-80GB", 81920, 552, 400.0, 58.0, 1410, 210, 1593, 1593, True, 0x20B210DE
        ),
        GpuModelSpec("NVIDIA H200", 143771, 580, 700.0, 76.0, 1980, 345, 3201, 3201, True, 0x233510DE, True),
        GpuModelSpec(
            "NVIDIA GeForce RTX 4090", 24564, 340, 450.0, 22.0, 2520, 210, 10501, 405, False, 0x268410DE
        ),
    )
}
WORKLOADS = ("mixed", "training", "inference", "idle")
# "mixed" on 8 GPUs: four training, two inference, one notebook (someone's interactive session, light
# load), one warming up (later ones train). No GPU sits idle: an idle GPU is what GPUUtilizationLow
# reports, and a healthy demo lab raises no alert between its incidents (incidents.py).
_MIXED_ROLES = (
    "training",
    "inference",
    "notebook",
    "warmup",
    "training",
    "training",
    "inference",
    "training",
)
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
# (process name, uid, cgroup kind) of the process each role runs
ROLE_PROCESS = {
    "training": ("python", 1000, "kubepods"),
    "warmup": ("python", 1000, "host"),
    "inference": ("vllm", 0, "docker"),
    "notebook": ("python", 1001, "host"),
}
# Seconds between a training run's evaluation/checkpoint pauses (20 s of low load each).
EVAL_PERIOD_S = 1800.0
_HW_SLOWDOWN = (
    nvmlnames.REASON_HW_SLOWDOWN
    | nvmlnames.REASON_HW_THERMAL_SLOWDOWN
    | nvmlnames.REASON_HW_POWER_BRAKE_SLOWDOWN
)


def mix(*keys: int) -> int:
    """Hash integers to 64 bits (splitmix64 finaliser)."""
    x = 0x9E3779B97F4A7C15
    for k in keys:
        x = ((x ^ (k & _MASK)) * 0xBF58476D1CE4E5B9) & _MASK
        x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 29)


def _h01(*keys: int) -> float:
    """A deterministic pseudo-random number in [0, 1)."""
    return (mix(*keys) >> 11) / 9007199254740992.0


class _Integral:
    """The integral from 0 to t of rate(s) on a 10 s grid, memoised; a jump over a day is bridged at the mean.

    The last `KEEP` grid points (85 minutes) are kept, as doubles (not float objects), and trimmed every
    `TRIM` points: 192 of them (64 GPUs) held a float object for each of up to 1,024 points, grown over
    2 h 50 min."""

    STEP = 10.0
    MAX_GAP = 8640
    KEEP = 512
    TRIM = 64

    def __init__(self, rate: Callable[[float], float]) -> None:
        self.rate = rate
        self.base = 0  # grid index of values[0]
        self.values = array("d", [0.0])

    def at(self, t: float) -> float:
        if t <= 0:
            return 0.0
        k = int(t // self.STEP)
        last = self.base + len(self.values) - 1
        if k < self.base:  # the clock went back past what is kept: interpolate
            return self.values[0] * t / (self.base * self.STEP)
        if k - last > self.MAX_GAP:
            mean = sum(self.rate((last + (k - last) * j / 16) * self.STEP) for j in range(16)) / 16
            self.values = array("d", [self.values[-1] + mean * (k - last) * self.STEP])
            self.base = last = k
        while last < k:
            self.values.append(self.values[-1] + self.rate(last * self.STEP) * self.STEP)
            last += 1
        if len(self.values) > self.KEEP + self.TRIM:
            del self.values[: -self.KEEP]
            self.base = last - len(self.values) + 1
        return self.values[k - self.base] + self.rate(k * self.STEP) * (t - k * self.STEP)

    def resume(self, k: int, value: float) -> None:
        """Go on from `value`, the integral up to grid point `k` (computed elsewhere: a history)."""
        self.base, self.values = k, array("d", [value])


@dataclass(frozen=True, slots=True)
class Reading:
    """Every changing figure of one GPU at one instant."""

    util: int
    mem_util: int
    app_used_mib: float  # used by processes, excluding what the driver reserves
    power_w: float
    temp: int
    mem_temp: int
    sm_mhz: int
    mem_mhz: int
    pstate: int
    reasons: int
    fan: int
    energy_mj: int
    pcie_tx: int
    pcie_rx: int
    # GPM figures (fractions 0-1 of the interval; NVLink in MiB/s), as GPM would measure them
    gr_active: float = 0.0
    sm_active: float = 0.0
    sm_occupancy: float = 0.0
    tensor_active: float = 0.0
    dram_active: float = 0.0
    fp64_active: float = 0.0
    fp32_active: float = 0.0
    fp16_active: float = 0.0
    nvlink_tx_mib_s: float = 0.0
    nvlink_rx_mib_s: float = 0.0


# role -> (SM activity per unit of utilization, tensor share of SM activity, occupancy, DRAM per util)
ACTIVITY = {
    "training": (0.88, 0.62, 0.42, 0.55),
    "warmup": (0.88, 0.62, 0.42, 0.55),
    "inference": (0.72, 0.40, 0.30, 0.70),
    "notebook": (0.60, 0.15, 0.25, 0.30),
}


def host_key(hostname: str) -> int:
    """A stable number for `hostname` (0 for ""), mixed into the simulated GPUs' UUIDs."""
    return zlib.crc32(hostname.encode()) + 1 if hostname else 0


class Workload:
    """What each simulated GPU is doing at time t (seconds since `start`)."""

    KNOTS = 16

    def __init__(
        self,
        gpu_count: int,
        spec: GpuModelSpec,
        workload: str,
        seed: int,
        start: float,
        *,
        hostname: str = "",
        incidents: IncidentSchedule | None = None,
        serving_pid: int | None = None,
    ) -> None:
        if workload not in WORKLOADS:
            raise ValueError(f"unknown workload {workload!r}; choose one of: {', '.join(WORKLOADS)}")
        self.spec = spec
        self.seed = seed
        self.workload = workload
        self.host = host_key(hostname)
        self.incidents = incidents
        self.serving_pid = serving_pid
        self.start = start
        self.roles = [self._role(workload, i) for i in range(gpu_count)]
        self.throttle = [0] * gpu_count  # clock-event reason masks injected as faults
        self._cache: dict[int, tuple[float, int, Reading]] = {}
        self._knots: dict[tuple[int, int], dict[int, float]] = {}  # (GPU, channel) -> {k: knot}
        self._energy = [_Integral(partial(self._power_mw, i)) for i in range(gpu_count)]
        self._tx = [_Integral(partial(self._pcie_direction, i, 0)) for i in range(gpu_count)]
        self._rx = [_Integral(partial(self._pcie_direction, i, 1)) for i in range(gpu_count)]

    def _smooth(self, i: int, channel: int, t: float, period: float) -> float:
        """Value noise in [0, 1): random knots every `period` seconds, smoothly interpolated."""
        x = t / period
        k = math.floor(x)
        fr = x - k
        fr = fr * fr * (3.0 - 2.0 * fr)
        a = self._knot(i, channel, k)
        return a + (self._knot(i, channel, k + 1) - a) * fr

    def _knot(self, i: int, channel: int, k: int) -> float:
        """Knot `k` of a channel, the last `KNOTS` computed remembered per GPU and channel: a reading asks
        k and k + 1 at t and at t - 10, 40 and 120 s (the die's lagged power). A fixed size: a dict of
        every knot met grew by ~190 entries a second on 64 GPUs to ~7 MB, cleared every few minutes."""
        slot = self._knots.get((i, channel))
        if slot is None:
            slot = self._knots[(i, channel)] = {}
        value = slot.get(k)
        if value is None:
            if len(slot) >= self.KNOTS:
                del slot[next(iter(slot))]  # the first computed
            value = slot[k] = _h01(self.seed, i, channel, k)
        return value

    @staticmethod
    def _role(workload: str, i: int) -> str:
        if workload != "mixed":
            return workload
        role = _MIXED_ROLES[i % len(_MIXED_ROLES)]
        return "training" if role == "warmup" and i >= len(_MIXED_ROLES) else role

    def resume_counters(self, i: int, k: int, energy: float, tx: float, rx: float) -> None:
        """Go on from a history: GPU `i`'s energy (mJ) and PCIe byte integrals up to grid point `k`
        (k x 10 s since the start), as `readings.WorkloadArrays.counters` computed them."""
        self._energy[i].resume(k, energy)
        self._tx[i].resume(k, tx)
        self._rx[i].resume(k, rx)

    # -- identity --------------------------------------------------------------------------------

    def uuid(self, i: int) -> str:
        """A UUID stable per (seed, hostname, index): two demo hosts never share one."""
        keys = (self.seed, i) if not self.host else (self.seed, self.host, i)
        h = f"{mix(*keys, 101):016x}{mix(*keys, 102):016x}"
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"

    def pci_bus(self, i: int) -> tuple[int, int]:
        """(domain, bus) as on an HGX board: eight GPUs a domain."""
        return i // len(_HGX_BUSES), _HGX_BUSES[i % len(_HGX_BUSES)]

    # -- signals ---------------------------------------------------------------------------------

    def _incident(self, t: float, kind: str) -> Incident | None:
        return self.incidents.active(self.start + t, kind) if self.incidents is not None else None

    def _stalled(self, i: int, t: float) -> bool:
        """The training run hangs: its GPUs spin in a collective (busy, but the SMs do nothing)."""
        return self.roles[i] in ("training", "warmup") and self._incident(t, STALL) is not None

    def _train_util(self, i: int, t: float) -> float:
        if self._stalled(i, t):
            return 100.0
        if (t + 120.0) % EVAL_PERIOD_S < 20.0:  # evaluation / checkpoint, in step on all GPUs
            return 20.0 + 20.0 * self._knot(i, 101, int(t))
        return min(100.0, max(85.0, 93.0 + 7.0 * (2.0 * self._smooth(i, 1, t, 3.0) - 1.0)))

    def _util(self, i: int, t: float) -> float:
        role = self.roles[i]
        if role == "training":
            return self._train_util(i, t)
        if role == "inference":  # a served model under steady traffic, with bursts
            burst = max(0.0, (self._smooth(i, 2, t, 4.0) - 0.3) / 0.7)
            return 25.0 + 72.0 * burst**0.8
        if role == "notebook":
            if self._incident(t, IDLE) is not None:
                return 0.0  # its user stepped away; the kernel and its memory stay
            return 15.0 + 40.0 * self._smooth(i, 11, t, 45.0) ** 2
        if role == "warmup" and t >= 45.0:  # loading for 45 s, then ramping up over four minutes
            return min(1.0, 0.1 + (t - 45.0) / 240.0) * self._train_util(i, t)
        return 0.0

    def _throttle(self, i: int, t: float) -> tuple[int, float]:
        """(clock-event reasons, temperature floor) of GPU `i` now: injected faults and incidents."""
        mask, floor = self.throttle[i], 0.0
        if self.incidents is None:
            return mask, floor
        now = self.incidents.elapsed(self.start + t)
        for incident in self.incidents.during(now - 90.0, now + 1e-3):
            if incident.kind != THROTTLE or incident.gpu != i:
                continue
            hot = 89.0 + 2.0 * self._knot(i, 108, 0)
            if incident.is_active(now):
                # the die heats past 85 C within a minute, then the hardware slows the clock down
                u = now - incident.start_s
                floor = max(floor, 72.0 + (hot - 72.0) * min(1.0, u / 60.0))
                if u >= 60.0:
                    mask |= nvmlnames.REASON_HW_THERMAL_SLOWDOWN
            elif now >= incident.end_s:  # and cools down over a minute and a half
                floor = max(floor, hot - (hot - 72.0) * (now - incident.end_s) / 90.0)
        return mask, floor

    def _app_used_mib(self, i: int, t: float) -> float:
        spec, role = self.spec, self.roles[i]
        usable = spec.memory_mib - spec.reserved_mib
        idle = 0.005 * spec.memory_mib * (1.0 + self._knot(i, 103, 0))
        if role == "training":  # under GPUMemoryHigh's 90 % of the board
            frac = 0.62 + 0.24 * self._knot(i, 104, 0) + 0.004 * (self._smooth(i, 4, t, 30.0) - 0.5)
        elif role == "inference":
            frac = 0.895 + 0.002 * self._knot(i, 104, 0)
        elif role == "notebook":
            frac = 0.24 + 0.05 * self._knot(i, 104, 0)
        elif role == "warmup" and t >= 20.0:
            frac = max(idle / usable, 0.85 * min(1.0, (t - 20.0) / 180.0))
        else:
            return idle
        return frac * usable

    def _power(self, i: int, t: float) -> tuple[float, bool]:
        """Power draw in W, and whether the software power cap holds it down."""
        spec = self.spec
        u = self._util(i, t) / 100.0
        wobble = 2.0 * self._smooth(i, 5, t, 2.0) - 1.0
        if u <= 0.0:
            busy = 8.0 if self.roles[i] != "idle" else 0.0  # a process holding the GPU in P0
            return spec.idle_power_w + busy + 1.5 * wobble, False
        p = spec.idle_power_w + (0.99 * spec.power_limit_w - spec.idle_power_w) * u**1.25
        p += 0.01 * spec.power_limit_w * wobble
        if self.throttle[i] & nvmlnames.REASON_HW_POWER_BRAKE_SLOWDOWN:
            p *= 0.5
        cap = 0.965 * spec.power_limit_w
        return (cap, True) if p >= cap else (p, False)

    def _power_mw(self, i: int, t: float) -> float:
        return self._power(i, t)[0] * 1000.0

    def _pcie_direction(self, i: int, direction: int, t: float) -> float:
        return self._pcie_rate(i, t)[direction]

    def _pcie_rate(self, i: int, t: float) -> tuple[float, float]:
        """PCIe (TX, RX) rate in bytes per second."""
        role, u = self.roles[i], self._util(i, t) / 100.0
        jitter = 0.5 + self._smooth(i, 6, t, 5.0)
        if role == "warmup" and 20.0 <= t < 60.0:  # loading weights from host memory
            return 0.05e9, 11e9 * jitter
        if role in ("training", "warmup"):
            return 0.4e9 * u * jitter, 1.5e9 * u * jitter
        if role == "inference":
            return 0.12e9 * u * jitter, 0.25e9 * u * jitter
        return 2e3 * jitter, 3e3 * jitter

    def pcie_rate(self, i: int, now: float) -> tuple[float, float]:
        """PCIe (TX, RX) bytes per second of GPU `i` at Unix time `now`."""
        return self._pcie_rate(i, now - self.start)

    def reading(self, i: int, now: float, generation: int) -> Reading:
        """All figures of GPU `i` at Unix time `now`; cached until `now` or `generation` changes."""
        cached = self._cache.get(i)
        if cached is not None and cached[0] == now and cached[1] == generation:
            return cached[2]
        spec, t = self.spec, now - self.start
        throttle, temp_floor = self._throttle(i, t)
        util = self._util(i, t)
        power, capped = self._power(i, t)
        # the die warms with the power of the last minutes
        lagged = (
            0.5 * self._power(i, t - 10)[0]
            + 0.3 * self._power(i, t - 40)[0]
            + 0.2 * self._power(i, t - 120)[0]
        )
        temp = 27.0 + 48.0 * lagged / spec.power_limit_w + 1.5 * (self._smooth(i, 7, t, 20.0) - 0.5)
        if throttle & (nvmlnames.REASON_HW_THERMAL_SLOWDOWN | nvmlnames.REASON_HW_SLOWDOWN):
            temp = max(temp, 89.0 + 3.0 * self._knot(i, 108, 0))
        elif throttle & nvmlnames.REASON_SW_THERMAL_SLOWDOWN:
            temp = max(temp, 85.0 + 2.0 * self._knot(i, 108, 0))
        temp = max(temp, temp_floor)
        role = self.roles[i]
        pstate = 8 if role == "idle" or (role == "warmup" and t < 20.0) else 0
        reasons = throttle | (nvmlnames.REASON_GPU_IDLE if util < 0.5 else 0)
        reasons |= nvmlnames.REASON_SW_POWER_CAP if capped else 0
        if pstate == 8:
            sm = float(spec.idle_sm_mhz)
        elif util < 0.5:
            sm = 0.9 * spec.max_sm_mhz
        else:
            sm = spec.max_sm_mhz - 15.0 * int(4 * self._smooth(i, 9, t, 7.0))
        if capped:
            sm *= 0.93
        if throttle & _HW_SLOWDOWN:
            sm *= 0.45
        elif throttle & nvmlnames.REASON_SW_THERMAL_SLOWDOWN:
            sm *= 0.75
        mem_util = util * (0.6 if role == "inference" else 0.45) * (0.8 + 0.4 * self._smooth(i, 10, t, 3.0))
        gpm = self._activity(i, t, util / 100.0, sm / spec.max_sm_mhz)
        reading = Reading(
            util=int(round(util)),
            mem_util=int(round(mem_util)),
            app_used_mib=self._app_used_mib(i, t),
            power_w=round(power, 3),
            temp=int(round(temp)),
            mem_temp=int(round(temp + 4.0)),
            sm_mhz=int(15 * round(sm / 15)),
            mem_mhz=spec.idle_mem_mhz if pstate == 8 else spec.mem_mhz,
            pstate=pstate,
            reasons=reasons,
            fan=min(100, int(30 + 0.45 * util + max(0.0, temp - 50.0) * 0.5)),
            # the driver was loaded some hours before the simulation starts
            energy_mj=int(
                spec.idle_power_w * 3.6e6 * (2 + 20 * self._knot(i, 111, 0)) + self._energy[i].at(t)
            ),
            pcie_tx=int(1e12 * self._knot(i, 112, 0) + self._tx[i].at(t)),
            pcie_rx=int(4e12 * self._knot(i, 113, 0) + self._rx[i].at(t)),
            **gpm,
        )
        self._cache[i] = (now, generation, reading)
        return reading

    def _activity(self, i: int, t: float, u: float, clock: float) -> dict[str, float]:
        """The GPM figures: what the SMs do while "utilization" says only that a kernel ran."""
        role = self.roles[i]
        if u <= 0.0 or role not in ACTIVITY:
            return {}
        per_util, tensor_share, occupancy, dram = ACTIVITY[role]
        wobble = 0.95 + 0.1 * self._smooth(i, 12, t, 5.0)
        if self._stalled(i, t):  # a hung collective: one spinning kernel, idle SMs
            per_util, tensor_share, occupancy, dram = 0.03, 0.0, 0.02, 0.01
        sm = min(1.0, u * per_util * wobble * min(1.0, 0.4 + 0.6 * clock))
        nvlink = 0.0
        if role in ("training", "warmup") and not self._stalled(i, t):
            nvlink = 90_000.0 * u * (0.5 + self._smooth(i, 13, t, 6.0))  # MiB/s, all-reduce traffic
        return {
            "gr_active": round(min(1.0, u * (0.97 + 0.03 * self._smooth(i, 14, t, 3.0))), 4),
            "sm_active": round(sm, 4),
            "sm_occupancy": round(min(1.0, sm * occupancy / max(per_util, 0.01) * 0.9), 4),
            "tensor_active": round(sm * tensor_share, 4),
            "dram_active": round(min(1.0, u * dram * wobble), 4),
            "fp64_active": 0.0,
            "fp32_active": round(sm * (0.30 if role == "notebook" else 0.12), 4),
            "fp16_active": round(sm * 0.08, 4),
            "nvlink_tx_mib_s": round(nvlink, 1),
            "nvlink_rx_mib_s": round(nvlink * 0.98, 1),
        }

    def pcie_replays(self, i: int, now: float) -> int:
        """PCIe replays of GPU `i` from the schedule's PCIe incidents: 40 over each incident's 2 minutes."""
        if self.incidents is None:
            return 0
        t = self.incidents.elapsed(now)
        total = 0
        for h in range(int(max(t, 0) // 3600) + 1):
            for incident in self.incidents.hour(h):
                if incident.kind == PCIE and incident.gpu == i and t > incident.start_s:
                    span = incident.end_s - incident.start_s
                    total += int(40 * min(1.0, (t - incident.start_s) / span))
        return total

    # -- processes -------------------------------------------------------------------------------

    def pid_of(self, i: int) -> int:
        """The pid of GPU `i`'s process: `serving_pid` for an inference GPU when given, else made up."""
        if self.serving_pid is not None and self.roles[i] == "inference":
            return self.serving_pid
        return 20000 + 101 * i + self.seed % 97

    def processes(self, i: int, now: float, generation: int) -> list[tuple[int, str, int]]:
        """The compute processes of GPU `i`: (pid, name, used bytes)."""
        role = self.roles[i]
        if role not in ROLE_PROCESS or (role == "warmup" and now - self.start < 20.0):
            return []
        used = int(self.reading(i, now, generation).app_used_mib) * MIB
        return [(self.pid_of(i), ROLE_PROCESS[role][0], used)]

    def write_proc_root(self, root: Path) -> None:
        """Write `<root>/<pid>/{comm,status,cgroup}` for every simulated process."""
        for i, role in enumerate(self.roles):
            if role not in ROLE_PROCESS:
                continue
            name, uid, kind = ROLE_PROCESS[role]
            cid = f"{mix(self.seed, i, 14):016x}{mix(self.seed, i, 15):016x}" * 2
            pod = f"{mix(self.seed, i, 16):016x}{mix(self.seed, i, 17):016x}"
            pod_uid = f"{pod[:8]}_{pod[8:12]}_{pod[12:16]}_{pod[16:20]}_{pod[20:]}"
            cgroup = {
                "docker": f"0::/system.slice/docker-{cid}.scope\n",
                "kubepods": "0::/kubepods.slice/kubepods-besteffort.slice/"
                f"kubepods-besteffort-pod{pod_uid}.slice/cri-containerd-{cid}.scope\n",
                "host": f"0::/user.slice/user-{uid}.slice/session-3.scope\n",
            }[kind]
            d = root / str(self.pid_of(i))
            d.mkdir(parents=True, exist_ok=True)
            (d / "comm").write_text(name + "\n")
            ids = f"{uid}\t{uid}\t{uid}\t{uid}"
            (d / "status").write_text(f"Name:\t{name}\nUid:\t{ids}\nGid:\t{ids}\n")
            (d / "cgroup").write_text(cgroup)
