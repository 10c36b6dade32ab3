"""How old the newest stored GPU sample gets while `gpuwatch serve` takes a big import.

Usage: python bench/bench_import_serve.py [--series 1000000] [--root DIR] [--runs 1]

Starts `gpuwatch serve --demo` (one simulated GPU sampled every 0.1 s, the store flushing every
0.25 s, a fresh data directory) on a free port, POSTs a Prometheus text body of N new one-sample
series (`imported_total{pod,node}`, ~55 bytes a line: a million fit the 64 MiB cap) to
/api/v1/import/prometheus, and meanwhile asks `max(timestamp(DCGM_FI_DEV_GPU_UTIL))` every 0.1 s: how
long ago the newest GPU sample the store holds was taken. Prints the worst of it for each second of
the POST (the body is parsed first, then written). `--root DIR` runs another tree's gpuwatch (a build
to compare with, in turns).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
QUERY = "max(timestamp(DCGM_FI_DEV_GPU_UTIL))"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def once(root: Path, n: int) -> None:
    body = "".join(f'imported_total{{pod="p{i:07d}",node="n{i % 97}"}} {i} 1700000000000\n' for i in range(n))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    env.update(
        PYTHONPATH=str(root),
        GPUWATCH_DEMO_GPUS="1",
        GPUWATCH_DEMO_SOURCES="false",
        GPUWATCH_DEMO_HISTORY="false",
        GPUWATCH_FLUSH_INTERVAL="0.25",
        GPUWATCH_SAMPLE_INTERVAL="0.1",
    )
    with tempfile.TemporaryDirectory() as tmp:
        args = ["serve", "--demo", "--host", "127.0.0.1", "--port", str(port), "--data-dir", tmp]
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch.cli.main", *args],
            env=env,
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for(url)
            time.sleep(4)  # the sampler's and the flush's rhythm settled
            done = threading.Event()
            answer: dict[str, float] = {}

            def post() -> None:
                t0 = time.time()
                r = requests.post(url + "/api/v1/import/prometheus", data=body.encode(), timeout=600)
                answer["took_s"], answer["status"] = time.time() - t0, r.status_code
                done.set()

            t_post = time.time()
            threading.Thread(target=post).start()
            worst: dict[int, float] = {}
            while not done.is_set():
                try:
                    r = requests.get(url + "/api/v1/query", params={"query": QUERY}, timeout=60)
                    newest = float(r.json()["data"]["result"][0]["value"][1])
                except (requests.RequestException, KeyError, IndexError, ValueError):
                    newest = None
                if newest is not None:
                    second = int(time.time() - t_post)
                    worst[second] = max(worst.get(second, 0.0), time.time() - newest)
                time.sleep(0.1)
        finally:
            proc.terminate()
            proc.wait(30)
    print(
        f"{n} series in {answer['took_s']:.1f} s (HTTP {answer['status']:.0f}); the newest stored GPU "
        f"sample at most {max(worst.values(), default=0):.1f} s old; per second of the POST: "
        + " ".join(f"{s}:{v:.1f}" for s, v in sorted(worst.items())),
        flush=True,
    )


def _wait_for(url: str) -> None:
    for _ in range(600):
        try:
            if requests.get(url + "/-/health", timeout=1).status_code in (200, 503):
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise SystemExit(f"gpuwatch serve did not answer at {url}")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--series", type=int, default=1_000_000)
    p.add_argument("--root", type=Path, default=ROOT, help="the gpuwatch tree to measure")
    p.add_argument("--runs", type=int, default=1)
    args = p.parse_args()
    for _ in range(args.runs):
        once(args.root.resolve(), args.series)


if __name__ == "__main__":
    main()
