"""The usage counters of a simulated history: `collect.allocation.AllocationMeter`'s and
`collect.usage.UsageMeter`'s, over every tick at once.

Each tick charges the time (and energy) since a GPU's previous tick to whoever held it, as the meters
do when the collector calls them: allocated, busy or idle-but-held by the utilization reading, energy
from the counter's increase, per holder (user, pod, run) and per user; the host's GPU seconds count
every GPU, lost or not. Sums run in the meters' own order (tick by tick, GPU by GPU), so the figures
are the same floats.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuwatch.collect.allocation import (
    ALLOCATED,
    BUSY,
    ENERGY,
    GPU_SECONDS,
    GPUS_ALLOCATED,
    IDLE_HELD,
    MJ_PER_KWH,
)
from gpuwatch.core.model import Labels
from gpuwatch.demo.historygpu import GpuState, Series

USER_SECONDS = "gpuwatch_user_gpu_seconds_total"
USER_ENERGY = "gpuwatch_user_gpu_energy_kwh_total"


@dataclass(frozen=True)
class Holding:
    """One GPU's part in the usage counters: its state over the ticks, its holder's labels (None: no
    process ever) and its user's (`user`, `Hostname`)."""

    state: GpuState
    holder: Labels | None
    user: Labels | None


def _kwh(energy: np.ndarray, prev: np.ndarray) -> np.ndarray:
    """The kWh between two energy readings (mJ; NaN: none), as the meters count a counter that went down."""
    used = np.where(energy >= prev, energy - prev, energy)
    return np.where(np.isfinite(energy) & np.isfinite(prev), used / MJ_PER_KWH, 0.0)


def _ordered_sum(increments: np.ndarray) -> np.ndarray:
    """Running totals of a [tick, GPU] matrix added tick by tick, GPU by GPU: the total after each tick."""
    if increments.shape[1] == 0:
        return np.zeros(increments.shape[0])
    return np.cumsum(increments.reshape(-1)).reshape(increments.shape)[:, -1]


def usage_history(
    t_ms: np.ndarray, gpus: list[Holding], host: Labels, *, idle_below: float, max_gap_s: float
) -> list[Series]:
    """The allocation and per-user counters, and the allocated-GPU gauge, at every tick."""
    out: list[Series] = []
    dt = np.diff(t_ms, prepend=t_ms[0]) / 1000.0
    valid = (dt > 0) & (dt <= max_gap_s)
    valid[0] = False
    for g in gpus:
        if g.holder is None:
            continue
        s = g.state
        held = s.held
        if not held.any():
            continue
        charged = held & valid
        first = int(np.argmax(held))
        prev_energy = np.concatenate(([np.nan], s.energy_mj[:-1]))
        parts = {
            ALLOCATED: np.where(charged, dt, 0.0),
            BUSY: np.where(charged & (s.util >= idle_below), dt, 0.0),
            IDLE_HELD: np.where(charged & (s.util < idle_below), dt, 0.0),
            ENERGY: np.where(charged, _kwh(s.energy_mj, prev_energy), 0.0),
        }
        for name, inc in parts.items():
            out.append((name, g.holder, t_ms[first:], np.cumsum(inc)[first:]))
    every = np.stack([np.where(valid, dt, 0.0) for _ in gpus], axis=1) if gpus else np.zeros((t_ms.size, 0))
    out.append((GPU_SECONDS, host, t_ms, _ordered_sum(every)))
    held_now = np.stack([g.state.held for g in gpus], axis=1) if gpus else np.zeros((t_ms.size, 0))
    out.append((GPUS_ALLOCATED, host, t_ms, held_now.sum(axis=1).astype(np.float64)))
    out.extend(_per_user(t_ms, gpus, max_gap_s))
    return out


def _per_user(t_ms: np.ndarray, gpus: list[Holding], max_gap_s: float) -> list[Series]:
    """UsageMeter's counters: a GPU is observed while it answers, charged since its previous answer."""
    users: dict[Labels, list[tuple[np.ndarray, np.ndarray]]] = {}
    seen: dict[Labels, int] = {}
    idx = np.arange(t_ms.size)
    for g in gpus:
        if g.user is None:
            continue
        s = g.state
        up = ~s.lost
        last_up = np.maximum.accumulate(np.where(up, idx, -1))
        prev = np.concatenate(([-1], last_up[:-1]))
        has_prev = up & (prev >= 0)
        p = np.maximum(prev, 0)
        dt = (t_ms - t_ms[p]) / 1000.0
        charged = has_prev & s.held & (dt > 0) & (dt <= max_gap_s)
        seconds = np.where(charged, dt, 0.0)
        kwh = np.where(charged, _kwh(s.energy_mj, s.energy_mj[p]), 0.0)
        users.setdefault(g.user, []).append((seconds, kwh))
        if s.held.any():
            first = int(np.argmax(s.held))
            seen[g.user] = min(seen.get(g.user, first), first)
    out: list[Series] = []
    for labels, parts in users.items():
        if labels not in seen:
            continue
        first = seen[labels]
        seconds = _ordered_sum(np.stack([a for a, _ in parts], axis=1))
        kwh = _ordered_sum(np.stack([b for _, b in parts], axis=1))
        out.append((USER_SECONDS, labels, t_ms[first:], seconds[first:]))
        out.append((USER_ENERGY, labels, t_ms[first:], kwh[first:]))
    return out
