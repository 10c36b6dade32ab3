"""Time the usage report (`gpuwatch report`, the Usage page's twin) over its counters' tiers (or raw samples).

Usage:
    python bench/bench_usage.py --gpus 8 --days 7 --step-s 1 --dir /tmp/usage8   # the data, then the report
    python bench/bench_usage.py --dir /tmp/usage8 --reuse                       # the report only

The data: the usage counters as the GPU sampler writes them every `--step-s` seconds for `--days` on
`--gpus` GPUs of one host, each GPU held by one of four users (one holder series per GPU: allocated,
busy, idle-held, energy), busy 80 % of the time and idle-held the rest in stretches of minutes, plus the
host's GPU-seconds counter. Printed: the samples loaded and how long, then the median of `--runs` reports
(`Engine.instant` over the store opened read-only, as `gpuwatch report --data-dir` does) by user over
the whole range and per day, and the figures themselves (allocated must equal days x 24 x GPUs hours).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

T0_MS = 1_793_491_200_000  # 2026-11-01T00:00:00Z
DAY_MS = 86_400_000


def load(data: Path, gpus: int, days: float, step_s: float, tiers: bool = True) -> int:
    from gpuwatch.core.clock import FakeClock
    from gpuwatch.core.model import make_labels
    from gpuwatch.store import Store

    step_ms = int(step_s * 1000)
    t = np.arange(T0_MS + step_ms, T0_MS + int(days * DAY_MS) + 1, step_ms, dtype=np.int64)
    dt = np.full(len(t), step_s)
    store = Store.open(data, clock=FakeClock((T0_MS + days * DAY_MS) / 1000), flush_interval_s=3600.0)
    n = 0
    rng = np.random.default_rng(7)
    try:
        for g in range(gpus):
            # idle stretches: a 10-minute block is idle with probability 0.2
            blocks = rng.random(int(days * DAY_MS / 600_000) + 1) < 0.2
            idle = blocks[((t - T0_MS) // 600_000).astype(np.int64)]
            labels = make_labels(
                {"user": f"user{g % 4}", "Hostname": "node-1", "gpu": str(g), "UUID": f"GPU-{g:08d}"}
            )
            power_kw = np.where(idle, 0.08, 0.6)
            for name, values in (
                ("gpuwatch_usage_allocated_gpu_seconds_total", np.cumsum(dt)),
                ("gpuwatch_usage_busy_gpu_seconds_total", np.cumsum(np.where(idle, 0.0, dt))),
                ("gpuwatch_usage_idle_held_gpu_seconds_total", np.cumsum(np.where(idle, dt, 0.0))),
                ("gpuwatch_usage_energy_kwh_total", np.cumsum(power_kw * dt / 3600)),
            ):
                store.append_series(name, labels, t, values)
                n += len(t)
        host = make_labels({"Hostname": "node-1"})
        store.append_series("gpuwatch_usage_gpu_seconds_total", host, t, np.cumsum(dt) * gpus)
        n += len(t)
        if tiers:
            t0 = time.perf_counter()
            store.build_tiers()
            print(f"tiers built in {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        store.close()
    return n


def report(data: Path, days: float, runs: int) -> None:
    from gpuwatch.app.config import load as load_settings
    from gpuwatch.core.clock import SystemClock
    from gpuwatch.query import Engine
    from gpuwatch.query.usage import usage_report
    from gpuwatch.store import Store

    store = Store.open(data, clock=SystemClock(), read_only=True)
    settings = load_settings(None, {}, {"data_dir": str(data)})
    engine = Engine.configured(store, settings, SystemClock().monotonic)
    start, end = T0_MS, T0_MS + int(days * DAY_MS)
    try:
        for every in (None, "day"):
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                got = usage_report(engine.instant, start, end, by="user", every=every)
                times.append(time.perf_counter() - t0)
            assert got.total is not None
            print(
                f"by user, every {every or 'range'}: median {statistics.median(times):.2f} s of {runs} "
                f"(min {min(times):.2f}); allocated {got.total.allocated_gpu_hours:.1f} h, idle-held "
                f"{got.total.idle_held_gpu_hours:.1f} h, rate {got.total.allocation_rate:.3f}, "
                f"{len(got.rows)} rows"
            )
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--days", type=float, default=7.0)
    p.add_argument("--step-s", type=float, default=1.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--reuse", action="store_true", help="the data is in --dir already")
    p.add_argument(
        "--no-tiers", action="store_true", help="leave the tiers unbuilt: the report reads raw samples"
    )
    args = p.parse_args(argv)
    if not args.reuse:
        t0 = time.perf_counter()
        n = load(args.dir, args.gpus, args.days, args.step_s, not args.no_tiers)
        took = time.perf_counter() - t0
        print(f"loaded {n / 1e6:.1f} M samples in {took:.1f} s")
    report(args.dir, args.days, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
