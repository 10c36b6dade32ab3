"""The inference pages' data: one set of tiles for vLLM, SGLang and TGI over a real store fed by
scraped expositions and the built-in recording rules; per-engine availability ("not available" vs
"no data"), thresholds that judge, the service list, and the serving GPUs of a local port."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ScrapeError
from gpuwatch.core.model import Batch, Sample, stable_labels
from gpuwatch.demo.engines import SglangSim, VllmSim
from gpuwatch.query import Engine
from gpuwatch.query.parse import parse
from gpuwatch.store import Store
from gpuwatch.web.dash.gpupanels import gpu_panels
from gpuwatch.web.dash.inference import service_panels
from gpuwatch.web.dash.inferencedata import (
    ENGINES,
    TGI_NO_TTFT,
    expr_for,
    judge,
    local_port,
    services,
    serving_gpus,
    tiles,
)
from tests.test_inference_rules import Fetch, Tgi, run


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, FakeClock]]:
    """Six minutes of the demo's vLLM and SGLang and a TGI, scraped every 15 s with the rules run."""
    clock = FakeClock(1_800_000_000)
    store = Store.open(tmp_path_factory.mktemp("inf") / "data", clock=clock)
    rng = random.Random(5)
    vllm, sglang, tgi = VllmSim(rng), SglangSim(rng), Tgi()
    jobs = [
        {"job_name": "vllm", "static_configs": [{"targets": ["127.0.0.1:1"]}]},
        {"job_name": "sglang", "static_configs": [{"targets": ["127.0.0.1:2"]}]},
        {"job_name": "tgi", "static_configs": [{"targets": ["tgi:3000", "gone:3000"]}]},
    ]
    bodies = {
        "127.0.0.1:1": lambda: generate_latest(vllm.registry),
        "127.0.0.1:2": lambda: generate_latest(sglang.registry),
        "tgi:3000": tgi.text,
    }

    class Down(Fetch):
        def __call__(self, spec: Any, timeout_s: float) -> Any:
            if spec.address == "gone:3000":
                raise ScrapeError("connection refused")
            return super().__call__(spec, timeout_s)

    def tick(dt: float) -> None:
        for _ in range(int(dt)):
            vllm.tick(1.0)
            sglang.tick(1.0)
        tgi.step()

    run(store, clock, jobs, Down(bodies), tick, minutes=6)
    yield store, clock
    store.close()


def _tiles(served: tuple[Store, FakeClock], engine: str, job: str) -> dict[str, dict[str, Any]]:
    store, clock = served
    return {t["id"]: t for t in tiles(Engine(store).instant, engine, job, clock.now_ms())}


def test_vllm_has_every_tile_with_data(served: tuple[Store, FakeClock]) -> None:
    got = _tiles(served, "vllm", "vllm")
    for tid in ("requests", "tokens_in", "tokens_out", "running", "waiting", "kv_cache", "e2e_p99"):
        assert got[tid]["available"] and got[tid]["value"] is not None, tid
    for kind in ("ttft", "itl", "e2e"):
        p50, p95, p99 = (got[f"{kind}_{q}"]["value"] for q in ("p50", "p95", "p99"))
        assert 0 < p50 <= p95 <= p99, kind
    assert got["tokens_in"]["value"] > 0 and got["tokens_out"]["value"] > 0
    assert got["unreachable"]["value"] == 0 and got["unreachable"]["state"] == "ok"
    assert got["error_ratio"]["state"] == judge(got["error_ratio"]["value"], 0.001, 0.01)


def test_tgi_says_what_it_does_not_expose(served: tuple[Store, FakeClock]) -> None:
    got = _tiles(served, "tgi", "tgi")
    for q in ("p50", "p95", "p99"):
        ttft = got[f"ttft_{q}"]
        assert not ttft["available"] and ttft["state"] == "na" and ttft["note"] == TGI_NO_TTFT
        assert ttft["value"] is None and ttft["expr"] is None
    assert not got["preemptions"]["available"]
    assert got["kv_cache"]["note"].startswith("approximation") and got["kv_cache"]["value"] == pytest.approx(
        0.25
    )
    assert got["itl_p99"]["available"] and got["itl_p99"]["note"].startswith("approximation")
    assert (
        got["itl_p99"]["value"] is None and got["itl_p99"]["state"] == "none"
    )  # exposed, but not by this TGI
    assert got["error_ratio"]["value"] == pytest.approx(1 / 45) and got["error_ratio"]["state"] == "crit"
    assert got["e2e_p99"]["value"] > 2.0
    assert got["unreachable"]["value"] == 1 and got["unreachable"]["state"] == "crit"


