"""Run bench_scrape.py (or bench_serve.py) of two source trees at the same time, so both see the same VM spell.

Usage: python bench/bench_pair.py BEFORE_DIR AFTER_DIR [--rounds 3] [--bench bench_scrape.py] [-- bench args]

This 2-vCPU VM's speed moves by ~2x from one quarter hour to the next (bench/README.md, Scrape), more than
most changes worth measuring, so back-to-back runs of two builds can disagree on which one is cheaper. Here
both builds run their own bench (their own targets, their own `gpuwatch serve`) over the same minutes;
each round prints both serve CPU figures and their ratio. Both processes share the two cores, so the
absolute figures are those of a busier machine; the ratio is the figure to read. Each tree is run with its
own bench script (`BEFORE_DIR/bench/...`) and `PYTHONPATH=DIR`, with this interpreter.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

CPU = re.compile(r"serve cpu: ([0-9.]+)% of one core; peak rss ([0-9.]+) MiB")


def run_pair(
    dirs: list[Path], bench: str, extra: list[str], save: Path | None = None, tag: str = ""
) -> list[tuple[float, float] | None]:
    procs = [
        subprocess.Popen(
            [sys.executable, str(d / "bench" / bench), *extra],
            cwd=d,
            env={**os.environ, "PYTHONPATH": str(d)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for d in dirs
    ]
    out: list[tuple[float, float] | None] = []
    for d, p in zip(dirs, procs, strict=True):
        text, _ = p.communicate()
        if save is not None:
            save.mkdir(parents=True, exist_ok=True)
            (save / f"{d.name}-{tag}.txt").write_text(text)
        m = CPU.search(text)
        if m is None:
            print(text[-2000:], file=sys.stderr)
        out.append((float(m.group(1)), float(m.group(2))) if m else None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bench", default="bench_scrape.py")
    ap.add_argument("--save", type=Path, help="write each bench's whole output into this folder")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args = ap.parse_args(argv[:cut])
    extra = argv[cut + 1 :] or ["--seconds", "90", "--warmup", "30"]
    ratios = []
    for i in range(1, args.rounds + 1):
        load = Path("/proc/loadavg").read_text().split()[:3]
        started = time.strftime("%H:%M:%S", time.gmtime())
        before, after = run_pair([args.before, args.after], args.bench, extra, args.save, str(i))
        if before is None or after is None:
            print(f"round {i}: a bench failed (its output is above)")
            return 1
        ratios.append(after[0] / before[0])
        print(
            f"round {i} ({started} UTC, load {' '.join(load)}): before {before[0]:.2f}% ({before[1]:.0f} MiB), "
            f"after {after[0]:.2f}% ({after[1]:.0f} MiB), after/before {ratios[-1]:.2f}",
            flush=True,
        )
    print(f"after/before: median {statistics.median(ratios):.2f}, range {min(ratios):.2f}-{max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
