"""The demo's simulated vLLM and SGLang registries, its training run and its servers."""

from __future__ import annotations

import itertools
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import generate_latest

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.core.clock import FakeClock
from gpuwatch.demo.engines import (
    SGLANG_E2E,
    SGLANG_ITL,
    SGLANG_QUEUE_TIME,
    SGLANG_TTFT,
    VLLM_ITERATION_TOKENS,
    VLLM_ITL,
    VLLM_REQUEST_LATENCY,
    VLLM_REQUEST_TOKENS,
    VLLM_TTFT,
    SglangSim,
    VllmSim,
)
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.demo.sources import DemoSources, local_url
from gpuwatch.demo.training import TRAINING_RUN, TrainingSim
from gpuwatch.promtext.parser import parse
from gpuwatch.promtext.result import ParseResult

VLLM_LABELS = {"engine": "0", "model_name": "meta-llama/Llama-3.1-8B-Instruct"}
SGLANG_SCHED = {
    "engine_type": "unified",
    "model_name": "Qwen/Qwen2.5-7B-Instruct",
    "moe_ep_rank": "0",
    "pp_rank": "0",
    "tp_rank": "0",
}
SGLANG_TOK = {"engine_type": "unified", "model_name": "Qwen/Qwen2.5-7B-Instruct"}


def scraped(registry: Any) -> ParseResult:
    result = parse(generate_latest(registry))
    assert result.errors == []
    return result


def by_name(result: ParseResult) -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for name, labels, _, _ in result.samples:
        out.setdefault(name, []).append(dict(labels))
    return out


def value(result: ParseResult, name: str, **labels: str) -> float:
    (v,) = [v for n, lab, _, v in result.samples if n == name and dict(lab) == labels]
    return v


def les(result: ParseResult, name: str) -> list[float]:
    return [float(lab["le"]) for lab in by_name(result)[name + "_bucket"]]


def busy(sim: VllmSim | SglangSim, ticks: int = 60) -> None:
    for _ in range(ticks):
        sim.tick(1.0)


def test_vllm_names_labels_and_buckets() -> None:
    sim = VllmSim(random.Random(1))
    busy(sim)
    result = scraped(sim.registry)
    series = by_name(result)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:time_to_first_token_seconds_sum",
        "vllm:inter_token_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:prompt_tokens_created",  # single-process vLLM keeps prometheus_client's _created series
    ):
        assert series[name] == [VLLM_LABELS], name
    reasons = {lab.pop("finished_reason") for lab in series["vllm:request_success_total"]}
    assert reasons == {"stop", "length", "abort", "error", "repetition"}
    assert all(lab == VLLM_LABELS for lab in series["vllm:request_success_total"])
    assert result.metadata["vllm:e2e_request_latency_seconds"].type == "histogram"
    inf = float("inf")
    assert les(result, "vllm:e2e_request_latency_seconds") == [*VLLM_REQUEST_LATENCY, inf]
    assert les(result, "vllm:request_queue_time_seconds") == [*VLLM_REQUEST_LATENCY, inf]
    assert les(result, "vllm:time_to_first_token_seconds") == [*VLLM_TTFT, inf]
    assert les(result, "vllm:inter_token_latency_seconds") == [*VLLM_ITL, inf]
    assert VLLM_REQUEST_LATENCY[:3] == (0.3, 0.5, 0.8) and VLLM_TTFT[0] == 0.001 and VLLM_ITL[-1] == 80.0
    assert 0 <= value(result, "vllm:kv_cache_usage_perc", **VLLM_LABELS) <= 1
    done = sum(v for n, _, _, v in result.samples if n == "vllm:request_success_total")
    assert done > 0 and value(result, "vllm:e2e_request_latency_seconds_count", **VLLM_LABELS) == done
    assert value(result, "vllm:generation_tokens_total", **VLLM_LABELS) > 0


