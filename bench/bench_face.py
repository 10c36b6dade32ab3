"""A gpuwatch face on VictoriaMetrics beside gpuwatch alone: the cluster page's panel queries.

Usage: python bench/bench_face.py [--gpus 64] [--hours 24] [--loads 5] [--ranges 1h,24h] [--width 1200]
       [--bodies]

Data, built before anything is timed: bench/querydata.py's GPUs (12 dcgm-exporter figures each, every
15 s, on nodes of 8) and its inference series, over `--hours` ending now; written into a fresh
Debian VictoriaMetrics (`-search.latencyOffset=0s`, remote write in 5-minute slices, then
`/internal/force_flush`) and into a fresh gpuwatch store (`Store.append_many`, flushed).

Then, in turns, `--loads` loads of the cluster page a range: every panel of `cluster.PANELS` (all nodes)
as gpuwatch.js asks it (`query_range` over the range with its step for ~`--width`/2 points, start and
end aligned to the step; `$__rate` 4 steps or 60 s, `$__today` the range) and the page twin's raw read
(`read_overview` and the stale-GPU read), through `LocalBackend` (gpuwatch's engine over the store) and
`RemoteBackend` (VictoriaMetrics' API). Per load: wall time, this process's CPU (the face's side: the
requests, reading the answers, or the local engine), and VictoriaMetrics' CPU (/proc/PID/stat); then
one more load under tracemalloc, whose peak is the memory a page load takes. The first load of each
is cold (VictoriaMetrics' caches, gpuwatch's chunk cache), the rest warm. One
process, no HTTP between the page and gpuwatch: what the face adds per page load, not the browser's.

`--bodies`: the body the browser gets for each panel's `/api/v1/query_range` (the face alone, no
gpuwatch store): read and written again (`success_body(RemoteBackend.range(...))`, the API's path
before the pass-through) against passed through (`RemoteBackend.range_body`), a load of each in turn,
then one more of each under tracemalloc; the ratios of the warm medians and of the peaks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import querydata  # noqa: E402

from gpuwatch.app.config import load  # noqa: E402
from gpuwatch.core.clock import FakeClock  # noqa: E402
from gpuwatch.core.model import Matcher, make_labels  # noqa: E402
from gpuwatch.query.backend import LocalBackend, QueryBackend  # noqa: E402
from gpuwatch.query.remote import RemoteBackend  # noqa: E402
from gpuwatch.query.values import success_body  # noqa: E402
from gpuwatch.remote.storage import RemoteStorage  # noqa: E402
from gpuwatch.remote.wire import HEADERS, compress, encode_request, encode_series  # noqa: E402
from gpuwatch.store import Store  # noqa: E402
from gpuwatch.web.dash.cluster import PANELS  # noqa: E402
from gpuwatch.web.dash.panel import fill  # noqa: E402
from gpuwatch.web.overview import read_overview  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
NICE_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def step_for(range_s: int, width: int) -> int:
    raw = range_s / max(30, min(11_000, width // 2))
    return next((s for s in NICE_STEPS if s >= raw), 86400)


def write_vm(url: str, series: list[querydata.Series], slice_ms: int = 300_000) -> None:
    lo = min(int(s.timestamps_ms[0]) for s in series)
    hi = max(int(s.timestamps_ms[-1]) for s in series)
    for start in range(lo, hi + 1, slice_ms):
        messages = []
        for s in series:
            keep = (s.timestamps_ms >= start) & (s.timestamps_ms < start + slice_ms)
            if keep.any():
                labels = sorted({"__name__": s.name, **s.labels}.items())
                messages.append(
                    encode_series(labels, s.timestamps_ms[keep].tolist(), s.values[keep].tolist())
                )
        for i in range(0, len(messages), 1000):
            r = requests.post(
                url, data=compress(encode_request(messages[i : i + 1000])), headers=HEADERS, timeout=60
            )
            r.raise_for_status()


def page_load(backend: QueryBackend, end_ms: int, range_s: int, width: int) -> int:
    """One cluster page load's queries; return the points answered."""
    step = step_for(range_s, width)
    step_ms = step * 1000
    start = (end_ms - range_s * 1000) // step_ms * step_ms
    end = -(-end_ms // step_ms) * step_ms
    variables = {"host_re": ".+", "__rate": f"{max(60, 4 * step)}s", "__interval": f"{step}s",
                 "__range": f"{range_s}s", "__today": f"{range_s}s"}  # fmt: skip
    points = 0
    for p in PANELS:
        m = backend.range(fill(p.query, variables), start, end, step_ms)
        points += sum(len(s.timestamps_ms) for s in m)
    rows = read_overview(backend, end_ms, 30_000)
    backend.select([Matcher("__name__", "=", "DCGM_FI_DEV_GPU_UTIL")], end_ms - 600_000, end_ms)
    return points + len(rows)


Body = Callable[[str, int, int, int], bytes]


def panel_bodies(body: Body, end_ms: int, range_s: int, width: int) -> int:
    """One cluster page load's panel answers as the browser gets them; return their bytes."""
    step = step_for(range_s, width)
    step_ms = step * 1000
    start = (end_ms - range_s * 1000) // step_ms * step_ms
    end = -(-end_ms // step_ms) * step_ms
    variables = {"host_re": ".+", "__rate": f"{max(60, 4 * step)}s", "__interval": f"{step}s",
                 "__range": f"{range_s}s", "__today": f"{range_s}s"}  # fmt: skip
    return sum(len(body(fill(p.query, variables), start, end, step_ms)) for p in PANELS)


def measure_turns(label: str, fns: dict[str, Callable[[], int]], vm_pid: int, loads: int) -> None:
    """A load of each of `fns` in turn, `loads` times; then one more of each under tracemalloc."""
    walls: dict[str, list[float]] = {k: [] for k in fns}
    cpus: dict[str, list[float]] = {k: [] for k in fns}
    vms: dict[str, list[float]] = {k: [] for k in fns}
    size: dict[str, int] = {}
    for _ in range(loads):
        for name, fn in fns.items():
            t0, c0, v0 = time.perf_counter(), time.process_time(), cpu_s(vm_pid)
            size[name] = fn()
            walls[name].append(time.perf_counter() - t0)
            cpus[name].append(time.process_time() - c0)
            vms[name].append(cpu_s(vm_pid) - v0)
    peaks = {}
    for name, fn in fns.items():
        tracemalloc.start()
        fn()
        peaks[name] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    warm = slice(1, None) if loads > 1 else slice(0, None)
    cpu = {k: statistics.median(v[warm]) for k, v in cpus.items()}
    for name in fns:
        print(
            f"{label}, {name:22s} cold {walls[name][0] * 1000:6.0f} ms (face CPU {cpus[name][0] * 1000:5.0f} ms)"
            f" | warm median {statistics.median(walls[name][warm]) * 1000:6.0f} ms (face CPU {cpu[name] * 1000:5.0f}"
            f" ms [{min(cpus[name][warm]) * 1000:.0f}-{max(cpus[name][warm]) * 1000:.0f}], VM CPU"
            f" {statistics.median(vms[name][warm]) * 1000:5.0f} ms) | {size[name] / 2**20:.1f} MiB of bodies"
            f" | peak {peaks[name]:.1f} MiB a load",
            flush=True,
        )
    old, new = list(fns)
    print(
        f"{label}: {new} / {old}: face CPU {cpu[new] / cpu[old]:.2f}x, peak {peaks[new] / peaks[old]:.2f}x",
        flush=True,
    )


def measure(name: str, fn: Callable[[], int], vm_pid: int, loads: int) -> None:
    walls, cpus, vms = [], [], []
    points = 0
    for _ in range(loads):
        t0, c0, v0 = time.perf_counter(), time.process_time(), cpu_s(vm_pid)
        points = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        vms.append(cpu_s(vm_pid) - v0)
    warm = slice(1, None) if loads > 1 else slice(0, None)
    tracemalloc.start()  # one more load, traced: the memory a page load takes at its peak (numpy's too)
    fn()
    peak_mib = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    print(
        f"{name:28s} cold {walls[0] * 1000:7.0f} ms (face CPU {cpus[0] * 1000:6.0f} ms, VM CPU {vms[0] * 1000:6.0f} ms)"
        f" | warm median {statistics.median(walls[warm]) * 1000:7.0f} ms (face CPU"
        f" {statistics.median(cpus[warm]) * 1000:6.0f} ms, VM CPU {statistics.median(vms[warm]) * 1000:6.0f} ms)"
        f" | {points} points | peak {peak_mib:.1f} MiB a load",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--ranges", default="1h,24h")
    ap.add_argument("--width", type=int, default=1200)
    ap.add_argument("--bodies", action="store_true", help="the API's bodies: read and written, or passed")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()}", flush=True)
    t0 = time.perf_counter()
    series = querydata.generate(args.gpus, args.hours / 24)
    shift = int(time.time() * 1000) // 1000 * 1000 - max(int(s.timestamps_ms[-1]) for s in series)
    series = [querydata.Series(s.name, s.labels, s.timestamps_ms + shift, s.values) for s in series]
    end_ms = max(int(s.timestamps_ms[-1]) for s in series)
    samples = sum(len(s.timestamps_ms) for s in series)
    print(
        f"data: {args.gpus} GPUs, {len(series)} series, {samples:,} samples ({time.perf_counter() - t0:.1f} s)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        port = 18000 + os.getpid() % 1000
        vm = subprocess.Popen(
            ["victoria-metrics", "-search.latencyOffset=0s", "-retentionPeriod=100y",
             f"-storageDataPath={tmp}/vm", f"-httpListenAddr=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):
                try:
                    if requests.get(f"{url}/health", timeout=1).ok:
                        break
                except requests.RequestException:
                    time.sleep(0.2)
            t0 = time.perf_counter()
            write_vm(f"{url}/api/v1/write", series)
            requests.get(f"{url}/internal/force_flush", timeout=60)
            print(f"VictoriaMetrics written in {time.perf_counter() - t0:.1f} s")
            settings = load(None, {}, {"data_dir": tmp, "query_timeout": 120})
            remote = RemoteBackend(RemoteStorage(url), settings)
            if args.bodies:
                variants: dict[str, Body] = {
                    "read and written": lambda e, a, b, s: success_body(remote.range(e, a, b, s)),
                    "passed through": remote.range_body,
                }
                for text in args.ranges.split(","):
                    range_s = int(text[:-1]) * {"m": 60, "h": 3600, "d": 86400}[text[-1]]
                    fns = {
                        k: (lambda f=f, r=range_s: panel_bodies(f, end_ms, r, args.width))
                        for k, f in variants.items()
                    }
                    measure_turns(f"{args.gpus} GPUs, {text}", fns, vm.pid, args.loads)
            else:
                clock = FakeClock(end_ms / 1000)
                store = Store.open(Path(tmp) / "store", clock=clock, flush_interval_s=3600.0)
                t0 = time.perf_counter()
                store.append_many(
                    [(s.name, make_labels(s.labels), s.timestamps_ms, s.values) for s in series]
                )
                store.flush()
                print(f"gpuwatch store written in {time.perf_counter() - t0:.1f} s")
                local = LocalBackend(store, store, settings, time.monotonic)
                for text in args.ranges.split(","):
                    range_s = int(text[:-1]) * {"m": 60, "h": 3600, "d": 86400}[text[-1]]
                    for name, backend in (("gpuwatch alone", local), ("face on VictoriaMetrics", remote)):
                        measure(f"{name}, {text}", lambda b=backend, r=range_s: page_load(b, end_ms, r, args.width), vm.pid,
                                args.loads)  # fmt: skip
                store.close()
        finally:
            vm.terminate()
            vm.wait(10)
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
