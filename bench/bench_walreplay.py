"""A store killed mid-stream, opened again: how long the open takes and the memory it peaks at.

    .venv/bin/python bench/bench_walreplay.py [--series 3400] [--minutes 35] [--before DIR] [--rounds 2]

A child process writes `--series` gauges at 1 s through the head for `--minutes` on a fake clock, as
`serve` does (`append` each second, `flush` every 2 s, `compact` every 5 minutes), then dies with
`os._exit` (no close: what a kill -9 leaves). Another child opens the store, reads one series back and
prints the time and its peak RSS (MiB); the WAL's size at the kill is printed too. The default is a
64-GPU demo node's ~3,400 series and 25 minutes: before each compaction checkpointed, DuckDB's 256 MB
`checkpoint_threshold` checkpointed this stream every ~28 minutes, so a kill found up to ~25 minutes
of it in the WAL.

`--before DIR` (an older tree: `git archive REV gpuwatch | tar -x -C DIR`; repeatable): each round runs
the children of every tree in turns (the order reversed each round), with `PYTHONPATH` set to the tree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write(data: str, series: int, minutes: int) -> None:
    import numpy as np

    from gpuwatch.core.clock import FakeClock
    from gpuwatch.core.model import Batch, Sample
    from gpuwatch.store import Store

    start_s = 1_790_208_000 + 3 * 3600
    clock = FakeClock(start_s)
    store = Store.open(Path(data), clock=clock, flush_interval_s=3600, compact_rows=10**9)
    labels = [(("gpu", str(g)),) for g in range(series)]
    rng = np.random.default_rng(1)
    for k in range(1, minutes * 60 + 1):
        clock.advance(1)
        values = rng.random(series) * 100
        store.append(
            Batch(
                clock.now_ms(), [Sample("util", lab, float(v)) for lab, v in zip(labels, values, strict=True)]
            )
        )
        if k % 2 == 0:
            store.flush()
        if k % 300 == 0:
            store.compact()
    store.flush()
    wal = sum(f.stat().st_size for f in Path(data).glob("*.wal"))
    print(json.dumps({"wal_mib": wal / 2**20}), flush=True)
    os._exit(0)  # a kill: no close, no checkpoint


def reopen(data: str) -> None:
    from gpuwatch.core.clock import FakeClock
    from gpuwatch.core.model import Matcher
    from gpuwatch.store import Store

    t = time.perf_counter()
    store = Store.open(Path(data), clock=FakeClock(1_790_208_000 + 4 * 3600))
    got = store.select([Matcher("gpu", "=", "0")], 0, 2**62)
    took = time.perf_counter() - t
    n = sum(s.timestamps_ms.size for s in got)
    store.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"open_s": took, "peak_mib": peak, "samples": n}), flush=True)


def child(tree: str, *args: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, *args],
        env=dict(os.environ, PYTHONPATH=tree),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=3400)
    ap.add_argument("--minutes", type=int, default=25)
    ap.add_argument("--before", action="append", default=[], help="an older source tree (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--write", help=argparse.SUPPRESS)
    ap.add_argument("--reopen", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.write:
        write(args.write, args.series, args.minutes)
        return
    if args.reopen:
        reopen(args.reopen)
        return
    trees = [("this", str(ROOT))] + [(Path(d).name, str(Path(d).resolve())) for d in args.before]
    print(f"{args.series} series at 1 s for {args.minutes} minutes; load average {os.getloadavg()[0]:.2f}")
    for r in range(args.rounds):
        for name, tree in trees if r % 2 == 0 else trees[::-1]:
            data = tempfile.mkdtemp()
            try:
                wrote = child(
                    tree, "--write", data, "--series", str(args.series), "--minutes", str(args.minutes)
                )
                got = child(tree, "--reopen", data)
            finally:
                shutil.rmtree(data, ignore_errors=True)
            print(
                f"round {r + 1} {name:8}: WAL at the kill {wrote['wal_mib']:.0f} MiB; open and first read "
                f"{got['open_s']:.2f} s, peak RSS {got['peak_mib']:.0f} MiB ({got['samples']:.0f} samples of "
                f"gpu 0); load {os.getloadavg()[0]:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
