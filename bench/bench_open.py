"""What opening a store costs: a new store in a new directory (`serve`'s first start, and most tests),
an in-memory one, and an existing file reopened.

    .venv/bin/python bench/bench_open.py [--opens 30] [--before DIR] [--rounds 3]

Each figure is the median of `--opens` opens (each followed by `close`, timed apart) in one process.
`--before DIR` (an older tree: `git archive REV gpuwatch | tar -x -C DIR`; repeatable): each round
runs a child process per tree, in turns (the order reversed each round), with `PYTHONPATH` set to it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(opens: int) -> dict[str, float]:
    from gpuwatch.core.clock import FakeClock
    from gpuwatch.store import Store

    clock = FakeClock(1_790_000_000)
    found: dict[str, list[float]] = {"new file": [], "close (new file)": [], "memory": [], "reopen": []}
    base = Path(tempfile.mkdtemp())
    for i in range(opens):
        t0 = time.perf_counter()
        store = Store.open(base / str(i), clock=clock)
        t1 = time.perf_counter()
        store.close()
        found["new file"].append(t1 - t0)
        found["close (new file)"].append(time.perf_counter() - t1)
        t0 = time.perf_counter()
        Store.open(None, clock=clock).close()
        found["memory"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        Store.open(base / "0", clock=clock).close()
        found["reopen"].append(time.perf_counter() - t0)
    return {k: round(statistics.median(v) * 1000, 1) for k, v in found.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opens", type=int, default=30)
    ap.add_argument("--before", action="append", default=[], help="an older tree to compare (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.opens)))
        return
    trees = [str(ROOT), *args.before]
    print(f"opens {args.opens} a figure; load average {os.getloadavg()[0]:.1f}; medians in ms")
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else list(reversed(trees)):
            env = dict(os.environ, PYTHONPATH=tree)
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--opens", str(args.opens)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            print(f"round {r + 1}  {tree:<40} {out.strip()}", flush=True)


if __name__ == "__main__":
    main()
