"""Training runs: validate the SDK's init/finish requests and describe runs with progress and ETA."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from gpuwatch.collect.push import MAX_NAME, PushError
from gpuwatch.core.model import (
    Matcher,
    MetricInfo,
    RunRecord,
    RunUpdate,
    Sample,
    SeriesData,
    is_stale,
    is_utf8,
    stable_labels,
)

RATE_WINDOW_MS = 10 * 60 * 1000  # the step rate (and so the ETA) comes from the last 10 minutes
STALLED_AFTER_MS = 10 * 60 * 1000  # a running run silent this long is reported as stalled
RUN_FEED_WINDOW_MS = 5 * 60 * 1000  # a node's run gauges count while one arrived this recently
SEEN_WRITE_INTERVAL_MS = 10_000  # at most one database write of a run's last step per run and interval
STATUSES = ("ok", "failed")
MAX_CONFIG_CHARS = 256 * 1024


class RunSource(Protocol):
    """What describing runs needs from the store."""

    def runs(self) -> list[RunRecord]: ...

    def select(self, matchers: list[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...


def parse_run_request(body: Any, now_ms: int) -> RunUpdate:  # noqa: C901 - one check per field of the request
    """Validate `POST /api/v1/runs` (`{"run", "action": "init"|"finish", ...}`); raise PushError if bad."""
    if not isinstance(body, dict):
        raise PushError("body: expected an object with run and action")
    unknown = sorted(
        set(body)
        - {"run", "action", "status", "total_steps", "config", "host", "gpus", "time", "step", "process"}
    )
    if unknown:
        raise PushError(f"body: unknown field {unknown[0]!r}")
    run = body.get("run")
    if not isinstance(run, str) or not run or len(run) > MAX_NAME or not is_utf8(run):
        raise PushError(f"run: expected a non-empty UTF-8 string of at most {MAX_NAME} characters")
    action = body.get("action")
    if action not in ("init", "finish"):
        raise PushError(f"action: expected 'init' or 'finish', got {action!r}")
    status = body.get("status")
    if action == "finish":
        status = status or "ok"
        if status not in STATUSES:
            raise PushError(f"status: expected one of {', '.join(STATUSES)}, got {status!r}")
    elif status is not None:
        raise PushError("status: only a finish sets the status")
    total = body.get("total_steps")
    if total is not None and (
        isinstance(total, bool) or not isinstance(total, int) or not 0 <= total < 2**62
    ):
        raise PushError(f"total_steps: expected a non-negative integer, got {total!r}")
    config = body.get("config")
    if config is not None:
        if not isinstance(config, dict):
            raise PushError("config: expected an object")
        try:
            if len(json.dumps(config, allow_nan=False)) > MAX_CONFIG_CHARS:
                raise PushError(f"config: larger than {MAX_CONFIG_CHARS // 1024} KiB")
        except ValueError:
            raise PushError("config: NaN and Infinity cannot be stored; use strings") from None
    host = body.get("host")
    if host is not None and (not isinstance(host, str) or len(host) > MAX_NAME or not is_utf8(host)):
        raise PushError("host: expected a UTF-8 string")
    gpus = body.get("gpus")
    if gpus is not None and (not isinstance(gpus, list) or len(gpus) > 4096):
        raise PushError("gpus: expected a list (indexes or UUIDs)")
    process = parse_process(body.get("process"))
    time_ms = now_ms
    t = body.get("time")
    if t is not None:
        if (
            isinstance(t, bool)
            or not isinstance(t, (int, float))
            or not math.isfinite(t)
            or not 0 <= t < 1e11
        ):
            raise PushError(f"time: expected Unix seconds, got {t!r}")
        time_ms = int(round(t * 1000))
    step = body.get("step")
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, (int, float)) or not -(2**62) < step < 2**62
    ):
        raise PushError(f"step: expected a number, got {step!r}")
    return RunUpdate(
        name=run,
        action=action,
        time_ms=time_ms,
        status=status,
        total_steps=total,
        config=config,
        host=host,
        gpus=gpus,
        last_step=float(step) if step is not None else None,
        process=process,
    )


def _pid(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**31:
        raise PushError(f"{where}: expected a process id, got {value!r}")
    return value


def parse_process(value: Any) -> dict[str, Any] | None:
    """Validate the `process` of an init: `{"pid", "launcher_pid", "cuda_visible_devices", "cuda_device"}`."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PushError("process: expected an object")
    unknown = sorted(set(value) - {"pid", "launcher_pid", "cuda_visible_devices", "cuda_device"})
    if unknown:
        raise PushError(f"process: unknown field {unknown[0]!r}")
    out: dict[str, Any] = {}
    for key in ("pid", "launcher_pid"):
        pid = _pid(value.get(key), f"process.{key}")
        if pid is not None:
            out[key] = pid
    visible = value.get("cuda_visible_devices")
    if visible is not None:
        if not isinstance(visible, str) or len(visible) > 4096:
            raise PushError("process.cuda_visible_devices: expected a string")
        out["cuda_visible_devices"] = visible
    device = value.get("cuda_device")
    if device is not None:
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < 4096:
            raise PushError(f"process.cuda_device: expected a device number, got {device!r}")
        out["cuda_device"] = device
    return out


