"""A vLLM-style /metrics page rendered by the real prometheus_client, for parser tests and bench/.

`vllm_page()` is about 5,000 lines (~4,800 samples, ~460 KB): the size the parser's speed target
is stated for. Values are deterministic so the text is the same on every run.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_latest_om

MODELS = (
    "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen2.5-7B",
    "mistralai/Mistral-7B",
    "google/gemma-2-9b",
)
LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def vllm_registry(engines: int = 4) -> CollectorRegistry:
    """Build a registry shaped like vLLM V1's: gauges, counters and labelled histograms."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    gauges = [
        Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            registry=reg,
        ),
        Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=reg
        ),
        Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=reg),
        Gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", labels, registry=reg),
        Gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage.", labels, registry=reg),
    ]
    counters = [
        Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg),
        Counter("vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=reg),
        Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=reg
        ),
    ]
    success = Counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [*labels, "finished_reason"],
        registry=reg,
    )
    hists = [
        Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_queue_time_seconds",
            "Time spent in WAITING phase for request.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_inference_time_seconds",
            "Time spent in RUNNING phase for request.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_prefill_time_seconds",
            "Time spent in PREFILL phase for request.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_decode_time_seconds",
            "Time spent in DECODE phase for request.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested tokens.",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=reg,
        ),
        Histogram(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            labels,
            buckets=(1, 2, 5, 10, 20),
            registry=reg,
        ),
        Histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            labels,
            buckets=TOKEN_BUCKETS,
            registry=reg,
        ),
    ]
    for m, model in enumerate(MODELS):
        for e in range(engines):
            key = (model, str(e))
            k = m * engines + e
            for i, g in enumerate(gauges):
                g.labels(*key).set((k * 7 + i) % 13 / 3)
            for i, c in enumerate(counters):
                c.labels(*key).inc(1000 * k + i * 17.5)
            for reason in ("stop", "length", "abort"):
                success.labels(*key, reason).inc(k + len(reason))
            for i, h in enumerate(hists):
                child = h.labels(*key)
                for j in range(12):
                    child.observe(((k + 1) * (i + 2) * (j + 3) % 97) / 7.0)
    return reg


def vllm_page(*, engines: int = 4, openmetrics: bool = False) -> bytes:
    """Render `vllm_registry(engines)` as Prometheus text 0.0.4 (default) or OpenMetrics."""
    reg = vllm_registry(engines)
    return generate_latest_om(reg) if openmetrics else generate_latest(reg)
