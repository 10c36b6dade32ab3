"""What the inference pages show: the services (scrape jobs of vLLM, SGLang or TGI), one set of tiles
whatever the engine, each judged by its thresholds or marked "not available" where the engine does
not expose it, the charts' expressions per engine, and the GPUs a local server runs on.

The tiles read the `gpuwatch:inference_*` recording rules (rules/builtin/inference-recording.yml)
where one exists; what the rules do not record (prompt tokens, running requests, TTFT / ITL / E2E
p50 and p95, finish reasons, latency buckets) is read from the engine's own metric, named per engine
in ENGINES below, with `job` as the only filter: one page per service.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuwatch.collect.listeners import listening_pids, with_descendants
from gpuwatch.query.values import Result, Vector
from gpuwatch.web.dash.common import InstantQuery
from gpuwatch.web.dash.panel import promql_string

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", "[::1]"})


@dataclass(frozen=True)
class Signal:
    """How one engine exposes one figure: a PromQL expression over `{SEL}` (the job's matchers),
    None where the engine has no such metric, and a note where the figure is an approximation."""

    expr: str | None
    note: str = ""


@dataclass(frozen=True)
class Tile:
    """One tile of the service page: `expr` per engine comes from ENGINES[engine][id]."""

    id: str
    title: str
    unit: str
    warn: float | None = None
    crit: float | None = None


def _q(hist: str, q: float) -> str:
    return f"histogram_quantile({q}, sum by (le) (rate({hist}_bucket{{SEL}}[5m])))"


def _qq(hists: tuple[str, ...], q: float) -> str:
    """A quantile of the first of `hists` that has buckets (old and new names of one histogram)."""
    inner = " or ".join(f"sum by (le) (rate({h}_bucket{{SEL}}[5m]))" for h in hists)
    return f"histogram_quantile({q}, {inner})" if len(hists) > 1 else _q(hists[0], q)


_VLLM_TTFT = ("vllm:time_to_first_token_seconds",)
_VLLM_ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
_VLLM_E2E = ("vllm:e2e_request_latency_seconds",)
_SGL_TTFT = ("sglang:time_to_first_token_seconds",)
_SGL_ITL = ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds")
_SGL_E2E = ("sglang:e2e_request_latency_seconds",)
_TGI_ITL = ("tgi_request_mean_time_per_token_duration",)
_TGI_E2E = ("tgi_request_duration",)

_COMMON: dict[str, Signal] = {
    "requests": Signal("sum(gpuwatch:inference_requests:rate1m{SEL})"),
    "tokens_out": Signal("sum(gpuwatch:inference_generation_tokens:rate1m{SEL})"),
    "error_ratio": Signal("max(gpuwatch:inference_error_ratio{SEL})"),
    "waiting": Signal("sum(gpuwatch:inference_queue_length{SEL})"),
    "kv_cache": Signal("max(gpuwatch:inference_kv_cache_usage_ratio{SEL})"),
    "preemptions": Signal("sum(gpuwatch:inference_preemptions:rate5m{SEL})"),
}


def _latencies(prefix: str, hists: tuple[str, ...] | None, note: str = "") -> dict[str, Signal]:
    out: dict[str, Signal] = {}
    for q, name in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
        out[f"{prefix}_{name}"] = Signal(_qq(hists, q) if hists else None, note)
    return out


TGI_NO_TTFT = "TGI exposes no time-to-first-token metric"
ENGINES: dict[str, dict[str, Signal]] = {
    "vllm": {
        **_COMMON,
        "tokens_in": Signal("sum(rate(vllm:prompt_tokens_total{SEL}[1m]))"),
        "running": Signal("sum(vllm:num_requests_running{SEL})"),
        **_latencies("ttft", _VLLM_TTFT),
        **_latencies("itl", _VLLM_ITL),
        **_latencies("e2e", _VLLM_E2E),
        "finish_reasons": Signal("sum by (finished_reason) (rate(vllm:request_success_total{SEL}[5m]))"),
        "latency_buckets": Signal(f"sum by (le) (rate({_VLLM_E2E[0]}_bucket{{SEL}}[1m]))"),
    },
    "sglang": {
        **_COMMON,
        "tokens_in": Signal("sum(rate(sglang:prompt_tokens_total{SEL}[1m]))"),
        "running": Signal("sum(sglang:num_running_reqs{SEL})"),
        **_latencies("ttft", _SGL_TTFT),
        **_latencies("itl", _SGL_ITL),
        **_latencies("e2e", _SGL_E2E),
        "finish_reasons": Signal(None, "SGLang exposes no finish reasons"),
        "latency_buckets": Signal(f"sum by (le) (rate({_SGL_E2E[0]}_bucket{{SEL}}[1m]))"),
    },
    "tgi": {
        **_COMMON,
        "preemptions": Signal(None, "TGI exposes no preemption count"),
        "tokens_in": Signal("sum(rate(tgi_request_input_length_sum{SEL}[1m]))"),
        "running": Signal("sum(tgi_batch_current_size{SEL})"),
        "kv_cache": Signal(
            "max(gpuwatch:inference_kv_cache_usage_ratio{SEL})",
            "approximation: the running batch's maximum tokens over the most the batch may hold",
        ),
        **_latencies("ttft", None, TGI_NO_TTFT),
        **_latencies("itl", _TGI_ITL, "approximation: each request's mean time per output token"),
        **_latencies("e2e", _TGI_E2E),
        "finish_reasons": Signal(None, "TGI exposes no finish reasons"),
        "latency_buckets": Signal(f"sum by (le) (rate({_TGI_E2E[0]}_bucket{{SEL}}[1m]))"),
    },
}

TILES: tuple[Tile, ...] = (
    Tile("requests", "Requests", "req/s"),
    Tile("tokens_in", "Tokens in", "tok/s"),
    Tile("tokens_out", "Tokens out", "tok/s"),
    Tile("error_ratio", "Errors", "ratio", warn=0.001, crit=0.01),
    Tile("running", "Running", "requests"),
    Tile("waiting", "Waiting", "requests"),
    Tile("kv_cache", "KV cache", "ratio", warn=0.9, crit=0.98),
    Tile("preemptions", "Preemptions", "req/s"),
    *(
        Tile(f"{kind}_{q}", f"{label} {q}", "s")
        for kind, label in (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "E2E"))
        for q in ("p50", "p95", "p99")
    ),
)
UNREACHABLE = "count(up{SEL} == 0) or (0 * count(up{SEL}))"


def selector(job: str) -> str:
    """The matchers (with braces) of one service's series."""
    return f'{{job="{promql_string(job)}"}}'


def expr_for(engine: str, signal_id: str, job: str) -> str | None:
    """The expression of `signal_id` for a service of `engine`, None where the engine lacks it."""
    sig = ENGINES.get(engine, {}).get(signal_id)
    if sig is None or sig.expr is None:
        return None
    return sig.expr.replace("{SEL}", selector(job))


def judge(value: float | None, warn: float | None, crit: float | None) -> str:
    """ok, warn or crit by the thresholds (a value at a threshold reaches it); none without a value."""
    if value is None:
        return "none"
    if crit is not None and value >= crit:
        return "crit"
    if warn is not None and value >= warn:
        return "warn"
    return "ok"


def _value(result: Result) -> float | None:
    if isinstance(result, Vector) and len(result):
        v = result.samples[0].value
        return v if math.isfinite(v) else None
    return None


def tiles(query: InstantQuery, engine: str, job: str, now_ms: int) -> list[dict[str, Any]]:
    """Every tile for one service: its value, state (ok/warn/crit/none) and availability:
    `available` False where the engine does not expose the figure (with the reason), `value` None
    where it does but nothing was measured (no requests in the window: "no data")."""
    out = []
    for tile in TILES:
        sig = ENGINES.get(engine, {}).get(tile.id, Signal(None, f"unknown engine {engine!r}"))
        row: dict[str, Any] = {
            "id": tile.id,
            "title": tile.title,
            "unit": tile.unit,
            "warn": tile.warn,
            "crit": tile.crit,
            "note": sig.note,
            "available": sig.expr is not None,
            "expr": expr_for(engine, tile.id, job),
            "value": None,
        }
        if row["expr"] is not None:
            row["value"] = _value(query(row["expr"], now_ms))
        row["state"] = judge(row["value"], tile.warn, tile.crit) if row["available"] else "na"
        out.append(row)
    unreachable = _value(query(UNREACHABLE.replace("{SEL}", selector(job)), now_ms))
    out.append(
        {
            "id": "unreachable",
            "title": "Unreachable targets",
            "unit": "targets",
            "warn": None,
            "crit": 1.0,
            "note": "",
            "available": True,
            "expr": UNREACHABLE.replace("{SEL}", selector(job)),
            "value": unreachable,
            "state": judge(unreachable, None, 1.0),
        }
    )
    return out


SERVICES = "max by (job, instance, engine, model_name) (last_over_time(gpuwatch:inference_queue_length[15m]))"


def services(query: InstantQuery, now_ms: int) -> list[dict[str, Any]]:
    """Each inference service (scrape job) seen in the last 15 minutes: its engine, models and
    instances, with requests/s, p99 latency, error ratio and KV cache now."""
    jobs: dict[str, dict[str, Any]] = {}
    found = query(SERVICES, now_ms)
    for s in found if isinstance(found, Vector) else []:
        job = s.labels.get("job", "")
        row = jobs.setdefault(job, {"job": job, "engines": set(), "models": set(), "instances": set()})
        row["engines"].add(s.labels.get("engine", ""))
        row["models"].add(s.labels.get("model_name", ""))
        row["instances"].add(s.labels.get("instance", ""))
    out = []
    for job, row in sorted(jobs.items()):
        engine = sorted(row["engines"])[0]
        figures = {
            tid: _value(query(expr, now_ms)) if (expr := expr_for(engine, tid, job)) else None
            for tid in ("requests", "e2e_p99", "error_ratio", "kv_cache", "waiting")
        }
        down = _value(query(UNREACHABLE.replace("{SEL}", selector(job)), now_ms))
        out.append(
            {
                "job": job,
                "engine": engine,
                "models": sorted(row["models"]),
                "instances": sorted(row["instances"]),
                **figures,
                "unreachable": down,
                "error_state": judge(figures["error_ratio"], 0.001, 0.01),
                "kv_state": judge(figures["kv_cache"], 0.9, 0.98),
            }
        )
    return out


def engine_of(query: InstantQuery, job: str, now_ms: int) -> str | None:
    """The engine a service runs (vllm, sglang, tgi), from its recorded series; None if unknown."""
    found = query(
        f"count by (engine) (last_over_time(gpuwatch:inference_queue_length{selector(job)}[1h]))", now_ms
    )
    if isinstance(found, Vector) and len(found):
        return sorted(s.labels.get("engine", "") for s in found)[0] or None
    return None


def local_port(url: str, own_hostnames: frozenset[str] = frozenset()) -> int | None:
    """The TCP port of a scrape URL whose host is this machine, else None."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    if host is None:
        return None
    if host not in LOCAL_HOSTS and host not in own_hostnames:
        return None
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    return port


def serving_gpus(
    query: InstantQuery,
    targets: Sequence[Mapping[str, Any]],
    job: str,
    now_ms: int,
    proc_root: Path,
    own_hostnames: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The GPUs a service's local targets run on, found without configuration: the processes
    listening on each target's port (and their children) joined with NVML's per-process table
    (`gpuwatch_process_gpu_memory_bytes{pid}`). `state` says what was found: found, no-process
    (a local port nobody here is seen listening on), no-gpu-process (listeners without GPU memory),
    remote (no target of this machine)."""
    ports = sorted(
        {
            p
            for t in targets
            if (t.get("labels") or {}).get("job") == job or t.get("scrapePool") == job
            if (p := local_port(str(t.get("scrapeUrl", "")), own_hostnames)) is not None
        }
    )
    if not ports:
        return {"state": "remote", "ports": [], "pids": [], "gpus": [], "matchers": None}
    pids = with_descendants(proc_root, listening_pids(proc_root, ports))
    if not pids:
        return {"state": "no-process", "ports": ports, "pids": [], "gpus": [], "matchers": None}
    alternatives = "|".join(str(p) for p in pids)
    found = query(f'last_over_time(gpuwatch_process_gpu_memory_bytes{{pid=~"{alternatives}"}}[2m])', now_ms)
    gpus: dict[tuple[str, str], dict[str, Any]] = {}
    for s in found if isinstance(found, Vector) else []:
        key = (s.labels.get("Hostname", ""), s.labels.get("UUID", ""))
        row = gpus.setdefault(
            key,
            {
                "hostname": key[0],
                "uuid": key[1],
                "gpu": s.labels.get("gpu", ""),
                "pids": [],
                "memory_bytes": 0.0,
            },
        )
        row["pids"].append(s.labels.get("pid", ""))
        row["memory_bytes"] += s.value if math.isfinite(s.value) else 0.0
    if not gpus:
        return {"state": "no-gpu-process", "ports": ports, "pids": pids, "gpus": [], "matchers": None}
    uuids = "|".join(sorted(k[1] for k in gpus if k[1]))
    return {
        "state": "found",
        "ports": ports,
        "pids": pids,
        "gpus": sorted(gpus.values(), key=lambda g: (g["hostname"], g["gpu"])),
        "matchers": f'UUID=~"{promql_string(uuids)}"' if uuids else None,
    }
