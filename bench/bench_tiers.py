"""Long panels: the cluster page's charts over 90 days (and a year) from gpuwatch's tiers, side by side
with VictoriaMetrics over the same samples.

Usage: python bench/bench_tiers.py [--gpus 64] [--days 90] [--every 15] [--runs 5] [--no-vm] [--keep DIR]

Data (bench/querydata.py's dcgm-exporter figures, deterministic): `--gpus` GPUs x the 5 metrics the
cluster page charts (utilization, framebuffer used, power, temperature, the energy counter) at 15 s (or
`--every` seconds, a multiple of 15: a year at 300 s fits a session; gpuwatch's year panels read the
same 1-hour points either way, VictoriaMetrics reads fewer samples) for `--days` days, 7 s off the grid (module constant OFF_GRID_MS). gpuwatch: every sample through `Store.append_series`,
the tiers built (`Store.build_tiers`, timed: the build rate), then retention with the defaults (raw
14 days, 1-minute 90 days, 1-hour 2 years), as a store that ran that long looks; file size after
close. VictoriaMetrics: the same samples by `/api/v1/import` (JSON lines), `force_flush`; its data
directory's size.

Panels: the cluster page's queries as the dashboard asks them for a range drawn 1,200 px wide (step
from `gw.stepFor`: 6 h at 90 days, 1 day at a year; start and end on the step), plus the lab's
utilization, temperature and energy trends over the step. gpuwatch: `Engine.range` in this process;
"cold" is the first run on a store opened afresh (DuckDB's cache empty, the OS page cache warm),
"warm" the median of `--runs` after it. VictoriaMetrics: `/api/v1/query_range?nocache=1` over HTTP;
"cold" the first query after a restart. Answers are compared (series count; values at common
timestamps within 1e-6 relative).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import orjson
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import querydata
from bench_query import free_port, wait_http

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import make_labels
from gpuwatch.query import Engine
from gpuwatch.store import Store
from gpuwatch.store.tierrows import TABLE

DAY_S = 86_400
# Samples 7 s off the 15 s grid: no sample sits exactly on a window's start, where VictoriaMetrics
# (left-closed windows) and Prometheus 3 / gpuwatch (left-open) would take different samples.
OFF_GRID_MS = 7_000
METRICS = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
]
PANELS = [  # (name, query): `$step` is the step in seconds
    ("util heatmap", "DCGM_FI_DEV_GPU_UTIL"),
    ("memory", "DCGM_FI_DEV_FB_USED * 1048576"),
    ("power per node", "sum by (Hostname) (DCGM_FI_DEV_POWER_USAGE)"),
    ("mean utilization", "avg(avg_over_time(DCGM_FI_DEV_GPU_UTIL[$step]))"),
    ("hottest per node", "max by (Hostname) (max_over_time(DCGM_FI_DEV_GPU_TEMP[$step]))"),
    ("energy per step", "sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[$step])) / 3.6e9"),
]
NICE_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]


def step_for(span_s: float, width_px: int = 1200) -> int:
    """gw.stepFor (static/js/gpuwatch.js): about a point per 2 px."""
    raw = span_s / max(30, min(11000, width_px // 2))
    return next((s for s in NICE_STEPS if s >= raw), -(-int(raw) // DAY_S) * DAY_S)


def shift_ms(days: int) -> int:
    """Whole days to move querydata's span back by so that it ends before now: VictoriaMetrics drops
    samples more than two days in the future (a year from querydata.T0_MS is)."""
    ahead = querydata.T0_MS + days * DAY_S * 1000 - int(time.time() * 1000)
    return max(0, -(-ahead // (DAY_S * 1000))) * DAY_S * 1000


def series_of(gpus: int, days: int, every_s: int = 15, back_ms: int = 0) -> Any:
    """(name, labels, timestamps, values) of every bench series, one GPU at a time, `back_ms` earlier."""
    t = querydata.timestamps(days)[: -1 : max(1, every_s // 15)] + OFF_GRID_MS - back_ms
    for g in range(gpus):
        values = querydata.gpu_series(g, t)
        for name in METRICS:
            yield name, querydata.gpu_labels(g), t, values[name]


def load_gpuwatch(args: argparse.Namespace, work: Path, now_s: float) -> dict[str, float]:
    clock = FakeClock(now_s)
    t0 = time.perf_counter()
    store = Store.open(work / "gpuwatch", clock=clock, retention_s=14 * DAY_S)
    n = 0
    for name, labels, t, v in series_of(args.gpus, args.days, args.every, args.back_ms):
        store.append_series(name, make_labels(labels), t, v)
        n += v.size
    store.flush()
    store.compact()
    t_write = time.perf_counter() - t0
    print(f"gpuwatch: {n:,} samples written in {t_write:.0f} s", flush=True)
    t0 = time.perf_counter()
    store.build_tiers()
    t_tiers = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.apply_retention(clock.now_ms())
    t_retention = time.perf_counter() - t0
    store.close()
    cur = duckdb.connect(str(work / "gpuwatch" / "gpuwatch.duckdb"), read_only=True)
    rows = [
        (res, count, points, cur.execute(
            f"SELECT sum(octet_length(data)) / sum(n) FROM (SELECT * FROM {table} LIMIT 500)"
        ).fetchone()[0])
        for res, table in TABLE.items()
        for count, points in cur.execute(f"SELECT count(*), sum(n) FROM {table}").fetchall()
    ]  # fmt: skip
    cur.close()
    size = sum(p.stat().st_size for p in (work / "gpuwatch").iterdir() if p.is_file())
    print(
        f"gpuwatch: {n:,} samples written in {t_write:.0f} s; tiers built in {t_tiers:.0f} s "
        f"({n / t_tiers / 1e6:.2f} M samples/s); retention {t_retention:.1f} s; file {size / 1e6:,.0f} MB "
        f"after close ({size / n:.2f} B per sample written)",
        flush=True,
    )
    for res, count, points, per_point in rows:
        print(
            f"  tier {res // 1000} s: {count:,} rows, {points:,} points, ~{per_point:.1f} B a point",
            flush=True,
        )
    return {"samples": n, "size": size}


def start_vm(data: Path) -> tuple[subprocess.Popen[Any], str]:
    port = free_port()
    proc = subprocess.Popen(
        ["victoria-metrics", f"-storageDataPath={data}", f"-httpListenAddr=127.0.0.1:{port}",
         "-retentionPeriod=100y", "-loggerLevel=ERROR", "-search.latencyOffset=0s", "-search.maxPointsPerTimeseries=100000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/health", proc)
    return proc, base


def load_vm(args: argparse.Namespace, work: Path) -> tuple[subprocess.Popen[Any], str]:
    proc, base = start_vm(work / "vm")
    t0 = time.perf_counter()
    with requests.Session() as session:
        for name, labels, t, v in series_of(args.gpus, args.days, args.every, args.back_ms):
            line = orjson.dumps(
                {"metric": {"__name__": name, **labels}, "values": v, "timestamps": t},
                option=orjson.OPT_SERIALIZE_NUMPY,
            )
            session.post(f"{base}/api/v1/import", data=line, timeout=600).raise_for_status()
        session.get(f"{base}/internal/force_flush", timeout=600).raise_for_status()
    took = time.perf_counter() - t0
    print(f"victoria-metrics: imported in {took:.0f} s", flush=True)
    return proc, base


def answer_of(result: Any) -> dict[tuple[tuple[str, str], ...], dict[int, float]]:
    out = {}
    for s in result:
        labels = tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__"))
        out[labels] = {int(round(float(t) * 1000)): float(v) for t, v in s["values"]}
    return out


def matrix_answer(m: Any) -> dict[tuple[tuple[str, str], ...], dict[int, float]]:
    return {
        tuple(sorted((k, v) for k, v in s.labels.items() if k != "__name__")): dict(
            zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True)
        )
        for s in m
    }


def compare(a: dict[Any, dict[int, float]], b: dict[Any, dict[int, float]]) -> str:
    if len(a) != len(b):
        return f"series {len(a)} vs {len(b)}"
    worst, common = 0.0, 0
    for k, pts in a.items():
        other = b.get(k, {})
        for t, v in pts.items():
            if t in other:
                common += 1
                worst = max(worst, abs(v - other[t]) / max(abs(other[t]), 1e-12))
    return f"same ({common:,} points, worst {worst:.0e})" if worst <= 1e-6 else f"differ (worst {worst:.1e})"


def run(args: argparse.Namespace, work: Path) -> None:
    args.back_ms = shift_ms(args.days)
    end_s = (querydata.T0_MS - args.back_ms) / 1000 + args.days * DAY_S
    now_s = end_s + 600
    load_gpuwatch(args, work, now_s)
    vm = None
    if not args.no_vm and shutil.which("victoria-metrics"):
        vm, base = load_vm(args, work)
    spans = [90] + ([365] if args.days >= 365 else [])
    try:
        for span_days in spans:
            step = step_for(span_days * DAY_S)
            end = int(end_s) // step * step
            start = (int(end_s) - span_days * DAY_S) // step * step
            print(f"\n{span_days} days, step {step} s ({(end - start) // step + 1} points)", flush=True)
            for name, template in PANELS:
                query = template.replace("$step", f"{step}s")
                store = Store.open(work / "gpuwatch", clock=FakeClock(now_s), read_only=True)
                engine = Engine(store)
                t0 = time.perf_counter()
                got = engine.range(query, start * 1000, end * 1000, step * 1000)
                cold = time.perf_counter() - t0
                warm = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    engine.range(query, start * 1000, end * 1000, step * 1000)
                    warm.append(time.perf_counter() - t0)
                store.close()
                line = f"  {name:18s} gpuwatch cold {cold * 1000:7.1f} ms, warm {statistics.median(warm) * 1000:7.1f} ms"
                if vm is not None:
                    params = {"query": query, "start": start, "end": end, "step": step, "nocache": 1}
                    vm.terminate()
                    vm.wait(60)
                    vm, base = start_vm(work / "vm")
                    vm_times = []
                    for _ in range(args.runs + 1):
                        t0 = time.perf_counter()
                        r = requests.get(f"{base}/api/v1/query_range", params=params, timeout=600)
                        vm_times.append(time.perf_counter() - t0)
                    r.raise_for_status()
                    same = compare(matrix_answer(got), answer_of(r.json()["data"]["result"]))
                    line += (
                        f" | VM cold {vm_times[0] * 1000:7.1f} ms, warm {statistics.median(vm_times[1:]) * 1000:7.1f}"
                        f" ms | {same}"
                    )
                print(line, flush=True)
    finally:
        if vm is not None:
            vm.terminate()
            vm.wait(60)
            size = sum(p.stat().st_size for p in (work / "vm").rglob("*") if p.is_file())
            print(f"victoria-metrics: data directory {size / 1e6:,.0f} MB after stop", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--days", type=int, default=90)
    p.add_argument("--every", type=int, default=15, help="seconds between samples (a multiple of 15)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--no-vm", action="store_true")
    p.add_argument("--keep", type=Path, help="build the data here and keep it")
    args = p.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        run(args, args.keep)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            run(args, Path(tmp))


if __name__ == "__main__":
    main()