def test_vllm_families_its_dashboards_read() -> None:
    """Token histograms and the request phases (queue, prefill, decode, inference, TPOT) that vLLM's
    own Grafana dashboard reads, with vLLM's buckets; healthy latencies stay under the built-in limits."""
    sim = VllmSim(random.Random(7))
    busy(sim, 300)
    result = scraped(sim.registry)
    inf = float("inf")
    for name, buckets in (
        ("vllm:request_prompt_tokens", VLLM_REQUEST_TOKENS),
        ("vllm:request_generation_tokens", VLLM_REQUEST_TOKENS),
        ("vllm:iteration_tokens_total", VLLM_ITERATION_TOKENS),
        ("vllm:request_queue_time_seconds", VLLM_REQUEST_LATENCY),
        ("vllm:request_prefill_time_seconds", VLLM_REQUEST_LATENCY),
        ("vllm:request_decode_time_seconds", VLLM_REQUEST_LATENCY),
        ("vllm:request_inference_time_seconds", VLLM_REQUEST_LATENCY),
        ("vllm:request_time_per_output_token_seconds", VLLM_ITL),
        ("vllm:request_max_num_generation_tokens", VLLM_REQUEST_TOKENS),
        ("vllm:request_params_max_tokens", VLLM_REQUEST_TOKENS),
        ("vllm:request_prefill_kv_computed_tokens", VLLM_REQUEST_TOKENS),
        ("vllm:request_params_n", (1, 2, 5, 10, 20)),
    ):
        assert result.metadata[name].type == "histogram", name
        assert les(result, name) == [*map(float, buckets), inf], name
        assert value(result, name + "_count", **VLLM_LABELS) > 0, name
    done = value(result, "vllm:e2e_request_latency_seconds_count", **VLLM_LABELS)
    assert value(result, "vllm:request_prompt_tokens_count", **VLLM_LABELS) == done
    assert value(result, "vllm:request_prompt_tokens_sum", **VLLM_LABELS) == value(
        result, "vllm:prompt_tokens_total", **VLLM_LABELS
    )

    def share_under(name: str, le: float) -> float:
        return value(result, name + "_bucket", **VLLM_LABELS, le=str(le)) / done

    assert share_under("vllm:e2e_request_latency_seconds", 2.0) > 0.99  # InferenceLatencyHigh: P99 > 2 s
    assert share_under("vllm:time_to_first_token_seconds", 1.0) > 0.99  # InferenceTTFTHigh: P99 > 1 s
    assert value(result, "vllm:num_requests_waiting", **VLLM_LABELS) < 100
    waiting = {lab["reason"] for lab in by_name(result)["vllm:num_requests_waiting_by_reason"]}
    assert waiting == {"capacity", "deferred"}
    cached = value(result, "vllm:prompt_tokens_cached_total", **VLLM_LABELS)
    assert cached == value(result, "vllm:prefix_cache_hits_total", **VLLM_LABELS) > 0


def test_vllm_counters_only_grow() -> None:
    sim = VllmSim(random.Random(2))
    before = scraped(sim.registry)
    busy(sim, 30)
    after = scraped(sim.registry)
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total"):
        assert value(after, name, **VLLM_LABELS) >= value(before, name, **VLLM_LABELS)


def test_sglang_names_labels_and_buckets() -> None:
    sim = SglangSim(random.Random(3))
    busy(sim)
    result = scraped(sim.registry)
    series = by_name(result)
    for name in (
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:num_used_tokens",
        "sglang:max_total_num_tokens",
        "sglang:gen_throughput",
        "sglang:cache_hit_rate",
        "sglang:queue_time_seconds_count",
    ):
        assert series[name] == [SGLANG_SCHED], name
    for name in ("sglang:inter_token_latency_seconds_count", "sglang:num_aborted_requests_total"):
        assert series.get(name, [SGLANG_TOK]) == [SGLANG_TOK], name
    for name in (
        "sglang:num_requests_total",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:e2e_request_latency_seconds_count",
        "sglang:time_to_first_token_seconds_count",
    ):
        assert {lab.pop("is_streaming") for lab in series[name]} <= {"true", "false"}, name
        assert all(lab == SGLANG_TOK for lab in series[name]), name
    assert not [n for n in series if n.endswith("_created")], (
        "SGLang runs prometheus_client in multiprocess mode"
    )
    inf = float("inf")
    assert les(result, "sglang:queue_time_seconds") == [*SGLANG_QUEUE_TIME, inf]
    assert les(result, "sglang:inter_token_latency_seconds") == [*SGLANG_ITL, inf]
    assert sorted(set(les(result, "sglang:e2e_request_latency_seconds"))) == [*SGLANG_E2E, inf]
    assert sorted(set(les(result, "sglang:time_to_first_token_seconds"))) == [*SGLANG_TTFT, inf]
    assert 0 <= value(result, "sglang:token_usage", **SGLANG_SCHED) <= 1
    assert sum(v for n, _, _, v in result.samples if n == "sglang:num_requests_total") > 0


