"""One simulated GPU's history: every series `GpuCollector` would have written, at many ticks at once.

The values come from `readings.WorkloadArrays` and go through what the collector does with them,
step for step: NVML's units (MiB, W from mW), the GPM scales, the PCIe rates and the byte totals
summed from them, the clock-event reasons per bit, and the XIDs of the incident schedule. An XID 79
takes the GPU off the bus: from the first tick in it the GPU is lost (`gpuwatch_gpu_lost 1`, nothing
else read) until a re-probe (every 30 s, on a tick) finds it again; the first tick after the collector
opened a GPU or found it again has no GPM figures and no PCIe rates, as they need two samples.

Which series exist and their labels come from the live collector itself (a `Template`: samples it
took of the same simulated GPUs), so a history names everything as the live demo does; a metric of the
template that this module cannot compute is an error, not a gap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpuwatch.collect.gpm import GPM_FIELDS
from gpuwatch.collect.gpu_metrics import THROTTLE_REASONS
from gpuwatch.core.model import Labels, make_labels
from gpuwatch.demo.incidents import XID
from gpuwatch.demo.nvmlstructs import GPM_FIGURES, ZERO_GPM
from gpuwatch.demo.readings import GRID_S, WorkloadArrays
from gpuwatch.demo.workload import MIB, ROLE_PROCESS

REPROBE_MS = 30_000  # GpuCollector's reprobe_interval_s
LOST = "gpuwatch_gpu_lost"
XID_LAST = "DCGM_FI_DEV_XID_ERRORS"
XID_TOTAL = "gpuwatch_xid_errors_total"
PROCESS = "gpuwatch_process_gpu_memory_bytes"
THROTTLED = "gpuwatch_clock_throttled"
_RATES = {
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gpuwatch_pcie_tx_bytes_total", "pcie_tx"),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gpuwatch_pcie_rx_bytes_total", "pcie_rx"),
}
_TOTALS = {total: (rate, raw) for rate, (total, raw) in _RATES.items()}

Series = tuple[str, Labels, np.ndarray, np.ndarray]  # name, labels, timestamps (ms), values
Figures = dict[str, np.ndarray]


def _gpm(name: str) -> Callable[[Figures], np.ndarray] | None:
    """The value of a GPM metric as the collector reads it from the simulated NVML."""
    for field in GPM_FIELDS:
        if field.name != name:
            continue
        if field.metric_id in GPM_FIGURES:
            attr, scale = GPM_FIGURES[field.metric_id]
            return lambda r, attr=attr, scale=scale, out=field.scale: r[attr] * scale * 1.0 * out  # type: ignore[misc]
        if field.metric_id in ZERO_GPM:
            return lambda r: np.zeros(r["util"].shape)
    return None


def _fields(limit_w: float, memory_mib: int, reserved_mib: int) -> dict[str, Callable[[Figures], np.ndarray]]:
    """Metric name -> its values from a GPU's readings (NVML's answer, as the collector turns it)."""

    def used(r: Figures) -> np.ndarray:
        return np.trunc(r["app_used_mib"] * MIB).astype(np.int64)

    def zero(r: Figures) -> np.ndarray:
        return np.zeros(r["util"].shape)

    def const(value: float) -> Callable[[Figures], np.ndarray]:
        return lambda r: np.full(r["util"].shape, value)

    return {
        "DCGM_FI_DEV_GPU_UTIL": lambda r: r["util"],
        "DCGM_FI_DEV_MEM_COPY_UTIL": lambda r: r["mem_util"],
        "DCGM_FI_DEV_FB_USED": lambda r: (used(r) // MIB).astype(np.float64),
        "DCGM_FI_DEV_FB_FREE": lambda r: ((memory_mib * MIB - reserved_mib * MIB - used(r)) // MIB).astype(
            np.float64
        ),
        "DCGM_FI_DEV_FB_TOTAL": const(float(memory_mib)),
        "DCGM_FI_DEV_FB_RESERVED": const(float(reserved_mib)),
        "DCGM_FI_DEV_GPU_TEMP": lambda r: r["temp"],
        "DCGM_FI_DEV_POWER_USAGE": lambda r: np.trunc(r["power_w"] * 1000) / 1000.0,
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": const(int(limit_w * 1000) / 1000.0),
        "DCGM_FI_DEV_SM_CLOCK": lambda r: r["sm_mhz"],
        "DCGM_FI_DEV_MEM_CLOCK": lambda r: r["mem_mhz"],
        "DCGM_FI_DEV_FAN_SPEED": lambda r: r["fan"],
        "DCGM_FI_DEV_PSTATE": lambda r: r["pstate"],
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": lambda r: r["reasons"].astype(np.float64),
        "DCGM_FI_DEV_MEMORY_TEMP": lambda r: r["mem_temp"],
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": lambda r: r["energy_mj"],
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": zero,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": zero,
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": zero,
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": zero,
        "DCGM_FI_DEV_ROW_REMAP_PENDING": zero,
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": zero,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": lambda r: r["pcie_replays"].astype(np.float64),
    }


@dataclass(frozen=True)
class GpuSeries:
    """What the live collector writes for one GPU: its figures' series (name -> labels), its process
    series' labels (None: no process) and its usage holder's labels (allocation counters)."""

    index: int
    labels: Labels  # the GPU's own (gpuwatch_gpu_lost's)
    figures: dict[str, Labels]
    process: Labels | None
    user: str


@dataclass
class GpuState:
    """The collector's state of one GPU after the last tick of a history (for resuming)."""

    lost: np.ndarray  # per tick
    held: np.ndarray  # a process holds it (and it answers)
    util: np.ndarray
    energy_mj: np.ndarray  # NaN where lost
    totals: dict[str, float]  # PCIe byte totals at the last tick
    last_xid: int
    xid_counts: dict[int, int]
    # (k, energy, TX, RX): the workload's integrals at grid point k, for Workload.resume_counters
    integrals: tuple[int, float, float, float]


