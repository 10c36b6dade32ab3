"""Federation's two ends in one process: a node serving GET /federate, a hub scraping such a page.

Usage: python bench/bench_federate.py [--series 50000] [--page 20000] [--rounds 3]

Serve: a store in a temporary directory gets --series series (500 names, 100 instances) written three
times 15 s apart, then `/federate?match[]={__name__=~".+"}` is asked --rounds times through Flask's
test client, plain and gzip; each answer's wall time and size is printed, and the longest pause of a
thread that sleeps 1 ms in a loop meanwhile (what the sampler thread would wait at worst).
Scrape: a `Target` on a fake fetch scrapes a --page-line /federate page (GPU-shaped labels, every line
timestamped) --rounds times, each round's samples newer; each scrape's CPU time is printed. The
collector is tuned as `gpuwatch serve` tunes it (cli/gctune.py).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatch.app.build import build_runtime  # noqa: E402
from gpuwatch.app.config import load  # noqa: E402
from gpuwatch.cli.gctune import tune_for_serving  # noqa: E402
from gpuwatch.collect.fetch import FetchResult  # noqa: E402
from gpuwatch.collect.scrape import Target  # noqa: E402
from gpuwatch.collect.targetspec import TargetSpec  # noqa: E402
from gpuwatch.core.clock import FakeClock  # noqa: E402
from gpuwatch.core.model import Batch, Sample, make_labels  # noqa: E402
from gpuwatch.demo.nvml import FakeNvml  # noqa: E402
from gpuwatch.web import create_app  # noqa: E402


def serve(series: int, rounds: int) -> None:
    clock = FakeClock(1_800_000_000)
    with tempfile.TemporaryDirectory() as d:
        settings = load(None, {}, {"data_dir": d, "demo": True, "demo_sources": False, "demo_history": False})
        nvml = FakeNvml(gpu_count=8, clock=clock, blocking_event_wait=False)
        rt = build_runtime(settings, "node", clock=clock, nvml=nvml)
        try:
            labels = [
                make_labels({"job": "j", "instance": f"h{i // 500}:1", "x": str(i)}) for i in range(series)
            ]
            for k in range(3):
                rt.store.append(Batch(clock.now_ms(), [Sample(f"m_{i % 500}", labels[i], float(i + k)) for i in range(series)]))  # fmt: skip
                clock.advance(15)
            rt.store.flush()
            client = create_app(rt).test_client()
            tune_for_serving()  # as `gpuwatch serve` does after start-up
            gaps: list[float] = []
            stop = threading.Event()

            def ticker() -> None:
                last = time.perf_counter()
                while not stop.is_set():
                    time.sleep(0.001)
                    now = time.perf_counter()
                    gaps.append(now - last)
                    last = now

            thread = threading.Thread(target=ticker)
            thread.start()
            for headers in ({}, {"Accept-Encoding": "gzip"}):
                for _ in range(rounds):
                    t = time.perf_counter()
                    got = client.get(
                        "/federate", query_string={"match[]": '{__name__=~".+"}'}, headers=headers
                    )
                    took = time.perf_counter() - t
                    print(
                        f"serve {series} series{' gzip' if headers else ''}: {took:.3f} s, {len(got.data)} bytes"
                    )
            stop.set()
            thread.join()
            print(f"longest pause of a 1 ms ticker meanwhile: {max(gaps) * 1000:.1f} ms")
        finally:
            rt.close()


def scrape(lines: int, rounds: int) -> None:
    def page(r: int) -> bytes:
        return "".join(
            f'm_{i % 200}{{Hostname="node-a",UUID="GPU-{i:08d}",gpu="{i % 8}",modelName="NVIDIA H100 80GB HBM3"}} '
            f"{i * 0.5 + r} {1_800_000_000_000 + r * 15_000}\n"
            for i in range(lines)
        ).encode()

    pages = [page(r) for r in range(rounds)]
    current = [0]

    def fetch(spec: TargetSpec, timeout_s: float) -> FetchResult:
        return FetchResult(pages[current[0]], "text/plain; version=0.0.4")

    spec = TargetSpec(
        job="n", address="a:1", scheme="http", metrics_path="/federate", params=(),
        labels=make_labels({"job": "n", "instance": "a:1"}), interval_s=15, timeout_s=10, honor_labels=True,
    )  # fmt: skip
    target = Target(spec, fetch, FakeClock(1_800_000_000))
    for r in range(rounds):
        current[0] = r
        t = time.thread_time()
        batches = target.scrape()
        took = time.thread_time() - t
        print(
            f"scrape a {lines}-line page: {took:.3f} s CPU, {sum(len(b.samples) for b in batches[1:])} samples"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--series", type=int, default=50_000)
    ap.add_argument("--page", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    serve(args.series, args.rounds)
    scrape(args.page, args.rounds)


if __name__ == "__main__":
    main()
