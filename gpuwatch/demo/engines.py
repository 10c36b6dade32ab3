"""Simulated inference engines for the demo: a vLLM and an SGLang `prometheus_client` registry.

Each holds the metric names, labels and histogram buckets its engine exposes (vLLM V1, SGLang) and moves
them under a bursty request load (`Load`, `Batcher`) that the engine handles with room to spare, except in
the latency spikes of the incident schedule (incidents.py). `sources.py` serves them over HTTP.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpuwatch.core.clock import Clock
from gpuwatch.demo.incidents import LATENCY, IncidentSchedule

VLLM_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SGLANG_MODEL = "Qwen/Qwen2.5-7B-Instruct"

# vllm/v1/metrics/buckets.py (vllm 0.33.0); see docs METRICS.md §1.3.
VLLM_REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                        120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
             20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
            40.0, 80.0)  # fmt: skip
VLLM_FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
# request_tokens: the 1-2-5 series up to max_model_len (131072 for Llama 3.1 8B)
VLLM_REQUEST_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
VLLM_ITERATION_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)

# sglang/srt/observability/metrics_collector.py (sglang 0.5.23); see METRICS.md §2.1.
SGLANG_QUEUE_TIME = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60,
                     70, 80, 90, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800,
                     2000, 2500, 3000)  # fmt: skip
SGLANG_TTFT = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
SGLANG_ITL = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
              0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0)  # fmt: skip
SGLANG_E2E = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1,
    2,
    4,
    6,
    8,
    10,
    20,
    40,
    60,
    80,
    100,
    200,
    400,
    600,
    1200,
    1800,
    2400,
)


def _poisson(rng: random.Random, mean: float) -> int:
    """Draw a Poisson count (normal approximation above 30, which is plenty for a demo)."""
    if mean <= 0:
        return 0
    if mean > 30:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, p = math.exp(-mean), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


# A latency spike (incidents.LATENCY): the load grows, requests slow down and fewer fit in the KV cache.
SPIKE_LOAD, SPIKE_SLOWDOWN, SPIKE_RUNNING = 2.0, 3.5, 32


class Load:
    """A bursty request rate, advanced once a tick; a latency spike when the schedule says so."""

    def __init__(self, rng: random.Random, base_rps: float) -> None:
        self.rng = rng
        self.base_rps = base_rps
        self.burst_s = 0.0

    def advance(self, dt: float, spike: bool = False) -> tuple[float, float]:
        """Return (requests per second, latency factor) for the next `dt` seconds."""
        self.burst_s = max(0.0, self.burst_s - dt)
        if self.burst_s == 0 and self.rng.random() < dt / 60:  # about one burst a minute
            self.burst_s = self.rng.uniform(10, 40)
        rate = self.base_rps * (3.0 if self.burst_s else 1.0) * self.rng.uniform(0.8, 1.2)
        if spike:
            return rate * SPIKE_LOAD, SPIKE_SLOWDOWN * self.rng.uniform(0.9, 1.1)
        return rate, 1.0


class Batcher:
    """Requests waiting and running on one engine; `advance` returns the requests that finished."""

    def __init__(self, rng: random.Random, max_running: int) -> None:
        self.rng = rng
        self.max_running = max_running
        self.running = 0
        self.waiting = 0

    def advance(self, rps: float, dt: float, mean_duration_s: float, max_running: int | None = None) -> int:
        """Move on by `dt` seconds, in steps of at most a second (a slot frees and refills within one)."""
        steps = max(1, math.ceil(dt - 1e-9))
        step = dt / steps
        finished = 0
        for _ in range(steps):
            done = min(self.running, _poisson(self.rng, self.running * step / mean_duration_s))
            self.running -= done
            finished += done
            self.waiting += _poisson(self.rng, rps * step)
            admitted = max(0, min(self.waiting, (max_running or self.max_running) - self.running))
            self.running += admitted
            self.waiting -= admitted
        return finished


def _spiking(clock: Clock | None, incidents: IncidentSchedule | None, engine: str) -> bool:
    if clock is None or incidents is None:
        return False
    incident = incidents.active(clock.now(), LATENCY)
    return incident is not None and incident.engine == engine


def _request(rng: random.Random, itl_s: float, slow: float) -> tuple[int, int, float]:
    """(prompt tokens, generated tokens, mean inter-token latency) of one chat request."""
    prompt = rng.randint(64, 2048)
    generated = max(1, min(120, int(rng.lognormvariate(math.log(30), 0.7))))
    return prompt, generated, rng.lognormvariate(math.log(itl_s), 0.15) * slow


class VllmSim:
    """A vLLM V1 engine's `/metrics`: the real names, labels (`model_name`, `engine`) and buckets."""

    def __init__(
        self,
        rng: random.Random,
        model: str = VLLM_MODEL,
        max_running: int = 64,
        *,
        clock: Clock | None = None,
        incidents: IncidentSchedule | None = None,
    ) -> None:
        self.rng = rng
        self.clock = clock
        self.incidents = incidents
        self.registry = CollectorRegistry()
        self.load = Load(rng, base_rps=6.0)
        self.batch = Batcher(rng, max_running)
        ml = ("model_name", "engine")
        self.labels = {"model_name": model, "engine": "0"}
        r = self.registry
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", ml, registry=r
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", ml, registry=r
        )
        self.kv_usage = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", ml, registry=r
        )
        self.preemptions = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", ml, registry=r
        )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", ml, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", ml, registry=r
        )
        self.cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            ml,
            registry=r,
        )
        self.cache_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            ml,
            registry=r,
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*ml, "finished_reason"),
            registry=r,
        )
        for reason in VLLM_FINISHED_REASONS:  # vLLM creates every reason's child up front
            self.success.labels(**self.labels, finished_reason=reason)
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            ml,
            buckets=VLLM_REQUEST_LATENCY,
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            ml,
            buckets=VLLM_TTFT,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ml,
            buckets=VLLM_ITL,
            registry=r,
        )
        self.queue = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", ml, buckets=VLLM_REQUEST_LATENCY, registry=r)  # fmt: skip
        self.inference = Histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", ml, buckets=VLLM_REQUEST_LATENCY, registry=r)  # fmt: skip
        self.prefill = Histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", ml, buckets=VLLM_REQUEST_LATENCY, registry=r)  # fmt: skip
        self.decode = Histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", ml, buckets=VLLM_REQUEST_LATENCY, registry=r)  # fmt: skip
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", ml, buckets=VLLM_ITL, registry=r)  # fmt: skip
        self.prompt_hist = Histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", ml, buckets=VLLM_REQUEST_TOKENS, registry=r)  # fmt: skip
        self.generation_hist = Histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", ml, buckets=VLLM_REQUEST_TOKENS, registry=r)  # fmt: skip
        self.iteration = Histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ml, buckets=VLLM_ITERATION_TOKENS, registry=r)  # fmt: skip
        self.max_generation = Histogram("vllm:request_max_num_generation_tokens", "Histogram of maximum number of requested generation tokens.", ml, buckets=VLLM_REQUEST_TOKENS, registry=r)  # fmt: skip
        self.params_max_tokens = Histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", ml, buckets=VLLM_REQUEST_TOKENS, registry=r)  # fmt: skip
        self.params_n = Histogram("vllm:request_params_n", "Histogram of the n request parameter.", ml, buckets=(1, 2, 5, 10, 20), registry=r)  # fmt: skip
        self.kv_computed = Histogram("vllm:request_prefill_kv_computed_tokens", "Histogram of new KV tokens computed during prefill (excluding cached tokens).", ml, buckets=VLLM_REQUEST_TOKENS, registry=r)  # fmt: skip
        self.cached_tokens = Counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", ml, registry=r)  # fmt: skip
        self.waiting_by_reason = Gauge("vllm:num_requests_waiting_by_reason", "Number of requests waiting, by reason.", (*ml, "reason"), registry=r)  # fmt: skip
        # vLLM creates every child when the engine starts, so each series exists (at 0) from the first scrape.
        for metric in (self.preemptions, self.prompt_tokens, self.generation_tokens, self.cache_queries,
                       self.cache_hits, self.e2e, self.ttft, self.itl, self.queue, self.inference,
                       self.prefill, self.decode, self.tpot, self.prompt_hist, self.generation_hist,
                       self.iteration, self.max_generation, self.params_max_tokens, self.params_n,
                       self.kv_computed, self.cached_tokens):  # fmt: skip
            metric.labels(**self.labels)
        # the children, looked up once: labels() costs more than the observation itself
        self._kids = {
            n: getattr(self, n).labels(**self.labels)
            for n in (
                "cache_hits",
                "cache_queries",
                "cached_tokens",
                "kv_computed",
                "max_generation",
                "params_max_tokens",
                "params_n",
                "decode",
                "e2e",
                "generation_hist",
                "generation_tokens",
                "inference",
                "iteration",
                "itl",
                "kv_usage",
                "preemptions",
                "prefill",
                "prompt_hist",
                "prompt_tokens",
                "queue",
                "running",
                "tpot",
                "ttft",
                "waiting",
            )
        }
        self._reasons = {
            r: self.success.labels(**self.labels, finished_reason=r) for r in VLLM_FINISHED_REASONS
        }
        self._capacity = self.waiting_by_reason.labels(**self.labels, reason="capacity")
        self.waiting_by_reason.labels(**self.labels, reason="deferred").set(0)
        self.tick(0.0)

    def tick(self, dt: float) -> None:
        """Move the figures on by `dt` seconds."""
        spike = _spiking(self.clock, self.incidents, "vllm")
        rps, slow = self.load.advance(dt, spike) if dt else (0.0, 1.0)
        cap = SPIKE_RUNNING if spike else None
        finished = self.batch.advance(rps, dt, mean_duration_s=0.45 * slow, max_running=cap) if dt else 0
        k = self._kids
        kv = 0.2 + 0.6 * self.batch.running / self.batch.max_running + self.rng.uniform(0, 0.04)
        if spike:  # the KV cache is what limits the batch
            kv = self.rng.uniform(0.955, 0.99)
        kv = min(1.0, kv)
        k["running"].set(self.batch.running)
        k["waiting"].set(self.batch.waiting)
        self._capacity.set(self.batch.waiting)
        k["kv_usage"].set(round(kv, 4))
        if kv > 0.95 and self.rng.random() < 0.5:
            k["preemptions"].inc(self.rng.randint(1, 3))
        queue_s = self.batch.waiting / max(rps, 0.1) * self.rng.uniform(0.5, 1.0)
        for _ in range(min(finished, 64 * max(1, int(dt)))):  # bounded work a tick, whatever the load
            prompt, generated, itl = _request(self.rng, 0.009, slow)
            cached = int(prompt * self.rng.uniform(0.0, 0.6))
            prefill = (self.rng.lognormvariate(math.log(0.05), 0.5) + (prompt - cached) / 40000) * slow
            decode = (generated - 1) * itl
            k["prompt_tokens"].inc(prompt)
            k["generation_tokens"].inc(generated)
            k["prompt_hist"].observe(prompt)
            k["generation_hist"].observe(generated)
            k["cache_queries"].inc(prompt)
            k["cache_hits"].inc(cached)
            k["cached_tokens"].inc(cached)
            k["kv_computed"].observe(prompt - cached)
            max_tokens = self.rng.choice((256, 512, 1024))
            k["max_generation"].observe(max_tokens)
            k["params_max_tokens"].observe(max_tokens)
            k["params_n"].observe(1)
            reason = self.rng.choices(VLLM_FINISHED_REASONS, (80, 15, 3, 3 if spike else 0.1, 1))[0]
            self._reasons[reason].inc()
            q = queue_s * self.rng.uniform(0.5, 1.5)
            k["queue"].observe(q)
            k["prefill"].observe(prefill)
            k["decode"].observe(decode)
            k["inference"].observe(prefill + decode)
            k["tpot"].observe(itl)
            k["ttft"].observe(q + prefill)
            for _ in range(min(4, generated - 1)):  # vLLM observes every gap; a few a request stay cheap
                k["itl"].observe(itl * self.rng.uniform(0.7, 1.5))
            k["e2e"].observe(q + prefill + decode)
        for _ in range(min(8, int(dt))):  # engine steps: a prefill chunk or a decode batch each
            k["iteration"].observe(
                self.batch.running + (self.rng.randint(64, 2048) if self.rng.random() < 0.3 else 0)
            )