class SeenThrottle:
    """Pick which run sightings (last step, last seen) to write: at most one per run every 10 s.

    Each write waits for the store's writer, which flushes first; a loop pushing every second would
    flush once a second per run. `list_runs` reads the newest step from `training_step` itself, so the
    stored last step only needs to be roughly current.
    """

    def __init__(self, interval_ms: int = SEEN_WRITE_INTERVAL_MS, max_runs: int = 10_000) -> None:
        self.interval_ms = interval_ms
        self.max_runs = max_runs
        self._last: dict[str, int] = {}
        self._lock = threading.Lock()

    def admit(self, run: str, now_ms: int) -> bool:
        """Return True if a sighting of `run` at `now_ms` should be written now."""
        with self._lock:
            last = self._last.get(run)
            if last is not None and 0 <= now_ms - last < self.interval_ms:
                return False
            if len(self._last) >= self.max_runs:
                self._last.clear()
            self._last[run] = now_ms
            return True


def latest_step(series: list[SeriesData]) -> tuple[int, float] | None:
    """Return the newest (time ms, step) among the given `training_step` samples, skipping markers."""
    best: tuple[int, float] | None = None
    for s in series:
        for t, v in zip(s.timestamps_ms[::-1], s.values[::-1], strict=True):
            if math.isfinite(float(v)):
                if best is None or int(t) > best[0]:
                    best = (int(t), float(v))
                break
    return best


def step_rate(series: list[SeriesData]) -> float | None:
    """Return steps per second over the given `training_step` samples (None when unknown)."""
    best: float | None = None
    for s in series:
        keep = [i for i, v in enumerate(s.values) if not is_stale(float(v)) and math.isfinite(float(v))]
        if len(keep) < 2:
            continue
        i, j = keep[0], keep[-1]
        dt = (int(s.timestamps_ms[j]) - int(s.timestamps_ms[i])) / 1000.0
        if dt <= 0:
            continue
        rate = (float(s.values[j]) - float(s.values[i])) / dt
        best = rate if best is None else max(best, rate)
    return best


def describe(
    record: RunRecord,
    rate: float | None,
    now_ms: int,
    energy_kwh: float | None = None,
    price_per_kwh: float = 0.0,
    currency: str = "",
) -> dict[str, Any]:
    """Return one run as `GET /api/v1/runs` shows it: times in Unix seconds, progress 0-1, ETA seconds,
    energy in kWh and its cost (None without a price)."""
    progress = None
    if record.total_steps and record.last_step is not None:
        progress = max(0.0, min(1.0, record.last_step / record.total_steps))
    eta = None
    if (
        record.status == "running"
        and rate is not None
        and rate > 0
        and record.total_steps is not None
        and record.last_step is not None
    ):
        eta = max(0.0, (record.total_steps - record.last_step) / rate)
    is_stalled = (
        record.status == "running"
        and record.last_seen_ms is not None
        and now_ms - record.last_seen_ms > STALLED_AFTER_MS
    )
    return {
        "run": record.name,
        "status": record.status,
        "is_stalled": is_stalled,
        "start": _seconds(record.start_ms),
        "end": _seconds(record.end_ms),
        "last_seen": _seconds(record.last_seen_ms),
        "total_steps": record.total_steps,
        "last_step": record.last_step,
        "progress": progress,
        "steps_per_second": rate,
        "eta_seconds": eta,
        "host": record.host,
        "gpus": record.gpus,
        "config": record.config,
        "process": record.process,
        "energy_kwh": energy_kwh,
        "cost": energy_kwh * price_per_kwh if energy_kwh is not None and price_per_kwh > 0 else None,
        "currency": currency if price_per_kwh > 0 else None,
    }


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000.0


