"""A live store through a 2-hour window's close late in a UTC day: what each 5-minute compaction and
tier step costs.

    .venv/bin/python bench/bench_windowclose.py [--series 64] [--before DIR] [--rounds 2]

`--series` gauges at 1 s from a UTC day's 00:00 to 21:52:30, written by `Store.append_series` and their
tiers built; then the live stream through the head (a `Batch` of every series each second) for 90
minutes past it, and every 5 minutes what the writer does then: `flush`, `compact` (the head into
chunks; closed windows merged) and the tier build until it has nothing left. The 20:00-22:00 window
closes at 22:00. Prints, per build, the slowest step, the step's time summed over all, and the
process's peak RSS (MiB) before the live stream and at the end, and the steps that took over 1 s.

`--before DIR` (an older tree: `git archive REV gpuwatch | tar -x -C DIR`; repeatable): each round runs
a child process per tree, in turns (the order reversed each round), with `PYTHONPATH` set to the tree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DAY_MS = 86_400_000
STEP_S = 300


def child(series: int) -> dict[str, object]:
    import numpy as np

    from gpuwatch.core.clock import FakeClock
    from gpuwatch.core.model import Batch, Sample
    from gpuwatch.store import Store

    day = 1_790_208_000_000 // DAY_MS * DAY_MS
    start = day + 21 * 3_600_000 + 52 * 60_000 + 30_000  # 21:52:30
    clock = FakeClock(start / 1000)
    rng = np.random.default_rng(1)
    labels = [(("gpu", str(g)),) for g in range(series)]
    with Store.open(Path(tempfile.mkdtemp()) / "data", clock=clock) as s:
        t = np.arange(day, start, 1000, dtype=np.int64)
        for lab in labels:
            s.append_series("util", lab, t, np.round(rng.random(t.size) * 100, 0))
        s.flush()
        s.compact()
        while s.build_tiers():
            pass
        peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        steps: list[tuple[str, float]] = []
        t_ms = start
        for _ in range(90 * 60 // STEP_S):
            for _ in range(STEP_S):
                t_ms += 1000
                clock.advance(1)
                values = rng.random(series) * 100
                s.append(
                    Batch(
                        t_ms, [Sample("util", lab, float(v)) for lab, v in zip(labels, values, strict=True)]
                    )
                )
            t0 = time.perf_counter()
            s.flush()
            s.compact()
            while s.build_tiers():
                pass
            hhmm = time.strftime("%H:%M:%S", time.gmtime(t_ms / 1000))
            steps.append((hhmm, time.perf_counter() - t0))
    slowest = max(steps, key=lambda x: x[1])
    return {
        "slowest": slowest,
        "over_1s": [(at, round(took, 2)) for at, took in steps if took > 1.0],
        "total_s": sum(x[1] for x in steps),
        "median_s": sorted(x[1] for x in steps)[len(steps) // 2],
        "peak_before": peak_before,
        "peak_after": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=64)
    ap.add_argument("--before", action="append", default=[], help="an older source tree (repeatable)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.series)))
        return
    trees = [("this", str(ROOT))] + [(Path(d).name, str(Path(d).resolve())) for d in args.before]
    print(f"{args.series} series at 1 s; load average {os.getloadavg()[0]:.2f}", flush=True)
    for r in range(args.rounds):
        for name, tree in trees if r % 2 == 0 else trees[::-1]:
            env = dict(os.environ, PYTHONPATH=tree)
            out = subprocess.run(
                [sys.executable, __file__, "--child", "--series", str(args.series)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            got = json.loads(out.strip().splitlines()[-1])
            at, took = got["slowest"]
            print(
                f"round {r + 1} {name:8}: slowest step {took:.2f} s (at {at}), median {got['median_s']:.3f} s, "
                f"all 18 steps {got['total_s']:.2f} s; peak RSS {got['peak_before']:.0f} -> "
                f"{got['peak_after']:.0f} MiB; load {os.getloadavg()[0]:.2f}; steps over 1 s: "
                + (", ".join(f"{a} {b:.2f} s" for a, b in got["over_1s"]) or "none"),
                flush=True,
            )


if __name__ == "__main__":
    main()
