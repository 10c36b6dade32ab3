"""Benchmark PromQL range queries: gpuwatch's engine (direct and over HTTP) vs Prometheus and VictoriaMetrics.

Run on demand (not a test):
    python bench/bench_query.py [--sets 24h,7d] [--runs 10] [--block 5] [--last-byte] [--no-peers] [--dir /tmp/x] [--keep]

Data (bench/querydata.py, deterministic): `24h` = 8 GPUs x 12 dcgm-exporter metrics + 2 vLLM/inference
models (178 series, 1.03 M samples at 15 s); `7d` = 64 GPUs x 12 metrics for 7 days + the same 2 models
(850 series, 34.3 M samples). Each set is loaded into
- gpuwatch: `Store.append_series` per series, `close()` (compacted chunks), reopened read-only;
- Prometheus (if `prometheus`/`promtool` are on PATH): OpenMetrics file -> `promtool tsdb
  create-blocks-from openmetrics --max-block-duration=162h`, then `prometheus` on that directory;
- VictoriaMetrics (if `victoria-metrics` is on PATH): `POST /api/v1/import/prometheus` (ms timestamps,
  one request per series) then `/internal/force_flush`; queried with `nocache=1` (no rollup result cache).

Each query runs as query_range over the whole set (24h: 15 s step, 5,761 points; 7d: 60 s step,
10,081 points, within the 11,000-point limit of all three; gpuwatch's engine is also timed at 15 s with
`max_points` raised). One warm-up run, then --runs timed runs; median and p90. Peers are timed through
HTTP (request + JSON decode; with `--last-byte`, to the body's last byte: the servers' part of a large
answer, which the Python client's decoding would swamp); gpuwatch both engine-direct and through its /api/v1/query_range
(waitress in a child process with serve's garbage-collector settings, as `gpuwatch serve`; it inherits
the environment, so set the Dockerfile's MALLOC_* lines to measure with the image's allocator). Over HTTP
the targets take turns by blocks of `--block` runs (gpuwatch, Prometheus, VictoriaMetrics, gpuwatch,
...), each block after a warm-up run, so a slow spell of the VM falls on all of them alike;
`--block 1` times each query right after another server's, with cold caches. Answers are compared: series count, and points at
the same timestamps agreeing within 1e-6 relative (exact) or 1% (close).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import querydata

from gpuwatch.core.clock import SystemClock
from gpuwatch.core.model import make_labels
from gpuwatch.query import Engine
from gpuwatch.store import Store

QUERIES = [
    "histogram_quantile(0.99, sum by (le, model_name) (rate(inference_latency_seconds_bucket[5m])))",
    "sum by (model_name) (rate(vllm:request_success_total[1m]))",
    "rate(errors_total[5m]) / rate(requests_total[5m])",
    "DCGM_FI_DEV_FB_USED / DCGM_FI_DEV_FB_TOTAL > 0.9",
    "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[1h]) > 0",
    "avg_over_time(DCGM_FI_DEV_GPU_UTIL[30m])",
]
SETS = {"24h": (8, 1.0, 15_000), "7d": (64, 7.0, 60_000)}
Result = dict[tuple[tuple[str, str], ...], tuple[np.ndarray, np.ndarray]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[Any], timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=2).ok:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s")


def stop(proc: subprocess.Popen[Any] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def timed(fn: Callable[[], Any], runs: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def timed_interleaved(calls: dict[str, Callable[[], Any]], runs: int, block: int) -> dict[str, list[float]]:
    """Time each call `runs` times, the targets taking turns by blocks of `block` runs (a a a, b b b,
    c c c, a a a, ...), each block after one untimed warm-up run. This VM's speed moves by up to 2x
    from one minute to the next; in turns, every target sees the same spells, where back-to-back
    blocks of all runs would not. `block=1` without warm-up measures each query right after another
    server's: cold caches, as a dashboard's first query after a pause."""
    times: dict[str, list[float]] = {label: [] for label in calls}
    while any(len(t) < runs for t in times.values()):
        for label, fn in calls.items():
            if block > 1:
                fn()
            for _ in range(min(block, runs - len(times[label]))):
                t0 = time.perf_counter()
                fn()
                times[label].append(time.perf_counter() - t0)
    return times


def med_p90(times: list[float]) -> tuple[float, float]:
    s = sorted(times)
    return statistics.median(s), s[min(len(s) - 1, int(np.ceil(0.9 * len(s))) - 1)]


def key_of(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return make_labels(labels)  # sorted, without __name__


def from_matrix(matrix: Any) -> Result:
    return {key_of(s.labels): (s.timestamps_ms, s.values) for s in matrix.series}


def from_json(body: dict[str, Any]) -> Result:
    if body.get("status") != "success":
        raise RuntimeError(f"query failed: {body}")
    out: Result = {}
    for s in body["data"]["result"]:
        pts = s["values"]
        t = np.array([round(float(p[0]) * 1000) for p in pts], dtype=np.int64)
        v = np.array([float(p[1]) for p in pts])
        out[key_of(s["metric"])] = (t, v)
    return out


def http_query(
    session: requests.Session,
    base: str,
    expr: str,
    start_ms: int,
    end_ms: int,
    step_ms: int,
    decode: bool = True,
    **extra: str,
) -> Any:
    """GET /api/v1/query_range and decode the JSON (what is timed for the HTTP rows); without `decode`,
    only read the body to its last byte (`--last-byte`)."""
    params = {
        "query": expr,
        "start": str(start_ms / 1000),
        "end": str(end_ms / 1000),
        "step": f"{step_ms // 1000}s",
        **extra,
    }
    response = session.get(f"{base}/api/v1/query_range", params=params, timeout=600)
    return response.json() if decode else response.content


def compare(a: Result, b: Result) -> str:
    """Series in both / only in a / only in b; of the points at common timestamps, exact and within 1%."""
    common = a.keys() & b.keys()
    pts = exact = close = only_a = only_b = 0
    for k in common:
        ta, va = a[k]
        tb, vb = b[k]
        both, ia, ib = np.intersect1d(ta, tb, return_indices=True)
        only_a += ta.size - both.size
        only_b += tb.size - both.size
        x, y = va[ia], vb[ib]
        diff = np.abs(x - y)
        scale = np.maximum(np.abs(x), np.abs(y))
        same_nan = np.isnan(x) & np.isnan(y)
        pts += both.size
        exact += int(np.count_nonzero((diff <= 1e-6 * scale + 1e-12) | same_nan))
        close += int(np.count_nonzero((diff <= 1e-2 * scale + 1e-9) | same_nan))
    text = f"series {len(a)}/{len(b)} ({len(common)} same labels)"
    if pts:
        text += f", points {pts:,} common: {100 * exact / pts:.1f}% exact, {100 * close / pts:.1f}% within 1%"
    if only_a or only_b:
        text += f"; points only here {only_a:,} / only there {only_b:,}"
    return text


# -- loading -------------------------------------------------------------------------------------------


def load_gpuwatch(series: list[querydata.Series], data_dir: Path) -> float:
    t0 = time.perf_counter()
    store = Store.open(data_dir, clock=SystemClock(), retention_s=3650 * 86400)
    for s in series:
        store.append_series(s.name, make_labels(s.labels), s.timestamps_ms, s.values)
    store.flush()
    store.close()
    return time.perf_counter() - t0


def start_prometheus(
    series: list[querydata.Series], work: Path, log: list[str]
) -> tuple[subprocess.Popen[Any], str]:
    om = work / "data.om"
    t0 = time.perf_counter()
    size = querydata.write_openmetrics(series, str(om))
    log.append(
        f"prometheus: OpenMetrics file {size / 1e6:,.0f} MB written in {time.perf_counter() - t0:.1f} s"
    )
    tsdb = work / "prom"
    t0 = time.perf_counter()
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--max-block-duration=162h",
            str(om),
            str(tsdb),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    t_blocks = time.perf_counter() - t0
    om.unlink()
    config = work / "prometheus.yml"
    config.write_text("global: {}\n")
    port = free_port()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tsdb}",
            "--storage.tsdb.retention.time=10y",
            f"--web.listen-address=127.0.0.1:{port}",
            "--query.max-samples=500000000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "prometheus.log", "w"),  # noqa: SIM115
    )
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/-/ready", proc)
    t_start = time.perf_counter() - t0
    log.append(f"prometheus: promtool create-blocks {t_blocks:.1f} s, start to ready {t_start:.1f} s")
    return proc, base


def start_victoria(
    series: list[querydata.Series], work: Path, log: list[str]
) -> tuple[subprocess.Popen[Any], str]:
    data = work / "vm"
    port = free_port()
    proc = subprocess.Popen(
        [
            "victoria-metrics",
            f"-storageDataPath={data}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=10y",
            "-loggerLevel=ERROR",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "vm.log", "w"),  # noqa: SIM115
    )
    base = f"http://127.0.0.1:{port}"
    wait_http(f"{base}/health", proc)
    t0 = time.perf_counter()
    t_text = 0.0
    with requests.Session() as session:
        for s in series:
            t1 = time.perf_counter()
            body = querydata.text_lines(s, seconds=False).encode()
            t_text += time.perf_counter() - t1
            session.post(f"{base}/api/v1/import/prometheus", data=body, timeout=600).raise_for_status()
        session.get(f"{base}/internal/force_flush", timeout=600).raise_for_status()
    total = time.perf_counter() - t0
    log.append(
        f"victoria-metrics: import + force_flush {total - t_text:.1f} s (+{t_text:.1f} s rendering the text)"
    )
    return proc, base


def n_samples(series: list[querydata.Series]) -> int:
    return sum(s.values.size for s in series)


# -- running -------------------------------------------------------------------------------------------


def serve(data_dir: str, port: int) -> None:
    """Child process: gpuwatch's Prometheus API over a read-only store, served by waitress as `gpuwatch serve`."""
    from types import SimpleNamespace

    from gpuwatch.app.config import load
    from gpuwatch.cli.gctune import tune_for_serving
    from gpuwatch.query.backend import LocalBackend
    from gpuwatch.web import create_app
    from gpuwatch.web.serving import make_server

    clock = SystemClock()
    store = Store.open(Path(data_dir), clock=clock, read_only=True)
    settings = load(None, {}, {"data_dir": data_dir})  # the defaults, as `gpuwatch serve` has them
    # The routes answer through the runtime's backend: gpuwatch's engine over the store, as in serve.
    backend = LocalBackend(store, store, settings, clock.monotonic)
    runtime = SimpleNamespace(
        store=store, queryable=store, backend=backend, clock=clock, settings=settings, access=None
    )
    server = make_server(create_app(runtime), "127.0.0.1", port)
    tune_for_serving()  # as `gpuwatch serve` does after start-up
    server.run()


