"""Tier decoding: 1-minute tier rows decoded whole and for one function's columns only, and 7-day panels
answered from the 1-minute tier through the engine, beside an older source tree and beside raw samples.

Usage: python bench/bench_tierdecode.py [--parts rows,panels] [--before DIR] [--gpus 8,64] [--rounds 4]
           [--runs 3] [--dir DIR] [--keep]

rows: bench/querydata.py's 8 GPUs x 1 day (178 series) built into 1-minute points (`core.tiers.build`)
and encoded as the store writes a row (`tierrows.encode_points`, 1,440 points a row), and the same GPUs
x 30 days as 1-hour rows (720 points, the fixed-width form 1-hour rows are written in); each round decodes
every row whole and for the columns of avg_over_time, max_over_time, last_over_time and rate
(`query.tiered.columns`) and an instant selector's (`tiered.instant_columns`), the kinds in turns, the
order rotated each round: ms a row (median of the rounds) and the ratio to the whole decode.

panels: querydata's `--gpus` GPUs (8: 178 series, 64: 850) x 7 days at 15 s, written by
`Store.append_series`, compacted, tiers built (a fake clock a day after the data), closed; reopened
read-only in each child. A panel is one function over every series: `FUNC(NAME[30m])` for each metric
name in turn (range functions drop the name, so one selector of all names would be refused), and
`{__name__=~".+"}` for the instant selector, over the 7 days at a step of 30 min (the dashboard's step
at 7 days, 337 points): the 1-minute tier. Each panel opens the store afresh (empty chunk cache and
DuckDB buffer, the OS page cache warm); per query a first run, then the median of `--runs` ("warm"); a
panel's figure is the sum over its queries. In `--raw-rounds` rounds this tree also times the same
panels from raw samples (the store without its tiers: chunks through the chunk cache, 128 MB by
default, which holds one metric's series for 7 days at 64 GPUs, ~41 MB decoded, but not all 850).

`--before DIR` (an older tree: `git archive REV gpuwatch | tar -x -C DIR`): each round runs a child
process per tree, in turns (the order swapped each round), with `PYTHONPATH` set to the tree; ratios
are this tree's over DIR's, round by round, then their median. Answers of the two trees' panels are
compared by digest (labels, timestamps and values' bits). Without `--before`, this tree alone.
`--dir DIR`: build the stores there (kept with `--keep`, reused when there).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))  # querydata; gpuwatch comes from PYTHONPATH in the children

import querydata  # noqa: E402

DAYS = 7
STEP_S = 1800
RANGE = "30m"
FUNCTIONS = ("avg_over_time", "max_over_time", "last_over_time", "rate")
INSTANT = "instant"


# -- children (run with PYTHONPATH set to one tree) ----------------------------------------------------


def rows_child(gpus: int, rounds: int, res: str) -> dict[str, Any]:
    import numpy as np

    from gpuwatch.core.tiers import HOUR_MS, MINUTE_MS, build
    from gpuwatch.store.tierrows import decode_points, encode_points

    res_ms, days = (MINUTE_MS, 1) if res == "1m" else (HOUR_MS, 30)  # a row's period each
    rows = [
        (encode_points(p, narrow=res_ms != HOUR_MS), p.size)  # (as the store writes rows of each)
        for p in (build(s.timestamps_ms, s.values, res_ms) for s in querydata.generate(gpus, days))
    ]
    kinds: dict[str, Any] = {"whole": None}
    try:
        from gpuwatch.query import tiered

        for name in FUNCTIONS:
            kinds[name] = tiered.columns(name)
        kinds[INSTANT] = tiered.instant_columns()
    except AttributeError:  # a tree before partial decoding: the whole decode only
        pass

    def per_row(columns: Any) -> float:
        t0 = time.perf_counter()
        if columns is None:
            for blob, n in rows:
                decode_points(blob, n)
        else:
            for blob, n in rows:
                decode_points(blob, n, columns)
        return (time.perf_counter() - t0) * 1000 / len(rows)

    for columns in kinds.values():  # warm-up
        per_row(columns)
    got: dict[str, list[float]] = {k: [] for k in kinds}
    order = list(kinds)
    for r in range(rounds):
        for k in order[r % len(order) :] + order[: r % len(order)]:
            got[k].append(per_row(kinds[k]))
    return {
        "rows": len(rows),
        "points": int(np.sum([n for _, n in rows])),
        "ms": {k: statistics.median(v) for k, v in got.items()},
    }


def panel_queries() -> dict[str, list[str]]:
    names = sorted({s.name for s in querydata.generate(1, 0.01)})
    out = {f: [f"{f}({name}[{RANGE}])" for name in names] for f in FUNCTIONS}
    out[INSTANT] = ['{__name__=~".+"}']
    return out


def digest(result: Any) -> str:
    h = hashlib.sha1()
    for s in result:
        h.update(repr(sorted(dict(s.labels).items())).encode())
        h.update(s.timestamps_ms.tobytes())
        h.update(s.values.tobytes())
    return h.hexdigest()[:16]


def panels_child(data: str, runs: int, raw: bool) -> dict[str, Any]:
    from gpuwatch.core.clock import SystemClock
    from gpuwatch.query import Engine
    from gpuwatch.store import Store

    class RawOnly:
        """The store without its tiers: the engine reads samples."""

        def __init__(self, store: Any) -> None:
            self.store = store

        def select(self, *args: Any) -> Any:
            return self.store.select(*args)

        def select_last(self, *args: Any) -> Any:
            return self.store.select_last(*args)

    start = querydata.T0_MS + STEP_S * 1000
    end = querydata.T0_MS + DAYS * querydata.DAY_MS
    out: dict[str, Any] = {
        "tiers": {},
        "raw": {},
        "first": {"tiers": {}, "raw": {}},
        "digest": {},
        "series": 0,
    }
    for panel, queries in panel_queries().items():
        for kind in ("tiers", "raw") if raw else ("tiers",):
            # A store opened afresh for each panel and kind: its first queries start with an empty chunk
            # cache and DuckDB buffer (the OS page cache warm), the timed runs after are warm.
            store = Store.open(Path(data), clock=SystemClock(), read_only=True)
            try:
                source = store if kind == "tiers" else RawOnly(store)
                total = first = 0.0
                h = hashlib.sha1()
                series = 0
                for q in queries:
                    t0 = time.perf_counter()
                    result = Engine(source).range(q, start, end, STEP_S * 1000)
                    first += (time.perf_counter() - t0) * 1000
                    times = []
                    for _ in range(runs):
                        t0 = time.perf_counter()
                        Engine(source).range(q, start, end, STEP_S * 1000)
                        times.append(time.perf_counter() - t0)
                    total += statistics.median(times) * 1000
                    h.update(digest(result).encode())
                    series += len(result)
            finally:
                store.close()
            out[kind][panel] = total
            out["first"][kind][panel] = first
            if kind == "tiers":
                out["digest"][panel] = h.hexdigest()[:16]
                out["series"] = max(out["series"], series)
    return out


# -- building and driving -----------------------------------------------------------------------------


def build_store(gpus: int, data: Path) -> None:
    """Write querydata's `gpus` GPUs x 7 days into a store at `data`, build its tiers, close it."""
    sys.path.insert(0, str(ROOT))
    from gpuwatch.core.clock import FakeClock
    from gpuwatch.core.model import make_labels
    from gpuwatch.store import Store

    end_s = querydata.T0_MS / 1000 + DAYS * 86_400
    store = Store.open(data, clock=FakeClock(end_s + 86_400), retention_s=3650 * 86_400)
    t0 = time.perf_counter()
    n = 0
    series = querydata.generate(gpus, DAYS)
    for s in series:
        store.append_series(s.name, make_labels(s.labels), s.timestamps_ms, s.values)
        n += s.values.size
    store.flush()
    store.compact()
    t_write = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.build_tiers()
    t_tiers = time.perf_counter() - t0
    store.close()
    print(
        f"store of {gpus} GPUs: {len(series)} series, {n:,} samples written in {t_write:.0f} s, "
        f"tiers built in {t_tiers:.0f} s",
        flush=True,
    )


