"""Scrape overhead: `gpuwatch serve` scraping 20 vLLM-sized targets every 5 s while sampling 64 GPUs at 1 s.

Usage: python bench/bench_scrape.py [--targets 20] [--interval 5s] [--gpus 64] [--seconds 180]

Starts bench/scrape_targets.py (a separate process: N prometheus_client servers of ~1,700 lines each on
127.0.0.1), then `gpuwatch serve --demo` (simulated GPUs only) with a config file listing the targets
as one `scrape_configs` job. After --warmup seconds it measures the serve process's CPU time (user +
system, all threads, psutil) and peak RSS over --seconds, then asks gpuwatch itself, over its
PromQL API, for each target's `scrape_duration_seconds` and the spacing of its `up` samples over the
window (the scrape interval as it happened: jitter is how far each spacing is from --interval). Last,
the parser's speed on the served page against prometheus_client's parser. Prints figures for
bench/README.md.
"""

from __future__ import annotations

import argparse
import itertools
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

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_serve import thread_names, thread_ticks  # noqa: E402
from bench.scrape_targets import start_targets  # noqa: E402
from gpuwatch.core.units import parse_duration  # noqa: E402
from gpuwatch.promtext.parser import Parser, parse  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if requests.get(f"{url}/-/health", timeout=2).ok:
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit("gpuwatch did not start")
        time.sleep(0.2)


def series_over(url: str, expr: str) -> dict[str, list[tuple[float, float]]]:
    """Return instance -> [(time, value)] for a range-vector expression, evaluated now."""
    body = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=60).json()
    assert body["status"] == "success", body
    return {
        r["metric"]["instance"]: [(float(t), float(v)) for t, v in r["values"]]
        for r in body["data"]["result"]
    }