def run_set(name: str, args: argparse.Namespace, root: Path) -> None:
    gpus, days, step_ms = SETS[name]
    work = root / name
    work.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    t0 = time.perf_counter()
    series = querydata.generate(gpus, days)
    start_ms = querydata.T0_MS
    end_ms = start_ms + int(days * querydata.DAY_MS)
    steps = (end_ms - start_ms) // step_ms + 1
    print(
        f"\n## {name}: {gpus} GPUs x {days:g} days, {len(series)} series, {n_samples(series):,} samples "
        f"(generated in {time.perf_counter() - t0:.1f} s); range {end_ms - start_ms} ms, step {step_ms // 1000} s, "
        f"{steps:,} points",
        flush=True,
    )
    gw_dir = work / "gpuwatch"
    t_load = load_gpuwatch(series, gw_dir)
    size = (gw_dir / "gpuwatch.duckdb").stat().st_size
    log.append(
        f"gpuwatch: append_series + close {t_load:.1f} s ({n_samples(series) / t_load / 1e6:.2f} M samples/s), "
        f"{size / 1e6:,.0f} MB ({size / n_samples(series):.2f} bytes/sample)"
    )
    procs: list[subprocess.Popen[Any]] = []
    peers: dict[str, str] = {}
    try:
        if not args.no_peers and shutil.which("promtool") and shutil.which("prometheus"):
            proc, base = start_prometheus(series, work, log)
            procs.append(proc)
            peers["prometheus"] = base
        if not args.no_peers and shutil.which("victoria-metrics"):
            proc, base = start_victoria(series, work, log)
            procs.append(proc)
            peers["victoria"] = base
        samples = n_samples(series)
        del series
        for line in log:
            print(line, flush=True)
        time.sleep(args.settle)
        print(f"load average before queries: {os.getloadavg()[0]:.2f}", flush=True)
        for sub, label in (("prom", "prometheus"), ("vm", "victoria-metrics")):
            if (work / sub).exists():
                du = sum(f.stat().st_size for f in (work / sub).rglob("*") if f.is_file())
                print(f"{label}: {du / 1e6:,.1f} MB on disk ({du / samples:.2f} bytes/sample)")
        rows: dict[str, dict[str, tuple[float, float]]] = {q: {} for q in QUERIES}
        # answers[q][target] = (aligned: the timed query, shifted: the same with start + 7 s)
        answers: dict[str, dict[str, tuple[Result, Result]]] = {q: {} for q in QUERIES}
        shifted = start_ms + 7_000

        # The client's own garbage collections (the series generated above, every decoded answer) would
        # land in the timings: at the p90, query 2's JSON decoding took 8.5 ms instead of 2.0. Freeze what
        # exists, so a collection scans only the few objects made since.
        gc.collect()
        gc.freeze()
        store = Store.open(gw_dir, clock=SystemClock(), read_only=True)
        engine = Engine(store, max_points=50_000)
        for q in QUERIES:
            times = timed(lambda q=q: engine.range(q, start_ms, end_ms, step_ms), args.runs)
            rows[q]["gpuwatch"] = med_p90(times)
            answers[q]["gpuwatch"] = (
                from_matrix(engine.range(q, start_ms, end_ms, step_ms)),
                from_matrix(engine.range(q, shifted, end_ms, step_ms)),
            )
            if step_ms != 15_000:
                times = timed(lambda q=q: engine.range(q, start_ms, end_ms, 15_000), args.runs)
                rows[q]["gpuwatch@15s"] = med_p90(times)
        store.close()

        port = free_port()
        child = subprocess.Popen([sys.executable, __file__, "--serve", str(gw_dir), str(port)])
        procs.append(child)
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/api/v1/status/buildinfo", child)
        targets = {
            "gpuwatch-http": (base, {}),
            **{p: (u, {"nocache": "1"} if p == "victoria" else {}) for p, u in peers.items()},
        }
        with requests.Session() as session:
            for q in QUERIES:
                calls = {
                    label: (
                        lambda url=url, q=q, extra=extra, t=start_ms: http_query(
                            session, url, q, t, end_ms, step_ms, not args.last_byte, **extra
                        )
                    )
                    for label, (url, extra) in targets.items()
                }
                for label, times in timed_interleaved(calls, args.runs, args.block).items():
                    rows[q][label] = med_p90(times)
                for label, (url, extra) in targets.items():
                    answers[q][label] = (
                        from_json(http_query(session, url, q, start_ms, end_ms, step_ms, **extra)),
                        from_json(http_query(session, url, q, shifted, end_ms, step_ms, **extra)),
                    )
        stop(child)
        report(rows, answers, list(peers), args.last_byte)
        print(f"load average after queries: {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        for proc in procs:
            stop(proc)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def ms(x: float) -> str:
    return f"{x * 1000:.1f}" if x < 0.1 else f"{x * 1000:.0f}"


def report(
    rows: dict[str, dict[str, tuple[float, float]]],
    answers: dict[str, dict[str, tuple[Result, Result]]],
    peers: list[str],
    last_byte: bool = False,
) -> None:
    cols = [
        c
        for c in ("gpuwatch", "gpuwatch@15s", "gpuwatch-http", "prometheus", "victoria")
        if c in rows[QUERIES[0]]
    ]
    print("\nmedian / p90 ms" + (" (HTTP: to the last byte, JSON not decoded)" if last_byte else "") + ":")
    print("| # | " + " | ".join(cols) + "".join(f" | gw/{p[:4]} | gw-http/{p[:4]}" for p in peers) + " |")
    for i, q in enumerate(QUERIES, 1):
        r = rows[q]
        cells = [f"{ms(r[c][0])} / {ms(r[c][1])}" for c in cols]
        for p in peers:
            cells.append(f"{r['gpuwatch'][0] / r[p][0]:.2f}")
            cells.append(f"{r['gpuwatch-http'][0] / r[p][0]:.2f}")
        print(f"| {i} | " + " | ".join(cells) + " |")
    print(
        "\nanswers, gpuwatch engine vs each (aligned: the timed query; +7s: start 7 s later, off the samples):"
    )
    for i, q in enumerate(QUERIES, 1):
        a = answers[q]
        for other in ("gpuwatch-http", *peers):
            print(f"  {i} vs {other}: aligned {compare(a['gpuwatch'][0], a[other][0])}")
            print(f"  {i} vs {other}: +7s     {compare(a['gpuwatch'][1], a[other][1])}")
    for i, q in enumerate(QUERIES, 1):
        print(f"  {i}: {q}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="24h,7d", help="comma-separated: 24h, 7d")
    ap.add_argument(
        "--block",
        type=int,
        default=5,
        help="HTTP targets take turns by blocks of this many runs, each after a warm-up run; "
        "1: one run each in turn, no warm-up (cold caches)",
    )
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument(
        "--last-byte",
        action="store_true",
        help="HTTP rows: time to the answer's last byte, without decoding its JSON in the client",
    )
    ap.add_argument("--no-peers", action="store_true", help="gpuwatch only")
    ap.add_argument("--dir", help="work directory (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the loaded data")
    ap.add_argument("--settle", type=float, default=10.0, help="seconds to wait after loading")
    args = ap.parse_args()
    print(
        f"Python {platform.python_version()}, duckdb {duckdb.__version__}, numpy {np.__version__}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="gpuwatch-qbench-"))
    try:
        for name in args.sets.split(","):
            run_set(name.strip(), args, root)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
