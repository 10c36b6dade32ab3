"""Tables, totals and the floor file: what the harness prints and what CI compares (HARNESS.md section 5)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tests.promqltest.runner import TIERS, CaseInfo, Outcome

FLOOR_FILE = Path(__file__).resolve().parent.parent / "data" / "promql" / "floor.txt"


def tally(outcomes: Iterable[Outcome]) -> dict[tuple[str, str], dict[str, int]]:
    """Count outcomes per (file, tier)."""
    table: dict[tuple[str, str], dict[str, int]] = {}
    for o in outcomes:
        row = table.setdefault(
            (o.file, o.tier), {"passed": 0, "failed": 0, "unsupported": 0, "skipped": 0, "error": 0}
        )
        row[o.outcome] += 1
    return table


def passed_per_tier(outcomes: Iterable[Outcome]) -> dict[str, int]:
    out = dict.fromkeys(TIERS, 0)
    for o in outcomes:
        if o.outcome == "passed":
            out[o.tier] += 1
    return out


def totals_per_tier(info: dict[tuple[str, int], CaseInfo]) -> dict[str, int]:
    out = dict.fromkeys(TIERS, 0)
    for ci in info.values():
        out[ci.tier] += 1
    return out


def format_table(outcomes: list[Outcome], markdown: bool = False) -> str:
    """Per-file table: passed/failed/unsupported for each tier run (`out` only when run), and skipped."""
    files = sorted({o.file for o in outcomes})
    table = tally(outcomes)
    shown = [t for t in TIERS if t != "out" or any(o.tier == t and o.outcome != "skipped" for o in outcomes)]
    header = ["file"] + [f"{t} {c}" for t in shown for c in ("pass", "fail", "unsup")] + ["skipped"]
    rows = []
    grand = [0] * (len(header) - 1)
    for f in files:
        cells = []
        for t in shown:
            r = table.get((f, t), {})
            cells += [r.get("passed", 0), r.get("failed", 0) + r.get("error", 0), r.get("unsupported", 0)]
        cells.append(sum(table.get((f, t), {}).get("skipped", 0) for t in TIERS))
        grand = [a + b for a, b in zip(grand, cells, strict=True)]
        rows.append([f, *map(str, cells)])
    rows.append(["**total**" if markdown else "total", *map(str, grand)])
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    return "\n".join([fmt(header), *(fmt(r) for r in rows)])


def closing_line(outcomes: list[Outcome]) -> str:
    passed = sum(o.outcome == "passed" for o in outcomes)
    failed = sum(o.outcome in ("failed", "error") for o in outcomes)
    skipped = sum(o.outcome in ("unsupported", "skipped") for o in outcomes)
    return f"{passed} passed, {failed} failed, {skipped} skipped"


def read_floor(path: Path = FLOOR_FILE) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = int(v)
    return out
