"""The dashboard in headless Chromium over 7 days of 64-GPU history: data requests, first chart, and
the cluster page refreshing every second.

    .venv/bin/python bench/bench_dashboard.py [--gpus 64] [--days 7] [--loads 5] [--soak 300]

1. Imports bench/querydata.py's data set (64 dcgm-exporter GPUs on 8 nodes, every 15 s, plus vLLM
   histograms) shifted to end now, and starts `gpuwatch serve` on it (no GPUs of its own).
2. Data requests: each page (cluster, GPU, Explore, timeline) loaded `--loads` times over 24 h and
   over 7 d; every /api/ request's time from the browser's Resource Timing (requestStart ->
   responseEnd); p50 and p95 per page and range. Targets: 24 h p95 <= 100 ms, 7 d <= 300 ms.
3. First chart: navigation -> the first Plotly chart drawn, with a cold cache (a new browser context)
   and with Plotly cached (the same context again). Targets: <= 2.0 s cold, <= 600 ms cached.
4. Soak: the cluster page over 1 h refreshing every second for `--soak` seconds: gpuwatch's CPU
   above its idle (no page: half as long before and after), the browser's main thread busy (CDP TaskDuration) and JS
   heap growth after a forced GC. Targets: <= 3 % of a core, <= 25 %, <= 10 MB.

Two builds side by side (`--trees OLD,NEW --rounds 6 --pages cluster --ranges 24h`): the data is imported
once; each round starts `gpuwatch serve` from each source tree in turn (the order alternating), each on a
fresh copy of the data (its caches cold), and loads the pages `--loads` times; the figures are pooled
per tree, with NEW/OLD ratios. Only data requests are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_history

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # fmt: skip
SETTLED = """() => {
  const ps = Array.from(document.querySelectorAll('[data-panel]'));
  return ps.length > 0 && ps.every(p => p.dataset.state && p.dataset.state !== 'loading');
}"""
API_TIMES = """() => performance.getEntriesByType('resource')
  .filter(e => e.name.includes('/api/'))
  .map(e => [e.responseEnd - e.requestStart, decodeURIComponent(e.name.split('?')[1] || e.name).slice(0, 90)])"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def pages(range_: str, only: set[str] | None = None) -> dict[str, str]:
    r = f"from=now-{range_}&to=now&refresh=off"
    all_pages = {
        "cluster": f"/?{r}",
        "gpu": f"/gpus/node00/1?{r}",
        "explore": f"/explore?expr={quote('avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)')}&{r}",
        "timeline": f"/timeline?{r}",
    }
    return {k: v for k, v in all_pages.items() if only is None or k in only}


def data_requests(
    browser: Any,
    base: str,
    loads: int,
    verbose: bool = False,
    only: set[str] | None = None,
    ranges: tuple[str, ...] = ("24h", "7d"),
    raw: dict[str, list[float]] | None = None,
) -> dict[str, dict[str, float]]:
    """p50/p95 of each page's /api/ requests over `loads` loads (the first with the server's caches
    cold); `raw` collects every request's time by "page range" (and "page range first load"), and
    "page range settled" the time from navigation until every panel has drawn."""
    out: dict[str, dict[str, float]] = {}
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    for range_ in ranges:
        for name, path in pages(range_, only).items():
            times: list[float] = []
            slow: list[tuple[float, str]] = []
            for k in range(loads):
                t0 = time.perf_counter()
                page.goto(base + path)
                page.wait_for_function(SETTLED, timeout=60_000, polling=10)
                if raw is not None:
                    raw.setdefault(f"{name} {range_} settled", []).append((time.perf_counter() - t0) * 1000)
                got = page.evaluate(API_TIMES)
                if raw is not None:
                    raw.setdefault(f"{name} {range_}", []).extend(t for t, _ in got)
                    if k == 0:  # the server's caches cold (each page's first load, if it is loaded first)
                        raw.setdefault(f"{name} {range_} first load", []).extend(t for t, _ in got)
                times += [t for t, _ in got]
                slow += [(t, u) for t, u in got]
            if verbose:
                for t, u in sorted(slow, reverse=True)[:3]:
                    print(f"      {t:6.1f} ms {u}")
            out[f"{name} {range_}"] = {"n": len(times), "p50": pct(times, 0.5), "p95": pct(times, 0.95)}
            print(f"  {name:9s} {range_:4s} requests={len(times):3d} p50={pct(times, 0.5):6.1f} ms "
                  f"p95={pct(times, 0.95):6.1f} ms", flush=True)  # fmt: skip
    ctx.close()
    return out