def lost_ticks(t_ms: np.ndarray, arrays: WorkloadArrays, i: int) -> tuple[np.ndarray, np.ndarray]:
    """(lost, fresh) per tick of GPU `i`: off the bus from the first tick in an XID 79 until a re-probe
    on a tick after it finds the GPU; fresh: the first tick of all and the one after each loss."""
    lost = np.zeros(t_ms.shape, dtype=bool)
    fresh = np.zeros(t_ms.shape, dtype=bool)
    fresh[0] = True
    spans, sched = arrays.spans(XID), arrays.w.incidents
    if spans is None or sched is None:
        return lost, fresh
    e = t_ms / 1000.0 - sched.start  # elapsed seconds of each tick, as FakeNvml._fell_off computes them
    for start, end, gpu, xid in zip(spans.start, spans.end, spans.gpu, spans.xid, strict=True):
        if gpu != i or xid != 79:
            continue
        k0 = int(np.searchsorted(e, start, side="left"))
        if k0 >= e.size or e[k0] >= end:
            continue  # no tick fell inside it
        k = k0
        while True:
            kp = int(np.searchsorted(t_ms, t_ms[k] + REPROBE_MS, side="left"))
            if kp >= t_ms.size:
                lost[k0:] = True
                break
            if start <= e[kp] < end:  # still off the bus: probe again in 30 s
                k = kp
                continue
            lost[k0:kp] = True
            fresh[kp] = True
            break
    return lost, fresh