def test_sglang_latencies_and_running_requests(served: tuple[Store, FakeClock]) -> None:
    got = _tiles(served, "sglang", "sglang")
    assert got["ttft_p99"]["value"] is not None and got["e2e_p50"]["value"] is not None
    assert got["running"]["value"] is not None


@pytest.mark.parametrize(
    ("value", "warn", "crit", "state"),
    [
        (None, 0.001, 0.01, "none"),
        (0.0005, 0.001, 0.01, "ok"),
        (0.001, 0.001, 0.01, "warn"),
        (0.02, 0.001, 0.01, "crit"),
        (0.89, 0.9, 0.98, "ok"),
        (0.95, 0.9, 0.98, "warn"),
        (0.99, 0.9, 0.98, "crit"),
    ],
)
def test_thresholds_judge(value: float | None, warn: float, crit: float, state: str) -> None:
    assert judge(value, warn, crit) == state


def test_services_list_each_engine(served: tuple[Store, FakeClock]) -> None:
    store, clock = served
    rows = {r["job"]: r for r in services(Engine(store).instant, clock.now_ms())}
    assert {j: r["engine"] for j, r in rows.items()} == {"vllm": "vllm", "sglang": "sglang", "tgi": "tgi"}
    assert rows["tgi"]["unreachable"] == 1 and rows["tgi"]["error_state"] == "crit"
    assert rows["vllm"]["requests"] > 0


def test_local_port() -> None:
    assert local_port("http://127.0.0.1:8000/metrics") == 8000
    assert local_port("http://[::1]:9/metrics") == 9
    assert local_port("http://gpu-node-2:8000/metrics") is None
    assert local_port("http://gpu-node-2/metrics", frozenset({"gpu-node-2"})) == 80
    assert local_port("http://x:notaport/") is None


def test_serving_gpus_from_a_real_listening_port(tmp_path: Path) -> None:
    """A real socket of this process, found in the real /proc, joined with NVML's process table."""
    clock = FakeClock(1_800_000_000)
    store = Store.open(tmp_path / "data", clock=clock)
    try:
        gpu = {"gpu": "2", "UUID": "GPU-2222", "Hostname": "node-1"}
        store.append(
            Batch(
                clock.now_ms(),
                [
                    Sample(
                        "gpuwatch_process_gpu_memory_bytes",
                        stable_labels({**gpu, "pid": str(os.getpid())}),
                        3e9,
                    ),
                    Sample(
                        "gpuwatch_process_gpu_memory_bytes",
                        stable_labels({**gpu, "UUID": "GPU-9", "gpu": "9", "pid": "1"}),
                        1.0,
                    ),
                ],
            )
        )
        store.flush()
        query = Engine(store).instant
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            targets = [
                {
                    "scrapePool": "vllm",
                    "labels": {"job": "vllm"},
                    "scrapeUrl": f"http://127.0.0.1:{port}/metrics",
                }
            ]
            got = serving_gpus(query, targets, "vllm", clock.now_ms(), Path("/proc"))
            assert got["state"] == "found"
            assert [g["uuid"] for g in got["gpus"]] == ["GPU-2222"]
            assert got["gpus"][0]["memory_bytes"] == 3e9
            assert got["matchers"] == 'UUID=~"GPU-2222"'
        got = serving_gpus(query, targets, "vllm", clock.now_ms(), Path("/proc"))
        assert got["state"] == "no-process"
        remote = [
            {"scrapePool": "vllm", "labels": {"job": "vllm"}, "scrapeUrl": "http://node-9:8000/metrics"}
        ]
        assert serving_gpus(query, remote, "vllm", clock.now_ms(), Path("/proc"))["state"] == "remote"
    finally:
        store.close()


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_expression_of_every_engine_parses(engine: str) -> None:
    job = 'a"job'
    exprs = [expr_for(engine, sid, job) for sid in ENGINES[engine]]
    exprs += [q for p in service_panels(engine, job, 'UUID=~"GPU-1|GPU-2"') for q in p.queries()]
    exprs += [q for p in gpu_panels('Hostname=~"n1", gpu=~"0|1"') for q in p.queries()]
    for expr in exprs:
        if expr is not None:
            assert "$" not in expr and "{SEL}" not in expr, expr
            parse(expr)
