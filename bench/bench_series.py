"""New series per second through import or scrape: N new series of one sample each, into a real store.

Usage: python bench/bench_series.py [--series 100000 300000 1000000] [--via import|scrape|victoria] [--labels 6]
       [--marker] [--again] [--root DIR] [--profile]

Builds a Prometheus text body of N series `bench_new_series{pod="...",node="...",l0..}` and times it
into a fresh DuckDB store in a temporary directory, with the garbage collector set as `gpuwatch serve`
sets it (`cli/gctune.py`):
- `--via import`: the body with a timestamp on each line, through `importer.prepare` and `write` (what
  `import_text` calls: parse and group, then the writer's series ids and the import's transaction),
  as `POST /api/v1/import/prometheus` does;
- `--via scrape`: the body without timestamps, as prometheus_client writes a page (formatted here: a
  registry of a million children takes minutes to build), served over HTTP on 127.0.0.1 and scraped
  once by a real `Target` (fetch, parse, labels, staleness), its batches appended and flushed.
- `--via victoria`: the same bodies, timestamped, into a fresh VictoriaMetrics (`victoria-metrics` on
  PATH) by `POST /api/v1/import/prometheus` and `/internal/force_flush`, its process's CPU meanwhile.
Then N more new series into the same store (flat per series, or not?). Each N runs in a process of
its own. Prints series/s by the wall clock and by the process's CPU time (all threads: on a shared
machine the steadier figure), and the RSS growth per series while the store is open, also after a
full collection and glibc's malloc_trim (what is held, not the allocator's keep of the garbage).

`--marker` also appends one sample of a marker series every 20 ms from another thread (the store on
the system clock, flushing every 0.25 s) and prints the longest a marker waited to be written while
the N series went in: how long the writer was held (for an import also split by when the marker was
appended: while the body was parsed, when only the GIL and the garbage collector hold the writer, or
while it was written). `--root DIR` imports gpuwatch from another tree
(a build to compare with, in turns); `--profile` prints the calling thread's cProfile. `--again`
(scrape) scrapes the second page's series once more with new values: the cost of a known line.
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import dataclasses
import gc
import http.server
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
T0_MS = 1_800_000_000_000
MARKER_EVERY_S = 0.02


def body(
    n: int, labels: int, offset: int = 0, timestamps: bool = True, value: int = 1, t_ms: int = T0_MS
) -> str:
    extra = ",".join(f'l{j}="value-{j}"' for j in range(labels - 2))
    stamp = f" {t_ms}" if timestamps else ""
    head = "# HELP bench_new_series A new series.\n# TYPE bench_new_series gauge\n"
    return head + "".join(
        f'bench_new_series{{pod="pod-{offset + i:07d}",node="node-{(offset + i) % 97}",{extra}}} {value}{stamp}\n'
        for i in range(n)
    )


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def trimmed_rss_mb() -> float:
    """RSS after a full collection and glibc's malloc_trim: what the process holds, not what its
    allocator kept of the garbage."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb()


class Page(http.server.BaseHTTPRequestHandler):
    """Serves `server.page` (bytes) as prometheus_client serves a registry."""

    def do_GET(self) -> None:
        data: bytes = self.server.page  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


class Markers:
    """Appends a marker sample every 20 ms and notes when each was appended and each flush ended."""

    def __init__(self, store: Any, clock: Any) -> None:
        from gpuwatch.core.model import Batch, Sample, stable_labels

        self._store, self._clock = store, clock
        self._sample, self._batch = Sample, Batch
        self._labels = stable_labels({"bench": "marker"})
        self.appended: list[float] = []
        self.flushes: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._append), threading.Thread(target=self._poll)]
        for t in self._threads:
            t.start()

    def _append(self) -> None:
        i = 0
        while not self._stop.wait(MARKER_EVERY_S):
            now_ms = self._clock.now_ms()
            self._store.append(self._batch(now_ms, [self._sample("bench_marker", self._labels, float(i))]))
            self.appended.append(now_ms)
            i += 1

    def _poll(self) -> None:
        last = None
        while not self._stop.wait(0.005):
            done = self._store.counters()["last_flush_ms"]
            if done != last:
                self.flushes.append(done)
                last = done

    def longest_wait_s(self, lo_ms: float, hi_ms: float) -> float:
        """The longest a marker appended in [lo_ms, hi_ms] waited for the flush that wrote it."""
        worst = 0.0
        for a in self.appended:
            if lo_ms <= a <= hi_ms:
                done = next((f for f in self.flushes if f is not None and f >= a), None)
                worst = max(worst, ((done if done is not None else self._clock.now_ms()) - a) / 1000)
        return worst

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()