def child(tree: Path, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", *args],
        env=env,
        cwd=tempfile.gettempdir(),  # (not a tree: only PYTHONPATH's gpuwatch is imported)
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"child {args} in {tree} failed:\n{proc.stderr[-3000:]}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def in_turns(trees: list[Path], rounds: int, args: list[str]) -> dict[Path, list[dict[str, Any]]]:
    got: dict[Path, list[dict[str, Any]]] = {t: [] for t in trees}
    for r in range(rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            got[tree].append(child(tree, [*args, str(tree)]))
    return got


def run_rows(args: argparse.Namespace, trees: list[Path], res: str) -> None:
    got = in_turns(trees, args.rounds, ["rows", str(args.row_gpus), "5", res])
    this, before = trees[-1], trees[0] if len(trees) > 1 else None
    first = got[this][0]
    kind = "1-minute rows (narrowed columns)" if res == "1m" else "1-hour rows (fixed-width columns)"
    print(f"\n## rows: {first['rows']} {kind} of {first['points'] // first['rows']:,} points on average")
    mine = got[this]
    whole = [g["ms"]["whole"] for g in mine]
    for kind in mine[0]["ms"]:
        ms = [g["ms"][kind] for g in mine]
        line = f"  {kind:15s} {statistics.median(ms):.4f} ms a row ({min(ms):.4f}-{max(ms):.4f})"
        if kind != "whole":
            line += f", {statistics.median([a / b for a, b in zip(ms, whole, strict=True)]):.2f}x whole"
        if before is not None:
            old = [g["ms"]["whole"] for g in got[before]]
            line += (
                f", {statistics.median([a / b for a, b in zip(ms, old, strict=True)]):.2f}x before's whole"
            )
        print(line)
    if before is not None:
        old = [g["ms"]["whole"] for g in got[before]]
        print(f"  before: whole {statistics.median(old):.4f} ms a row ({min(old):.4f}-{max(old):.4f})")


def run_panels(args: argparse.Namespace, trees: list[Path], root: Path) -> None:
    this, before = trees[-1], trees[0] if len(trees) > 1 else None
    for gpus in args.gpus:
        data = root / f"g{gpus}"
        if not (data / "gpuwatch.duckdb").exists():
            build_store(gpus, data)
        got: dict[Path, list[dict[str, Any]]] = {t: [] for t in trees}
        for r in range(args.rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                raw = "1" if tree == this and r < args.raw_rounds else "0"
                got[tree].append(child(tree, ["panels", str(data), str(args.runs), raw, str(tree)]))
        mine = got[this]
        print(f"\n## panels, 7 days at {STEP_S // 60} min steps: {gpus} GPUs, {mine[0]['series']} series")
        for panel in mine[0]["tiers"]:
            ms = [g["tiers"][panel] for g in mine]
            line = f"  {panel:15s} tiers {statistics.median(ms):7.1f} ms ({min(ms):.1f}-{max(ms):.1f})"
            if before is not None:
                old = [g["tiers"][panel] for g in got[before]]
                ratio = statistics.median([a / b for a, b in zip(ms, old, strict=True)])
                same = all(g["digest"][panel] == mine[0]["digest"][panel] for g in got[before])
                line += (
                    f"; before {statistics.median(old):7.1f} ms ({min(old):.1f}-{max(old):.1f}), {ratio:.2f}x"
                    f"{'' if same else ' ANSWERS DIFFER'}"
                )
            print(line, flush=True)
        print("  first run of each panel (a store just opened) / warm, this tree: tiers against raw samples")
        for panel in mine[0]["tiers"]:
            first = statistics.median([g["first"]["tiers"][panel] for g in mine])
            line = f"  {panel:15s} tiers {first:7.1f} / {statistics.median([g['tiers'][panel] for g in mine]):6.1f} ms"
            raws = [g for g in mine if g["raw"]]
            if raws:
                raw_first = statistics.median([g["first"]["raw"][panel] for g in raws])
                raw_warm = statistics.median([g["raw"][panel] for g in raws])
                line += f"; raw {raw_first:7.1f} / {raw_warm:6.1f} ms"
            print(line, flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        what, rest = sys.argv[2], sys.argv[3:]
        import gpuwatch

        assert gpuwatch.__file__ is not None and gpuwatch.__file__.startswith(rest[-1]), gpuwatch.__file__
        if what == "rows":
            print(json.dumps(rows_child(int(rest[0]), int(rest[1]), rest[2])))
        else:
            print(json.dumps(panels_child(rest[0], int(rest[1]), rest[2] == "1")))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="rows,panels", help="rows (rows1m, rows1h), panels")
    p.add_argument("--before", type=Path, help="an older gpuwatch source tree to run beside this one")
    p.add_argument("--gpus", default="8,64", help="the panels' stores: GPUs each (8: 178 series, 64: 850)")
    p.add_argument("--row-gpus", type=int, default=8)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--raw-rounds", type=int, default=1, help="rounds that also time the raw-sample panels")
    p.add_argument("--runs", type=int, default=3, help="timed runs of each query, after a warm-up")
    p.add_argument("--dir", type=Path)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    args.gpus = [int(g) for g in args.gpus.split(",")]
    trees = [*([args.before.resolve()] if args.before else []), ROOT]
    root = args.dir or Path(tempfile.mkdtemp(prefix="tierdecode-"))
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    try:
        parts = args.parts.split(",")
        for res in ("1m", "1h"):
            if f"rows{res}" in parts or "rows" in parts:
                run_rows(args, trees, res)
        if "panels" in parts:
            run_panels(args, trees, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
