"""Soak: `gpuwatch serve --demo` (64 GPUs, 20 vLLM-sized targets) under 50 dashboards refreshing every second.

    .venv/bin/python bench/bench_soak.py [--clients 50] [--seconds 600] [--mix 36,8,6] [--csv rss.csv]

1. Starts bench/scrape_targets.py (20 prometheus_client servers of ~1,700 lines, scraped every 5 s as
   job `vllm`), then `gpuwatch serve --demo` with 64 simulated GPUs at 1 s (demo sources off, default
   log level, its stderr kept), and waits `--warmup` seconds.
2. Clients: one asyncio loop in this process plays `--clients` browser tabs (the mix: cluster page,
   GPU pages, the inference service page of job `vllm`), each on a 1 s refresh over the last hour.
   Each client first loads its page's HTML, then runs static/js/gpuwatch.js's refresh as the page
   does: panels from the page's JSON twin, a chart asks once a step (the step from its width, start
   and end aligned to it), a stat at every tick or once its `min_interval`, an empty answer asks the
   panel's `failed_if`/`unsupported_if`, a changed chart its `failed_if`; plus each page's own
   requests (the cluster twin every 5 s, the GPU page's health queries, the inference page's latency
   heatmap and twin every tick). A tick whose requests are still out is skipped, as the page skips
   it. Each client has at most 6 keep-alive connections, as a browser has per host.
3. Every 10 s: gpuwatch's RSS and CPU, this process's CPU (the load generator) and the targets',
   and one `/-/health`.
4. After the load stops: every GPU series' timestamps over the window (`DCGM_FI_*` names, from the
   store through the API) and the gaps over 2 sample intervals; the sample job's runs; the log
   lines gpuwatch wrote (per condition and minute, and the conditions held back by the log throttle);
   then SIGTERM and its exit status.

Prints figures for bench/README.md ("Soak"); `--csv` writes the 10 s rows.
"""

from __future__ import annotations

import argparse
import asyncio
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scrape_targets import start_targets  # noqa: E402

NICE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_POINTS = 1500
RANGED = ("timeseries", "heatmap", "events")
GRID_PX = 1200  # the panels' grid at a 1280 px wide window: 12 columns
BROWSER_CONNECTIONS = 6  # a browser's HTTP/1.1 connections per host
TIMEOUT_S = 30.0
_VAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


# -- what gpuwatch.js computes --------------------------------------------------------------------
def step_for(start_ms: float, end_ms: float, width_px: float) -> int:
    """gw.stepFor: about one point per 2 px, at most 1,500 points, rounded up to a nice step."""
    points = max(30, min(MAX_POINTS, math.floor((width_px or 600) / 2)))
    raw = (end_ms - start_ms) / 1000 / points
    for s in NICE_STEPS:
        if s >= raw:
            return s
    return math.ceil(raw / 86400) * 86400


