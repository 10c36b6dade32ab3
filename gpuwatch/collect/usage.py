"""Who used the GPUs: per-user GPU time and energy from NVML's process table, as counters.

At each sample, every user with a compute process on a GPU is charged the time since that GPU's
previous sample (once per GPU, however many processes they run there) and an equal share of the
energy the GPU used meanwhile (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`'s increase). A gap of more than
`max_gap_s` between samples is not charged. The counters start at 0 when gpuwatch starts (PromQL's
`increase()` handles the restart): `sum by (user) (increase(gpuwatch_user_gpu_seconds_total[7d])) / 3600`
is the week's GPU-hours per user.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuwatch.core.model import MetricInfo, Sample, stable_labels

MJ_PER_KWH = 3.6e9

SECONDS = "gpuwatch_user_gpu_seconds_total"
ENERGY = "gpuwatch_user_gpu_energy_kwh_total"

USAGE_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        SECONDS,
        "counter",
        "GPU time of each user's compute processes (one GPU for one second is one), since gpuwatch started.",
        "seconds",
        ("user", "Hostname"),
    ),
    MetricInfo(
        ENERGY,
        "counter",
        "Energy of the GPUs each user's processes held, split equally among the users of a GPU (kWh).",
        "kWh",
        ("user", "Hostname"),
    ),
)


@dataclass
class _Gpu:
    t_ms: int
    energy_mj: float | None


@dataclass
class UsageMeter:
    """Accumulates per-user GPU seconds and kWh; `observe` each GPU each sample, then `samples()`."""

    max_gap_s: float = 60.0
    max_users: int = 10_000
    _gpus: dict[tuple[str, int], _Gpu] = field(default_factory=dict)
    _seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    _kwh: dict[tuple[str, str], float] = field(default_factory=dict)

    def resume(self, t_ms: int, samples: Iterable[Sample]) -> None:
        """Go on from counters already written: `samples` holds each series' newest value at `t_ms` (an
        imported history's), and the GPUs' energy counters and `gpuwatch_gpu_lost` then."""
        energy: dict[tuple[str, int], float] = {}
        lost: set[tuple[str, int]] = set()
        for s in samples:
            d = dict(s.labels)
            if s.name in (SECONDS, ENERGY) and "user" in d:
                table = self._seconds if s.name == SECONDS else self._kwh
                table[(d["user"], d.get("Hostname", ""))] = s.value
            elif (
                s.name in ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "gpuwatch_gpu_lost")
                and d.get("gpu", "").isdigit()
            ):
                gpu = (d.get("Hostname", ""), int(d["gpu"]))
                if s.name == "gpuwatch_gpu_lost":
                    if s.value > 0:
                        lost.add(gpu)
                else:
                    energy[gpu] = s.value
        for key in self._seconds.keys() - self._kwh.keys():
            self._kwh[key] = 0.0
        for key in self._kwh.keys() - self._seconds.keys():
            self._seconds[key] = 0.0
        for gpu, mj in energy.items():
            if gpu not in lost:  # a lost GPU was last observed before: it is charged from its next answer
                self._gpus[gpu] = _Gpu(t_ms, mj)

    def observe(self, hostname: str, gpu: int, t_ms: int, users: set[str], energy_mj: float | None) -> None:
        """Charge the users on GPU `gpu` now for the time (and energy) since its previous sample."""
        prev = self._gpus.get((hostname, gpu))
        self._gpus[(hostname, gpu)] = _Gpu(t_ms, energy_mj)
        for user in users:
            key = (user, hostname)
            if key not in self._seconds and len(self._seconds) < self.max_users:
                self._seconds[key] = 0.0
                self._kwh[key] = 0.0
        if prev is None or not users:
            return
        dt_s = (t_ms - prev.t_ms) / 1000.0
        if not 0 < dt_s <= self.max_gap_s:
            return
        share = 0.0
        if energy_mj is not None and prev.energy_mj is not None:
            used = energy_mj - prev.energy_mj if energy_mj >= prev.energy_mj else energy_mj
            share = used / MJ_PER_KWH / len(users)
        for user in users:
            key = (user, hostname)
            if key in self._seconds:
                self._seconds[key] += dt_s
                self._kwh[key] += share

    def samples(self) -> list[Sample]:
        out = []
        for (user, hostname), seconds in self._seconds.items():
            labels = stable_labels({"user": user, "Hostname": hostname})
            out.append(Sample(SECONDS, labels, seconds))
            out.append(Sample(ENERGY, labels, self._kwh[(user, hostname)]))
        return out
