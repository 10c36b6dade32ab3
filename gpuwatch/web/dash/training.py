"""Training runs: `/training` (the list) and `/training/<run>` (curves, checkpoints, GPUs, logs), with
their JSON twins `/api/ui/training` and `/api/ui/training/<run>`.

The run page's curves come from its twin, which smooths every raw point before reducing them
(`?smoothing=0.6&max_points=&start=&end=&compare=a,b`, see trainingdata.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flask import Blueprint, abort, request
from flask.typing import ResponseReturnValue

from gpuwatch.core.model import LogLine, Matcher, RunRecord, SeriesData
from gpuwatch.web.dash.common import float_arg, instant_query, time_arg
from gpuwatch.web.dash.gpupanels import STRINGS as GPU_STRINGS
from gpuwatch.web.dash.gpupanels import gpu_panels
from gpuwatch.web.dash.page import page_json, render_page
from gpuwatch.web.dash.smoothing import DEFAULT_WEIGHT, MAX_POINTS
from gpuwatch.web.dash.trainingdata import parse_compare, run_detail, runs_table
from gpuwatch.web.runtime import WebRuntime, runtime

bp = Blueprint("dash_training", __name__)

STRINGS = {
    "training.title": ("Training runs", "训练任务"),
    "training.help": (
        "Runs the SDK, pushes or tailed logs report. Tick two or more to compare them.",
        "由 SDK、推送或日志上报的训练任务。勾选两个以上可对比。",
    ),
    "training.run": ("Run", "任务"),
    "training.state": ("State", "状态"),
    "training.state.running": ("running", "运行中"),
    "training.state.stalled": ("stalled", "停滞"),
    "training.state.finished": ("finished", "已完成"),
    "training.state.failed": ("failed", "失败"),
    "training.progress": ("Progress", "进度"),
    "training.eta": ("ETA", "预计剩余"),
    "training.step": ("Step", "步数"),
    "training.last_loss": ("Last loss", "最新 loss"),
    "training.host": ("Host", "主机"),
    "training.gpus": ("GPUs", "GPU"),
    "training.energy": ("Energy", "能耗"),
    "training.unknown": ("not known", "未知"),
    "training.last_seen": ("Last seen", "最近上报"),
    "training.none": ("No training run reported yet.", "还没有训练任务上报。"),
    "training.compare": ("compare", "对比"),
    "training.compare_selected": ("Compare selected runs", "对比所选任务"),
    "training.compare_with": ("Compare with", "对比"),
    "training.smoothing": ("Smoothing", "平滑"),
    "training.xaxis": ("x axis", "横轴"),
    "training.x.wall": ("wall time", "时间"),
    "training.x.step": ("step", "步数"),
    "training.x.relative": ("hours since start", "开始后小时数"),
    "training.lr_log": ("learning rate log scale", "学习率对数坐标"),
    "training.loss": (
        "Loss (smoothed; raw faint; dotted: checkpoints; ×: log events)",
        "Loss（平滑；浅色为原始值；虚线为 checkpoint；×为日志事件）",
    ),
    "training.lr": ("Learning rate", "学习率"),
    "training.grad_norm": ("Gradient norm", "梯度范数"),
    "training.throughput": ("Throughput (tokens/s)", "吞吐（tokens/s）"),
    "training.checkpoints": ("Checkpoint durations", "Checkpoint 耗时"),
    "training.raw": ("raw", "原始"),
    "training.eval": ("eval", "验证"),
    "training.skipped": ("older points left out (narrow the range)", "个更早的点未显示（请缩小时间范围）"),
    "training.events": ("events", "事件"),
    "training.points": ("raw points, smoothed before any reduction", "个原始点，先平滑后抽样"),
    "training.gpus_of_run": ("The run's GPUs", "任务使用的 GPU"),
    "training.gpus_unknown": (
        "The run names no GPUs (pass gpus= to gpuwatch.client.init).",
        "任务没有声明 GPU（在 gpuwatch.client.init 中传 gpus=）。",
    ),
    "training.gpus_from.info": ("from the run's GPU info series", "来自任务的 GPU 信息序列"),
    "training.gpus_from.run": ("as the run named them", "来自任务元数据"),
    "training.gpus_from.host": (
        "the run names no GPUs: every GPU of its host",
        "任务没有声明 GPU：显示其主机上的全部 GPU",
    ),
    "training.logs": ("Log lines and detected events", "日志与检测到的事件"),
    "training.no_logs": ("No tailed log lines for this run in the range.", "该时间范围内没有此任务的日志。"),
    "logs.time": ("Time", "时间"),
    "logs.level": ("Level", "级别"),
    "logs.event": ("Event", "事件"),
    "logs.text": ("Text", "内容"),
    "logs.event.cuda_oom": ("CUDA OOM", "显存不足"),
    "logs.event.nccl_error": ("NCCL", "NCCL"),
    "logs.event.nan_loss": ("NaN loss", "NaN loss"),
    "logs.event.traceback": ("traceback", "异常栈"),
}
TABLES = (STRINGS, GPU_STRINGS)


class _Reads:
    """What the training pages read: the runs and their log lines from the local store (they stay
    there), their series where queries are answered (the local store, or `storage.remote`)."""

    def __init__(self, rt: WebRuntime) -> None:
        self._rt = rt

    def runs(self) -> list[RunRecord]:
        return self._rt.store.runs()

    def log_lines(self, **kw: Any) -> list[LogLine]:
        return self._rt.store.log_lines(**kw)

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return self._rt.backend.select(matchers, start_ms, end_ms)


def _runs() -> dict[str, Any]:
    rt = runtime()
    now = rt.clock.now_ms()
    return {"runs": runs_table(_Reads(rt), instant_query(rt), now)}


def _run(name: str) -> dict[str, Any]:
    rt = runtime()
    now = rt.clock.now_ms()
    weight = float_arg("smoothing", DEFAULT_WEIGHT, 0.0, 1.0, hi_open=True)
    max_points = int(float_arg("max_points", MAX_POINTS, 10, 20_000))
    start, end = time_arg("start"), time_arg("end")
    query = instant_query(rt)
    runs = []
    for i, n in enumerate(parse_compare(request.args.get("compare"), name)):
        detail = run_detail(
            _Reads(rt), query, n, now, start_ms=start, end_ms=end, weight=weight, max_points=max_points
        )
        if detail is None:
            if i == 0:
                abort(404, f"no training run named {name!r}")
            continue
        runs.append(detail)
    return {"run": name, "weight": weight, "runs": runs}


@bp.get("/api/ui/training")
def runs_json() -> ResponseReturnValue:
    return page_json("training", (), _runs(), {}, TABLES)


@bp.get("/api/ui/training/<path:name>")
def run_json(name: str) -> ResponseReturnValue:
    data = _run(name)
    panels = gpu_panels(data["runs"][0]["gpus"]["matchers"])
    return page_json("training", panels, data, {"run": name}, TABLES)


@bp.get("/training")
def runs_page() -> ResponseReturnValue:
    return render_page("training.html", page="training", data=_runs(), tables=TABLES, title="Training")


@bp.get("/training/<path:name>")
def run_page(name: str) -> ResponseReturnValue:
    # The page draws its curves from the twin (with its range and smoothing); here only the summary.
    rt = runtime()
    now = rt.clock.now_ms()
    detail = run_detail(_Reads(rt), instant_query(rt), name, now, start_ms=now, end_ms=now)
    if detail is None:
        abort(404, f"no training run named {name!r}")
    run = detail["run"]
    data = {
        "run": name,
        "compare": parse_compare(request.args.get("compare"), name)[1:],
        "start_ms": int(run["start"] * 1000) if run["start"] is not None else None,
        "end_ms": int(run["end"] * 1000) + 60_000 if run["end"] is not None else None,
        "summary": run,
        "gpus": detail["gpus"],
    }
    panels = gpu_panels(detail["gpus"]["matchers"])
    return render_page(
        "training_run.html",
        page="training",
        panels=panels,
        data=data,
        variables={"run": name},
        tables=TABLES,
        title=name,
    )