def list_runs(
    store: RunSource,
    now_ms: int,
    energy_kwh: Callable[[RunRecord], float | None] | None = None,
    price_per_kwh: float = 0.0,
    currency: str = "",
) -> list[dict[str, Any]]:
    """Return every run with progress and ETA from its step rate over the last 10 minutes, and its
    energy (`energy_kwh(record)`, see `collect.runenergy`) and cost: this gpuwatch's own runs
    (`instance` None), then those of the nodes it scrapes (`federated_runs`)."""
    out = []
    for record in store.runs():
        rate = None
        if record.status == "running":
            found = store.select(
                [
                    Matcher("__name__", "=", "training_step"),
                    Matcher("run", "=", record.name),
                    Matcher("instance", "=", ""),  # not a node's run of the same name
                ],
                now_ms - RATE_WINDOW_MS,
                now_ms + RATE_WINDOW_MS,  # a trainer's clock may run ahead of ours
            )
            rate = step_rate(found)
            newest = latest_step(found)
            if newest is not None and newest[0] > (record.last_seen_ms or 0):
                record = replace(record, last_step=newest[1], last_seen_ms=newest[0])
        kwh = energy_kwh(record) if energy_kwh is not None else None
        out.append({**describe(record, rate, now_ms, kwh, price_per_kwh, currency), "instance": None})
    out.extend(federated_runs(store, now_ms))
    return out


def _newest(series: SeriesData) -> tuple[int, float] | None:
    for i in range(len(series.values) - 1, -1, -1):
        v = float(series.values[i])
        if not is_stale(v):
            return int(series.timestamps_ms[i]), v
    return None


