"""Which Grafana dashboards gpuwatch writes, and from which registry panels (the JSON: grafana.py).

What a page builds per request from what it finds (a run's GPUs, a service's engine) is written for
every case at once: the inference panels join each engine's expression with `or` (a job runs one
engine, so one side answers), and the GPU panels of a run or service select `Hostname`/`gpu` through
multi-value variables. The run page's curves, which the page draws from its twin rather than from
panels, are written as panels over the same series.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpuwatch.web.dash import cluster, gpu, gpupanels, inference, inferencedata, training, trainingdata
from gpuwatch.web.dash.i18n import strings
from gpuwatch.web.dash.panel import Panel, Thresholds, check_unique


@dataclass(frozen=True)
class Variable:
    """A query variable: the values of `label` on the series `selector` selects (`label_values`).

    `is_multi`: several values (and All) may be chosen, written as a regex alternation: for `=~`
    matchers only. `all_value`: what All stands for (empty: every listed value)."""

    name: str
    label: str
    selector: str
    label_name: str
    is_multi: bool = False
    all_value: str = ""

    def query(self) -> str:
        return f"label_values({self.selector}, {self.label_name})"


@dataclass(frozen=True)
class Section:
    """Panels under one row title ("" for none), laid out on the page's 12-column grid."""

    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class DashboardSpec:
    """One dashboard: its uid (also its file name), title, variables and sections."""

    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    sections: tuple[Section, ...]
    strings: Mapping[str, str]

    def panels(self) -> tuple[Panel, ...]:
        return tuple(p for s in self.sections for p in s.panels)


_GPU_INFO = ("", '__name__=~"' + "|".join(trainingdata.RUN_GPU_INFO) + '",run="$run"')
_RUN_SERIES = '{__name__=~"training_.+"}'
# A run's or a service's GPUs as the page selects them (trainingdata.gpu_matchers' form).
_GPU_MATCHERS = 'Hostname=~"$hostname", gpu=~"$gpu"'

_CURVE_TITLES: Mapping[str, tuple[str, str, str]] = {
    # curve id -> (title, unit, title key)
    "loss": ("Loss", "none", ""),
    "eval_loss": ("Eval loss", "none", ""),
    "learning_rate": ("Learning rate", "none", "training.lr"),
    "grad_norm": ("Gradient norm", "none", "training.grad_norm"),
    "throughput": ("Throughput (tokens/s)", "per_second", "training.throughput"),
}


def curve_panels() -> tuple[Panel, ...]:
    """The run page's curves (trainingdata.CURVES) and checkpoint durations as panels, raw: Grafana
    cannot smooth before reducing as the page does."""
    out = []
    for cid, metric, _smoothed in trainingdata.CURVES:
        title, unit, key = _CURVE_TITLES[cid]
        out.append(
            Panel(cid, title, f'{metric}{{run="$run"}}', unit, legend="{{job}}", width=6, title_key=key,
                  log_y=cid == "learning_rate")
        )  # fmt: skip
    out.append(
        Panel("checkpoints", "Checkpoint durations", 'training_checkpoint_seconds{run="$run"}', "seconds",
              legend="{{job}}", width=6, min=0, title_key="training.checkpoints")
    )  # fmt: skip
    return check_unique(out)


def merged_service_panels(job: str = "$job") -> tuple[Panel, ...]:
    """The inference service page's charts for whichever engine the job runs: each chart's
    expressions of every engine joined with `or` (a chart no engine has is left out)."""
    merged: dict[str, Panel] = {}
    queries: dict[str, list[str]] = {}
    for engine in inferencedata.ENGINES:
        for p in inference.service_panels(engine, job, None):
            merged.setdefault(p.id, p)
            found = queries.setdefault(p.id, [])
            if p.query not in found:
                found.append(p.query)
    return tuple(replace(p, query=_either(queries[p.id])) for p in merged.values())


def tile_panels(job: str = "$job") -> tuple[Panel, ...]:
    """The service page's tiles as stats, each engine's expression joined with `or`."""
    units = {
        "req/s": "per_second",
        "tok/s": "per_second",
        "ratio": "ratio",
        "requests": "count",
        "s": "seconds",
    }
    out = []
    for tile in inferencedata.TILES:
        found = [e for engine in inferencedata.ENGINES if (e := inferencedata.expr_for(engine, tile.id, job))]
        if not found:
            continue
        out.append(
            Panel(f"tile_{tile.id}", tile.title, _either(list(dict.fromkeys(found))), units[tile.unit], "stat",
                  width=2, title_key=f"inference.tile.{tile.id}", thresholds=Thresholds(tile.warn, tile.crit))
        )  # fmt: skip
    unreachable = inferencedata.UNREACHABLE.replace("{SEL}", inferencedata.selector(job))
    out.append(
        Panel("tile_unreachable", "Unreachable targets", unreachable, "count", "stat", width=2,
              title_key="inference.tile.unreachable", thresholds=Thresholds(crit=1.0))
    )  # fmt: skip
    return tuple(out)


