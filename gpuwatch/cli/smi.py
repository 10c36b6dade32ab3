"""A one-shot GPU table like nvidia-smi's, from GpuStatus data (pure: no NVML, no colour)."""

from __future__ import annotations

from collections.abc import Sequence

from gpuwatch.collect.gpu_metrics import THROTTLE_REASONS
from gpuwatch.collect.gpu_status import GpuStatus

LOST_TEXT = "lost (fell off the bus)"
_MIB = 1 << 20


def _num(figures: dict[str, float], name: str, fmt: str = "{:.0f}") -> str:
    value = figures.get(name)
    return "-" if value is None else fmt.format(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    """Align columns; columns in `right` are right-aligned. A row of one cell spans the rest of the line."""
    widths = [len(h) for h in header]
    for row in rows:
        if len(row) == len(header):
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

    def line(cells: Sequence[str]) -> str:
        if len(cells) < len(header):  # an index cell, then free text
            return (cells[0].rjust(widths[0]) + "  " + "  ".join(cells[1:])).rstrip()
        out = [
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    return [line(header)] + [line(r) for r in rows]


def _throttles(figures: dict[str, float]) -> str:
    mask = figures.get("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    if mask is None:
        return "-"
    names = [name for bit, name in THROTTLE_REASONS if int(mask) & bit]
    return ",".join(names) if names else "none"


def format_smi(statuses: Sequence[GpuStatus], *, driver_version: str | None = None) -> str:
    """Render GPUs and their compute processes as two plain-text tables."""
    title = "gpuwatch smi" + (f"    driver {driver_version}" if driver_version else "")
    gpu_header = ["GPU", "Name", "Util", "Memory used / total", "Temp", "Power / limit", "Perf", "Throttle"]
    gpu_rows: list[list[str]] = []
    for s in statuses:
        if s.is_lost:
            gpu_rows.append([str(s.index), s.name or s.uuid or "?", LOST_TEXT])
            continue
        f = s.figures
        util = _num(f, "DCGM_FI_DEV_GPU_UTIL", "{:.0f} %")
        memory = f"{_num(f, 'DCGM_FI_DEV_FB_USED')} / {_num(f, 'DCGM_FI_DEV_FB_TOTAL')} MiB"
        temp = _num(f, "DCGM_FI_DEV_GPU_TEMP", "{:.0f} C")
        power = f"{_num(f, 'DCGM_FI_DEV_POWER_USAGE')} / {_num(f, 'DCGM_FI_DEV_ENFORCED_POWER_LIMIT')} W"
        pstate = _num(f, "DCGM_FI_DEV_PSTATE", "P{:.0f}")
        gpu_rows.append([str(s.index), s.name, util, memory, temp, power, pstate, _throttles(f)])
    lines = [title, ""]
    lines += _table(gpu_header, gpu_rows, right={0, 2, 3, 4, 5})
    proc_header = ["GPU", "PID", "User", "Container", "Process", "Memory"]
    proc_rows = [
        [
            str(s.index),
            str(p.pid),
            p.user or "-",
            p.container_id[:12] or "-",
            p.name or "-",
            "-" if p.used_memory_bytes is None else f"{p.used_memory_bytes // _MIB} MiB",
        ]
        for s in statuses
        for p in s.processes
    ]
    lines += ["", "Processes"]
    lines += (
        _table(proc_header, proc_rows, right={0, 1, 5}) if proc_rows else ["No running compute processes."]
    )
    return "\n".join(lines) + "\n"
