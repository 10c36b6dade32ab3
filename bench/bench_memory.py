"""What a store costs in memory: RSS after opening a 7-day store and running the dashboard's 7-day panel
queries, answered from the tiers and (in another process, in turns) from raw samples alone.

Usage: python bench/bench_memory.py [--gpus 8] [--days 7] [--rounds 2] [--keep DIR]

Data: bench/querydata.py's 12 dcgm-exporter metrics for `--gpus` GPUs at 15 s over `--days` days plus
its 2 inference models (the 24h/7d sets of bench_query.py), written by `Store.append_series`, tiers
built, closed. Each measurement is a fresh process (this interpreter, serve's GC settings): it opens
the store read-only, runs each panel query once as the dashboard asks a 7-day range 1,200 px wide
(step 600 s, start and end on the step), and prints its RSS (VmRSS) and peak (VmHWM) after, and the
chunk cache's and DuckDB's memory. `raw` hides the tiers from the engine (the build before them).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import querydata

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import make_labels
from gpuwatch.store import Store

PANELS = [
    "avg(DCGM_FI_DEV_GPU_UTIL)",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED * 1048576",
    "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)",
    "max by (Hostname) (max_over_time(DCGM_FI_DEV_GPU_TEMP[10m]))",
    "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])) / 1000",
    "histogram_quantile(0.99, sum by (le, model_name) (rate(inference_latency_seconds_bucket[10m])))",
]
STEP_S = 600


def build(data: Path, gpus: int, days: int) -> float:
    end_s = querydata.T0_MS / 1000 + days * 86_400
    store = Store.open(data, clock=FakeClock(end_s + 600), retention_s=3650 * 86_400)
    n = 0
    for s in querydata.generate(gpus, days):
        store.append_series(s.name, make_labels(s.labels), s.timestamps_ms, s.values)
        n += s.values.size
    store.flush()
    store.compact()
    store.build_tiers()
    store.close()
    print(f"store: {n:,} samples, {(data / 'gpuwatch.duckdb').stat().st_size / 1e6:.0f} MB", flush=True)
    return end_s


def status(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def child(data: str, end_s: float, mode: str) -> None:
    from gpuwatch.cli.gctune import tune_for_serving
    from gpuwatch.query import Engine

    tune_for_serving()

    class RawOnly:
        def __init__(self, store: Store) -> None:
            self.store = store

        def select(self, *a: object) -> object:
            return self.store.select(*a)  # type: ignore[arg-type]

        def select_last(self, *a: object) -> object:
            return self.store.select_last(*a)  # type: ignore[arg-type]

    before = status("VmRSS")
    store = Store.open(Path(data), clock=FakeClock(end_s + 600), read_only=True)
    opened = status("VmRSS")
    engine = Engine(store if mode == "tiers" else RawOnly(store))  # type: ignore[arg-type]
    end = int(end_s) // STEP_S * STEP_S
    start = end - 7 * 86_400 // STEP_S * STEP_S
    t0 = time.perf_counter()
    for q in PANELS:
        engine.range(q, start * 1000, end * 1000, STEP_S * 1000)
    took = time.perf_counter() - t0
    gc.collect()
    stats = store.counters()
    print(
        json.dumps(
            {
                "mode": mode,
                "rss_start": before,
                "rss_open": opened,
                "rss": status("VmRSS"),
                "peak": status("VmHWM"),
                "cache_mb": stats.get("chunk_cache_bytes", 0) / 1e6,
                "duckdb_mb": (store.duckdb_memory_bytes() or 0) / 1e6,
                "seconds": took,
            }
        ),
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--keep", type=Path)
    p.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.child[0], float(args.child[1]), args.child[2])
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = (args.keep or Path(tmp)) / "gpuwatch"
        if (data / "end.txt").exists():
            end_s = float((data / "end.txt").read_text())
        else:
            end_s = build(data, args.gpus, args.days)
            (data / "end.txt").write_text(str(end_s))
        for k in range(args.rounds):
            for mode in ("tiers", "raw") if k % 2 == 0 else ("raw", "tiers"):
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(data), str(end_s), mode],
                    check=True, capture_output=True, text=True,
                ).stdout  # fmt: skip
                r = json.loads(out.strip().splitlines()[-1])
                print(
                    f"{r['mode']:>5}: RSS {r['rss_start']:.0f} MiB at start, {r['rss_open']:.0f} opened, "
                    f"{r['rss']:.0f} after the {len(PANELS)} panels (peak {r['peak']:.0f}); chunk cache "
                    f"{r['cache_mb']:.1f} MB, DuckDB {r['duckdb_mb']:.1f} MB; queries {r['seconds']:.2f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
