"""The scrape -> store path as `gpuwatch serve` runs it, alone in one process, CPU per thread group.

Usage: python bench/bench_scrape_loop.py [--targets 20] [--warmup 15] [--seconds 45] [--ports JSON]

Starts bench/scrape_targets.py (unless --ports names running ones), then a real `ScrapePool` (its
scheduler thread and worker pool, `scrape_interval: 5s`, the real clock) feeding a real store in a
temporary directory, with `gpuwatch serve`'s GC settings. No GPUs, no rules, no web server: what is
measured is the scrape path only. After --warmup seconds it reads the process CPU time and each
thread's CPU clock over --seconds and prints them as % of one core, the scrape workers summed. To
compare two builds back to back, copy this file into the other tree's bench/ and run both copies
alternately; --ports lets them share one target server (start bench/scrape_targets.py yourself).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scrape_targets import running_targets  # noqa: E402
from gpuwatch.cli import gctune  # noqa: E402
from gpuwatch.collect.scrapeconfig import parse_scrape_configs  # noqa: E402
from gpuwatch.collect.scrapepool import ScrapePool  # noqa: E402
from gpuwatch.core.clock import SystemClock  # noqa: E402
from gpuwatch.store.core import Store  # noqa: E402


def thread_cpu() -> dict[str, float]:
    out = {}
    for t in threading.enumerate():
        if t.ident is not None:
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                out[t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return out


def measure(ports: list[int], warmup: float, seconds: float) -> str:
    clock = SystemClock()
    targets = [f"127.0.0.1:{p}" for p in ports]
    config = [{"job_name": "bench", "scrape_interval": "5s", "static_configs": [{"targets": targets}]}]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "data", clock=clock)
        pool = ScrapePool(
            parse_scrape_configs(config), default_interval_s=5.0, sink=store.append, clock=clock
        )
        gctune.tune_for_serving()
        pool.start()
        try:
            time.sleep(warmup)
            cpu0, threads0, wall0 = time.process_time(), thread_cpu(), time.monotonic()
            time.sleep(seconds)
            cpu1, threads1, wall1 = time.process_time(), thread_cpu(), time.monotonic()
        finally:
            pool.stop()
            store.close()
    wall = wall1 - wall0
    groups: dict[str, float] = {}
    for name, t in threads1.items():
        group = "scrape workers" if name.startswith("gpuwatch-scrape_") else name
        groups[group] = groups.get(group, 0.0) + t - threads0.get(name, 0.0)
    parts = ", ".join(
        f"{k} {100 * v / wall:.2f}%" for k, v in sorted(groups.items(), key=lambda kv: -kv[1]) if v > 0
    )
    return f"process {100 * (cpu1 - cpu0) / wall:.2f}% of one core | {parts}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=20)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--seconds", type=float, default=45.0)
    ap.add_argument("--ports", help="JSON list of ports of running scrape_targets.py servers")
    args = ap.parse_args()
    if args.ports:
        print(measure(json.loads(args.ports), args.warmup, args.seconds))
        return
    with running_targets(args.targets) as ports:
        print(measure(ports, args.warmup, args.seconds))


if __name__ == "__main__":
    main()