def js_num(x: float) -> str:
    """A number as JavaScript's String() writes it (no `.0` on whole numbers)."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def prom_string(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def fill(query: str, vars_: dict[str, str]) -> str:
    """gw.fill: `$name` from `vars_`, escaped for a PromQL double-quoted string."""
    return _VAR.sub(lambda m: prom_string(vars_[m.group(1)]) if m.group(1) in vars_ else m.group(0), query)


def builtin_vars(start_ms: float, end_ms: float, step: int) -> dict[str, str]:
    lt = time.localtime(end_ms / 1000)
    midnight_ms = (end_ms / 1000 - (lt.tm_hour * 3600 + lt.tm_min * 60 + lt.tm_sec)) * 1000
    return {
        "__rate": f"{max(60, 4 * step)}s",
        "__interval": f"{max(1, step)}s",
        "__range": f"{max(1, round((end_ms - start_ms) / 1000))}s",
        "__today": f"{max(1, round((end_ms - midnight_ms) / 1000))}s",
    }


def query_range_path(expr: str, start_ms: float, end_ms: float, width_px: float) -> str:
    step = step_for(start_ms, end_ms, width_px)
    step_ms = step * 1000
    start = math.floor(start_ms / step_ms) * step_ms
    end = math.ceil(end_ms / step_ms) * step_ms
    q = urlencode(
        {"query": expr, "start": js_num(start / 1000), "end": js_num(end / 1000), "step": str(step)}
    )
    return "/api/v1/query_range?" + q


def query_path(expr: str, time_ms: float) -> str:
    return "/api/v1/query?" + urlencode({"query": expr, "time": js_num(time_ms / 1000)})


# -- a small HTTP/1.1 keep-alive client (a browser's connection pool per tab) ---------------------
class HttpError(Exception):
    pass


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def get(self, host: str, path: str) -> tuple[int, bytes, bool]:
        """GET `path`; (status, body, whether the connection may be reused)."""
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: */*\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        keep = headers.get("connection", "").lower() != "close"
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await self.reader.readuntil(b"\r\n")
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            body = b"".join(parts)
        else:
            body, keep = await self.reader.read(), False
        return status, body, keep

    def close(self) -> None:
        self.writer.close()


class Pool:
    """At most `size` keep-alive connections to one server, as a browser tab has."""

    def __init__(self, host: str, port: int, size: int = BROWSER_CONNECTIONS) -> None:
        self.host, self.port = host, port
        self.idle: list[Connection] = []
        self.slots = asyncio.Semaphore(size)
        self.opened = 0

    async def get(self, path: str) -> tuple[int, bytes]:
        async with self.slots:
            conn = self.idle.pop() if self.idle else None
            if conn is None:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                conn = Connection(reader, writer)
                self.opened += 1
            try:
                status, body, keep = await asyncio.wait_for(
                    conn.get(f"{self.host}:{self.port}", path), TIMEOUT_S
                )
            except BaseException:
                conn.close()
                raise
            if keep:
                self.idle.append(conn)
            else:
                conn.close()
            return status, body

    def close(self) -> None:
        for c in self.idle:
            c.close()
        self.idle.clear()


# -- what was measured ----------------------------------------------------------------------------
@dataclass
class Record:
    latencies: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    statuses: collections.Counter[tuple[str, int]] = field(default_factory=collections.Counter)
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    by_panel: dict[str, list[float]] = field(default_factory=lambda: collections.defaultdict(list))
    ticks_due: int = 0
    ticks_run: int = 0
    bytes_in: int = 0
    failed_loads: int = 0
    nominal: float = 0.0
    bad_answers: list[tuple[int, str, bytes]] = field(default_factory=list)
    recording: bool = True


def kind_of(path: str) -> str:
    if path.startswith("/api/v1/query_range"):
        return "query_range"
    if path.startswith("/api/v1/query"):
        return "query"
    if path.startswith("/api/ui/"):
        return "ui twin"
    if path.startswith("/-/"):
        return "health"
    return "page html"


async def fetch(pool: Pool, path: str, rec: Record, label: str = "") -> Any:
    """GET `path`, recording its time by kind; the decoded JSON (None for HTML or on failure)."""
    kind = kind_of(path)
    t0 = time.perf_counter()
    try:
        status, body = await pool.get(path)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, HttpError, ValueError) as e:
        if rec.recording:
            rec.failures[f"{kind}: {type(e).__name__}"] += 1
        return None
    ms = 1000 * (time.perf_counter() - t0)
    if rec.recording:
        rec.latencies[kind].append(ms)
        rec.statuses[(kind, status)] += 1
        rec.bytes_in += len(body)
        if label:
            rec.by_panel[label].append(ms)
        if status != 200 and len(rec.bad_answers) < 8:
            rec.bad_answers.append((status, path[:160], body[:200]))
    if status != 200 or kind == "page html":
        return None
    return orjson.loads(body)


def has_result(answer: Any) -> bool:
    return bool(answer and answer.get("status") == "success" and answer["data"]["result"])


@dataclass
class PanelState:
    panel: dict[str, Any]
    width_px: float
    fetch_key: str = ""
    fetched_at: float = -1e18
    sig: int | None = None


class Page:
    """One browser tab: its HTML once, then gpuwatch.js's refresh every second."""

    def __init__(self, kind: str, html: str, twin: str, twin_every_s: float, rec: Record, pool: Pool) -> None:
        self.kind, self.html, self.twin, self.twin_every_s = kind, html, twin, twin_every_s
        self.rec, self.pool = rec, pool
        self.panels: list[PanelState] = []
        self.vars: dict[str, str] = {}
        self.data: dict[str, Any] = {}
        self.last_twin = 0.0
        self.heat_asked = -1e18

    async def load(self, stop: asyncio.Event) -> bool:
        """Load the page (again after a second while it fails, as someone would); False: stopped first."""
        twin = None
        while twin is None:
            if stop.is_set():
                return False
            await fetch(self.pool, self.html, self.rec)
            twin = await fetch(self.pool, self.twin, self.rec)
            if twin is None:
                self.rec.failed_loads += 1
                await asyncio.sleep(1.0)
        self.vars = dict(twin["variables"])
        self.data = twin["data"]
        self.panels = [PanelState(p, GRID_PX * (p.get("width") or 6) / 12 - 24) for p in twin["panels"]]
        self.last_twin = time.monotonic()
        return True

    def nominal_rate(self) -> float:
        """Requests a second this page asks when every tick runs on time (not counting the extra
        queries an empty or changed answer brings)."""
        end_ms = time.time() * 1000
        rate = 0.0
        for st in self.panels:
            p = st.panel
            step = step_for(end_ms - 3_600_000, end_ms, st.width_px) if p["kind"] in RANGED else 0
            rate += 1 / max(1, step, p.get("min_interval") or 0)
        if self.kind == "cluster":
            rate += 1 / 5
        elif self.kind == "gpu":
            rate += 1 if self.data.get("health_query") else 0
        elif self.kind == "inference":
            rate += 1 / 5 + (
                1 / step_for(end_ms - 3_600_000, end_ms, 800) if self.data.get("heatmap_expr") else 0
            )
        return rate

    async def panel(self, st: PanelState, start_ms: float, end_ms: float) -> None:
        p = st.panel
        ranged = p["kind"] in RANGED
        step = step_for(start_ms, end_ms, st.width_px) if ranged else 0
        all_vars = {**builtin_vars(start_ms, end_ms, step), **self.vars}
        key = f"now-1h|now|{step}|light"
        every = max(step if ranged else 0, p.get("min_interval") or 0) * 1000
        now = time.monotonic() * 1000
        if every and st.fetch_key == key and now - st.fetched_at < every:
            return
        st.fetch_key, st.fetched_at = key, now
        expr = fill(p["query"], all_vars)
        path = query_range_path(expr, start_ms, end_ms, st.width_px) if ranged else query_path(expr, end_ms)
        answer = await fetch(self.pool, path, self.rec, f"{self.kind}/{p['id']}")
        if answer is None or answer.get("status") != "success":
            return
        if not answer["data"]["result"]:  # absenceState: which kind of nothing
            asks = [q for q in (p.get("failed_if"), p.get("unsupported_if")) if q]
            await asyncio.gather(
                *(fetch(self.pool, query_path(fill(q, all_vars), end_ms), self.rec) for q in asks)
            )
            return
        if p["kind"] in ("table", "stat"):
            return
        sig = hash(orjson.dumps(answer))
        if sig == st.sig:  # the same answer: not redrawn, failed_if not asked
            return
        st.sig = sig
        if p.get("failed_if"):
            await fetch(self.pool, query_path(fill(p["failed_if"], all_vars), end_ms), self.rec)

    async def extras(self, start_ms: float, end_ms: float) -> None:
        """The page's own requests besides its panels."""
        now = time.monotonic()
        if self.kind == "cluster":
            if now - self.last_twin >= 4.5:
                self.last_twin = now
                await fetch(self.pool, self.twin, self.rec)
        elif self.kind == "gpu":
            health, xid_total = self.data.get("health_query"), self.data.get("xid_total_query")
            if not health:
                return
            answer = await fetch(self.pool, query_path(fill(health, self.vars), end_ms), self.rec)
            xid = [
                s
                for s in (answer or {}).get("data", {}).get("result", [])
                if s["metric"].get("__name__") == "DCGM_FI_DEV_XID_ERRORS"
            ]
            if xid and float(xid[0]["value"][1]) and xid_total:
                await fetch(
                    self.pool,
                    query_range_path(fill(xid_total, self.vars), start_ms, end_ms, 600),
                    self.rec,
                )
        elif self.kind == "inference":  # the latency heatmap once a step, the twin every 5 s
            asks = []
            expr = self.data.get("heatmap_expr")
            step = step_for(start_ms, end_ms, 800)
            if expr and now - self.heat_asked >= step:
                self.heat_asked = now
                asks.append(fetch(self.pool, query_range_path(expr, start_ms, end_ms, 800), self.rec, "inference/heatmap"))  # fmt: skip
            if now - self.last_twin >= 4.5:
                self.last_twin = now
                asks.append(fetch(self.pool, self.twin, self.rec))
            await asyncio.gather(*asks)

    async def tick(self) -> None:
        end_ms = time.time() * 1000
        start_ms = end_ms - 3_600_000
        await asyncio.gather(
            *(self.panel(st, start_ms, end_ms) for st in self.panels), self.extras(start_ms, end_ms)
        )