class _WithoutCreated(Collector):
    """Expose `inner` without `_created` series, as prometheus_client's multiprocess mode (SGLang's) does."""

    def __init__(self, inner: CollectorRegistry) -> None:
        self.inner = inner

    def collect(self) -> Iterable[Metric]:
        for metric in self.inner.collect():  # each collect builds fresh Metric objects
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


class SglangSim:
    """An SGLang server's `/metrics` (`--enable-metrics`): scheduler and tokenizer-manager metrics."""

    def __init__(
        self,
        rng: random.Random,
        model: str = SGLANG_MODEL,
        max_running: int = 48,
        *,
        clock: Clock | None = None,
        incidents: IncidentSchedule | None = None,
    ) -> None:
        self.rng = rng
        self.clock = clock
        self.incidents = incidents
        self.metrics = CollectorRegistry()
        self.registry = CollectorRegistry()
        self.registry.register(_WithoutCreated(self.metrics))
        self.load = Load(rng, base_rps=4.0)
        self.batch = Batcher(rng, max_running)
        self.max_tokens = 400_000
        sched = ("engine_type", "model_name", "moe_ep_rank", "pp_rank", "tp_rank")
        tok = ("engine_type", "model_name")
        self.sched = {
            "engine_type": "unified",
            "model_name": model,
            "moe_ep_rank": "0",
            "pp_rank": "0",
            "tp_rank": "0",
        }
        self.tok = {"engine_type": "unified", "model_name": model}
        r = self.metrics
        self.running = Gauge("sglang:num_running_reqs", "The number of running requests.", sched, registry=r)
        self.queued = Gauge(
            "sglang:num_queue_reqs", "The number of requests in the waiting queue.", sched, registry=r
        )
        self.token_usage = Gauge("sglang:token_usage", "The token usage.", sched, registry=r)
        self.used_tokens = Gauge("sglang:num_used_tokens", "The number of used tokens.", sched, registry=r)
        self.max_total = Gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", sched, registry=r)  # fmt: skip
        self.throughput = Gauge(
            "sglang:gen_throughput", "The generation throughput (token/s).", sched, registry=r
        )
        self.cache_hit_rate = Gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", sched, registry=r)
        self.retracted = Counter(
            "sglang:num_retracted_requests", "The number of retracted requests.", sched, registry=r
        )
        self.queue_time = Histogram("sglang:queue_time_seconds", "Histogram of queueing time in seconds.", sched, buckets=SGLANG_QUEUE_TIME, registry=r)  # fmt: skip
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", (*tok, "is_streaming"), registry=r
        )
        self.generation_tokens = Counter("sglang:generation_tokens", "Number of generation tokens processed.", (*tok, "is_streaming"), registry=r)  # fmt: skip
        self.requests = Counter(
            "sglang:num_requests", "The number of processed requests.", (*tok, "is_streaming"), registry=r
        )
        self.aborted = Counter("sglang:num_aborted_requests", "Number of requests aborted.", tok, registry=r)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", (*tok, "is_streaming"), buckets=SGLANG_TTFT, registry=r)  # fmt: skip
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tok, buckets=SGLANG_ITL, registry=r)  # fmt: skip
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", (*tok, "is_streaming"), buckets=SGLANG_E2E, registry=r)  # fmt: skip
        self.http = Counter("sglang:http_responses", "Total number of HTTP responses by endpoint and status code", ("endpoint", "status_code", "method"), registry=r)  # fmt: skip
        self.max_total.labels(**self.sched).set(self.max_tokens)
        self._children: dict[tuple[int, str], Any] = {}
        self.tick(0.0)

    def tick(self, dt: float) -> None:
        """Move the figures on by `dt` seconds."""
        spike = _spiking(self.clock, self.incidents, "sglang")
        rps, slow = self.load.advance(dt, spike) if dt else (0.0, 1.0)
        cap = SPIKE_RUNNING if spike else None
        finished = self.batch.advance(rps, dt, mean_duration_s=0.5 * slow, max_running=cap) if dt else 0
        s, c = self.sched, self._child
        used = int(self.max_tokens * (0.15 + 0.5 * self.batch.running / self.batch.max_running))
        if spike:
            used = int(self.max_tokens * self.rng.uniform(0.955, 0.99))
        self.running.labels(**s).set(self.batch.running)
        self.queued.labels(**s).set(self.batch.waiting)
        self.used_tokens.labels(**s).set(used)
        self.token_usage.labels(**s).set(round(min(1.0, used / self.max_tokens), 4))
        self.cache_hit_rate.labels(**s).set(round(self.rng.uniform(0.3, 0.6), 4))
        if used > 0.95 * self.max_tokens:
            self.retracted.labels(**s).inc()
        queue_s = self.batch.waiting / max(rps, 0.1) * self.rng.uniform(0.5, 1.0)
        generated_total = 0
        for _ in range(min(finished, 64 * max(1, int(dt)))):
            streaming = "true" if self.rng.random() < 0.7 else "false"
            prompt, generated, itl = _request(self.rng, 0.008, slow)
            ttft = (self.rng.lognormvariate(math.log(0.12), 0.5) + prompt / 50000) * slow
            q = queue_s * self.rng.uniform(0.5, 1.5)
            generated_total += generated
            c(self.prompt_tokens, streaming).inc(prompt)
            c(self.generation_tokens, streaming).inc(generated)
            c(self.requests, streaming).inc()
            if self.rng.random() < 0.02:
                c(self.aborted).inc()
            failed = self.rng.random() < (0.03 if spike else 0.001)  # errors come with latency spikes
            c(self.http, "500" if failed else "200").inc()
            c(self.queue_time).observe(q)
            c(self.ttft, streaming).observe(q + ttft)
            for _ in range(4):  # SGLang observes every token gap; a few samples a request keep this cheap
                c(self.itl).observe(itl * self.rng.uniform(0.7, 1.5))
            c(self.e2e, streaming).observe(q + ttft + generated * itl)
        if dt:
            self.throughput.labels(**s).set(round(generated_total / dt, 1))

    def _child(self, metric: Any, key: str = "") -> Any:
        """The child of `metric` for this server (and `key`: is_streaming, or an HTTP status), made on
        first use, as SGLang's multiprocess registry shows only the series that were touched."""
        child = self._children.get((id(metric), key))
        if child is None:
            names = metric._labelnames
            if "is_streaming" in names:
                child = metric.labels(**self.tok, is_streaming=key)
            elif "status_code" in names:
                child = metric.labels("/v1/chat/completions", key, "POST")
            else:
                child = metric.labels(**(self.sched if "tp_rank" in names else self.tok))
            self._children[(id(metric), key)] = child
        return child
