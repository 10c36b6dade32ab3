"""Sampling overhead: `gpuwatch serve --demo` with N simulated GPUs, CPU and RSS of the process.

Usage: python bench/bench_serve.py [--gpus 64] [--seconds 300] [--interval 1s]

Starts gpuwatch as a subprocess on a free port with a fresh data directory, lets it warm up for 20 s,
then measures the process's CPU time (user + system, all threads) and peak RSS over --seconds.
Prints one line per figure; paste them into bench/README.md with the date and the machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def thread_ticks(pid: int) -> dict[str, int]:
    """Return CPU clock ticks (user + system) per thread name of process `pid`, from /proc."""
    out: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the thread ended
        fields = stat[stat.rindex(")") + 2 :].split()
        out[tid] = int(fields[11]) + int(fields[12])
    return out


def thread_names(pid: int) -> dict[str, str]:
    """Return Python thread names by OS thread id, from `py-spy dump` when it is installed."""
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(spy):
        return {}
    try:
        dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {}
    for m in re.finditer(r'^Thread (0x[0-9A-Fa-f]+|\d+) [^"]*"([^"]*)"', dump.stdout, re.M):
        tid = m.group(1)
        names[str(int(tid, 0))] = m.group(2)
    return names


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=300.0)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--interval", default="1s")
    args = ap.parse_args()

    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
        env.update(
            GPUWATCH_DEMO_GPUS=str(args.gpus),
            GPUWATCH_SAMPLE_INTERVAL=args.interval,
            GPUWATCH_LOG_LEVEL="warning",
            GPUWATCH_DEMO_SOURCES="false",  # GPUs only: the figure is the cost of sampling them
            GPUWATCH_DEMO_HISTORY="false",
        )
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwatch.cli.main",
                "serve",
                "--demo",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--data-dir",
                data,
            ],
            env=env,
        )
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/-/health", timeout=2).ok:
                        break
                except requests.ConnectionError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("gpuwatch did not start")
                time.sleep(0.2)
            p = psutil.Process(proc.pid)
            time.sleep(args.warmup)
            t0 = p.cpu_times()
            th0 = thread_ticks(proc.pid)
            w0 = time.monotonic()
            peak_rss = 0
            while time.monotonic() - w0 < args.seconds:
                peak_rss = max(peak_rss, p.memory_info().rss)
                time.sleep(1.0)
            t1 = p.cpu_times()
            th1 = thread_ticks(proc.pid)
            wall = time.monotonic() - w0
            cpu = (t1.user - t0.user) + (t1.system - t0.system)
            jobs = requests.get(f"http://127.0.0.1:{port}/-/jobs", timeout=5).json()["jobs"]
            sample = next(j for j in jobs if j["name"] == "sample")
            print(f"machine: {os.cpu_count()} vCPU, Python {platform.python_version()}, {platform.machine()}")
            print(
                f"gpus={args.gpus} interval={args.interval} measured={wall:.0f}s after {args.warmup:.0f}s warm-up"
            )
            print(f"cpu: {100 * cpu / wall:.2f}% of one core")
            hz = os.sysconf("SC_CLK_TCK")
            names = thread_names(proc.pid)
            per = {names.get(n, f"tid {n}"): th1[n] - th0.get(n, 0) for n in th1}
            for name, ticks in sorted(per.items(), key=lambda kv: -kv[1]):
                if ticks:
                    print(f"  thread {name}: {100 * ticks / hz / wall:.2f}%")
            print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            print(f"rss: peak {peak_rss / 2**20:.1f} MiB")
            print(
                f"sample job: {sample['runs']} runs, {sample['failures']} failures, "
                f"last {1000 * (sample['last_duration_s'] or 0):.1f} ms"
            )
        finally:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