async def run_client(page: Page, stop: asyncio.Event, phase_s: float) -> None:
    await asyncio.sleep(phase_s)
    if not await page.load(stop):
        return
    running: asyncio.Task[None] | None = None
    loop = asyncio.get_running_loop()
    next_t = loop.time() + 1.0
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_t - loop.time()))
        if stop.is_set():
            break
        next_t += 1.0
        if page.rec.recording:
            page.rec.ticks_due += 1
        if running is not None and not running.done():
            continue  # the last tick's requests are still out: skipped, as gpuwatch.js skips it
        if page.rec.recording:
            page.rec.ticks_run += 1
        running = asyncio.create_task(page.tick())
    if running is not None:
        with contextlib.suppress(Exception):
            await running
    page.pool.close()


# -- the soak -------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


def cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


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


async def monitor(
    url_host: str, port: int, serve: psutil.Process, targets: psutil.Process, rec: Record, stop: asyncio.Event,
    every_s: float, rows: list[Row],
) -> None:  # fmt: skip
    me = psutil.Process()
    pool = Pool(url_host, port, 1)
    t0 = time.monotonic()
    last = (t0, cpu_s(serve), cpu_s(me), cpu_s(targets), 0)
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
        done = sum(len(v) for v in rec.latencies.values())
        cur = (now, cpu_s(serve), cpu_s(me), cpu_s(targets), done)
        wall = cur[0] - last[0]
        rows.append(
            Row(now - t0, serve.memory_info().rss / 2**20, 100 * (cur[1] - last[1]) / wall,
                100 * (cur[2] - last[2]) / wall, 100 * (cur[3] - last[3]) / wall, status, health_ms,
                cur[4] - last[4], os.getloadavg()[0])
        )  # fmt: skip
        r = rows[-1]
        print(
            f"  {r.t_s:5.0f} s  rss {r.rss_mib:6.1f} MiB  serve {r.serve_cpu_pct:5.1f} %  load gen {r.load_cpu_pct:5.1f} %"
            f"  targets {r.targets_cpu_pct:5.1f} %  health {r.health} ({r.health_ms:.0f} ms)  {r.requests / wall:5.1f} req/s"
            f"  loadavg {r.loadavg:.2f}",
            flush=True,
        )
        last = cur
    pool.close()


