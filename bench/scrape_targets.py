"""Serve N vLLM-sized `/metrics` pages on 127.0.0.1 from this process, for bench/bench_scrape.py.

Usage: python bench/scrape_targets.py [--targets 20]

Each target is its own prometheus_client registry shaped like a vLLM V1 server (tests/data/vllm_like.py,
4 models, one engine each) plus what a real vLLM also exposes: the FastAPI instrumentator's HTTP metrics
for a dozen handlers and prometheus_client's process/GC collectors; about 1,700 lines. Each is served by
prometheus_client's own `start_http_server` on an ephemeral port; a ticker thread moves every target's
counters and histograms once a second. Prints one JSON line `{"ports": [...], "lines": n}` when ready,
then runs until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "data"))

from prometheus_client import (  # noqa: E402
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
    start_http_server,
)
from vllm_like import MODELS, vllm_registry  # noqa: E402

HANDLERS = (
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models", "/tokenize", "/detokenize",
    "/v1/responses", "/v1/score", "/v1/rerank", "/pooling", "/v1/audio/transcriptions", "/invocations",
)  # fmt: skip
HIGHR = (0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 7.5, 10, 30, 60)


class VllmTarget:
    """One simulated vLLM server's registry and the children the ticker moves."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.registry = reg = vllm_registry(engines=1)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            reg.register(collector)
        self.http = Counter("http_requests", "Total number of requests by method, status and handler.", ("handler", "method", "status"), registry=reg)  # fmt: skip
        req_size = Summary("http_request_size_bytes", "Content length of incoming requests by handler.", ("handler",), registry=reg)  # fmt: skip
        resp_size = Summary("http_response_size_bytes", "Content length of outgoing responses by handler.", ("handler",), registry=reg)  # fmt: skip
        self.duration = Histogram("http_request_duration_seconds", "Latency with only few buckets by handler.", ("handler", "method"), buckets=(0.1, 0.5, 1), registry=reg)  # fmt: skip
        self.highr = Histogram("http_request_duration_highr_seconds", "Latency with many buckets but no API specific labels.", buckets=HIGHR, registry=reg)  # fmt: skip
        for h in HANDLERS:
            for status in ("2xx", "4xx", "5xx"):
                self.http.labels(h, "POST", status)
            req_size.labels(h).observe(rng.randint(100, 5000))
            resp_size.labels(h).observe(rng.randint(100, 50000))
            self.duration.labels(h, "POST")
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", ("block_size", "cache_dtype", "enable_prefix_caching", "gpu_memory_utilization", "num_cpu_blocks", "num_gpu_blocks", "engine"), registry=reg)  # fmt: skip
        info.labels("16", "auto", "True", "0.9", "None", "31023", "0").set(1)
        self.success = [reg._names_to_collectors["vllm:request_success_total"].labels(m, "0", "stop") for m in MODELS]  # type: ignore[attr-defined]  # fmt: skip
        self.e2e = [reg._names_to_collectors["vllm:e2e_request_latency_seconds"].labels(m, "0") for m in MODELS]  # type: ignore[attr-defined]  # fmt: skip
        self.tokens = [reg._names_to_collectors["vllm:generation_tokens_total"].labels(m, "0") for m in MODELS]  # type: ignore[attr-defined]  # fmt: skip
        self.running = [reg._names_to_collectors["vllm:num_requests_running"].labels(m, "0") for m in MODELS]  # type: ignore[attr-defined]  # fmt: skip

    def tick(self) -> None:
        rng = self.rng
        for i in range(len(MODELS)):
            n = rng.randint(2, 12)
            self.success[i].inc(n)
            self.tokens[i].inc(n * rng.randint(50, 500))
            self.running[i].set(rng.randint(0, 64))
            for _ in range(3):
                self.e2e[i].observe(rng.lognormvariate(0.5, 0.6))
        for h in HANDLERS[:3]:
            self.http.labels(h, "POST", "2xx").inc(rng.randint(1, 10))
            self.duration.labels(h, "POST").observe(rng.uniform(0.05, 2))
        self.highr.observe(rng.uniform(0.05, 2))


def start_targets(n: int) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Run this script in a child process with `n` targets; return it and its ready line (`ports`, `lines`)."""
    proc = subprocess.Popen([sys.executable, __file__, "--targets", str(n)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        return proc, json.loads(proc.stdout.readline())
    except BaseException:
        proc.kill()
        proc.wait(30)
        raise


@contextlib.contextmanager
def running_targets(n: int) -> Iterator[list[int]]:
    """`start_targets` for a `with` block: yields the targets' ports, stops the child after."""
    proc, ready = start_targets(n)
    try:
        yield ready["ports"]
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=20)
    args = ap.parse_args()
    rng = random.Random(1)
    targets = [VllmTarget(rng) for _ in range(args.targets)]
    ports = []
    for t in targets:
        server, _thread = start_http_server(0, addr="127.0.0.1", registry=t.registry)
        ports.append(server.server_port)
    lines = generate_latest(targets[0].registry).count(b"\n") if targets else 0
    print(json.dumps({"ports": ports, "lines": lines}), flush=True)

    def ticker() -> None:
        while True:
            time.sleep(1.0)
            for t in targets:
                t.tick()

    threading.Thread(target=ticker, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
