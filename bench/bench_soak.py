"""Soak: `gpuwatch serve --demo` (64 GPUs, 20 vLLM-sized targets) under 50 dashboards refreshing every second.

    .venv/bin/python bench/bench_soak.py [--clients 50] [--seconds 600] [--mix 36,8,6] [--csv rss.csv]

1. Starts bench/scrape_targets.py (20 prometheus_client servers of ~1,700 lines, scraped every 5 s as
   job `vllm`), then `gpuwatch serve --demo` with 64 simulated GPUs at 1 s (demo sources off, default
   log level, its stderr kept), and waits `--warmup` seconds.
2. Clients: one asyncio loop in this process plays `--clients` browser tabs (the mix: cluster page,
   GPU pages, the inference service page of job `vllm`), each refreshing every `--refresh` seconds (1) over the last hour.
   Each client first loads its page's HTML, then runs static/js/gpuwatch.js's refresh as the page
   does: panels from the page's JSON twin, a chart asks once a step (the step from its width, start
   and end aligned to it), a stat at every tick or once its `min_interval`, an empty answer asks the
   panel's `failed_if`/`unsupported_if`, a changed chart its `failed_if`; plus each page's own
   requests (the cluster twin every 5 s, the GPU page's health queries, the inference page's latency
   heatmap and twin every tick). A tick whose requests are still out is skipped, as the page skips
   it. Each client has at most 6 keep-alive connections, as a browser has per host.
3. Every 10 s: gpuwatch's RSS and CPU, this process's CPU (the load generator) and the targets',
   one `/-/health`, and from gpuwatch's `/metrics` the memory DuckDB and the chunk cache hold.
4. After the load stops: every GPU series' timestamps over the window (`DCGM_FI_*` names, from the
   store through the API) and the gaps over 2 sample intervals; the sample job's runs; the log
   lines gpuwatch wrote (per condition and minute, and the conditions held back by the log throttle);
   then SIGTERM and its exit status.

Prints figures for bench/README.md ("Soak"); `--csv` writes the 10 s rows. With `--mallinfo`,
`--trace START,SNAP,...` (seconds into the load) and `--trace-dir DIR`, the server starts tracemalloc
at START and dumps a snapshot at each SNAP into DIR; the run ends with what grew between them,
by the place that allocated it. `--types T,...` (with `--mallinfo` and `--trace-dir`) counts the
server's objects by type at each T instead, at ~1 s a count against tracing's doubled CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import collections
import contextlib
import csv
import itertools
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import soaktabs  # noqa: E402
from bench.scrape_targets import start_targets  # noqa: E402
from bench.soaktabs import Page, Pool, Record, run_client  # noqa: E402


# -- the soak -------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def rss_parts_mib(pid: int) -> tuple[float, float, float]:
    """Resident memory by kind of mapping (/proc/PID/smaps): glibc's main heap (`[heap]`, where every
    thread allocates under MALLOC_ARENA_MAX=1), other anonymous memory (CPython's 1 MiB arenas, DuckDB's
    allocator, big mmapped blocks, stacks) and file-backed pages (code, the mapped store)."""
    parts = {"heap": 0, "anon": 0, "file": 0}
    kind = "anon"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line.startswith("Rss:"):
                    parts[kind] += int(line.split()[1])
                # a mapping's header (address range, perms, offset, dev, inode, name), not a field
                elif not line[0].isupper():
                    fields = line.split(maxsplit=5)
                    name = fields[5].strip() if len(fields) > 5 else ""
                    kind = "heap" if name == "[heap]" else "file" if name.startswith("/") else "anon"
    except OSError:
        return math.nan, math.nan, math.nan
    return parts["heap"] / 1024, parts["anon"] / 1024, parts["file"] / 1024


@dataclass
class Row:
    t_s: float
    rss_mib: float
    serve_cpu_pct: float
    load_cpu_pct: float
    targets_cpu_pct: float
    health: int
    health_ms: float
    requests: int
    loadavg: float
    duckdb_mib: float  # gpuwatch's own figures on /metrics (nan where it did not answer)
    cache_mib: float
    heap_mib: float  # RSS by kind of mapping (rss_parts_mib)
    anon_mib: float
    file_mib: float
    index_mib: float = math.nan  # the store's indexes (gpuwatch_store_index_bytes)
    trimmed_mib: float = math.nan  # given back by the trim job so far (gpuwatch_memory_trimmed_bytes_total)
    wal_mib: float = math.nan  # DuckDB's write-ahead log: what is written since its last checkpoint


def wal_mib(data_dir: Path) -> float:
    return sum(f.stat().st_size for f in data_dir.glob("*.wal")) / 2**20 if data_dir.is_dir() else math.nan


async def monitor(
    url_host: str, port: int, serve: psutil.Process, targets: psutil.Process, rec: Record, stop: asyncio.Event,
    every_s: float, rows: list[Row], trace: list[float], types: list[float], trace_dir: Path | None,
    data_dir: Path,
) -> None:  # fmt: skip
    me = psutil.Process()
    pool = Pool(url_host, port, 1)
    t0 = time.monotonic()
    last = (t0, cpu_s(serve), cpu_s(me), cpu_s(targets), 0)
    asked = 0  # trace requests left for memprobe.py: the first starts tracing, the rest are snapshots
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
        now = time.monotonic()
        h0 = time.perf_counter()
        try:
            status, _ = await pool.get("/-/health")
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            status = 0
        health_ms = 1000 * (time.perf_counter() - h0)
        own = dict.fromkeys(
            ["gpuwatch_store_duckdb_memory_bytes", "gpuwatch_store_chunk_cache_bytes", "gpuwatch_store_index_bytes",
             "gpuwatch_memory_trimmed_bytes_total"], math.nan,
        )  # fmt: skip
        try:
            code, text = await pool.get("/metrics")
            for line in text.decode().splitlines() if code == 200 else ():
                name, _, value = line.partition(" ")
                if name in own:
                    own[name] = float(value) / 2**20
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass
        done = sum(len(v) for v in rec.latencies.values())
        cur = (now, cpu_s(serve), cpu_s(me), cpu_s(targets), done)
        wall = cur[0] - last[0]
        rows.append(
            Row(now - t0, serve.memory_info().rss / 2**20, 100 * (cur[1] - last[1]) / wall,
                100 * (cur[2] - last[2]) / wall, 100 * (cur[3] - last[3]) / wall, status, health_ms,
                cur[4] - last[4], os.getloadavg()[0], own["gpuwatch_store_duckdb_memory_bytes"],
                own["gpuwatch_store_chunk_cache_bytes"], *rss_parts_mib(serve.pid),
                own["gpuwatch_store_index_bytes"], own["gpuwatch_memory_trimmed_bytes_total"], wal_mib(data_dir))
        )  # fmt: skip
        r = rows[-1]
        while trace and trace_dir and r.t_s >= trace[0]:  # memprobe.py answers at its next row
            (trace_dir / ("start" if asked == 0 else f"snap-{asked:02d}-{r.t_s:.0f}s")).write_text("")
            asked += 1
            trace.pop(0)
        while types and trace_dir and r.t_s >= types[0]:
            (trace_dir / f"types-{len(rows):05d}-{r.t_s:.0f}s").write_text("")
            types.pop(0)
        print(
            f"  {r.t_s:5.0f} s  rss {r.rss_mib:6.1f} MiB (heap {r.heap_mib:.0f}, anon {r.anon_mib:.0f}, file {r.file_mib:.0f}; duckdb {r.duckdb_mib:4.1f}, chunk cache {r.cache_mib:5.1f}, index {r.index_mib:.0f}, trimmed {r.trimmed_mib:.0f}, wal {r.wal_mib:.0f})  serve {r.serve_cpu_pct:5.1f} %  load gen {r.load_cpu_pct:5.1f} %"
            f"  targets {r.targets_cpu_pct:5.1f} %  health {r.health} ({r.health_ms:.0f} ms)  {r.requests / wall:5.1f} req/s"
            f"  loadavg {r.loadavg:.2f}",
            flush=True,
        )
        last = cur
    pool.close()


async def soak(args: argparse.Namespace, port: int, serve: psutil.Process, targets: psutil.Process, data_dir: Path) -> tuple[Record, list[Row], float]:  # fmt: skip
    host = "127.0.0.1"
    rec = Record()
    n_cluster, n_gpu, n_inf = (int(x) for x in args.mix.split(","))
    scale = args.clients / (n_cluster + n_gpu + n_inf)
    counts = [round(n_cluster * scale), round(n_gpu * scale)]
    counts.append(args.clients - sum(counts))
    twin = requests.get(f"http://{host}:{port}/api/ui/cluster", timeout=30).json()["data"]
    gpus = [(g["hostname"], g["gpu"]) for g in twin["gpus_seen"]]
    rng = random.Random(7)
    pages: list[Page] = []
    for _ in range(counts[0]):
        pages.append(Page("cluster", "/?refresh=1s", "/api/ui/cluster", 4.5, rec, Pool(host, port)))
    for _ in range(counts[1]):
        h, g = rng.choice(gpus)
        gp = f"{quote(h, safe='')}/{quote(g, safe='')}"
        pages.append(Page("gpu", f"/gpus/{gp}?refresh=1s", f"/api/ui/gpus/{gp}", 0, rec, Pool(host, port)))
    for _ in range(counts[2]):
        pages.append(Page("inference", "/inference/vllm?refresh=1s", "/api/ui/inference/vllm", 0, rec, Pool(host, port)))  # fmt: skip
    stop = asyncio.Event()
    rows: list[Row] = []
    w0 = time.monotonic()
    tasks = [asyncio.create_task(run_client(p, stop, rng.uniform(0, 2.0))) for p in pages]
    trace = [float(x) for x in args.trace.split(",")] if args.trace else []
    types = [float(x) for x in args.types.split(",")] if args.types else []
    trace_dir = Path(args.trace_dir) if args.trace_dir else None
    mon = asyncio.create_task(
        monitor(host, port, serve, targets, rec, stop, args.every, rows, trace, types, trace_dir, data_dir)
    )
    await asyncio.sleep(args.seconds)
    rec.recording = False
    wall = time.monotonic() - w0
    stop.set()
    await asyncio.gather(*tasks, mon, return_exceptions=True)
    kinds = collections.defaultdict(list)
    for p in pages:
        if p.panels:
            kinds[p.kind].append(p.nominal_rate())
    rec.nominal = (
        sum(sum(v) for v in kinds.values()) * len(pages) / max(1, sum(len(v) for v in kinds.values()))
    )
    print(
        f"clients: {counts[0]} cluster, {counts[1]} GPU, {counts[2]} inference pages; nominal requests/s a page: "
        + ", ".join(f"{k} {sum(v) / len(v):.2f}" for k, v in kinds.items())
    )
    return rec, rows, wall


_LOST = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d+) \w+ \S+: GPU (\d+) \(.*\) (is lost|answers again)"
)


def lost_spells(log_text: str, end_s: float) -> dict[str, list[tuple[float, float]]]:
    """When each GPU was lost, from gpuwatch's log (the demo loses one on schedule): by the `gpu` label,
    (from, to) in Unix seconds (the log's times are the machine's, read as UTC)."""
    spells: dict[str, list[tuple[float, float]]] = {}
    since: dict[str, float] = {}
    for line in log_text.splitlines():
        m = _LOST.match(line)
        if not m:
            continue
        at = calendar.timegm(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
        if m.group(4) == "is lost":
            since.setdefault(m.group(3), at)
        elif m.group(3) in since:
            spells.setdefault(m.group(3), []).append((since.pop(m.group(3)), at))
    for gpu, at in since.items():
        spells.setdefault(gpu, []).append((at, end_s))
    return spells


def gpu_gaps(
    url: str, start_s: float, end_s: float, interval_s: float, lost: dict[str, list[tuple[float, float]]]
) -> dict[str, Any]:
    """Every GPU series' timestamps in [start_s, end_s] from the store; gaps over 2 sample intervals,
    apart from those of a GPU while it was lost (`lost`: the demo's scheduled incident, not starvation)."""
    names = requests.get(f"{url}/api/v1/label/__name__/values", timeout=60).json()["data"]
    names = [n for n in names if n.startswith("DCGM_FI_")]
    window = math.ceil(end_s - start_s) + 2
    series = samples = 0
    gaps: list[tuple[str, float, float]] = []
    while_lost = 0
    longest = 0.0
    short: list[tuple[str, int]] = []
    for name in names:
        for _ in range(30):  # a busy answer (503) is asked again; another error is counted, not fatal
            body = requests.get(f"{url}/api/v1/query", params={"query": f"{name}[{window}s]", "time": str(end_s)}, timeout=120).json()  # fmt: skip
            if body.get("errorType") != "unavailable":
                break
            time.sleep(2)
        if "data" not in body:
            print(f"  gaps: {name} not read: {body.get('errorType')}: {body.get('error')}")
            continue
        for s in body["data"]["result"]:
            ts = [float(t) for t, _ in s["values"] if start_s <= float(t) <= end_s]
            series += 1
            samples += len(ts)
            who = f"{name}{{Hostname={s['metric'].get('Hostname')},gpu={s['metric'].get('gpu')}}}"
            edges = [start_s, *ts, end_s]
            spells = lost.get(str(s["metric"].get("gpu")), [])
            for a, b in itertools.pairwise(edges):
                if any(a <= to + 2 * interval_s and b >= since for since, to in spells):
                    while_lost += b - a > 2 * interval_s
                    continue
                longest = max(longest, b - a)
                if b - a > 2 * interval_s:
                    gaps.append((who, a, b))
            if len(ts) < 0.5 * (end_s - start_s) / interval_s:
                short.append((who, len(ts)))
    return {
        "names": len(names),
        "series": series,
        "samples": samples,
        "gaps": gaps,
        "while_lost": while_lost,
        "longest": longest,
        "short": short,
    }


_THROTTLED = re.compile(r"\(and (\d+) more like it in the last")
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d):\d\d,\d+ (\w+) (\S+): (.*)$")