def child(n: int, labels: int, via: str, marker: bool, profile: bool, again: bool = False) -> None:
    from gpuwatch.cli.gctune import tune_for_serving
    from gpuwatch.collect.importer import prepare, write
    from gpuwatch.core.clock import FakeClock, SystemClock
    from gpuwatch.store import Store

    clock: Any = SystemClock() if marker else FakeClock(T0_MS / 1000)
    prof = cProfile.Profile() if profile else None
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp), clock=clock, flush_interval_s=0.25 if marker else 3600)
        tune_for_serving()
        if via == "import":
            texts = [body(n, labels), body(n, labels, offset=n)]

            def once(k: int) -> None:  # import_text, with the moment parsing ends noted
                prepared = prepare(texts[k], now_ms=T0_MS)
                assert not prepared.errors
                parsed.append(clock.now_ms())
                result = write(store, prepared)
                assert result.series == n and not result.errors, result

        else:
            from gpuwatch.collect.fetch import HttpFetcher
            from gpuwatch.collect.scrape import Target
            from gpuwatch.collect.targetspec import TargetSpec
            from gpuwatch.core.model import make_labels

            pages = [body(n, labels, timestamps=False).encode(), body(n, labels, n, False).encode()]
            pages.append(body(n, labels, n, False, value=2).encode())  # (--again) the second's, new values
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            address = f"127.0.0.1:{server.server_address[1]}"
            spec = TargetSpec(
                "bench",
                address,
                "http",
                "/metrics",
                (),
                make_labels({"job": "bench", "instance": address}),
                60,
                60,
            )
            if "series_limits" in TargetSpec.__dataclass_fields__:  # (not in builds before them)
                from gpuwatch.core.model import NO_SERIES_LIMITS

                spec = dataclasses.replace(spec, series_limits=NO_SERIES_LIMITS)
            # serve's fetch caps a page at 32 MB; a million of these lines are 88 MB
            target = Target(spec, HttpFetcher(clock, max_body_bytes=1 << 30), clock)

            def once(k: int) -> None:
                server.page = pages[k]  # type: ignore[attr-defined]
                for batch in target.scrape():
                    store.append(batch)
                store.flush()
                assert target.health == "up", target.last_error

        parsed: list[int] = []  # (import) when each body was parsed and its writing began
        markers = Markers(store, clock) if marker else None
        before = rss_mb()
        took, cpu = [], []
        for k in range(2):
            if prof and k == 0:
                prof.enable()
            t0, c0, start = time.perf_counter(), time.process_time(), clock.now_ms()
            once(k)
            took.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            if prof and k == 0:
                prof.disable()
            if k == 0:
                grown = rss_mb() - before
                held = trimmed_rss_mb() - before
            if markers is not None:
                end = clock.now_ms()
                time.sleep(0.5)  # let the markers of the import's last moments be flushed
                split = ""
                if parsed:  # a marker appended while the body was parsed, or while it was written
                    split = (
                        f" (appended while parsing {markers.longest_wait_s(start, parsed[k]):.2f} s, "
                        f"while writing {markers.longest_wait_s(parsed[k], end):.2f} s)"
                    )
                print(
                    f"    marker: longest wait {markers.longest_wait_s(start, end):.2f} s{split}", flush=True
                )
        if markers is not None:
            markers.stop()
        if again and via == "scrape":
            c0 = time.process_time()
            once(2)
            known = time.process_time() - c0
            print(
                f"    again, the same {n} series with new values: CPU {known:.2f} s = {1e6 * known / n:.2f} us a line;"
                f" RSS now +{trimmed_rss_mb() - before:.0f} MB after gc and malloc_trim ({2 * n} series in all)"
            )
        store.close()
    print(
        f"{n:>8} series via {via}, {labels} labels: {took[0]:6.2f} s = {n / took[0]:>9,.0f} series/s "
        f"(CPU {cpu[0]:.2f} s = {n / cpu[0]:,.0f}/s); next {n}: {took[1]:6.2f} s = {n / took[1]:>9,.0f}/s "
        f"(CPU {cpu[1]:.2f} s); "
        f"RSS +{grown:.0f} MB ({grown * 1024 * 1024 / n:,.0f} B/series; "
        f"{held * 1024 * 1024 / n:,.0f} after gc and malloc_trim)",
        flush=True,
    )
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