FIRST_CHART = "() => !!document.querySelector('.js-plotly-plot .main-svg')"


def first_chart(browser: Any, base: str, runs: int) -> dict[str, float]:
    cold: list[float] = []
    warm: list[float] = []
    for _ in range(runs):
        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
        page = ctx.new_page()
        for into in (cold, warm):
            page.goto("about:blank")
            t0 = time.perf_counter()
            page.goto(base + "/?from=now-24h&to=now&refresh=off", wait_until="commit")
            page.wait_for_function(FIRST_CHART, timeout=60_000, polling=10)
            into.append((time.perf_counter() - t0) * 1000)
        ctx.close()
    res = {"cold_median": statistics.median(cold), "cold_max": max(cold),
           "warm_median": statistics.median(warm), "warm_max": max(warm)}  # fmt: skip
    print(f"  first chart: cold median {res['cold_median']:.0f} ms (max {res['cold_max']:.0f}), "
          f"Plotly cached median {res['warm_median']:.0f} ms (max {res['warm_max']:.0f})", flush=True)  # fmt: skip
    return res


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return float(t.user + t.system)


def idle_core(server: psutil.Process, seconds: float) -> float:
    c0 = cpu_s(server)
    time.sleep(seconds)
    return (cpu_s(server) - c0) / seconds


def soak(browser: Any, base: str, server: psutil.Process, seconds: float) -> dict[str, float]:
    """gpuwatch's CPU with the page open, less its idle CPU (the mean of half as long before and after)."""
    time.sleep(20)  # the server's start-up work (opening the store, first rule rounds) settles
    before = idle_core(server, seconds / 2)
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    page = ctx.new_page()
    cdp = ctx.new_cdp_session(page)
    cdp.send("Performance.enable")
    page.goto(base + "/?from=now-1h&to=now&refresh=1s")
    page.wait_for_function(SETTLED, timeout=60_000)
    page.wait_for_timeout(5000)
    cdp.send("HeapProfiler.collectGarbage")

    def metrics() -> dict[str, float]:
        return {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}

    m0, c0, t0 = metrics(), cpu_s(server), time.perf_counter()
    page.wait_for_timeout(seconds * 1000)
    cdp.send("HeapProfiler.collectGarbage")
    m1, c1, t1 = metrics(), cpu_s(server), time.perf_counter()
    wall = t1 - t0
    busy = (m1["TaskDuration"] - m0["TaskDuration"]) / wall
    ctx.close()
    after = idle_core(server, seconds / 2)
    idle = (before + after) / 2
    res = {
        "seconds": wall,
        "server_idle_core": idle,
        "server_idle_before_after": [before, after],
        "server_added_core": (c1 - c0) / wall - idle,
        "main_thread_busy": busy,
        "heap_growth_mb": (m1["JSHeapUsedSize"] - m0["JSHeapUsedSize"]) / 2**20,
        "heap_mb": m1["JSHeapUsedSize"] / 2**20,
    }
    print(f"  soak {wall:.0f} s: gpuwatch +{100 * res['server_added_core']:.1f} % of a core "
          f"(idle {100 * idle:.1f} %), main thread busy {100 * busy:.1f} %, "
          f"heap {res['heap_growth_mb']:+.1f} MB (now {res['heap_mb']:.1f} MB)", flush=True)  # fmt: skip
    return res


def start_server(tree: Path, data: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`gpuwatch serve` from the source tree `tree` on `data` (no GPUs of its own); wait until it answers."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    env["GPUWATCH_RETENTION"] = "3650d"
    env["PYTHONPATH"] = str(tree)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatch.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(data)],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=tree,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    for _ in range(480):
        try:
            if requests.get(base + "/-/health", timeout=2).ok:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.25)
    return proc, base


