"""What the training pages show: runs with their state, one run's curves at full resolution (smoothed
before any reduction), its checkpoints, its GPUs and its log events. Plain data; the page module
(training.py) serves it."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from gpuwatch.collect.logs import detect_event
from gpuwatch.collect.runs import list_runs
from gpuwatch.core.model import LogLine, Matcher, RunRecord, SeriesData, is_stale
from gpuwatch.query.values import Vector
from gpuwatch.web.dash.common import InstantQuery
from gpuwatch.web.dash.panel import promql_string
from gpuwatch.web.dash.smoothing import DEFAULT_WEIGHT, MAX_POINTS, reduce_indices, smooth_and_reduce

# The curves of a run page: (id, stored name, smoothed?).
CURVES: tuple[tuple[str, str, bool], ...] = (
    ("loss", "training_loss", True),
    ("eval_loss", "training_eval_loss", True),
    ("learning_rate", "training_learning_rate", False),
    ("grad_norm", "training_grad_norm", True),
    ("throughput", "training_throughput_tokens_per_second", True),
)
MAX_RAW_POINTS = 2_000_000  # per curve and request: older points beyond it are left out (and counted)
RUN_GPU_INFO = ("gpuwatch_run_gpu_info", "gpuwatch_training_run_gpu_info")
MAX_COMPARE = 8


class TrainingSource(Protocol):
    """What the training pages read from the store."""

    def runs(self) -> list[RunRecord]: ...

    def select(self, matchers: list[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...

    def log_lines(
        self,
        *,
        run: str | None = None,
        text: str | None = None,
        level: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 200,
    ) -> list[LogLine]: ...


def run_state(run: dict[str, Any]) -> str:
    """Return running, stalled, finished or failed for a run as `list_runs` describes it."""
    if run["status"] == "running":
        return "stalled" if run.get("is_stalled") else "running"
    return "failed" if run["status"] == "failed" else "finished"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _points(series: Sequence[SeriesData]) -> tuple[np.ndarray, np.ndarray]:
    """Merge the samples of `series` (one name, maybe several label sets) by time, markers dropped."""
    ts: list[np.ndarray] = []
    vs: list[np.ndarray] = []
    for s in series:
        keep = np.array([not is_stale(float(v)) for v in s.values], dtype=bool)
        ts.append(np.asarray(s.timestamps_ms, dtype=np.int64)[keep])
        vs.append(np.asarray(s.values, dtype=np.float64)[keep])
    if not ts:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    t = np.concatenate(ts)
    v = np.concatenate(vs)
    order = np.argsort(t, kind="stable")
    return t[order], v[order]


def _select(store: TrainingSource, name: str, run: str, start_ms: int, end_ms: int) -> list[SeriesData]:
    return store.select([Matcher("__name__", "=", name), Matcher("run", "=", run)], start_ms, end_ms)


def steps_at(step_t: np.ndarray, step_v: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Return the step logged at or last before each time of `t` (NaN before the first step)."""
    if step_t.size == 0:
        return np.full(t.shape, np.nan)
    i = np.searchsorted(step_t, t, side="right") - 1
    out = np.where(i >= 0, step_v[np.clip(i, 0, None)], np.nan)
    return out.astype(np.float64)


def _json_list(a: np.ndarray) -> list[float | None]:
    return [_finite(float(x)) for x in a.tolist()]


def curve(
    t: np.ndarray,
    v: np.ndarray,
    steps: np.ndarray,
    *,
    smooth: bool,
    weight: float,
    max_points: int = MAX_POINTS,
) -> dict[str, Any]:
    """One curve as the run page draws it: time (ms), step, raw and smoothed values, and the times of
    non-finite values (NaN loss), smoothed over every point before at most `max_points` are kept."""
    n = int(v.size)
    if smooth:
        idx, smoothed = smooth_and_reduce(v, weight, max_points)
    else:
        idx = reduce_indices(v, max_points)
        smoothed = None
    bad = np.flatnonzero(~np.isfinite(v))
    return {
        "points": n,
        "reduced": bool(idx.size < n),
        "t": [int(x) for x in t[idx].tolist()],
        "step": _json_list(steps[idx]),
        "raw": _json_list(v[idx]),
        "smoothed": _json_list(smoothed) if smoothed is not None else None,
        "nonfinite": [
            {"t": int(t[i]), "step": _finite(float(steps[i])), "value": str(float(v[i]))} for i in bad[:100]
        ],
    }


