"""The usage panels: GPUs allocated now and over time (the cluster and usage pages), and GPUs held and
held idle per group (the usage page), all from the usage counters and gauge (`collect/allocation.py`).

"Allocated" is one definition everywhere: a GPU with at least one compute process, as the usage
report counts it (`gpuwatch_gpus_allocated`, `gpuwatch_usage_allocated_gpu_seconds_total`)."""

from __future__ import annotations

from gpuwatch.web.dash.panel import Panel

# --by -> (English, Chinese) name of a group
GROUP_NAMES = {
    "user": ("user", "用户"),
    "run": ("training run", "训练任务"),
    "host": ("host", "主机"),
    "job": ("Slurm job", "Slurm 作业"),
    "pod": ("pod", "Pod"),
}
STRINGS = {
    "usage.allocated_now": ("Allocated", "已分配"),
    "usage.allocation": ("Allocated GPUs of all GPUs", "已分配 GPU / 全部 GPU"),
    **{f"usage.by.{k}": v for k, v in GROUP_NAMES.items()},
    **{
        f"usage.held_by.{k}": (f"GPUs held, by {en}", f"占用的 GPU（按{zh}）")
        for k, (en, zh) in GROUP_NAMES.items()
    },
    **{
        f"usage.idle_by.{k}": (f"GPUs held idle, by {en}", f"空占的 GPU（按{zh}）")
        for k, (en, zh) in GROUP_NAMES.items()
    },
}

# --by -> the legend of a group's series
LEGENDS = {
    "user": "{{user}}",
    "run": "{{run}}",
    "host": "{{Hostname}}",
    "job": "{{slurm_job}} ({{user}})",
    "pod": "{{pod}}",
}


def allocated_stat(selector: str = "", width: int = 2) -> Panel:
    """GPUs with a compute process now (`selector`: the braces of a Hostname matcher, or "")."""
    return Panel("allocated", "Allocated", f"sum(gpuwatch_gpus_allocated{selector})", "count", "stat",
                 width=width, title_key="usage.allocated_now", min_interval=5,
                 description="GPUs running at least one compute process (gpuwatch_gpus_allocated)")  # fmt: skip


def allocation_chart(selector: str = "", width: int = 12) -> Panel:
    """GPUs allocated and all GPUs over time, two lines."""
    return Panel(
        "allocation",
        "Allocated GPUs of all GPUs",
        f'label_replace(sum(gpuwatch_gpus_allocated{selector}), "series", "allocated", "", "") '
        f'or label_replace(count(gpuwatch_gpu_lost{selector}), "series", "all GPUs", "", "")',
        "count",
        legend="{{series}}",
        min=0,
        width=width,
        title_key="usage.allocation",
        description="GPUs with at least one compute process, and every GPU sampled",
    )


def _named(metric: str, by: str, labels: str) -> str:
    """GPUs per group from `metric`'s rate, the group's empty name written "(none)" (a pod without a
    readable name by its uid), so that every series has a legend."""
    per = f"sum by ({labels}) (rate({metric}[$__rate]))"
    if by == "pod":
        unnamed = f'sum by ({labels}) (rate({metric}{{pod=""}}[$__rate]))'
        named = f'sum by ({labels}) (rate({metric}{{pod!=""}}[$__rate]))'
        by_uid = f'label_replace({unnamed}, "pod", "$1", "pod_uid", "(.+)")'
        return f'{named} or label_replace({by_uid}, "pod", "(none)", "pod_uid", "")'
    first = labels.split(",")[0].strip()
    return f'label_replace({per}, "{first}", "(none)", "{first}", "")'


def group_charts(by: str, labels: str) -> tuple[Panel, Panel]:
    """GPUs held and GPUs held idle over time, stacked by the group `by` (its labels `labels`)."""
    legend = LEGENDS[by]
    return (
        Panel("held_by", STRINGS[f"usage.held_by.{by}"][0],
              _named("gpuwatch_usage_allocated_gpu_seconds_total", by, labels), "count",
              legend=legend, stacked=True, min=0, width=6, title_key=f"usage.held_by.{by}",
              description="allocated GPU-seconds per second: the GPUs each group held, on average over each step"),
        Panel("idle_by", STRINGS[f"usage.idle_by.{by}"][0],
              _named("gpuwatch_usage_idle_held_gpu_seconds_total", by, labels), "count",
              legend=legend, stacked=True, min=0, width=6, title_key=f"usage.idle_by.{by}",
              description="allocated GPUs under the idle threshold's utilization, on average over each step"),
    )  # fmt: skip
