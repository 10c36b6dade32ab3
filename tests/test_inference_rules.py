"""The built-in inference recording rules over real expositions of vLLM (V1 and V0), SGLang and TGI.

Each server's `/metrics` is produced the way that server produces it (prometheus_client registries with
the servers' names, labels and buckets; TGI's Rust exporter format written out as it renders it),
scraped into a real store every 15 s of FakeClock time for six minutes, with the rule manager running
the built-in groups after every scrape. The normalised `gpuwatch:inference_*` series must carry the
right values and exactly the labels job, instance, model_name and engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gpuwatch.collect.fetch import FetchResult
from gpuwatch.collect.scrapeconfig import parse_scrape_configs
from gpuwatch.collect.scrapepool import ScrapePool
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock
from gpuwatch.demo.engines import (
    SGLANG_E2E,
    SGLANG_MODEL,
    SGLANG_TTFT,
    VLLM_MODEL,
    VLLM_REQUEST_LATENCY,
    VLLM_TTFT,
    SglangSim,
    VllmSim,
    _WithoutCreated,
)
from gpuwatch.query import Engine, Vector
from gpuwatch.rules.load import builtin_path, load_builtin
from gpuwatch.rules.manager import RuleManager
from gpuwatch.store import Store
from tests.conftest import require_tool

STEP_S = 15
NAMES = (
    "gpuwatch:inference_requests:rate1m",
    "gpuwatch:inference_latency_seconds:p99",
    "gpuwatch:inference_ttft_seconds:p99",
    "gpuwatch:inference_queue_length",
    "gpuwatch:inference_kv_cache_usage_ratio",
    "gpuwatch:inference_generation_tokens:rate1m",
    "gpuwatch:inference_error_ratio",
    "gpuwatch:inference_preemptions:rate5m",
)
# vLLM V0 buckets (vllm/engine/metrics.py): e2e and TTFT.
V0_E2E = (1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
V0_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
# TGI's duration buckets (router/src/server.rs): 0.0001 * 1.5^k for k = 1..35.
TGI_DURATION = tuple(0.0001 * 1.5**k for k in range(1, 36))


class VllmV1:
    """vLLM 0.33 with two data-parallel engines: every step 30 requests stop and 1 fails per engine."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        ml = ("model_name", "engine")
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.", (*ml, "finished_reason"), registry=r)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", ml, buckets=VLLM_REQUEST_LATENCY, registry=r)  # fmt: skip
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ml, buckets=VLLM_TTFT, registry=r)  # fmt: skip
        self.waiting = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", ml, registry=r)  # fmt: skip
        self.kv = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", ml, registry=r
        )
        self.tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", ml, registry=r)  # fmt: skip
        self.preempt = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", ml, registry=r)  # fmt: skip
        for engine, waiting, kv in (("0", 3, 0.5), ("1", 4, 0.97)):
            lab = {"model_name": "llama-v1", "engine": engine}
            for reason in ("stop", "length", "abort", "error", "repetition"):
                self.success.labels(**lab, finished_reason=reason)
            self.waiting.labels(**lab).set(waiting)
            self.kv.labels(**lab).set(kv)

    def step(self) -> None:
        for engine in ("0", "1"):
            lab = {"model_name": "llama-v1", "engine": engine}
            self.success.labels(**lab, finished_reason="stop").inc(30)
            self.success.labels(**lab, finished_reason="error").inc(1)
            for _ in range(31):
                self.e2e.labels(**lab).observe(2.2)
                self.ttft.labels(**lab).observe(0.2)
            self.tokens.labels(**lab).inc(750)
            self.preempt.labels(**lab).inc(3)


