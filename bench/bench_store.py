"""Benchmark the store: bulk and live ingest rates, bytes per sample on disk, range-read latency.

Run on demand (not a test):  python bench/bench_store.py [--quick] [--dir /tmp/x]

The data set is synthetic but shaped like a real GPU node, and deterministic (fixed seeds):
64 GPUs x 25 dcgm-exporter metrics at 1 s. Utilisation moves in job phases (steps) with noise,
temperatures are integers that follow the load, power has 2 decimals, energy (mJ) and PCIe bytes are
rising counters, clocks are MHz steps, memory is MiB, DCGM_FI_PROF_* ratios have 6 decimals,
error counters are mostly zero.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Labels, Matcher, Sample, make_labels
from gpuwatch.store import Store

METRICS = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_POWER_VIOLATION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
]
READ_FIRST = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
]
T0_MS = 1_780_000_000_000 // 86_400_000 * 86_400_000  # a UTC midnight
FB_TOTAL = 81_559.0


def gpu_labels(g: int) -> Labels:
    return make_labels(
        {
            "gpu": str(g % 8),
            "UUID": f"GPU-{g:08x}-5f1e-4c3a-9b1d-{g * 7919:012x}",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": f"node{g // 8:02d}",
            "pci_bus_id": f"00000000:{0x18 + 16 * (g % 8):02X}:00.0",
        }
    )


def gpu_day(g: int, day: int, seconds: int = 86_400) -> dict[str, np.ndarray]:
    """Return all 25 metrics of GPU `g` for `seconds` starting at day `day`, deterministically."""
    rng = np.random.default_rng([g, day])
    n = seconds
    # Job phases of 5-60 min at a load level; idle phases in between.
    lengths = rng.integers(300, 3600, n // 300 + 2)
    levels = np.where(rng.random(lengths.size) < 0.2, 0.0, rng.uniform(40, 100, lengths.size))
    load = np.repeat(levels, lengths)[:n]
    util = np.clip(np.rint(load + rng.normal(0, 3, n) * (load > 0)), 0, 100)
    temp_ema = 35 + 0.5 * np.convolve(load, np.full(120, 1 / 120), mode="full")[:n]
    temp = np.clip(np.rint(temp_ema + rng.normal(0, 0.4, n)), 30, 90)
    power = np.round(70 + 6.3 * load + rng.normal(0, 4, n) * (load > 0) + rng.normal(0, 0.3, n), 2)
    energy0 = float((g * 1_000 + day) * 86_400 * 300_000)
    energy = energy0 + np.cumsum(np.rint(power * 1000))
    sm_clock = np.where(load > 0, 1980 - 15 * rng.integers(0, 3, n) * (rng.random(n) < 0.05), 345)
    fb_used = np.repeat(np.where(levels > 0, np.rint(levels * 700), 1), lengths)[:n]
    pcie_tx = np.rint(np.maximum(0, load * 120 + rng.normal(0, 150, n)) * (load > 0))  # KB/s
    pcie_rx = np.rint(np.maximum(0, load * 900 + rng.normal(0, 500, n)) * (load > 0))
    base_bytes = float((g * 1_000 + day) * 86_400 * 50_000_000)
    violation = np.cumsum((temp > 85) * 1_000_000.0) + day * 1e9
    gr_active = np.round(np.clip(load / 100 + rng.normal(0, 0.01, n) * (load > 0), 0, 1), 6)
    dram = np.round(gr_active * 0.45, 6)
    tensor = np.round(gr_active * 0.7, 6)
    zeros = np.zeros(n)
    out = {
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_MEM_COPY_UTIL": np.rint(util * 0.4),
        "DCGM_FI_DEV_ENC_UTIL": zeros,
        "DCGM_FI_DEV_DEC_UTIL": zeros,
        "DCGM_FI_DEV_GPU_TEMP": temp,
        "DCGM_FI_DEV_MEMORY_TEMP": temp + 4,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": energy,
        "DCGM_FI_DEV_SM_CLOCK": sm_clock.astype(np.float64),
        "DCGM_FI_DEV_MEM_CLOCK": np.full(n, 2619.0),
        "DCGM_FI_DEV_FB_USED": fb_used,
        "DCGM_FI_DEV_FB_FREE": FB_TOTAL - fb_used,
        "DCGM_FI_DEV_FB_TOTAL": np.full(n, FB_TOTAL),
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": pcie_tx,
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": pcie_rx,
        "DCGM_FI_PROF_PCIE_TX_BYTES": base_bytes + np.cumsum(pcie_tx * 1024),
        "DCGM_FI_PROF_PCIE_RX_BYTES": base_bytes + np.cumsum(pcie_rx * 1024),
        "DCGM_FI_DEV_XID_ERRORS": zeros,
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": np.cumsum(rng.random(n) < 1e-4).astype(np.float64),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": zeros,
        "DCGM_FI_DEV_POWER_VIOLATION": violation,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": zeros,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": gr_active,
        "DCGM_FI_PROF_DRAM_ACTIVE": dram,
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": tensor,
    }
    return {k: v.astype(np.float64) for k, v in out.items()}


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.name.startswith("gpuwatch.duckdb"))


def bench_bulk(d: Path, gpus: int, hours: int) -> tuple[float, float, int]:
    """Append `hours` of every series, 2 h (one chunk window) per call; return (samples/s, B/sample, n)."""
    store = Store.open(d, clock=FakeClock())
    labels = [gpu_labels(g) for g in range(gpus)]
    elapsed, total = 0.0, 0
    data = {g: gpu_day(g, 0, hours * 3600) for g in range(gpus)}
    ts_all = T0_MS + np.arange(hours * 3600, dtype=np.int64) * 1000
    for lo in range(0, hours * 3600, 7200):
        sl = slice(lo, lo + 7200)
        block = [
            (name, labels[g], ts_all[sl].copy(), data[g][name][sl].copy())
            for g in range(gpus)
            for name in METRICS
        ]
        t = time.perf_counter()
        for name, lab, ts, vs in block:
            store.append_series(name, lab, ts, vs)
        store.flush()
        elapsed += time.perf_counter() - t
        total += sum(b[2].size for b in block)
    t = time.perf_counter()
    store.close()
    close_s = time.perf_counter() - t
    print(
        f"  bulk: {total:,} samples in {elapsed:.2f} s ({total / elapsed:,.0f} samples/s); close {close_s:.2f} s"
    )
    size = dir_bytes(d)
    print(f"  size after close: {size:,} bytes = {size / total:.3f} bytes/sample")
    return total / elapsed, size / total, total


def bench_live(d: Path, gpus: int, ticks: int) -> float:
    """Append Batch objects of gpus*25 samples per tick, as the collector does; return samples/s."""
    store = Store.open(d, clock=FakeClock())
    labels = [gpu_labels(g) for g in range(gpus)]
    data = {g: gpu_day(g, 1, ticks) for g in range(gpus)}
    batches = [
        Batch(
            T0_MS + k * 1000,
            [Sample(name, labels[g], float(data[g][name][k])) for g in range(gpus) for name in METRICS],
        )
        for k in range(ticks)
    ]
    t = time.perf_counter()
    for b in batches:
        store.append(b)
    store.flush()
    elapsed = time.perf_counter() - t
    n = ticks * gpus * len(METRICS)
    print(f"  live: {n:,} samples in {ticks} batches, {elapsed:.2f} s ({n / elapsed:,.0f} samples/s)")
    t = time.perf_counter()
    store.close()
    print(f"  close (compaction of {n:,} head rows + checkpoint): {time.perf_counter() - t:.2f} s")
    return n / elapsed


def bench_read(d: Path, gpus: int, days: int, metrics: list[str], reads: int) -> tuple[float, float]:
    """Build a `days`-long store, then read one series over 24 h at random; return (median, p90) ms."""
    store = Store.open(d, clock=FakeClock())
    labels = [gpu_labels(g) for g in range(gpus)]
    t = time.perf_counter()
    total = 0
    for day in range(days):
        ts = T0_MS + day * 86_400_000 + np.arange(86_400, dtype=np.int64) * 1000
        for g in range(gpus):
            data = gpu_day(g, day)
            for name in metrics:
                store.append_series(name, labels[g], ts, data[name])
                total += ts.size
    store.close()
    print(
        f"  built {total:,} samples ({gpus} GPUs x {len(metrics)} metrics x {days} d) in {time.perf_counter() - t:.0f} s"
    )
    print(f"  size: {dir_bytes(d) / total:.3f} bytes/sample")
    store = Store.open(d, clock=FakeClock())
    rng = np.random.default_rng(7)
    times = []
    for i in range(reads + 3):
        g, name = int(rng.integers(gpus)), metrics[int(rng.integers(len(metrics)))]
        start = T0_MS + int(rng.integers(0, (days - 1) * 86_400)) * 1000
        matchers = [Matcher("__name__", "=", name), Matcher("UUID", "=", dict(labels[g])["UUID"])]
        t = time.perf_counter()
        (got,) = store.select(matchers, start, start + 86_400_000 - 1)
        ms = (time.perf_counter() - t) * 1000
        assert got.values.size == 86_400, got.values.size
        if i >= 3:  # the first reads warm the cursor and the page cache
            times.append(ms)
    store.close()
    median, p90 = statistics.median(times), float(np.percentile(times, 90))
    print(
        f"  read 24 h of one series (86,400 samples), {reads} reads: median {median:.1f} ms, p90 {p90:.1f} ms"
    )
    return median, p90


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, help="scratch directory (default: a temp dir, removed afterwards)")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--bulk-hours", type=int, default=6, help="hours of all series for bulk ingest + size")
    ap.add_argument("--live-ticks", type=int, default=600, help="1 s ticks for the live-path ingest")
    ap.add_argument("--read-days", type=int, default=7)
    ap.add_argument("--read-metrics", type=int, default=4, help="metrics per GPU in the read store (<= 25)")
    ap.add_argument("--reads", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, to check that the script runs")
    args = ap.parse_args(argv)
    if args.quick:
        args.gpus, args.bulk_hours, args.live_ticks, args.read_days, args.read_metrics, args.reads = (
            4,
            2,
            20,
            2,
            2,
            5,
        )
    root = args.dir or Path(tempfile.mkdtemp(prefix="gpuwatch-bench-"))
    print(f"python {platform.python_version()}, duckdb {duckdb.__version__}, numpy {np.__version__}")
    try:
        print(f"(1+3) bulk ingest, {args.gpus} GPUs x {len(METRICS)} metrics x {args.bulk_hours} h at 1 s")
        bench_bulk(root / "bulk", args.gpus, args.bulk_hours)
        print(f"(2) live-path ingest, {args.gpus * len(METRICS)} samples per Batch")
        bench_live(root / "live", args.gpus, args.live_ticks)
        print(f"(4) range reads from a {args.read_days}-day store")
        read_metrics = READ_FIRST + [m for m in METRICS if m not in READ_FIRST]
        bench_read(root / "read", args.gpus, args.read_days, read_metrics[: args.read_metrics], args.reads)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