def latency_heatmap(job: str = "$job") -> Panel:
    """The service page's latency distribution: requests/s per end-to-end latency bucket."""
    found = [
        e for engine in inferencedata.ENGINES if (e := inferencedata.expr_for(engine, "latency_buckets", job))
    ]
    return Panel("latency_heatmap", "Request latency distribution (end to end)", _either(found), "per_second",
                 "heatmap", legend="{{le}}", width=12, title_key="inference.heatmap",
                 description="requests/s per latency bucket")  # fmt: skip


def _either(queries: Sequence[str]) -> str:
    return queries[0] if len(queries) == 1 else " or ".join(f"({q})" for q in queries)


def _gpu_variables(metric: str, matchers: str = "") -> tuple[Variable, ...]:
    """Hostname and gpu, several at once, from the series of `metric` that `matchers` select."""
    return (
        Variable("hostname", "Node", f"{metric}{{{matchers}}}" if matchers else metric, "Hostname", is_multi=True),
        Variable("gpu", "GPU", f'{metric}{{{matchers}{"," if matchers else ""}Hostname=~"$hostname"}}', "gpu",
                 is_multi=True),
    )  # fmt: skip


def specs() -> tuple[DashboardSpec, ...]:
    """The four dashboards, from the pages' registries."""
    gpu_util = "DCGM_FI_DEV_GPU_UTIL"
    health = Panel("health", "Health now", gpu.HEALTH, "none", "stat", legend="{{__name__}}", width=12,
                   title_key="gpu.health",
                   description="lost flag, throttling, ECC, last XID and row remapping, as the page's cards")  # fmt: skip
    run_gpus = gpupanels.gpu_panels(_GPU_MATCHERS)
    serving = gpupanels.gpu_panels(_GPU_MATCHERS, with_events=False)
    return (
        DashboardSpec(
            "gpuwatch-cluster",
            "gpuwatch / Cluster",
            "Every GPU and node: totals, utilization of each GPU, memory, power, idle-but-held GPUs, hosts.",
            (Variable("host_re", "Node", gpu_util, "Hostname", is_multi=True, all_value=".+"),),
            (Section("", cluster.PANELS),),
            strings("en", cluster.STRINGS),
        ),
        DashboardSpec(
            "gpuwatch-gpu",
            "gpuwatch / GPU",
            "One GPU: health, utilization, memory, temperature, power, clocks, PCIe, events, processes.",
            (
                Variable("hostname", "Node", gpu_util, "Hostname"),
                Variable("gpu", "GPU", 'DCGM_FI_DEV_GPU_UTIL{Hostname="$hostname"}', "gpu"),
            ),
            (Section("", (health, *gpu.PANELS)),),
            strings("en", gpu.STRINGS),
        ),
        DashboardSpec(
            "gpuwatch-training-run",
            "gpuwatch / Training run",
            "One training run: its curves and checkpoints, and the GPUs it runs on.",
            (Variable("run", "Run", _RUN_SERIES, "run"), *_gpu_variables(*_GPU_INFO)),
            (Section("Curves", curve_panels()), Section("The run's GPUs", run_gpus)),
            strings("en", training.STRINGS, gpupanels.STRINGS),
        ),
        DashboardSpec(
            "gpuwatch-inference-service",
            "gpuwatch / Inference service",
            "One vLLM, SGLang or TGI service (scrape job): tiles, charts, latency distribution, and the GPUs "
            "chosen as its own (the page finds them from the process on the target's port).",
            (
                Variable("job", "Service (job)", "gpuwatch:inference_queue_length", "job"),
                *_gpu_variables(gpu_util),
            ),
            (
                Section("", tile_panels()),
                Section("Charts", (*merged_service_panels(), latency_heatmap())),
                Section("Serving GPUs", serving),
            ),
            strings("en", inference.STRINGS, gpupanels.STRINGS),
        ),
    )
