"""Inference services: `/inference` (the list) and `/inference/<job>` (one page per service: tiles,
charts, a latency heatmap, the serving GPUs), with their JSON twins under `/api/ui/inference`."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, abort
from flask.typing import ResponseReturnValue

from gpuwatch.web.dash.common import instant_query
from gpuwatch.web.dash.gpupanels import STRINGS as GPU_STRINGS
from gpuwatch.web.dash.gpupanels import gpu_panels
from gpuwatch.web.dash.inferencedata import (
    ENGINES,
    engine_of,
    expr_for,
    selector,
    services,
    serving_gpus,
    tiles,
)
from gpuwatch.web.dash.page import page_json, render_page
from gpuwatch.web.dash.panel import Panel, Thresholds, check_unique
from gpuwatch.web.runtime import runtime

bp = Blueprint("dash_inference", __name__)

STRINGS = {
    "inference.title": ("Inference", "推理服务"),
    "inference.help": (
        "vLLM, SGLang and TGI servers gpuwatch scrapes, one row per scrape job.",
        "gpuwatch 采集的 vLLM、SGLang、TGI 服务，每个采集任务一行。",
    ),
    "inference.service": ("Service (job)", "服务（job）"),
    "inference.engine": ("Engine", "引擎"),
    "inference.models": ("Models", "模型"),
    "inference.requests": ("Requests/s", "请求/秒"),
    "inference.e2e_p99": ("E2E p99", "端到端 p99"),
    "inference.errors": ("Errors", "错误率"),
    "inference.kv": ("KV cache", "KV 缓存"),
    "inference.waiting": ("Waiting", "排队"),
    "inference.unreachable": ("Unreachable", "不可达"),
    "inference.none": (
        "No inference server seen in the last 15 minutes (scrape one: see docs/inference.md).",
        "最近 15 分钟没有推理服务（配置采集见 docs/inference.md）。",
    ),
    "inference.na": ("not available", "不支持"),
    "inference.heatmap": ("Request latency distribution (end to end)", "请求延迟分布（端到端）"),
    "inference.heatmap_note": ("requests/s per latency bucket", "每个延迟区间的请求/秒"),
    "inference.no_requests": ("no finished requests in the range", "该时间范围内没有完成的请求"),
    "inference.serving_gpus": ("Serving GPUs", "服务所用 GPU"),
    "inference.ports": ("port", "端口"),
    "inference.serving.found": (
        "Found through the process listening on the target's port",
        "通过监听目标端口的进程找到",
    ),
    "inference.serving.remote": (
        "The targets are on other machines: their GPUs are found only for local targets",
        "目标在其他机器上：仅能自动找到本机目标的 GPU",
    ),
    "inference.serving.no-process": (
        "No process here is seen listening on the target's port (another user's process needs root)",
        "本机未发现监听该端口的进程（其他用户的进程需要 root 权限）",
    ),
    "inference.serving.no-gpu-process": (
        "The listening processes hold no GPU memory in NVML's process table",
        "监听进程在 NVML 进程表中没有占用 GPU 显存",
    ),
    "inference.requests_chart": ("Requests/s", "请求/秒"),
    "inference.tokens_chart": ("Tokens/s in and out", "输入/输出 tokens/秒"),
    "inference.ttft_chart": ("Time to first token", "首 token 延迟"),
    "inference.itl_chart": ("Inter-token latency", "token 间延迟"),
    "inference.e2e_chart": ("End-to-end latency", "端到端延迟"),
    "inference.queue_chart": ("Running and waiting requests", "运行中与排队请求"),
    "inference.kv_chart": ("KV cache used", "KV 缓存占用"),
    "inference.errors_chart": ("Error ratio", "错误率"),
    "inference.preempt_chart": ("Preemptions/s", "抢占/秒"),
    "inference.finish_chart": ("Finish reasons (requests/s)", "结束原因（请求/秒）"),
    "inference.up_chart": ("Targets up", "目标在线"),
    "inference.tile.requests": ("Requests", "请求"),
    "inference.tile.tokens_in": ("Tokens in", "输入 tokens"),
    "inference.tile.tokens_out": ("Tokens out", "输出 tokens"),
    "inference.tile.error_ratio": ("Errors", "错误率"),
    "inference.tile.running": ("Running", "运行中"),
    "inference.tile.waiting": ("Waiting", "排队"),
    "inference.tile.kv_cache": ("KV cache", "KV 缓存"),
    "inference.tile.preemptions": ("Preemptions", "抢占"),
    "inference.tile.unreachable": ("Unreachable targets", "不可达目标"),
    "inference.tile.ttft_p50": ("TTFT p50", "首 token p50"),
    "inference.tile.ttft_p95": ("TTFT p95", "首 token p95"),
    "inference.tile.ttft_p99": ("TTFT p99", "首 token p99"),
    "inference.tile.itl_p50": ("ITL p50", "token 间 p50"),
    "inference.tile.itl_p95": ("ITL p95", "token 间 p95"),
    "inference.tile.itl_p99": ("ITL p99", "token 间 p99"),
    "inference.tile.e2e_p50": ("E2E p50", "端到端 p50"),
    "inference.tile.e2e_p95": ("E2E p95", "端到端 p95"),
    "inference.tile.e2e_p99": ("E2E p99", "端到端 p99"),
}
TABLES = (STRINGS, GPU_STRINGS)


def _quantiles(engine: str, job: str, kind: str) -> str | None:
    """One expression giving p50, p95 and p99 of a latency as three series (label `quantile`)."""
    parts = []
    for q in ("p50", "p95", "p99"):
        expr = expr_for(engine, f"{kind}_{q}", job)
        if expr is None:
            return None
        parts.append(f'label_replace({expr}, "quantile", "{q}", "", "")')
    return " or ".join(parts)


def service_panels(engine: str, job: str, gpu_matchers: str | None) -> tuple[Panel, ...]:
    """The charts of one service's page: each engine's own expression, absent where it has none."""
    sel = selector(job)
    failed = f"up{sel} == 0"

    def e(signal: str) -> str | None:
        return expr_for(engine, signal, job)

    out: list[Panel] = []

    def add(pid: str, title: str, query: str | None, unit: str, key: str, **kw: Any) -> None:
        if query is not None:
            out.append(Panel(pid, title, query, unit, title_key=key, failed_if=failed, **kw))

    add("requests", "Requests/s", e("requests"), "per_second", "inference.requests_chart", min=0, width=4)
    tokens_in, tokens_out = e("tokens_in"), e("tokens_out")
    if tokens_in and tokens_out:
        add("tokens", "Tokens/s", f'label_replace({tokens_in}, "dir", "in", "", "") or label_replace({tokens_out}, "dir", "out", "", "")',
            "per_second", "inference.tokens_chart", legend="{{dir}}", min=0, width=4)  # fmt: skip
    errors = e("error_ratio")  # in percent: a ratio's axis ticks (0 %, 1 %) cannot tell 0.1 % from 0.4 %
    add("errors", "Error ratio", f"100 * {errors}" if errors else None, "percent", "inference.errors_chart",
        min=0, width=4, thresholds=Thresholds(warn=0.1, crit=1.0))  # fmt: skip
    for kind, title in (
        ("ttft", "Time to first token"),
        ("itl", "Inter-token latency"),
        ("e2e", "End-to-end latency"),
    ):
        add(kind, title, _quantiles(engine, job, kind), "seconds", f"inference.{kind}_chart", legend="{{quantile}}",
            min=0, width=4, log_y=True)  # fmt: skip
    running, waiting = e("running"), e("waiting")
    if running and waiting:
        add("queue", "Running and waiting", f'label_replace({running}, "state", "running", "", "") or label_replace({waiting}, "state", "waiting", "", "")',
            "count", "inference.queue_chart", legend="{{state}}", min=0, width=4)  # fmt: skip
    add("kv_cache", "KV cache used", e("kv_cache"), "ratio", "inference.kv_chart", min=0, max=1, width=4,
        thresholds=Thresholds(warn=0.9, crit=0.98))  # fmt: skip
    add(
        "preemptions",
        "Preemptions/s",
        e("preemptions"),
        "per_second",
        "inference.preempt_chart",
        min=0,
        width=4,
    )
    add("finish_reasons", "Finish reasons", e("finish_reasons"), "per_second", "inference.finish_chart",
        kind="bars", legend="{{finished_reason}}", width=6)  # fmt: skip
    out.append(Panel("up", "Targets up", f"up{sel}", "count", legend="{{instance}}", min=0, width=6,
                     title_key="inference.up_chart"))  # fmt: skip
    return check_unique([*out, *gpu_panels(gpu_matchers, with_events=False)])


def _services() -> dict[str, Any]:
    rt = runtime()
    return {"services": services(instant_query(rt), rt.clock.now_ms())}


def _service(job: str) -> tuple[dict[str, Any], tuple[Panel, ...]]:
    rt = runtime()
    now = rt.clock.now_ms()
    query = instant_query(rt)
    engine = engine_of(query, job, now)
    if engine is None:
        abort(404, f"no inference service (vLLM, SGLang or TGI) with job {job!r} in the last hour")
    hostname = str(rt.status().get("hostname") or "")
    serving = serving_gpus(query, rt.targets(), job, now, rt.settings.proc_root, frozenset({hostname} - {""}))
    heat = ENGINES[engine]["latency_buckets"]
    data = {
        "job": job,
        "engine": engine,
        "tiles": tiles(query, engine, job, now),
        "serving": serving,
        "heatmap_expr": expr_for(engine, "latency_buckets", job),
        "heatmap_note": heat.note,
    }
    return data, service_panels(engine, job, serving["matchers"])


@bp.get("/api/ui/inference")
def services_json() -> ResponseReturnValue:
    return page_json("inference", (), _services(), {}, TABLES)


@bp.get("/api/ui/inference/<path:job>")
def service_json(job: str) -> ResponseReturnValue:
    data, panels = _service(job)
    return page_json("inference", panels, data, {"job": job}, TABLES)


@bp.get("/inference")
def services_page() -> ResponseReturnValue:
    return render_page("inference.html", page="inference", data=_services(), tables=TABLES, title="Inference")


@bp.get("/inference/<path:job>")
def service_page(job: str) -> ResponseReturnValue:
    data, panels = _service(job)
    return render_page(
        "inference_service.html",
        page="inference",
        panels=panels,
        data=data,
        variables={"job": job},
        tables=TABLES,
        title=job,
    )