def federated_runs(store: RunSource, now_ms: int) -> list[dict[str, Any]]:
    """Return the runs of the gpuwatch nodes this one scrapes, from their run gauges (RUN_METRICS, which
    a node writes every 15 s and a hub receives through /federate with the node's `instance`) and
    their `training_step`; each with the node's `instance`, as `list_runs` describes runs."""
    found = store.select(
        [Matcher("__name__", "=~", "gpuwatch_training_run_.+"), Matcher("instance", "!=", "")],
        now_ms - RUN_FEED_WINDOW_MS,
        now_ms + RATE_WINDOW_MS,
    )
    fields: dict[tuple[str, str], dict[str, Any]] = {}
    for s in found:
        labels = dict(s.labels)
        newest = _newest(s)
        run, instance = labels.get("run", ""), labels.get("instance", "")
        if newest is None or not run:
            continue
        f = fields.setdefault((instance, run), {})
        t, v = newest
        if s.name == "gpuwatch_training_run_info":
            if t >= f.get("info_ms", -1):  # a status change starts a new info series: the newest wins
                f.update(info_ms=t, status=labels.get("status", "running"), host=labels.get("host") or None)
        else:
            f[s.name] = v
    out = []
    for (instance, run), f in sorted(fields.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if "info_ms" not in f:
            continue
        total = f.get("gpuwatch_training_run_total_steps")
        start = f.get("gpuwatch_training_run_start_timestamp_seconds")
        end = f.get("gpuwatch_training_run_end_timestamp_seconds")
        seen = f.get("gpuwatch_training_run_last_seen_timestamp_seconds")
        record = RunRecord(
            name=run,
            status=f["status"],
            start_ms=None if start is None else int(start * 1000),
            end_ms=None if end is None else int(end * 1000),
            total_steps=None if total is None else int(total),
            config=None,
            host=f["host"],
            gpus=None,
            last_step=None,
            last_seen_ms=None if seen is None else int(seen * 1000),
        )
        steps = store.select(
            [
                Matcher("__name__", "=", "training_step"),
                Matcher("run", "=", run),
                Matcher("instance", "=", instance),
            ],
            now_ms - RATE_WINDOW_MS,
            now_ms + RATE_WINDOW_MS,
        )
        newest_step = latest_step(steps)
        if newest_step is not None:
            record = replace(
                record,
                last_step=newest_step[1],
                last_seen_ms=max(newest_step[0], record.last_seen_ms or 0),
            )
        rate = step_rate(steps) if record.status == "running" else None
        out.append({**describe(record, rate, now_ms), "instance": instance})
    return out


RUN_STATUS_INTERVAL_S = 15.0  # how often the run-status gauges are written (the `runs` job)
RUN_STATUS_MAX_SILENCE_MS = 24 * 3600 * 1000  # a running run silent for a day is abandoned: no more gauges
RUN_STATUS_FINISHED_MS = (
    2 * 3600 * 1000
)  # finished runs keep `running 0` this long, for rules that join on it

RUN_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "gpuwatch_training_run_running",
        "gauge",
        "1 while a training run is running, 0 once it finished (ok or failed).",
        "",
        ("run",),
    ),
    MetricInfo(
        "gpuwatch_training_run_last_seen_timestamp_seconds",
        "gauge",
        "When a training run last logged a step or figure (Unix seconds).",
        "seconds",
        ("run",),
    ),
    MetricInfo(
        "gpuwatch_training_run_info",
        "gauge",
        "A training run's status (running, ok, failed) and host, always 1; a hub lists its nodes' runs from it.",
        "",
        ("run", "status", "host"),
    ),
    MetricInfo(
        "gpuwatch_training_run_start_timestamp_seconds",
        "gauge",
        "When a training run started (Unix seconds).",
        "seconds",
        ("run",),
    ),
    MetricInfo(
        "gpuwatch_training_run_end_timestamp_seconds",
        "gauge",
        "When a finished training run ended (Unix seconds).",
        "seconds",
        ("run",),
    ),
    MetricInfo(
        "gpuwatch_training_run_total_steps",
        "gauge",
        "The steps a training run was started for (its init's total_steps), where given.",
        "",
        ("run",),
    ),
)


def run_status_samples(records: list[RunRecord], now_ms: int) -> list[Sample]:
    """Return each recent run's gauges (RUN_METRICS): running ones seen within a day, finished ones for
    two hours. The training rules join on them; a hub lists its nodes' runs from them."""
    out: list[Sample] = []
    for r in records:
        seen_ms = r.last_seen_ms or r.start_ms or now_ms
        running = r.status == "running"
        if running and now_ms - seen_ms > RUN_STATUS_MAX_SILENCE_MS:
            continue
        if not running and now_ms - (r.end_ms or seen_ms) > RUN_STATUS_FINISHED_MS:
            continue
        labels = stable_labels({"run": r.name})
        out.append(Sample("gpuwatch_training_run_running", labels, 1.0 if running else 0.0))
        out.append(Sample("gpuwatch_training_run_last_seen_timestamp_seconds", labels, seen_ms / 1000))
        info = stable_labels({"run": r.name, "status": r.status, "host": r.host or ""})
        out.append(Sample("gpuwatch_training_run_info", info, 1.0))
        if r.start_ms is not None:
            out.append(Sample("gpuwatch_training_run_start_timestamp_seconds", labels, r.start_ms / 1000))
        if r.end_ms is not None and not running:
            out.append(Sample("gpuwatch_training_run_end_timestamp_seconds", labels, r.end_ms / 1000))
        if r.total_steps is not None:
            out.append(Sample("gpuwatch_training_run_total_steps", labels, float(r.total_steps)))
    return out