class VllmV0:
    """An old vLLM (V0 engine): `gpu_cache_usage_perc`, no `engine` label, no "error" finish reason."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        ml = ("model_name",)
        self.success = Counter("vllm:request_success", "Count of successfully processed requests.", (*ml, "finished_reason"), registry=r)  # fmt: skip
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", ml, buckets=V0_E2E, registry=r)  # fmt: skip
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ml, buckets=V0_TTFT, registry=r)  # fmt: skip
        Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", ml, registry=r).labels("llama-v0").set(0)  # fmt: skip
        Gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", ml, registry=r).labels("llama-v0").set(0.42)  # fmt: skip
        self.tokens = Counter("vllm:generation_tokens", "Number of generation tokens processed.", ml, registry=r)  # fmt: skip
        self.preempt = Counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", ml, registry=r)  # fmt: skip
        self.preempt.labels("llama-v0")

    def step(self) -> None:
        self.success.labels("llama-v0", "stop").inc(15)
        for _ in range(15):
            self.e2e.labels("llama-v0").observe(0.5)
            self.ttft.labels("llama-v0").observe(0.03)
        self.tokens.labels("llama-v0").inc(300)


class Sglang:
    """SGLang 0.5.23 in prometheus_client's multiprocess style (no `_created`); 3 of 30 answers are 500."""

    def __init__(self) -> None:
        metrics = CollectorRegistry()
        self.registry = CollectorRegistry()
        self.registry.register(_WithoutCreated(metrics))
        r = metrics
        sched = {"engine_type": "unified", "model_name": "qwen", "moe_ep_rank": "0", "pp_rank": "0", "tp_rank": "0"}  # fmt: skip
        self.sched, self.tok = sched, {"engine_type": "unified", "model_name": "qwen"}
        Gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", list(sched), registry=r).labels(**sched).set(12)  # fmt: skip
        Gauge("sglang:num_running_reqs", "The number of running requests.", list(sched), registry=r).labels(**sched).set(40)  # fmt: skip
        Gauge("sglang:token_usage", "The token usage.", list(sched), registry=r).labels(**sched).set(0.8)
        self.retracted = Counter("sglang:num_retracted_requests", "The number of retracted requests.", list(sched), registry=r)  # fmt: skip
        tok = ("engine_type", "model_name", "is_streaming")
        self.requests = Counter("sglang:num_requests", "The number of processed requests.", tok, registry=r)
        self.tokens = Counter("sglang:generation_tokens", "Number of generation tokens processed.", tok, registry=r)  # fmt: skip
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", tok, buckets=SGLANG_E2E, registry=r)  # fmt: skip
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", tok, buckets=SGLANG_TTFT, registry=r)  # fmt: skip
        self.http = Counter("sglang:http_responses", "Total number of HTTP responses by endpoint and status code", ("endpoint", "status_code", "method"), registry=r)  # fmt: skip

    def step(self) -> None:
        self.retracted.labels(**self.sched).inc()
        for streaming, n in (("true", 20), ("false", 10)):
            self.requests.labels(**self.tok, is_streaming=streaming).inc(n)
            self.tokens.labels(**self.tok, is_streaming=streaming).inc(150 * n)
            for _ in range(n):
                self.e2e.labels(**self.tok, is_streaming=streaming).observe(1.5)
                self.ttft.labels(**self.tok, is_streaming=streaming).observe(0.3)
        self.http.labels("/generate", "200", "POST").inc(27)
        self.http.labels("/generate", "500", "POST").inc(3)


class Tgi:
    """TGI's router as metrics-exporter-prometheus 0.15.3 renders it: counters without `_total`, counters
    then gauges then histograms, a blank line after each family, `le` in full f64 digits."""

    def __init__(self) -> None:
        self.steps = 0

    def step(self) -> None:
        self.steps += 1

    def text(self) -> bytes:
        n = self.steps
        done, failed = 45 * n, n
        lines = [
            "# HELP tgi_request_count Total number of requests",
            "# TYPE tgi_request_count counter",
            f"tgi_request_count {done}",
            "",
            "# TYPE tgi_request_failure counter",
            f'tgi_request_failure{{err="generation"}} {failed}',
            "",
            "# TYPE tgi_request_success counter",
            f"tgi_request_success {done - failed}",
            "",
            "# TYPE tgi_queue_size gauge",
            "tgi_queue_size 5",
            "",
            "# TYPE tgi_batch_current_max_tokens gauge",
            "tgi_batch_current_max_tokens 1000",
            "",
            "# TYPE tgi_batch_max_total_tokens gauge",
            "tgi_batch_max_total_tokens 4000",
            "",
            "# HELP tgi_request_duration Request duration",
            "# TYPE tgi_request_duration histogram",
        ]
        lines += [
            f'tgi_request_duration_bucket{{le="{le!r}"}} {done if le >= 3.0 else 0}' for le in TGI_DURATION
        ]
        lines += [
            f'tgi_request_duration_bucket{{le="+Inf"}} {done}',
            f"tgi_request_duration_sum {3.0 * done!r}",
            f"tgi_request_duration_count {done}",
            "",
            "# TYPE tgi_request_generated_tokens histogram",
        ]
        bounds = [20.48 * (x + 1) for x in range(100)]
        lines += [
            f'tgi_request_generated_tokens_bucket{{le="{b!r}"}} {done if b >= 13.34 else 0}' for b in bounds
        ]
        lines += [
            f'tgi_request_generated_tokens_bucket{{le="+Inf"}} {done}',
            f"tgi_request_generated_tokens_sum {600 * n}",
            f"tgi_request_generated_tokens_count {done}",
            "",
        ]
        return "\n".join(lines).encode()