def gpu_history(
    arrays: WorkloadArrays, i: int, t_ms: np.ndarray, series: GpuSeries
) -> tuple[list[Series], GpuState]:
    """Every series the collector writes for GPU `i` at ticks `t_ms` (ascending, ms), but the usage counters."""
    w = arrays.w
    now = t_ms / 1000.0
    r = arrays.readings(i, now)
    r["pcie_replays"] = arrays.pcie_replays(i, now)
    lost, fresh = lost_ticks(t_ms, arrays, i)
    up = ~lost
    paired = up & ~fresh  # a tick whose previous tick answered too
    fields = _fields(w.spec.power_limit_w, w.spec.memory_mib, w.spec.reserved_mib)
    out: list[Series] = []
    totals: dict[str, float] = {}
    dt_ms = np.diff(t_ms, prepend=t_ms[0])
    for name, labels in series.figures.items():
        if name in _RATES or name in _TOTALS:
            continue
        if name in (THROTTLED, XID_LAST):
            continue  # below
        get = fields.get(name)
        keep = up
        if get is None:
            get = _gpm(name)
            keep = paired
        if get is None:
            raise ValueError(f"the demo's history cannot compute {name} (a metric the live collector writes)")
        out.append((name, labels, t_ms[keep], np.asarray(get(r), dtype=np.float64)[keep]))
    for bit, reason in THROTTLE_REASONS:
        labels = make_labels({**dict(series.labels), "reason": reason})
        out.append((THROTTLED, labels, t_ms[up], ((r["reasons"] & bit) != 0).astype(np.float64)[up]))
    # PCIe: the rate between two ticks that both answered, and the bytes summed from it
    for rate, (total, raw) in _RATES.items():
        if total not in series.figures:
            continue
        delta = np.diff(r[raw], prepend=r[raw][0])
        per_s = np.where(paired, delta * 1000.0 / np.maximum(dt_ms, 1), 0.0)
        summed = np.cumsum(np.where(paired, per_s * dt_ms / 1000.0, 0.0))
        out.append((total, series.figures[total], t_ms[up], summed[up]))
        if rate in series.figures:
            out.append((rate, series.figures[rate], t_ms[paired], per_s[paired]))
        totals[total] = float(summed[-1])
    out.append((LOST, series.labels, t_ms, lost.astype(np.float64)))
    last_xid, xid_counts = _xids(arrays, i, t_ms, series, out)
    held = up & _has_process(w.roles[i], now - w.start)
    if series.process is not None:
        used = np.trunc(r["app_used_mib"]) * MIB
        out.append((PROCESS, series.process, t_ms[held], used[held]))
    energy = np.where(up, r["energy_mj"], np.nan)
    k = int(np.floor_divide(now[-1] - w.start, GRID_S))
    integrals = (k, float(r["energy_grid"][k]), float(r["tx_grid"][k]), float(r["rx_grid"][k]))
    return out, GpuState(lost, held, r["util"], energy, totals, last_xid, xid_counts, integrals)


def _has_process(role: str, t: np.ndarray) -> np.ndarray:
    """Whether GPU of `role` runs its process at workload times `t` (warming up: from 20 s on)."""
    if role not in ROLE_PROCESS:
        return np.zeros(t.shape, dtype=bool)
    if role == "warmup":
        return t >= 20.0
    return np.ones(t.shape, dtype=bool)


def _xids(
    arrays: WorkloadArrays, i: int, t_ms: np.ndarray, series: GpuSeries, out: list[Series]
) -> tuple[int, dict[int, int]]:
    """The XID gauge (the last XID) and counters (per XID) of GPU `i`: each XID counts from the first
    tick at or after its start (the event thread hands it over before the next sample)."""
    spans, sched = arrays.spans(XID), arrays.w.incidents
    last = np.zeros(t_ms.shape)
    counts: dict[int, np.ndarray] = {}
    if spans is not None and sched is not None:
        e = t_ms / 1000.0 - sched.start
        for start, gpu, xid in zip(spans.start, spans.gpu, spans.xid, strict=True):
            if gpu != i:
                continue
            k = int(np.searchsorted(e, start, side="left"))
            if k >= e.size:
                continue
            last[k:] = float(xid)
            n = counts.setdefault(int(xid), np.zeros(t_ms.shape))
            n[k:] += 1.0
    out.append((XID_LAST, series.labels, t_ms, last))
    for xid, n in sorted(counts.items()):
        first = int(np.argmax(n > 0))
        out.append(
            (XID_TOTAL, make_labels({**dict(series.labels), "xid": str(xid)}), t_ms[first:], n[first:])
        )
    return int(last[-1]), {xid: int(n[-1]) for xid, n in counts.items()}
