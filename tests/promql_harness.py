"""Run Prometheus's PromQL conformance files against gpuwatch's engine (spec: tests/promqltest/HARNESS.md).

Usage: python -m tests.promql_harness [--tiers core,extended|all] [--markdown] [--failures] [--jsonl FILE]
       [--strict-messages] [--check-range-mode] [--backend store|array] [--floor FILE] [FILE.test ...]

The pieces live in `tests/promqltest/`: `reader` (the .test DSL), `stores`, `compare`, `runner`, `report`.
The data (Prometheus's files, `cases.tsv`, the floor) is in `tests/data/promql/`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.promqltest.reader import HarnessFileError, parse_file
from tests.promqltest.report import (
    FLOOR_FILE,
    closing_line,
    format_table,
    passed_per_tier,
    read_floor,
    tally,
    totals_per_tier,
)
from tests.promqltest.runner import (
    DATA_DIR,
    TIERS,
    CaseInfo,
    DriftError,
    Outcome,
    load_cases_tsv,
    run_all,
    run_case,
    run_file,
)
from tests.promqltest.stores import ArrayStore, RealStore, make_store

__all__ = [
    "DATA_DIR",
    "FLOOR_FILE",
    "TIERS",
    "ArrayStore",
    "CaseInfo",
    "DriftError",
    "HarnessFileError",
    "Outcome",
    "RealStore",
    "closing_line",
    "format_table",
    "load_cases_tsv",
    "main",
    "make_store",
    "parse_file",
    "passed_per_tier",
    "read_floor",
    "run_all",
    "run_case",
    "run_file",
    "tally",
    "totals_per_tier",
]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--data", type=Path, default=DATA_DIR)
    ap.add_argument("--tiers", default="core,extended", help="comma list of core,extended,out or 'all'")
    ap.add_argument("--backend", choices=("store", "array"), default="store")
    ap.add_argument("--strict-messages", action="store_true")
    ap.add_argument("--check-range-mode", action="store_true")
    ap.add_argument("--jsonl", type=Path, help="write one JSON line per case here ('-' for stdout)")
    ap.add_argument("--markdown", action="store_true", help="print the per-file table as Markdown")
    ap.add_argument("--failures", action="store_true", help="print failed cases with their reason")
    ap.add_argument("--floor", type=Path, default=FLOOR_FILE)
    args = ap.parse_args(argv)
    tiers = TIERS if args.tiers == "all" else tuple(t.strip() for t in args.tiers.split(","))
    try:
        outcomes, info = run_all(
            args.data,
            tiers,
            args.files,
            backend=args.backend,
            strict_messages=args.strict_messages,
            check_range_mode=args.check_range_mode,
        )
    except DriftError as exc:
        print(f"drift: {exc}", file=sys.stderr)
        return 2
    if args.jsonl:
        text = "\n".join(o.to_json() for o in outcomes) + "\n"
        if str(args.jsonl) == "-":
            sys.stdout.write(text)
        else:
            args.jsonl.write_text(text)
    if args.failures:
        for o in outcomes:
            if o.outcome in ("failed", "error") or (o.outcome == "unsupported" and o.tier != "out"):
                print(f"{o.outcome:11} {o.tier:8} {o.file}:{o.line}: {o.reason}")
    print(format_table(outcomes, markdown=args.markdown))
    totals = totals_per_tier(info)
    passed = passed_per_tier(outcomes)
    print("per tier: " + ", ".join(f"{t} {passed[t]}/{totals[t]}" for t in tiers))
    print(closing_line(outcomes))
    floor = read_floor(args.floor) if args.floor.exists() else {}
    core_failed = any(o.tier == "core" and o.outcome in ("failed", "error") for o in outcomes)
    below = any(passed.get(t, 0) < n for t, n in floor.items() if t in tiers)
    return 1 if core_failed or below else 0


if __name__ == "__main__":
    sys.exit(main())
