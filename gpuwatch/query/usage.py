"""Who used the GPUs over a range: GPU-hours allocated, busy and idle-but-held, energy and cost per group.

Every figure is the `increase()` of one of the usage counters (`collect/allocation.py`) over the range
or over each day, week or month of it (UTC), summed by the group's labels:

    sum by (user) (increase(gpuwatch_usage_idle_held_gpu_seconds_total[7d])) / 3600

A GPU's holders share it, so the groups add up to the lab: the allocation rate is the allocated
GPU-seconds over those of every GPU sampled (`gpuwatch_usage_gpu_seconds_total`). The report reads
through an instant-query function (the engine's `instant`, over the store or any `Queryable`), never
the store itself.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gpuwatch.core.tiers import HOUR_MS, MINUTE_MS
from gpuwatch.query.values import Result, Vector

InstantQuery = Callable[[str, int], Result]

# --by: the labels a group is made of, in the table's column order
GROUPS: dict[str, tuple[str, ...]] = {
    "user": ("user",),
    "run": ("run",),
    "host": ("Hostname",),
    "job": ("slurm_job", "user"),
    "pod": ("namespace", "pod", "pod_uid"),
}
EVERY = ("day", "week", "month")
MAX_PERIODS = 1000
FIGURES = {  # field -> counter
    "allocated_gpu_hours": "gpuwatch_usage_allocated_gpu_seconds_total",
    "busy_gpu_hours": "gpuwatch_usage_busy_gpu_seconds_total",
    "idle_held_gpu_hours": "gpuwatch_usage_idle_held_gpu_seconds_total",
    "energy_kwh": "gpuwatch_usage_energy_kwh_total",
}
GPU_SECONDS = "gpuwatch_usage_gpu_seconds_total"


@dataclass(frozen=True)
class UsageRow:
    """One group's figures over one period; `cost` None without a price, `gpu_hours` and
    `allocation_rate` for hosts only."""

    start_ms: int
    end_ms: int
    group: dict[str, str]
    allocated_gpu_hours: float
    busy_gpu_hours: float
    idle_held_gpu_hours: float
    energy_kwh: float
    cost: float | None = None
    gpu_hours: float | None = None
    allocation_rate: float | None = None


@dataclass(frozen=True)
class UsageTotals:
    """The whole lab over one period (or the whole range): every GPU's hours and what of it was held."""

    start_ms: int
    end_ms: int
    gpu_hours: float
    allocated_gpu_hours: float
    busy_gpu_hours: float
    idle_held_gpu_hours: float
    energy_kwh: float
    cost: float | None = None
    allocation_rate: float | None = None  # None where no GPU was sampled


@dataclass(frozen=True)
class UsageReport:
    """Rows per group and period, top idle-but-held first within each period, and the lab's totals."""

    start_ms: int
    end_ms: int
    by: str
    every: str | None
    currency: str
    price_per_kwh: float
    rows: list[UsageRow] = field(default_factory=list)
    periods: list[UsageTotals] = field(default_factory=list)
    total: UsageTotals | None = None

    @property
    def group_labels(self) -> tuple[str, ...]:
        return GROUPS[self.by]

    def to_json(self) -> dict[str, Any]:
        """The report as the JSON twin and `gpuwatch report --format json` give it."""
        out = asdict(self)
        out["group_labels"] = list(self.group_labels)
        out["queries"] = queries(self.by, "$__range")
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> UsageReport:
        """Read back what `to_json` wrote (`gpuwatch report --url`)."""
        total = d.get("total")
        return cls(
            start_ms=int(d["start_ms"]),
            end_ms=int(d["end_ms"]),
            by=str(d["by"]),
            every=d.get("every"),
            currency=str(d.get("currency", "")),
            price_per_kwh=float(d.get("price_per_kwh", 0.0)),
            rows=[UsageRow(**r) for r in d.get("rows", [])],
            periods=[UsageTotals(**p) for p in d.get("periods", [])],
            total=UsageTotals(**total) if total else None,
        )

    def columns(self) -> dict[str, np.ndarray]:
        """The rows as named columns (period start and end, the group's labels, the figures), for
        CSV and Parquet files."""
        rows = self.rows
        out: dict[str, np.ndarray] = {
            "period_start": np.array([r.start_ms for r in rows], np.int64).astype("datetime64[ms]"),
            "period_end": np.array([r.end_ms for r in rows], np.int64).astype("datetime64[ms]"),
        }
        for label in self.group_labels:
            out[label] = np.array([r.group.get(label, "") for r in rows], dtype=object)
        names = [*FIGURES, "cost"] + (["gpu_hours", "allocation_rate"] if self.by == "host" else [])
        for name in names:
            out[name] = np.array([_nan(getattr(r, name)) for r in rows], np.float64)
        return out


def _nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def queries(by: str, window: str) -> dict[str, str]:
    """The PromQL behind each figure over `window` (seconds and kWh; hours are seconds / 3600)."""
    labels = ", ".join(GROUPS[by])
    out = {name: f"sum by ({labels}) (increase({metric}[{window}]))" for name, metric in FIGURES.items()}
    out["gpu_seconds"] = f"sum by (Hostname) (increase({GPU_SECONDS}[{window}]))"
    return out


