"""The demo's training run over a simulated history: what `training.TrainingSim` would have logged.

The run ticks once a second from the demo's start, skips the ticks of its stalls (the incident
schedule), logs one step a tick and saves a checkpoint after every `checkpoint_every` steps (silent
for `checkpoint_ticks` ticks, then `training_checkpoint_seconds`); at `total_steps` it finishes and the
next tick starts it again under the same name. Its figures are drawn as `TrainingSim` draws them, with
numpy's generator (a live demo's are random too). Alongside: what the trainer's log gives when tailed
(job `demo-log`: loss, learning rate and gradient norm as printed), the runs job's gauges every
`runs_every_s` (status, start, last seen, total steps; the run's GPUs), and the run's row.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass

import numpy as np

from gpuwatch.collect.push import TRAINING_JOB
from gpuwatch.collect.rungpus import INFO_METRIC
from gpuwatch.collect.runs import run_status_samples
from gpuwatch.core.model import Labels, RunRecord, RunUpdate, make_labels, stable_labels
from gpuwatch.demo.historygpu import Series
from gpuwatch.demo.incidents import STALL, IncidentSchedule
from gpuwatch.demo.readings import Spans
from gpuwatch.demo.training import TRAINING_CONFIG, TRAINING_LOG_JOB, TRAINING_RUN, learning_rate, mean_loss


@dataclass(frozen=True)
class RunHistory:
    """The run's series, its row (an init, then the last step seen) and where the live run goes on."""

    series: list[Series]
    updates: list[RunUpdate]
    step: int  # the last step of the run going on at the end (0: it had just finished)


