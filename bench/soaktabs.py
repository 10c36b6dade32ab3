"""The soak's simulated browser tabs: what static/js/gpuwatch.js and each page's script ask a
gpuwatch server per refresh (steps from the chart widths, `min_interval`, the twins, the GPU page's
health query, the inference page's heatmap), over a browser's pool of keep-alive connections, and
what each answer took. Used by bench/bench_soak.py.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import orjson

NICE_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
MAX_POINTS = 1500
RANGED = ("timeseries", "heatmap", "events")
RANGE_MS = 3_600_000  # the time range every tab shows (bench_soak.py --range)
REFRESH_S = 1.0  # seconds between a tab's refreshes (bench_soak.py --refresh)
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
    statuses: collections.Counter[tuple[str, int | str]] = field(default_factory=collections.Counter)
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


BUSY = object()  # a 503 `unavailable` (query_max_concurrency): gpuwatch.js asks again next tick


async def fetch(pool: Pool, path: str, rec: Record, label: str = "") -> Any:
    """GET `path`, recording its time by kind (a 503's apart); the decoded JSON (None for HTML or on
    failure, BUSY for a 503 `unavailable`)."""
    kind = kind_of(path)
    t0 = time.perf_counter()
    try:
        status, body = await pool.get(path)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, HttpError, ValueError) as e:
        if rec.recording:
            rec.failures[f"{kind}: {type(e).__name__}"] += 1
        return None
    ms = 1000 * (time.perf_counter() - t0)
    busy = status == 503 and b'"unavailable"' in body
    if rec.recording:
        rec.latencies[kind if status == 200 else f"{kind} {'busy' if busy else status}"].append(ms)
        rec.statuses[(kind, "busy" if busy else status)] += 1
        rec.bytes_in += len(body)
        if label and status == 200:
            rec.by_panel[label].append(ms)
        if status != 200 and not busy and len(rec.bad_answers) < 8:
            rec.bad_answers.append((status, path[:160], body[:200]))
    if busy:
        return BUSY
    if status != 200 or kind == "page html":
        return None
    return orjson.loads(body)


def has_result(answer: Any) -> bool:
    return bool(
        answer and answer is not BUSY and answer.get("status") == "success" and answer["data"]["result"]
    )


@dataclass
class PanelState:
    panel: dict[str, Any]
    width_px: float
    fetch_key: str = ""
    fetched_at: float = -1e18
    sig: int | None = None


class Page:
    """One browser tab: its HTML once, then gpuwatch.js's refresh every `REFRESH_S`."""

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
            if twin is None or twin is BUSY:
                twin = None
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
            step = step_for(end_ms - RANGE_MS, end_ms, st.width_px) if p["kind"] in RANGED else 0
            rate += 1 / max(1, step, p.get("min_interval") or 0)
        if self.kind == "cluster":
            rate += 1 / 5
        elif self.kind == "gpu":
            rate += 1 if self.data.get("health_query") else 0
        elif self.kind == "inference":
            rate += 1 / 5 + (
                1 / step_for(end_ms - RANGE_MS, end_ms, 800) if self.data.get("heatmap_expr") else 0
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
        if answer is BUSY:  # kept as drawn, asked again next tick
            st.fetched_at = -1e18
            return
        if answer is None or answer.get("status") != "success":
            return
        if not answer["data"]["result"]:  # absenceState: which kind of nothing
            asks = [q for q in (p.get("failed_if"), p.get("unsupported_if")) if q]
            got = await asyncio.gather(
                *(fetch(self.pool, query_path(fill(q, all_vars), end_ms), self.rec) for q in asks)
            )
            if BUSY in got:
                st.fetched_at = -1e18
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
                if await fetch(self.pool, self.twin, self.rec) is BUSY:
                    self.last_twin = 0.0  # asked again next tick
        elif self.kind == "gpu":
            health, xid_total = self.data.get("health_query"), self.data.get("xid_total_query")
            if not health:
                return
            answer = await fetch(self.pool, query_path(fill(health, self.vars), end_ms), self.rec)
            if answer is BUSY:
                return
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
            expr = self.data.get("heatmap_expr")
            step = step_for(start_ms, end_ms, 800)
            heat = twin = None
            if expr and now - self.heat_asked >= step:
                self.heat_asked = now
                heat = fetch(self.pool, query_range_path(expr, start_ms, end_ms, 800), self.rec, "inference/heatmap")  # fmt: skip
            if now - self.last_twin >= 4.5:
                self.last_twin = now
                twin = fetch(self.pool, self.twin, self.rec)
            got = await asyncio.gather(heat or _nothing(), twin or _nothing())
            if got[0] is BUSY:
                self.heat_asked = -1e18
            if got[1] is BUSY:
                self.last_twin = 0.0

    async def tick(self) -> None:
        end_ms = time.time() * 1000
        start_ms = end_ms - RANGE_MS
        await asyncio.gather(
            *(self.panel(st, start_ms, end_ms) for st in self.panels), self.extras(start_ms, end_ms)
        )


async def _nothing() -> None:
    return None


async def run_client(page: Page, stop: asyncio.Event, phase_s: float) -> None:
    await asyncio.sleep(phase_s)
    if not await page.load(stop):
        return
    running: asyncio.Task[None] | None = None
    loop = asyncio.get_running_loop()
    next_t = loop.time() + REFRESH_S
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, next_t - loop.time()))
        if stop.is_set():
            break
        next_t += REFRESH_S
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