class Fetch:
    """Answers each target address with the body its server would send now."""

    def __init__(self, bodies: dict[str, Callable[[], bytes]]) -> None:
        self.bodies = bodies

    def __call__(self, spec: TargetSpec, timeout_s: float) -> FetchResult:
        return FetchResult(self.bodies[spec.address](), "text/plain; version=0.0.4; charset=utf-8")


JOBS = [
    {"job_name": "vllm", "static_configs": [{"targets": ["v1:8000", "v0:8000"]}]},
    {"job_name": "sglang", "static_configs": [{"targets": ["sg:30000"]}]},
    {
        "job_name": "tgi",
        "static_configs": [
            {"targets": ["tgi-a:3000"]},
            {"targets": ["tgi-b:3000"], "labels": {"model_name": "bigcode/starcoder2"}},
        ],
    },
]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_800_000_000)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    s = Store.open(tmp_path / "data", clock=clock)
    yield s
    s.close()


def inference_groups() -> list:  # type: ignore[type-arg]
    groups = [g for g in load_builtin() if g.name.startswith("gpuwatch-inference")]
    assert groups, "the inference recording rules are part of the built-in pack"
    return groups


def run(store: Store, clock: FakeClock, jobs: list[dict[str, object]], fetch: Fetch, tick: Callable[[float], None], minutes: float) -> None:  # fmt: skip
    pool = ScrapePool(parse_scrape_configs(jobs), default_interval_s=STEP_S, sink=store.append, clock=clock, fetch=fetch)  # fmt: skip
    rules = RuleManager(store, Engine(store).instant, clock, inference_groups(), default_interval_s=STEP_S)
    for i in range(int(minutes * 60 / STEP_S) + 1):
        if i:
            clock.advance(STEP_S)
            tick(STEP_S)
        pool.scrape_all()
        store.flush()
        rules.run_due()
    store.flush()


def recorded(store: Store, clock: FakeClock) -> dict[tuple[str, str, str, str], float]:
    """Return every normalised series at now as (name, engine, job/instance, model_name) -> value."""
    out = {}
    for name in NAMES:
        result = Engine(store).instant(name, clock.now_ms())
        assert isinstance(result, Vector)
        for s in result:
            labels = dict(s.labels)
            assert set(labels) == {"__name__", "job", "instance", "model_name", "engine"}, (name, labels)
            key = (name, labels["engine"], f"{labels['job']}/{labels['instance']}", labels["model_name"])
            assert key not in out
            out[key] = s.value
    return out