def _next_boundary(t_ms: int, every: str) -> int:
    t = dt.datetime.fromtimestamp(t_ms / 1000, dt.timezone.utc)
    day = dt.datetime(t.year, t.month, t.day, tzinfo=dt.timezone.utc)
    if every == "day":
        nxt = day + dt.timedelta(days=1)
    elif every == "week":  # ISO weeks: from Monday
        nxt = day + dt.timedelta(days=7 - day.weekday())
    else:
        nxt = dt.datetime(t.year + t.month // 12, t.month % 12 + 1, 1, tzinfo=dt.timezone.utc)
    return int(nxt.timestamp() * 1000)


def periods(start_ms: int, end_ms: int, every: str | None) -> list[tuple[int, int]]:
    """Split [start, end] at UTC day, ISO week or month boundaries (None: one period)."""
    if every is None:
        return [(start_ms, end_ms)]
    out = []
    a = start_ms
    while a < end_ms:
        b = min(end_ms, _next_boundary(a, every))
        out.append((a, b))
        if len(out) > MAX_PERIODS:
            raise ValueError(f"more than {MAX_PERIODS} periods of a {every}: shorten the range")
        a = b
    return out


def _by(result: Result, labels: Sequence[str]) -> dict[tuple[str, ...], float]:
    if not isinstance(result, Vector):
        raise TypeError(f"a usage query answered {type(result).__name__}, not an instant vector")
    return {tuple(s.labels.get(k, "") for k in labels): float(s.value) for s in result}


def _cost(kwh: float, price: float) -> float | None:
    return kwh * price if price > 0 else None


def _rate(allocated: float, total: float) -> float | None:
    return allocated / total if total > 0 else None


def on_grid(start_ms: int, end_ms: int) -> tuple[int, int]:
    """The range a report counts: from 6 hours on, whole minutes, and whole hours from 2 days on, so
    that its `increase()`s are answered from the 1-minute or 1-hour tier (query/tierpick.py)."""
    span = end_ms - start_ms
    grid = HOUR_MS if span >= 48 * HOUR_MS else MINUTE_MS if span >= 6 * HOUR_MS else 1
    return start_ms // grid * grid, end_ms // grid * grid


def usage_report(
    instant: InstantQuery,
    start_ms: int,
    end_ms: int,
    *,
    by: str = "user",
    every: str | None = None,
    price_per_kwh: float = 0.0,
    currency: str = "",
) -> UsageReport:
    """Read the usage counters' increases over [start, end] (each period of it) into a report; ValueError
    for a group or period gpuwatch does not know, or an empty range."""
    if by not in GROUPS:
        raise ValueError(f"cannot group by {by!r}: choose one of {', '.join(GROUPS)}")
    if every is not None and every not in EVERY:
        raise ValueError(f"cannot split by {every!r}: choose one of {', '.join(EVERY)}")
    if end_ms <= start_ms:
        raise ValueError("the range is empty: end must be after start")
    start_ms, end_ms = on_grid(start_ms, end_ms)
    labels = GROUPS[by]
    rows: list[UsageRow] = []
    totals: list[UsageTotals] = []
    for a, b in periods(start_ms, end_ms, every):
        texts = queries(by, f"{b - a}ms")
        found = {name: _by(instant(texts[name], b), labels) for name in FIGURES}
        gpu_seconds = _by(instant(texts["gpu_seconds"], b), ("Hostname",))
        period_rows = []
        for key in sorted(set().union(*found.values())):
            f = {name: found[name].get(key, 0.0) for name in FIGURES}
            if not any(f.values()):
                continue  # a holder whose series did not move in this period
            host_s = gpu_seconds.get(key, 0.0) if by == "host" else None
            period_rows.append(
                UsageRow(
                    a,
                    b,
                    dict(zip(labels, key, strict=True)),
                    f["allocated_gpu_hours"] / 3600,
                    f["busy_gpu_hours"] / 3600,
                    f["idle_held_gpu_hours"] / 3600,
                    f["energy_kwh"],
                    _cost(f["energy_kwh"], price_per_kwh),
                    host_s / 3600 if host_s is not None else None,
                    _rate(f["allocated_gpu_hours"], host_s) if host_s is not None else None,
                )
            )
        period_rows.sort(key=lambda r: (-r.idle_held_gpu_hours, -r.allocated_gpu_hours))
        rows.extend(period_rows)
        totals.append(_totals(a, b, period_rows, sum(gpu_seconds.values()) / 3600, price_per_kwh))
    total = _sum_totals(totals, price_per_kwh)
    return UsageReport(start_ms, end_ms, by, every, currency, price_per_kwh, rows, totals, total)


def _totals(a: int, b: int, rows: Sequence[UsageRow], gpu_hours: float, price: float) -> UsageTotals:
    allocated = sum(r.allocated_gpu_hours for r in rows)
    kwh = sum(r.energy_kwh for r in rows)
    return UsageTotals(
        a,
        b,
        gpu_hours,
        allocated,
        sum(r.busy_gpu_hours for r in rows),
        sum(r.idle_held_gpu_hours for r in rows),
        kwh,
        _cost(kwh, price),
        _rate(allocated, gpu_hours),
    )


def _sum_totals(parts: Sequence[UsageTotals], price: float) -> UsageTotals:
    gpu_hours = sum(p.gpu_hours for p in parts)
    allocated = sum(p.allocated_gpu_hours for p in parts)
    kwh = sum(p.energy_kwh for p in parts)
    return UsageTotals(
        parts[0].start_ms,
        parts[-1].end_ms,
        gpu_hours,
        allocated,
        sum(p.busy_gpu_hours for p in parts),
        sum(p.idle_held_gpu_hours for p in parts),
        kwh,
        _cost(kwh, price),
        _rate(allocated, gpu_hours),
    )