def _stalled(incidents: IncidentSchedule | None, now: np.ndarray) -> np.ndarray:
    if incidents is None:
        return np.zeros(now.shape, dtype=bool)
    hours = int(max(0.0, incidents.elapsed(float(now[-1]))) // 3600) + 2
    spans = Spans.of([x for h in range(hours) for x in incidents.hour(h) if x.kind == STALL])
    return spans.find(now - incidents.start) >= 0


def training_history(
    start_s: float,
    end_s: float,
    *,
    incidents: IncidentSchedule | None,
    gpus: list[tuple[str, str, str]],
    runs_ticks_ms: np.ndarray,
    total_steps: int = 50_000,
    checkpoint_every: int = 300,
    checkpoint_ticks: int = 4,
    seed: int = 0,
) -> RunHistory:
    """The run from `start_s` (the demo's start) to before `end_s`; `gpus`: (Hostname, gpu, UUID) of
    its GPUs; `runs_ticks_ms`: when the runs job wrote its gauges."""
    rng = np.random.default_rng(seed)
    now = start_s + np.arange(0, max(1, math.ceil(end_s - start_s)), dtype=np.float64)
    now = now[now < end_s]
    ticks = now[~_stalled(incidents, now)]  # the ticks that do something
    cycle = checkpoint_every + checkpoint_ticks
    blocks = (total_steps - 1) // checkpoint_every
    length = blocks * cycle + (total_steps - blocks * checkpoint_every)  # active ticks a run lasts
    a = np.arange(ticks.size)
    p = a % length  # position in its run
    q = p % cycle
    is_step = q < checkpoint_every
    is_close = q == cycle - 1
    step = (p // cycle) * checkpoint_every + np.minimum(q, checkpoint_every - 1) + 1
    t_ms = np.round(ticks * 1000).astype(np.int64)
    steps = step[is_step]
    st = steps.astype(np.float64)
    n = st.size
    # TrainingSim's formulas, a value per step; the noise drawn as it draws it
    every_step = range(total_steps + 1)
    loss_mean = np.array([mean_loss(s, total_steps) for s in every_step])
    lr_table = np.array([learning_rate(s, total_steps) for s in every_step])
    loss = np.maximum(0.5, loss_mean[steps] + rng.normal(0, 0.04, n))
    lr = lr_table[steps]
    spike = rng.random(n) < 0.01
    grad = np.abs(rng.normal(0.9, 0.15, n)) * np.where(spike, rng.uniform(3, 6, n), 1.0)
    tokens = np.trunc(16 * 2048 * rng.uniform(0.95, 1.05, n))
    # throughput: tokens over the time since the previous log of the same run (none for a run's first)
    elapsed = np.diff(ticks, prepend=np.nan)[is_step]
    first_of_run = p[is_step] == 0
    key = make_labels({"job": TRAINING_JOB, "run": TRAINING_RUN})
    log_key = make_labels({"job": TRAINING_LOG_JOB, "run": TRAINING_RUN})
    at = t_ms[is_step]
    close_ms = t_ms[is_close]
    logged = np.sort(np.concatenate((at, close_ms)))
    step_values = np.concatenate((st, step[is_close].astype(np.float64)))[
        np.argsort(np.concatenate((at, close_ms)), kind="stable")
    ]
    fast = ~first_of_run
    series: list[Series] = [
        ("training_step", key, logged, step_values),
        ("training_loss", key, at, loss),
        ("training_learning_rate", key, at, lr),
        ("training_grad_norm", key, at, grad),
        ("training_tokens", key, at, tokens),
        ("training_throughput_tokens_per_second", key, at[fast], tokens[fast] / elapsed[fast]),
        # the close of a checkpoint logs how long the saving took (from its step's tick)
        (
            "training_checkpoint_seconds",
            key,
            close_ms,
            ticks[is_close] - ticks[np.flatnonzero(is_close) - checkpoint_ticks],
        ),
        ("training_loss", log_key, at, np.round(loss, 4)),
        ("training_learning_rate", log_key, at, np.array([float(f"{x:.4e}") for x in lr])),
        ("training_grad_norm", log_key, at, np.round(grad, 3)),
    ]
    first_ms, last_ms = int(t_ms[0]), int(logged[-1])
    host = socket.gethostname()
    updates = [
        RunUpdate(
            TRAINING_RUN,
            "init",
            first_ms,
            total_steps=total_steps,
            config=dict(TRAINING_CONFIG),
            host=host,
            gpus=[gpu for _, gpu, _ in gpus],
        ),
        RunUpdate(TRAINING_RUN, "seen", last_ms, last_step=float(step_values[-1])),
    ]
    series.extend(
        _runs_job(runs_ticks_ms[runs_ticks_ms >= first_ms], logged, first_ms, total_steps, host, gpus)
    )
    last = int(step[-1]) if ticks.size and p[-1] != length - 1 else 0
    return RunHistory(series, updates, last)


def _runs_job(
    ticks_ms: np.ndarray,
    logged_ms: np.ndarray,
    start_ms: int,
    total_steps: int,
    host: str,
    gpus: list[tuple[str, str, str]],
) -> list[Series]:
    """The runs job's gauges at `ticks_ms`: the run running since `start_ms`, last seen at its last log."""
    if ticks_ms.size == 0:
        return []
    seen = logged_ms[np.maximum(np.searchsorted(logged_ms, ticks_ms, side="right") - 1, 0)]
    record = RunRecord(
        name=TRAINING_RUN, status="running", start_ms=start_ms, end_ms=None, total_steps=total_steps,
        config=None, host=host, gpus=None, last_step=None, last_seen_ms=start_ms, process=None,
    )  # fmt: skip
    out: list[Series] = []
    for s in run_status_samples([record], start_ms):
        values = seen / 1000 if s.name == "gpuwatch_training_run_last_seen_timestamp_seconds" else None
        out.append(
            (s.name, s.labels, ticks_ms, values if values is not None else np.full(ticks_ms.size, s.value))
        )
    for hostname, gpu, uuid in gpus:
        labels: Labels = stable_labels({"run": TRAINING_RUN, "Hostname": hostname, "gpu": gpu, "UUID": uuid})
        out.append((INFO_METRIC, labels, ticks_ms, np.ones(ticks_ms.size)))
    return out