class Recorder:
    """A transport for the SDK that answers 200 and keeps what was sent."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.lock = threading.Lock()

    def __call__(self, method: str, url: str, body: Any, timeout: float) -> int:
        with self.lock:
            self.bodies.append(body)
        return 200

    def points(self, metric: str) -> list[tuple[float, float]]:
        with self.lock:
            points = [p for body in self.bodies if isinstance(body, list) for p in body]
        return [(p["step"], p["metrics"][metric]) for p in points if metric in p["metrics"]]


def test_training_run_logs_checkpoints_and_starts_over() -> None:
    clock = FakeClock()
    sent = Recorder()
    sim = TrainingSim(
        "http://gpuwatch.invalid",
        random.Random(4),
        clock,
        total_steps=40,
        checkpoint_every=10,
        checkpoint_ticks=2,
        transport=sent,
    )
    runs = []
    for _ in range(48):  # 40 steps and 3 checkpoints of 2 ticks each, then a new run's first 2 steps
        clock.advance(1)
        sim.tick()
        if sim.run is not None and sim.run not in runs:
            runs.append(sim.run)
    assert len(runs) == 2 and runs[0].name == TRAINING_RUN and sim.step == 2
    assert runs[0].pending == 0 and runs[0].dropped == 0  # finish() delivered everything
    sim.close()
    losses = sent.points("loss")
    assert [step for step, _ in losses] == [*range(1, 41), 1, 2]
    assert [step for step, _ in sent.points("checkpoint_seconds")] == [10, 20, 30]
    assert [v for _, v in sent.points("checkpoint_seconds")] == [2.0, 2.0, 2.0]
    assert len(sent.points("lr")) == 42 and len(sent.points("grad_norm")) == 42
    assert all(v > 0 for _, v in sent.points("tokens_per_second"))
    assert sim.run is None
    inits = [b for b in sent.bodies if isinstance(b, dict) and b.get("action") == "init"]
    finishes = [b for b in sent.bodies if isinstance(b, dict) and b.get("action") == "finish"]
    assert inits and inits[0]["run"] == TRAINING_RUN and inits[0]["total_steps"] == 40
    assert len(finishes) == 2 and finishes[0]["status"] == "ok" and finishes[0]["step"] == 40


def test_training_curves() -> None:
    sim = TrainingSim("http://x.invalid", random.Random(5), FakeClock(), total_steps=3000)
    lrs = [sim.learning_rate(s) for s in range(3000)]
    peak = max(lrs)
    assert lrs[0] < lrs[50] < peak == pytest.approx(3e-4)  # warmup
    assert lrs.index(peak) == 99 and lrs[-1] == pytest.approx(3e-5, rel=0.01)  # cosine to a tenth
    assert all(a >= b for a, b in itertools.pairwise(lrs[100:]))
    early = sum(sim.loss(s) for s in range(10, 20)) / 10
    late = sum(sim.loss(s) for s in range(2900, 2910)) / 10
    assert early > late + 0.5


def test_servers_over_http_and_stop_closes_ports() -> None:
    demo = DemoSources(None, seed=6)
    with demo:
        vllm, sglang = demo.url("demo-vllm"), demo.url("demo-sglang")
        for url, name in ((vllm, "vllm:num_requests_running"), (sglang, "sglang:num_running_reqs")):
            answer = requests.get(url, timeout=5)
            assert answer.status_code == 200 and name in parse(answer.content).metadata
        jobs = {c.job_name: c.static_configs[0].targets for c in demo.scrape_configs()}
        assert jobs == {
            "demo-vllm": (vllm.split("/")[2],),
            "demo-sglang": (sglang.split("/")[2],),
        }
    assert not [t for t in threading.enumerate() if t.name == "gpuwatch-demo"]
    with pytest.raises(requests.ConnectionError):
        requests.get(vllm, timeout=5)
    demo.stop()  # twice is fine


def test_local_url() -> None:
    assert local_url("0.0.0.0", 9842) == "http://127.0.0.1:9842"
    assert local_url("::", 1) == "http://[::1]:1"
    assert local_url("10.0.0.5", 2) == "http://10.0.0.5:2"


@pytest.mark.parametrize("sources", [True, False])
def test_runtime_has_demo_sources_unless_turned_off(tmp_path: Path, sources: bool) -> None:
    clock = FakeClock()
    settings = load(None, {}, {"data_dir": str(tmp_path / "d"), "demo": True, "demo_sources": sources})
    rt = build_runtime(settings, "h", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
    try:
        assert (rt.demo is not None) is sources
        assert rt.scrapes is None  # built with the servers' ports in start()
    finally:
        rt.close()


def test_two_demo_hosts_do_not_share_gpu_uuids(tmp_path: Path) -> None:
    clock = FakeClock()
    uuids = []
    for host in ("lab-a", "lab-b"):
        settings = load(
            None,
            {},
            {"data_dir": str(tmp_path / host), "demo": True, "demo_sources": False, "demo_history": False},
        )
        rt = build_runtime(settings, host, clock=clock)
        try:
            assert rt.gpu is not None
            uuids.append({g.uuid for g in rt.gpu.gpus})
        finally:
            rt.close()
    assert len(uuids[0]) == len(uuids[1]) == 8 and not uuids[0] & uuids[1]