def test_every_engine_normalised_with_values_and_labels(store: Store, clock: FakeClock) -> None:
    v1, v0, sg, tgi = VllmV1(), VllmV0(), Sglang(), Tgi()
    fetch = Fetch(
        {
            "v1:8000": lambda: generate_latest(v1.registry),
            "v0:8000": lambda: generate_latest(v0.registry),
            "sg:30000": lambda: generate_latest(sg.registry),
            "tgi-a:3000": tgi.text,
            "tgi-b:3000": tgi.text,
        }
    )

    def tick(dt: float) -> None:
        for server in (v1, v0, sg, tgi):
            server.step()

    run(store, clock, JOBS, fetch, tick, minutes=6)
    got = recorded(store, clock)
    v1k, v0k = ("vllm", "vllm/v1:8000", "llama-v1"), ("vllm", "vllm/v0:8000", "llama-v0")
    sgk = ("sglang", "sglang/sg:30000", "qwen")
    tak, tbk = ("tgi", "tgi/tgi-a:3000", "tgi"), ("tgi", "tgi/tgi-b:3000", "bigcode/starcoder2")

    def quantile(lo: float, hi: float) -> float:  # Prometheus interpolates linearly inside the bucket
        return lo + (hi - lo) * 0.99

    tgi_hi = min(b for b in TGI_DURATION if b >= 3.0)
    tgi_lo = max(b for b in TGI_DURATION if b < 3.0)
    want = {
        # two engines x 31 finished requests a step; the engine label is summed away
        ("gpuwatch:inference_requests:rate1m", *v1k): 62 / 15,
        ("gpuwatch:inference_requests:rate1m", *v0k): 1.0,
        ("gpuwatch:inference_requests:rate1m", *sgk): 2.0,
        ("gpuwatch:inference_requests:rate1m", *tak): 3.0,
        ("gpuwatch:inference_requests:rate1m", *tbk): 3.0,
        ("gpuwatch:inference_latency_seconds:p99", *v1k): quantile(2.0, 2.5),
        ("gpuwatch:inference_latency_seconds:p99", *v0k): quantile(0.0, 1.0),
        ("gpuwatch:inference_latency_seconds:p99", *sgk): quantile(1.0, 2.0),
        ("gpuwatch:inference_latency_seconds:p99", *tak): quantile(tgi_lo, tgi_hi),
        ("gpuwatch:inference_latency_seconds:p99", *tbk): quantile(tgi_lo, tgi_hi),
        ("gpuwatch:inference_ttft_seconds:p99", *v1k): quantile(0.1, 0.25),
        ("gpuwatch:inference_ttft_seconds:p99", *v0k): quantile(0.02, 0.04),
        ("gpuwatch:inference_ttft_seconds:p99", *sgk): quantile(0.2, 0.4),
        ("gpuwatch:inference_queue_length", *v1k): 7,
        ("gpuwatch:inference_queue_length", *v0k): 0,
        ("gpuwatch:inference_queue_length", *sgk): 12,
        ("gpuwatch:inference_queue_length", *tak): 5,
        ("gpuwatch:inference_queue_length", *tbk): 5,
        ("gpuwatch:inference_kv_cache_usage_ratio", *v1k): 0.97,  # the fuller of the two engines
        ("gpuwatch:inference_kv_cache_usage_ratio", *v0k): 0.42,  # V0's gpu_cache_usage_perc
        ("gpuwatch:inference_kv_cache_usage_ratio", *sgk): 0.8,
        ("gpuwatch:inference_kv_cache_usage_ratio", *tak): 0.25,
        ("gpuwatch:inference_kv_cache_usage_ratio", *tbk): 0.25,
        ("gpuwatch:inference_generation_tokens:rate1m", *v1k): 100.0,
        ("gpuwatch:inference_generation_tokens:rate1m", *v0k): 20.0,
        ("gpuwatch:inference_generation_tokens:rate1m", *sgk): 300.0,
        ("gpuwatch:inference_generation_tokens:rate1m", *tak): 40.0,
        ("gpuwatch:inference_generation_tokens:rate1m", *tbk): 40.0,
        ("gpuwatch:inference_error_ratio", *v1k): 1 / 31,
        ("gpuwatch:inference_error_ratio", *sgk): 0.1,
        ("gpuwatch:inference_error_ratio", *tak): 1 / 45,
        ("gpuwatch:inference_error_ratio", *tbk): 1 / 45,
        ("gpuwatch:inference_preemptions:rate5m", *v1k): 0.4,
        ("gpuwatch:inference_preemptions:rate5m", *v0k): 0.0,
        ("gpuwatch:inference_preemptions:rate5m", *sgk): 1 / 15,
    }
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key


def test_demo_servers_feed_every_series(store: Store, clock: FakeClock) -> None:
    rng = random.Random(11)
    vllm, sglang = VllmSim(rng), SglangSim(rng)
    jobs = [
        {"job_name": "demo-vllm", "static_configs": [{"targets": ["127.0.0.1:1"]}]},
        {"job_name": "demo-sglang", "static_configs": [{"targets": ["127.0.0.1:2"]}]},
    ]
    fetch = Fetch(
        {
            "127.0.0.1:1": lambda: generate_latest(vllm.registry),
            "127.0.0.1:2": lambda: generate_latest(sglang.registry),
        }
    )

    def tick(dt: float) -> None:
        for _ in range(int(dt)):
            vllm.tick(1.0)
            sglang.tick(1.0)

    run(store, clock, jobs, fetch, tick, minutes=5)
    got = recorded(store, clock)
    vk, sk = (
        ("vllm", "demo-vllm/127.0.0.1:1", VLLM_MODEL),
        ("sglang", "demo-sglang/127.0.0.1:2", SGLANG_MODEL),
    )
    # SGLang shows a counter only once it was touched: no retraction yet, no preemption rate.
    maybe = {("gpuwatch:inference_preemptions:rate5m", *sk)}
    assert {(name, *key) for name in NAMES for key in (vk, sk)} - maybe <= set(got) <= {(name, *key) for name in NAMES for key in (vk, sk)}  # fmt: skip
    for key in (vk, sk):
        assert got[("gpuwatch:inference_requests:rate1m", *key)] > 0
        assert got[("gpuwatch:inference_generation_tokens:rate1m", *key)] > 100
        assert 0 < got[("gpuwatch:inference_latency_seconds:p99", *key)] < 7680
        assert 0 < got[("gpuwatch:inference_ttft_seconds:p99", *key)] < 400
        assert 0 <= got[("gpuwatch:inference_kv_cache_usage_ratio", *key)] <= 1
        assert 0 <= got[("gpuwatch:inference_error_ratio", *key)] < 0.2
        assert got[("gpuwatch:inference_queue_length", *key)] >= 0


def test_rule_file_passes_promtool() -> None:
    promtool = require_tool("promtool")
    import subprocess

    for path in sorted(builtin_path().glob("inference-*.yml")):
        out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