def side_by_side(args: argparse.Namespace, data: Path, tmp: Path) -> dict[str, Any]:
    """Each round: every tree in turn (order alternating), a fresh copy of `data`, `--loads` loads."""
    from playwright.sync_api import sync_playwright

    trees = [Path(t).resolve() for t in args.trees.split(",")]
    only = set(args.pages.split(",")) if args.pages else None
    ranges = tuple(args.ranges.split(","))
    raw: dict[str, dict[str, list[float]]] = {str(t): {} for t in trees}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        for r in range(args.rounds):
            for tree in trees if r % 2 == 0 else trees[::-1]:
                copy = tmp / f"copy-{r}"
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(data, copy)
                proc, base = start_server(tree, copy, tmp / f"serve-{r}.log")
                try:
                    time.sleep(2)  # the server's start-up work settles
                    print(f"round {r + 1} {tree} {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
                    server = psutil.Process(proc.pid)
                    c0 = cpu_s(server)
                    data_requests(browser, base, args.loads, False, only, ranges, raw[str(tree)])
                    # gpuwatch's CPU over the round's loads: the work, less exposed to the machine's noise
                    raw[str(tree)].setdefault("server CPU a round", []).append((cpu_s(server) - c0) * 1000)
                finally:
                    proc.terminate()
                    proc.wait(60)
        browser.close()
    out: dict[str, Any] = {}
    for key in raw[str(trees[0])]:
        row = {}
        for t in trees:
            xs = raw[str(t)][key]
            row[str(t)] = {"n": len(xs), "p50": pct(xs, 0.5), "p95": pct(xs, 0.95), "max": max(xs)}
        a, b = row[str(trees[0])], row[str(trees[-1])]
        print(f"  {key:28s} " + "  ".join(f"{t.name}: p50 {row[str(t)]['p50']:6.1f} p95 {row[str(t)]['p95']:6.1f} "
              f"max {row[str(t)]['max']:6.1f} ms (n={row[str(t)]['n']})" for t in trees)
              + f"  ratio p50 {b['p50'] / a['p50']:.2f} p95 {b['p95'] / a['p95']:.2f}", flush=True)  # fmt: skip
        out[key] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--first", type=int, default=5, help="first-chart runs")
    ap.add_argument("--soak", type=float, default=300)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--verbose", action="store_true", help="print each page's three slowest requests")
    ap.add_argument("--parts", default="requests,first,soak", help="which measurements (comma-separated)")
    ap.add_argument("--trees", help="OLD,NEW: two source trees measured side by side (module docstring)")
    ap.add_argument("--rounds", type=int, default=6, help="with --trees: rounds, each tree once a round")
    ap.add_argument("--pages", default="", help="with --trees: pages to load (cluster,gpu,explore,timeline)")
    ap.add_argument("--ranges", default="24h,7d", help="with --trees: ranges to load")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix=f"gpuwatch-bench-dash-{os.getpid()}-") as tmp:
        data = Path(tmp) / "data"
        t0 = time.time()
        n = dashboard_history.import_nodes(data, args.gpus, args.days)
        print(
            f"imported {n:,} samples ({args.gpus} GPUs, {args.days:g} days) in {time.time() - t0:.0f} s",
            flush=True,
        )
        if args.trees:
            found = side_by_side(args, data, Path(tmp))
            if args.json:
                Path(args.json).write_text(json.dumps(found, indent=2))
            return
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
        env["GPUWATCH_RETENTION"] = "3650d"
        log = (Path(tmp) / "serve.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(data)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(240):
                try:
                    if requests.get(base + "/-/health", timeout=2).ok:
                        break
                except requests.ConnectionError:
                    pass
                time.sleep(0.5)
            results: dict[str, Any] = {
                "machine": f"{platform.machine()}, {psutil.cpu_count()} cores, Python {platform.python_version()}",
                "gpus": args.gpus,
                "days": args.days,
            }
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
                parts = set(args.parts.split(","))
                if "requests" in parts:
                    print("data requests (browser Resource Timing):", flush=True)
                    results["requests"] = data_requests(browser, base, args.loads, args.verbose)
                if "first" in parts:
                    results["first_chart"] = first_chart(browser, base, args.first)
                if "soak" in parts and args.soak > 0:
                    results["soak"] = soak(browser, base, psutil.Process(proc.pid), args.soak)
                browser.close()
            if args.json:
                Path(args.json).write_text(json.dumps(results, indent=2))
        finally:
            proc.terminate()
            proc.wait(60)
            log.close()


if __name__ == "__main__":
    main()
