"""Time the demo's week of history: its import at start-up, and the pages right after it.

Usage:
    python bench/bench_demo_history.py --gpus 8 64            # the import, for each GPU count
    python bench/bench_demo_history.py --gpus 8 --pages       # and the pages before and after the tiers

Each GPU count gets a fresh data directory and `build_runtime` with `--demo`'s settings, as `gpuwatch
serve --demo` starts (the import is inside it): printed are its wall and CPU time, the import's own
log line (series, samples, seconds) and the peak RSS. `--pages`: then, in the same process, the
cluster page's charts (heatmap, power, allocation: /api/v1/query_range at the browser's step for a
1280 px chart) over 1 h, 24 h, 7 d and 30 d and the Usage page's twin over 7 d, first (cold) and the
median of three more; then `Store.build_tiers()` to the end (timed), and the same again.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.web import create_app
from gpuwatch.web.dash import cluster

NICE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
RANGES = {"1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400}
CHARTS = ("util", "power", "allocation")


def step_for(range_s: int, width_px: int = 1280) -> int:
    """The dashboard's step (static/js/gpuwatch.js stepFor) for a chart `width_px` wide."""
    raw = range_s / max(30, min(1500, width_px // 2))
    return next((s for s in NICE_STEPS if s >= raw), 86400)


class Caught(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def time_pages(client: Any, now_s: float) -> dict[str, list[float]]:
    """Each range's charts and the Usage twin: [first, then three more] in ms."""
    out: dict[str, list[float]] = {}
    panels = {p.id: p.query.replace("$host_re", ".+") for p in cluster.PANELS if p.id in CHARTS}
    for name, span in RANGES.items():
        step = step_for(span)
        times = []
        for _ in range(4):
            t0 = time.perf_counter()
            for expr in panels.values():
                q = {
                    "query": expr,
                    "start": str((now_s - span) // step * step),
                    "end": str(now_s),
                    "step": str(step),
                }
                r = client.get("/api/v1/query_range", query_string=q)
                assert r.status_code == 200, r.get_json()
            times.append((time.perf_counter() - t0) * 1000)
        out[f"cluster charts {name}"] = times
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        r = client.get("/api/ui/usage", query_string={"start": str(now_s - 7 * 86400), "end": str(now_s)})
        assert r.status_code == 200, r.get_json()
        times.append((time.perf_counter() - t0) * 1000)
    out["usage twin 7d"] = times
    return out


def show(label: str, timings: dict[str, list[float]]) -> None:
    for name, t in timings.items():
        print(f"  {label}: {name}: first {t[0]:.0f} ms, then median {statistics.median(t[1:]):.0f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--pages", action="store_true")
    args = ap.parse_args()
    caught = Caught()
    logging.getLogger("gpuwatch").addHandler(caught)
    logging.getLogger("gpuwatch").setLevel(logging.INFO)
    print(f"load average {os.getloadavg()[0]:.1f}")
    for gpus in args.gpus:
        with tempfile.TemporaryDirectory(prefix="gpuwatch-demohist-") as tmp:
            settings = load(None, {}, {"data_dir": tmp, "demo": True, "demo_gpus": gpus})
            cpu0, t0 = time.process_time(), time.perf_counter()
            rt = build_runtime(settings, "bench-host")
            wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
            line = next((x for x in caught.lines if x.startswith("demo: imported")), "(no import)")
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            print(
                f"{gpus} GPUs: build_runtime {wall:.1f} s wall, {cpu:.1f} s CPU (all threads); {line}; peak RSS {rss:.0f} MB"
            )
            caught.lines.clear()
            try:
                if args.pages:
                    client = create_app(rt).test_client()
                    now_s = rt.clock.now()
                    show("before tiers", time_pages(client, now_s))
                    t0 = time.perf_counter()
                    while rt.store.build_tiers():
                        pass
                    print(f"  build_tiers to the end: {time.perf_counter() - t0:.1f} s")
                    show("after tiers", time_pages(client, now_s))
            finally:
                rt.close()
        print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