def victoria(n: int, labels: int) -> None:
    """The same two bodies into a fresh VictoriaMetrics (`victoria-metrics` on PATH) over HTTP:
    `POST /api/v1/import/prometheus`, then `/internal/force_flush`; its process's CPU over that span."""
    import psutil
    import requests

    sys.path.insert(0, str(ROOT))
    from bench.bench_query import free_port, wait_http

    t_ms = int(time.time() * 1000) - 60_000  # VictoriaMetrics refuses samples far in the future
    texts = [body(n, labels, t_ms=t_ms).encode(), body(n, labels, offset=n, t_ms=t_ms).encode()]
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = subprocess.Popen(
            ["victoria-metrics", f"-storageDataPath={tmp}/vm", f"-httpListenAddr=127.0.0.1:{port}",
             "-retentionPeriod=10y", "-loggerLevel=ERROR"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{base}/health", proc)
            vm = psutil.Process(proc.pid)
            time.sleep(1)
            rss0 = vm.memory_info().rss
            took, cpu = [], []
            for k in range(2):
                c = vm.cpu_times()
                c0, t0 = c.user + c.system, time.perf_counter()
                requests.post(
                    f"{base}/api/v1/import/prometheus", data=texts[k], timeout=600
                ).raise_for_status()
                requests.get(f"{base}/internal/force_flush", timeout=600).raise_for_status()
                took.append(time.perf_counter() - t0)
                c = vm.cpu_times()
                cpu.append(c.user + c.system - c0)
                if k == 0:
                    grown = vm.memory_info().rss - rss0
            got = requests.get(f"{base}/api/v1/series/count", timeout=60).json()["data"]
        finally:
            proc.terminate()
            proc.wait(30)
    print(
        f"{n:>8} series into VictoriaMetrics, {labels} labels: {took[0]:6.2f} s = {n / took[0]:>9,.0f} series/s "
        f"(CPU {cpu[0]:.2f} s = {n / cpu[0]:,.0f}/s); next {n}: {took[1]:6.2f} s (CPU {cpu[1]:.2f} s); "
        f"RSS +{grown / 2**20:.0f} MB ({grown / n:,.0f} B/series); series counted {got}",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--series", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    p.add_argument("--labels", type=int, default=6)
    p.add_argument("--via", choices=["import", "scrape", "victoria"], default="import")
    p.add_argument("--marker", action="store_true")
    p.add_argument("--root", type=Path, default=ROOT, help="the gpuwatch tree to measure")
    p.add_argument("--profile", action="store_true")
    p.add_argument("--again", action="store_true", help="(scrape) then the second page's series again")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.via == "victoria":
        for n in args.series:
            victoria(n, args.labels)
        return
    if args.child:
        sys.path.insert(0, str(args.root.resolve()))
        child(args.series[0], args.labels, args.via, args.marker, args.profile, args.again)
        return
    for n in args.series:
        flags = ["--labels", str(args.labels), "--via", args.via, "--root", str(args.root)]
        flags += ["--marker"] * args.marker + ["--profile"] * args.profile + ["--again"] * args.again
        subprocess.run([sys.executable, __file__, "--child", "--series", str(n), *flags], check=True)


if __name__ == "__main__":
    main()
