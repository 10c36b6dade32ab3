"""The tier build's peak memory by batch size: the demo's week of history, its tiers built from raw.

    .venv/bin/python bench/bench_tierpeak.py [--gpus 64] [--batches 2000000,500000] [--rounds 1]

Imports `gpuwatch serve --demo`'s week for `--gpus` GPUs once (as `build_runtime` does at start-up,
with the tier build held off), then per round and per `tierbuild.BATCH_SAMPLES` in `--batches`, in
turns (the order reversed each round): a child process opens a copy of that store and builds all its
tiers (`Store.build_tiers()`), its RSS read every 50 ms. Prints the RSS after opening, the peak and the
build's time. Run it with the Docker image's allocator settings (`MALLOC_ARENA_MAX=1`,
`MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` 16777216) to measure what `serve` sees.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def build(data: Path, batch: int) -> None:
    import psutil

    from gpuwatch.core.clock import SystemClock
    from gpuwatch.store import Store, tierbuild

    tierbuild.BATCH_SAMPLES = batch
    proc = psutil.Process()
    top = [0.0]

    def watch() -> None:
        while True:
            top[0] = max(top[0], proc.memory_info().rss / 2**20)
            time.sleep(0.05)

    with Store.open(data, clock=SystemClock()) as s:
        base = proc.memory_info().rss / 2**20
        threading.Thread(target=watch, daemon=True).start()
        t0 = time.perf_counter()
        s.build_tiers()
        took = time.perf_counter() - t0
    print(
        f"BATCH_SAMPLES {batch:>9,}: RSS {base:.0f} MiB opened, peak {top[0]:.0f} (+{top[0] - base:.0f}), {took:.0f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--batches", default="2000000,500000")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--build", nargs=2, metavar=("DATA", "BATCH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build:
        build(Path(args.build[0]), int(args.build[1]))
        return
    from gpuwatch.app.build import build_runtime
    from gpuwatch.app.config import load
    from gpuwatch.store import tierbuild

    tmp = Path(tempfile.mkdtemp())
    tierbuild.GRACE_MS = 10**15  # no span is due: the import's tiers are left to the children
    t0 = time.perf_counter()
    rt = build_runtime(
        load(None, {}, {"data_dir": str(tmp / "week"), "demo": True, "demo_gpus": args.gpus}), "bench"
    )
    rt.close()
    print(
        f"{args.gpus} GPUs' week imported in {time.perf_counter() - t0:.0f} s; load {os.getloadavg()[0]:.2f}"
    )
    batches = [int(b) for b in args.batches.split(",")]
    try:
        for r in range(args.rounds):
            for batch in batches if r % 2 == 0 else batches[::-1]:
                copy = tmp / "copy"
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(tmp / "week", copy)
                subprocess.run([sys.executable, __file__, "--build", str(copy), str(batch)], check=True)
        print(f"load {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