async def soak(args: argparse.Namespace, port: int, serve: psutil.Process, targets: psutil.Process) -> tuple[Record, list[Row], float]:  # fmt: skip
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
    mon = asyncio.create_task(monitor(host, port, serve, targets, rec, stop, args.every, rows))
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


def gpu_gaps(url: str, start_s: float, end_s: float, interval_s: float) -> dict[str, Any]:
    """Every GPU series' timestamps in [start_s, end_s] from the store; gaps over 2 sample intervals."""
    names = requests.get(f"{url}/api/v1/label/__name__/values", timeout=60).json()["data"]
    names = [n for n in names if n.startswith("DCGM_FI_")]
    window = math.ceil(end_s - start_s) + 2
    series = samples = 0
    gaps: list[tuple[str, float, float]] = []
    longest = 0.0
    short: list[tuple[str, int]] = []
    for name in names:
        body = requests.get(f"{url}/api/v1/query", params={"query": f"{name}[{window}s]", "time": str(end_s)}, timeout=120).json()  # fmt: skip
        for s in body["data"]["result"]:
            ts = [float(t) for t, _ in s["values"] if start_s <= float(t) <= end_s]
            series += 1
            samples += len(ts)
            who = f"{name}{{Hostname={s['metric'].get('Hostname')},gpu={s['metric'].get('gpu')}}}"
            edges = [start_s, *ts, end_s]
            for a, b in itertools.pairwise(edges):
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
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--targets", type=int, default=20)
    ap.add_argument("--every", type=float, default=10.0, help="seconds between RSS/CPU/health rows")
    ap.add_argument("--csv", help="write the rows to this CSV file")
    ap.add_argument("--keep-log", help="copy gpuwatch's log to this file")
    ap.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra GPUWATCH_* setting"
    )
    args = ap.parse_args()

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
        }]}))  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
        env.update(GPUWATCH_DEMO_GPUS=str(args.gpus), GPUWATCH_DEMO_SOURCES="false")
        env.update(kv.split("=", 1) for kv in args.env)
        log_path = Path(tmp) / "serve.log"
        with open(log_path, "wb") as log:
            serve = subprocess.Popen(
                [sys.executable, "-m", "gpuwatch.cli.main", "serve", "--demo", "--host", "127.0.0.1",
                 "--port", str(port), "--data-dir", str(Path(tmp) / "data"), "--config", str(config)],
                env=env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(requests.ConnectionError):
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
        while not any(p["job"] == "vllm" for p in requests.get(f"{url}/api/ui/inference", timeout=30).json()["data"]["services"]):  # fmt: skip
            if time.monotonic() > deadline:
                raise SystemExit("no inference service vllm after a minute")
            time.sleep(1)
        log_before = len(log_path.read_text().splitlines())
        cpu0, me0, tcpu0 = cpu_s(sp), cpu_s(psutil.Process()), cpu_s(tp)
        start_s = time.time()
        rec, rows, wall = asyncio.run(soak(args, port, sp, tp))
        end_s = time.time()
        serve_cpu = 100 * (cpu_s(sp) - cpu0) / wall
        me_cpu = 100 * (cpu_s(psutil.Process()) - me0) / wall
        t_cpu = 100 * (cpu_s(tp) - tcpu0) / wall
        print(f"end {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")  # fmt: skip
        time.sleep(3)  # the last samples through the writer's flush
        report(args, url, rec, rows, wall, start_s, end_s, serve_cpu, me_cpu, t_cpu)
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
                w.writerow(["t_s", "rss_mib", "serve_cpu_pct", "loadgen_cpu_pct", "targets_cpu_pct", "health", "health_ms", "requests", "loadavg1"])  # fmt: skip
                for r in rows:
                    w.writerow([f"{r.t_s:.0f}", f"{r.rss_mib:.1f}", f"{r.serve_cpu_pct:.1f}", f"{r.load_cpu_pct:.1f}",
                                f"{r.targets_cpu_pct:.1f}", r.health, f"{r.health_ms:.0f}", r.requests, f"{r.loadavg:.2f}"])  # fmt: skip
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(60)
        if args.keep_log and (Path(tmp) / "serve.log").exists():
            shutil.copyfile(Path(tmp) / "serve.log", args.keep_log)
        targets.terminate()
        targets.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)