def run_gpus(query: InstantQuery, run: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """Return the host and GPUs a run uses: from a run-to-GPU info series where one exists (the SDK
    writes it), else from the run's own `host` and `gpus` fields; `source` says which."""
    matcher = "|".join(RUN_GPU_INFO)
    expr = f'last_over_time({{__name__=~"{matcher}", run="{promql_string(run["run"])}"}}[1d])'
    found = query(expr, now_ms)
    if isinstance(found, Vector) and len(found):
        hosts = sorted({s.labels.get("Hostname") or s.labels.get("hostname") or "" for s in found} - {""})
        gpus = sorted(
            {s.labels.get("UUID") or s.labels.get("uuid") or s.labels.get("gpu") or "" for s in found} - {""}
        )
        return {
            "hostname": hosts[0] if len(hosts) == 1 else None,
            "hosts": hosts,
            "gpus": gpus,
            "source": "info",
        }
    gpus = [str(g) for g in (run.get("gpus") or []) if str(g) != ""]
    host = run.get("host") or None
    return {
        "hostname": host,
        "hosts": [host] if host else [],
        "gpus": gpus,
        "source": "run" if gpus else "host" if host else "none",
    }


def _regex_alternatives(values: Sequence[str]) -> str:
    return "|".join(re.escape(v) for v in values)


def gpu_matchers(gpus: dict[str, Any]) -> str | None:
    """PromQL label matchers (without braces) for a run's GPUs, or None where the run names none.
    Indexes match `gpu`, `GPU-...` UUIDs match `UUID`; the host narrows both when known."""
    names = [str(g) for g in gpus.get("gpus") or []]
    hosts = gpus.get("hosts") or []
    if not names:  # a run that names only its host: every GPU of that host (the page says so)
        return f'Hostname=~"{promql_string(_regex_alternatives(hosts))}"' if hosts else None
    parts = []
    if hosts:
        parts.append(f'Hostname=~"{promql_string(_regex_alternatives(hosts))}"')
    uuids = [g for g in names if g.upper().startswith(("GPU-", "MIG-"))]
    indexes = [g for g in names if g not in uuids]
    if indexes:  # a selector cannot say "gpu or UUID": indexes win where a run mixes both
        parts.append(f'gpu=~"{promql_string(_regex_alternatives(indexes))}"')
    else:
        parts.append(f'UUID=~"{promql_string(_regex_alternatives(uuids))}"')
    return ", ".join(parts)


def energy_joules(
    query: InstantQuery, matchers: str | None, start_ms: int | None, end_ms: int
) -> float | None:
    """Energy the run's GPUs drew from its start to `end_ms` (J), where their counters are known."""
    if matchers is None or start_ms is None or end_ms <= start_ms:
        return None
    seconds = max(1, (end_ms - start_ms) // 1000)
    found = query(f"sum(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{matchers}}}[{seconds}s]))", end_ms)
    if isinstance(found, Vector) and len(found) and math.isfinite(found.samples[0].value):
        return found.samples[0].value / 1000.0  # the counter is in mJ
    return None


def last_value(store: TrainingSource, name: str, run: str, now_ms: int) -> float | None:
    """The newest finite value of `name` for `run` within the last day."""
    _t, v = _points(_select(store, name, run, now_ms - 24 * 3600 * 1000, now_ms + 600_000))
    ok = np.flatnonzero(np.isfinite(v))
    return float(v[ok[-1]]) if ok.size else None


def runs_table(store: TrainingSource, query: InstantQuery, now_ms: int) -> list[dict[str, Any]]:
    """Every run, newest first, with its state, last loss, GPUs and energy where known."""
    out = []
    for run in list_runs(store, now_ms):
        gpus = run_gpus(query, run, now_ms)
        start = int(run["start"] * 1000) if run["start"] is not None else None
        end = int(run["end"] * 1000) if run["end"] is not None else now_ms
        out.append(
            {
                **run,
                "state": run_state(run),
                "last_loss": last_value(store, "training_loss", run["run"], now_ms),
                "gpu_info": gpus,
                "energy_joules": energy_joules(query, gpu_matchers(gpus), start, end),
            }
        )
    return out


def run_logs(store: TrainingSource, run: str, start_ms: int, end_ms: int, limit: int = 500) -> dict[str, Any]:
    """The run's log lines in the range (newest first) and the events among them."""
    lines = store.log_lines(run=run, start_ms=start_ms, end_ms=end_ms, limit=limit)
    rows = [
        {"t": x.time_ms, "level": x.level, "file": x.file, "text": x.text, "event": detect_event(x.text)}
        for x in lines
    ]
    return {"lines": rows, "events": [r for r in rows if r["event"]], "truncated": len(rows) >= limit}


def run_detail(
    store: TrainingSource,
    query: InstantQuery,
    name: str,
    now_ms: int,
    *,
    start_ms: int | None = None,
    end_ms: int | None = None,
    weight: float = DEFAULT_WEIGHT,
    max_points: int = MAX_POINTS,
) -> dict[str, Any] | None:
    """One run: its summary, every curve at full resolution (smoothed first), checkpoints, GPUs and
    log events between `start_ms` and `end_ms` (default: the run's whole life). None: no such run."""
    described = next((r for r in list_runs(store, now_ms) if r["run"] == name), None)
    if described is None:
        return None
    run_start = int(described["start"] * 1000) if described["start"] is not None else None
    run_end = int(described["end"] * 1000) if described["end"] is not None else now_ms
    lo = start_ms if start_ms is not None else (run_start if run_start is not None else now_ms - 3600_000)
    hi = end_ms if end_ms is not None else run_end + 60_000
    step_t, step_v = _points(_select(store, "training_step", name, lo, hi))
    curves: dict[str, Any] = {}
    for cid, metric, smooth in CURVES:
        t, v = _points(_select(store, metric, name, lo, hi))
        if t.size == 0:
            continue
        skipped = max(0, int(t.size) - MAX_RAW_POINTS)  # the guard: the newest points of a huge range
        t, v = t[skipped:], v[skipped:]
        steps = steps_at(step_t, step_v, t)
        curves[cid] = {
            **curve(t, v, steps, smooth=smooth, weight=weight, max_points=max_points),
            "skipped_before": skipped,
        }
    ct, cv = _points(_select(store, "training_checkpoint_seconds", name, lo, hi))
    checkpoints = [
        {"t": int(a), "step": _finite(float(s)), "seconds": _finite(float(b))}
        for a, b, s in zip(ct.tolist(), cv.tolist(), steps_at(step_t, step_v, ct).tolist(), strict=True)
    ]
    gpus = run_gpus(query, described, now_ms)
    matchers = gpu_matchers(gpus)
    return {
        "run": {**described, "state": run_state(described)},
        "range": {"start": lo, "end": hi, "run_start": run_start},
        "weight": weight,
        "max_points": max_points,
        "curves": curves,
        "checkpoints": checkpoints,
        "gpus": {**gpus, "matchers": matchers},
        "energy_joules": energy_joules(query, matchers, run_start, run_end),
        "logs": run_logs(store, name, lo, hi),
    }


def parse_compare(text: str | None, first: str) -> list[str]:
    """The runs of `?compare=a,b` after `first`, without repeats, at most MAX_COMPARE in all."""
    out = [first]
    for name in (text or "").split(","):
        name = name.strip()
        if name and name not in out:
            out.append(name)
    return out[:MAX_COMPARE]