def parse_speed(text: bytes, repeat: int = 7) -> tuple[float, float, float]:
    """Return (gpuwatch cold ms, gpuwatch warm ms, prometheus_client ms): best of `repeat`."""
    from prometheus_client.parser import text_string_to_metric_families

    def best(fn) -> float:  # type: ignore[no-untyped-def]
        fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return 1000 * min(times)

    warm = Parser()
    decoded = text.decode()
    return (
        best(lambda: parse(text)),
        best(lambda: warm.parse(text)),
        best(lambda: [s for f in text_string_to_metric_families(decoded) for s in f.samples]),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=20)
    ap.add_argument("--interval", default="5s", help="scrape_interval of the targets")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--sample-interval", default="1s")
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--profile", metavar="FILE", help="also record the serve process with py-spy into FILE")
    ap.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="extra GPUWATCH_* setting"
    )
    args = ap.parse_args()
    interval_s = parse_duration(args.interval)

    targets, ready = start_targets(args.targets)
    serve: subprocess.Popen[bytes] | None = None
    tmp = ""
    spy: subprocess.Popen[bytes] | None = None
    try:
        ports, lines = ready["ports"], ready["lines"]
        page = requests.get(f"http://127.0.0.1:{ports[0]}/metrics", timeout=10).content
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        tmp = tempfile.mkdtemp()  # removed after serve has stopped (finally)
        config = Path(tmp) / "gpuwatch.yml"
        config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "scrape_configs": [
                        {
                            "job_name": "bench",
                            "scrape_interval": args.interval,
                            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}],
                        }
                    ]
                }
            )
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
        env.update(
            GPUWATCH_DEMO_GPUS=str(args.gpus),
            GPUWATCH_SAMPLE_INTERVAL=args.sample_interval,
            GPUWATCH_LOG_LEVEL="warning",
            GPUWATCH_DEMO_SOURCES="false",
            GPUWATCH_DEMO_HISTORY="false",
        )
        env.update(kv.split("=", 1) for kv in args.env)
        serve = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch.cli.main", "serve", "--demo", "--host", "127.0.0.1",
             "--port", str(port), "--data-dir", str(Path(tmp) / "data"), "--config", str(config)],
            env=env,
        )  # fmt: skip
        wait_healthy(url, serve)
        p = psutil.Process(serve.pid)
        time.sleep(args.warmup)
        if args.profile:
            spy = subprocess.Popen(
                [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid", str(serve.pid), "--duration", str(int(args.seconds)),
                 "--rate", "50", "--format", "raw", "--output", args.profile, "--nonblocking", "--threads"],
            )  # fmt: skip
        t0, w0, peak = p.cpu_times(), time.monotonic(), 0
        th0 = thread_ticks(serve.pid)
        while time.monotonic() - w0 < args.seconds:
            peak = max(peak, p.memory_info().rss)
            time.sleep(1.0)
        t1, wall = p.cpu_times(), time.monotonic() - w0
        th1 = thread_ticks(serve.pid)
        cpu = (t1.user - t0.user) + (t1.system - t0.system)
        window = f"[{int(args.seconds)}s]"
        durations = series_over(url, f'scrape_duration_seconds{{job="bench"}}{window}')
        ups = series_over(url, f'up{{job="bench"}}{window}')
        samples = series_over(url, f'scrape_samples_scraped{{job="bench"}}{window}')
        gpu_body = requests.get(
            f"{url}/api/v1/query", params={"query": f'DCGM_FI_DEV_GPU_UTIL{{gpu="0"}}{window}'}, timeout=60
        ).json()
        gpu_ts = (
            [float(t) for t, _ in gpu_body["data"]["result"][0]["values"]]
            if gpu_body["data"]["result"]
            else []
        )
        gpu_gaps = [b - a for a, b in itertools.pairwise(gpu_ts)]
        jobs = requests.get(f"{url}/-/jobs", timeout=5).json()["jobs"]
        groups = requests.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
        print(f"machine: {os.cpu_count()} vCPU, Python {platform.python_version()}, {platform.machine()}")
        print(
            f"targets={args.targets} x {lines} lines ({len(page) / 1000:.0f} KB) every {args.interval}, "
            f"gpus={args.gpus} every {args.sample_interval}; measured {wall:.0f}s after {args.warmup:.0f}s warm-up"
        )
        print(f"serve cpu: {100 * cpu / wall:.2f}% of one core; peak rss {peak / 2**20:.1f} MiB")
        names, hz = thread_names(serve.pid), os.sysconf("SC_CLK_TCK")
        per = {names.get(n, f"tid {n}"): th1[n] - th0.get(n, 0) for n in th1}
        for name, ticks in sorted(per.items(), key=lambda kv: -kv[1]):
            if ticks:
                print(f"  thread {name}: {100 * ticks / hz / wall:.2f}%")
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(
            f"gpu 0 samples in the window: {len(gpu_ts)} (sample interval {args.sample_interval}), "
            f"longest gap {max(gpu_gaps, default=0):.2f} s, gaps over 1.5 s: {sum(g > 1.5 for g in gpu_gaps)}"
        )
        for j in jobs:
            if j["name"] in ("sample", "rules", "host"):
                print(f"job {j['name']}: {j['runs']} runs, {j['failures']} failures, last {1000 * (j['last_duration_s'] or 0):.1f} ms")  # fmt: skip
        for g in groups:
            slowest = max(g["rules"], key=lambda r: r["evaluationTime"])
            print(
                f"rule group {g['name']} (every {g['interval']:.0f} s): last round {1000 * g['evaluationTime']:.0f} ms, "
                f"slowest rule {slowest['name']} {1000 * slowest['evaluationTime']:.0f} ms"
            )
        print("per target: scrapes, samples/scrape, scrape_duration ms (median / max), interval s (min / max), jitter ms (max |interval - 5s|)")  # fmt: skip
        worst_jitter, all_durations = 0.0, []
        for inst in sorted(ups):
            times = [t for t, _ in ups[inst]]
            gaps = [b - a for a, b in itertools.pairwise(times)]
            d = [1000 * v for _, v in durations.get(inst, [])]
            all_durations += d
            jitter = max((abs(g - interval_s) for g in gaps), default=0.0) * 1000
            worst_jitter = max(worst_jitter, jitter)
            down = sum(1 for _, v in ups[inst] if v != 1)
            n = samples.get(inst, [(0, 0)])[-1][1]
            print(
                f"  {inst}: {len(times)} scrapes ({down} down), {n:.0f} samples, "
                f"{statistics.median(d):.1f} / {max(d):.1f} ms, "
                + (f"{min(gaps):.3f} / {max(gaps):.3f} s, " if gaps else "- (one scrape in the window), ")
                + f"{jitter:.0f} ms"
            )
        print(
            f"all targets: scrape_duration median {statistics.median(all_durations):.1f} ms, "
            f"p99 {sorted(all_durations)[int(0.99 * (len(all_durations) - 1))]:.1f} ms, max {max(all_durations):.1f} ms; "
            f"worst interval jitter {worst_jitter:.0f} ms"
        )
        cold, warm, pc = parse_speed(page)
        print(
            f"parse {lines} lines: gpuwatch cold {cold:.2f} ms ({lines / cold:.0f} k lines/s), "
            f"warm {warm:.2f} ms ({lines / warm:.0f} k lines/s); prometheus_client {pc:.1f} ms "
            f"({lines / pc:.0f} k lines/s); {pc / warm:.1f}x"
        )
    finally:
        if spy is not None:
            spy.wait(60)
        for proc in (serve, targets):
            if proc is not None:
                proc.terminate()
                proc.wait(60)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