def report(
    args: argparse.Namespace, url: str, rec: Record, rows: list[Row], wall: float, start_s: float, end_s: float,
    serve_cpu: float, me_cpu: float, t_cpu: float,
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
    bad = {k: n for k, n in rec.statuses.items() if k[1] != 200}
    print(f"page loads retried (the twin did not answer): {rec.failed_loads}")
    print(f"errors: non-200 {sum(bad.values())} {dict(bad) if bad else ''}; failed requests {sum(rec.failures.values())} {dict(rec.failures) if rec.failures else ''}")  # fmt: skip
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
    g = gpu_gaps(url, start_s, end_s, 1.0)
    print(f"GPU samples: {g['series']} series of {g['names']} DCGM names, {g['samples']} samples in the window "
          f"(~{g['samples'] / max(1, g['series']):.0f} a series of {end_s - start_s:.0f} s); gaps over 2 s: {len(g['gaps'])}, "
          f"longest {g['longest']:.2f} s")  # fmt: skip
    for who, a, b in g["gaps"][:10]:
        print(f"  gap {b - a:.2f} s at {time.strftime('%H:%M:%S', time.gmtime(a))} {who}")
    if g["short"]:
        print(f"  series with under half their samples: {len(g['short'])}, e.g. {g['short'][:3]}")


if __name__ == "__main__":
    main()