def log_figures(text: str) -> dict[str, Any]:
    """Lines per condition, per condition and minute, and what the throttle held back."""
    per_condition: collections.Counter[str] = collections.Counter()
    per_minute: collections.Counter[tuple[str, str]] = collections.Counter()
    held: collections.Counter[str] = collections.Counter()
    other = 0
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            other += 1
            continue
        minute, level, logger, msg = m.groups()
        cond = f"{level} {logger}: " + re.sub(r"\d+(\.\d+)?", "N", _THROTTLED.sub("", msg))[:70]
        per_condition[cond] += 1
        per_minute[(cond, minute)] += 1
        t = _THROTTLED.search(msg)
        if t:
            held[cond] += int(t.group(1))
    return {
        "lines": len(text.splitlines()),
        "unparsed": other,
        "per_condition": per_condition,
        "max_per_minute": max(per_minute.values(), default=0),
        "held": held,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--mix", default="36,8,6", help="cluster,GPU,inference pages (scaled to --clients)")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--range", type=float, default=3600.0, help="seconds of history each tab shows (1 h)")
    ap.add_argument("--refresh", type=float, default=1.0, help="seconds between a tab's refreshes")
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--targets", type=int, default=20)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between RSS/CPU/health rows")
    ap.add_argument("--csv", help="write the rows to this CSV file")
    ap.add_argument("--mallinfo", metavar="CSV", help="write glibc's heap figures (bench/memprobe.py) here")
    ap.add_argument("--keep-log", help="copy gpuwatch's log to this file")
    ap.add_argument(
        "--trace", metavar="START,SNAP,...", help="seconds into the load: tracemalloc's start, snapshots"
    )
    ap.add_argument(
        "--types",
        metavar="T,...",
        help="seconds into the load: count the server's objects by type (~1 s each)",
    )
    ap.add_argument("--trace-dir", metavar="DIR", help="where the snapshots go (with --trace, --types)")
    ap.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra GPUWATCH_* setting"
    )
    args = ap.parse_args()
    soaktabs.RANGE_MS = int(args.range * 1000)
    soaktabs.REFRESH_S = args.refresh

    targets, ready = start_targets(args.targets)
    serve: subprocess.Popen[bytes] | None = None
    tmp = tempfile.mkdtemp()
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        url = f"http://127.0.0.1:{port}"
        config = Path(tmp) / "gpuwatch.yml"
        config.write_text(json.dumps({"scrape_configs": [{
            "job_name": "vllm", "scrape_interval": "5s",
            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ready["ports"]]}],
        }] if args.targets else []}))  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
        env.update(
            GPUWATCH_DEMO_GPUS=str(args.gpus), GPUWATCH_DEMO_SOURCES="false", GPUWATCH_DEMO_HISTORY="false"
        )
        env.update(kv.split("=", 1) for kv in args.env)
        log_path = Path(tmp) / "serve.log"
        probe = probe_command(args)
        with open(log_path, "wb") as log:
            serve = subprocess.Popen(
                [sys.executable, *probe, "serve", "--demo", "--host", "127.0.0.1",
                 "--port", str(port), "--data-dir", str(Path(tmp) / "data"), "--config", str(config)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 300  # a demo imports its week first (~25 s at 64 GPUs alone)
        while True:
            with contextlib.suppress(requests.RequestException):  # not up yet, or busy importing
                if requests.get(f"{url}/-/health", timeout=2).ok:
                    break
            if time.monotonic() > deadline or serve.poll() is not None:
                raise SystemExit("gpuwatch did not start:\n" + log_path.read_text())
            time.sleep(0.2)
        sp, tp = psutil.Process(serve.pid), psutil.Process(targets.pid)
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        loadavg = " ".join(f"{x:.2f}" for x in os.getloadavg())
        print(
            f"machine: {os.cpu_count()} vCPU, Python {platform.python_version()}; start {started} UTC, load average {loadavg}"
        )
        time.sleep(args.warmup)
        deadline = time.monotonic() + 60
        while args.targets and not any(p["job"] == "vllm" for p in requests.get(f"{url}/api/ui/inference", timeout=30).json()["data"]["services"]):  # fmt: skip
            if time.monotonic() > deadline:
                raise SystemExit("no inference service vllm after a minute")
            time.sleep(1)
        log_before = len(log_path.read_text().splitlines())
        cpu0, me0, tcpu0 = cpu_s(sp), cpu_s(psutil.Process()), cpu_s(tp)
        start_s = time.time()
        rec, rows, wall = asyncio.run(soak(args, port, sp, tp, Path(tmp) / "data"))
        end_s = time.time()
        serve_cpu = 100 * (cpu_s(sp) - cpu0) / wall
        me_cpu = 100 * (cpu_s(psutil.Process()) - me0) / wall
        t_cpu = 100 * (cpu_s(tp) - tcpu0) / wall
        print(f"end {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
        time.sleep(3)  # the last samples through the writer's flush
        report(args, url, rec, rows, wall, start_s, end_s, serve_cpu, me_cpu, t_cpu, log_path.read_text())
        if args.trace_dir:
            trace_report(Path(args.trace_dir))
            types_report(Path(args.trace_dir))
        jobs = requests.get(f"{url}/-/jobs", timeout=30).json()["jobs"]
        for j in jobs:
            if j["name"] in ("sample", "rules", "host"):
                print(f"job {j['name']}: {j['runs']} runs, {j['failures']} failures, last {1000 * (j['last_duration_s'] or 0):.1f} ms")  # fmt: skip
        serve.send_signal(signal.SIGTERM)
        rc = serve.wait(120)
        serve = None
        text = log_path.read_text()
        during = "\n".join(text.splitlines()[log_before:])
        lf = log_figures(during)
        print(f"gpuwatch exit status after SIGTERM: {rc}")
        print(
            f"log: {lf['lines']} lines from the soak's start to the exit ({len(text.splitlines())} in all), "
            f"at most {lf['max_per_minute']} of one condition in one minute"
        )
        for cond, n in lf["per_condition"].most_common(15):
            extra = f", {lf['held'][cond]} more held back" if lf["held"].get(cond) else ""
            print(f"  {n:4d}  {cond}{extra}")
        if "Traceback" in text:
            print("log has a Traceback")
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["t_s", "rss_mib", "serve_cpu_pct", "loadgen_cpu_pct", "targets_cpu_pct", "health", "health_ms", "requests", "loadavg1", "duckdb_mib", "chunk_cache_mib", "heap_mib", "anon_mib", "file_mib", "index_mib", "trimmed_mib", "wal_mib"])  # fmt: skip
                for r in rows:
                    w.writerow([f"{r.t_s:.0f}", f"{r.rss_mib:.1f}", f"{r.serve_cpu_pct:.1f}", f"{r.load_cpu_pct:.1f}",
                                f"{r.targets_cpu_pct:.1f}", r.health, f"{r.health_ms:.0f}", r.requests, f"{r.loadavg:.2f}",
                                f"{r.duckdb_mib:.1f}", f"{r.cache_mib:.1f}", f"{r.heap_mib:.1f}", f"{r.anon_mib:.1f}",
                                f"{r.file_mib:.1f}", f"{r.index_mib:.1f}", f"{r.trimmed_mib:.1f}", f"{r.wal_mib:.1f}"])  # fmt: skip
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(60)
        if args.keep_log and (Path(tmp) / "serve.log").exists():
            shutil.copyfile(Path(tmp) / "serve.log", args.keep_log)
        targets.terminate()
        targets.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def probe_command(args: argparse.Namespace) -> list[str]:
    """How the server starts: as `gpuwatch`, or under bench/memprobe.py (`--mallinfo`, `--trace`)."""
    if (args.trace or args.types) and not (args.mallinfo and args.trace_dir):
        raise SystemExit("--trace and --types need --mallinfo and --trace-dir")
    if not args.mallinfo:
        return ["-m", "gpuwatch.cli.main"]
    if args.trace_dir:
        Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
    trace = [args.trace_dir] if args.trace_dir else []
    return [str(ROOT / "bench" / "memprobe.py"), args.mallinfo, str(args.every), *trace, "--"]


def answered(d: Path, requests: str, wait_s: float) -> None:
    """Wait up to `wait_s` for memprobe.py to answer the requests left in `d` (the last may be under way)."""
    deadline = time.monotonic() + wait_s
    while any(d.glob(requests)) and time.monotonic() < deadline:
        time.sleep(1)


def types_report(d: Path, top: int = 20) -> None:
    """Which types of object grew in number between consecutive counts (`--types`)."""
    answered(d, "types-*", 60)
    counts = sorted(d.glob("*.types.json"))
    for a, b in itertools.pairwise(counts):
        old, new = json.loads(a.read_text()), json.loads(b.read_text())
        grew = sorted(((n - old.get(t, 0), t, n) for t, n in new.items()), reverse=True)[:top]
        print(f"objects {a.name.removesuffix('.types.json')} -> {b.name.removesuffix('.types.json')}: "
              f"{sum(old.values()):,} -> {sum(new.values()):,}")  # fmt: skip
        for diff, t, n in grew:
            print(f"  {diff:+9,d}  ({n:,})  {t}")


def trace_report(d: Path, top: int = 20) -> None:
    """What grew between consecutive snapshots, by the allocating traceback (newest 4 frames)."""
    import tracemalloc

    answered(d, "snap-*", 120)
    snaps = sorted(d.glob("*.tracemalloc"))
    for a, b in itertools.pairwise(snaps):
        old, new = tracemalloc.Snapshot.load(str(a)), tracemalloc.Snapshot.load(str(b))
        total = sum(t.size for t in new.traces) - sum(t.size for t in old.traces)
        print(f"tracemalloc {a.stem} -> {b.stem}: traced {sum(t.size for t in old.traces) / 1e6:.1f} -> "
              f"{sum(t.size for t in new.traces) / 1e6:.1f} MB ({total / 1e6:+.1f})")  # fmt: skip
        for kind in ("lineno", "traceback"):
            for st in new.compare_to(old, kind)[:top]:
                where = st.traceback.format(limit=-4 if kind == "traceback" else 1, most_recent_first=True)
                print(f"  {st.size_diff / 1e6:+8.2f} MB {st.count_diff:+8d} blocks  ({st.size / 1e6:.1f} MB)  "
                      + " <- ".join(w.strip() for w in where if not w.startswith("    ")))  # fmt: skip
            print()


def report(
    args: argparse.Namespace, url: str, rec: Record, rows: list[Row], wall: float, start_s: float, end_s: float,
    serve_cpu: float, me_cpu: float, t_cpu: float, log_text: str,
) -> None:  # fmt: skip
    done = sum(len(v) for v in rec.latencies.values())
    per_tick = done / max(1, rec.ticks_run)
    print(f"soak {wall:.0f} s, {args.clients} clients: ticks due {rec.ticks_due}, run {rec.ticks_run} "
          f"({rec.ticks_due - rec.ticks_run} skipped: the tick before was still out)")  # fmt: skip
    print(f"requests: {done} answered, {done / wall:.1f}/s; asked on time {rec.nominal:.1f}/s (the pages' schedule), "
          f"{per_tick:.1f} a tick that ran; {rec.bytes_in / wall / 1e6:.2f} MB/s in")  # fmt: skip
    print("latency per kind: n, p50, p90, p99, max ms")
    for kind in sorted(rec.latencies):
        xs = rec.latencies[kind]
        print(
            f"  {kind:12s} {len(xs):7d}  {pct(xs, 0.5):7.1f} {pct(xs, 0.9):7.1f} {pct(xs, 0.99):7.1f} {max(xs):8.1f}"
        )
    slow = sorted(rec.by_panel.items(), key=lambda kv: -pct(kv[1], 0.99))[:6]
    print(
        "slowest panels (p99): " + ", ".join(f"{k} {pct(v, 0.5):.0f}/{pct(v, 0.99):.0f} ms" for k, v in slow)
    )
    busy = {k: n for k, n in rec.statuses.items() if k[1] == "busy"}
    bad = {k: n for k, n in rec.statuses.items() if k[1] not in (200, "busy")}
    print(f"page loads retried (the twin did not answer): {rec.failed_loads}")
    print(f"busy (503 unavailable, asked again next tick): {sum(busy.values())} {dict(busy) if busy else ''}")
    print(f"errors: other non-200 {sum(bad.values())} {dict(bad) if bad else ''}; failed requests {sum(rec.failures.values())} {dict(rec.failures) if rec.failures else ''}")  # fmt: skip
    for status, path, body in rec.bad_answers:
        print(f"  {status} {path}: {body!r}")
    health = collections.Counter(r.health for r in rows)
    print(f"/-/health every {args.every:.0f} s: {dict(health)}; slowest {max((r.health_ms for r in rows), default=0):.0f} ms")  # fmt: skip
    rss = [r.rss_mib for r in rows]
    if rss:
        half = rss[len(rss) // 2 :]
        print(f"gpuwatch rss: first {rss[0]:.1f}, peak {max(rss):.1f}, last {rss[-1]:.1f} MiB; "
              f"second half {min(half):.1f}-{max(half):.1f} MiB")  # fmt: skip
    print(f"cpu (% of one core): gpuwatch {serve_cpu:.1f}, load generator {me_cpu:.1f}, targets {t_cpu:.1f}")
    lost = lost_spells(log_text, end_s)
    g = gpu_gaps(url, start_s, end_s, 1.0, lost)
    print(f"GPU samples: {g['series']} series of {g['names']} DCGM names, {g['samples']} samples in the window "
          f"(~{g['samples'] / max(1, g['series']):.0f} a series of {end_s - start_s:.0f} s); gaps over 2 s: {len(g['gaps'])}, "
          f"longest {g['longest']:.2f} s")  # fmt: skip
    if lost:
        when = ", ".join(f"GPU {gpu} {time.strftime('%H:%M:%S', time.gmtime(a))}-{time.strftime('%H:%M:%S', time.gmtime(b))}"
                         for gpu, spells in lost.items() for a, b in spells)  # fmt: skip
        print(f"  lost GPUs (the demo's scheduled incident; their gaps then are not counted above): {when}; "
              f"{g['while_lost']} such gaps")  # fmt: skip
    for who, a, b in g["gaps"][:10]:
        print(f"  gap {b - a:.2f} s at {time.strftime('%H:%M:%S', time.gmtime(a))} {who}")
    if g["short"]:
        print(f"  series with under half their samples: {len(g['short'])}, e.g. {g['short'][:3]}")


if __name__ == "__main__":
    main()
