"""`gpuwatch import` of TensorBoard event files: a run folder (or one event file) backfilled at once.

The samples are those the `tensorboard_dirs` watcher would store for the same files (same names, labels
and times), so importing a folder and then watching it stores nothing twice. Into a data directory they
are written directly and each run is recorded; through `--url` they go to `POST /api/v1/push`, which
stores the same samples and records the runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from gpuwatch.collect.importer import Prepared, SeriesSink, group_columns, write
from gpuwatch.collect.tensorboard import EVENT_FILE_MARK, TbImport, read_for_import, run_updates
from gpuwatch.collect.tfevents import load_codec
from gpuwatch.core.errors import GpuwatchError
from gpuwatch.core.model import LabelLimits, RunUpdate

POST_OBJECTS = 2000  # training points per push request (the server takes up to 10,000)
POST_BYTES = 4 * 1024 * 1024  # and bytes (it takes up to 8 MiB)
OBJECT_METRICS = 1000  # metrics per point (the server's limit)
HTTP_TIMEOUT_S = 300.0


def is_event_target(name: str) -> bool:
    """Return True if `name` is a folder or an event file (`events.out.tfevents.*`) to import."""
    if name == "-":
        return False
    path = Path(name)
    return path.is_dir() or EVENT_FILE_MARK in path.name


def looks_like_events(data: bytes) -> bool:
    """Return True if `data` starts with a TFRecord whose header checks out (an event file by content)."""
    try:
        codec = load_codec()
    except GpuwatchError:
        return False
    return codec.starts_with_record(data)


@dataclass(frozen=True)
class EventImport:
    """One folder or file read and grouped, ready to write."""

    name: str
    read: TbImport
    prepared: Prepared


def prepare_events(name: str, *, now_ms: int, limits: LabelLimits) -> EventImport:
    """Read every event file under `name`; raise GpuwatchError (one line) if there is none."""
    codec = load_codec()
    read = read_for_import(codec, name)
    if read.files == 0:
        raise GpuwatchError(f"{name}: no TensorBoard event files (names containing {EVENT_FILE_MARK!r})")
    errors: list[Any] = []
    columns = group_columns(read.points, errors, now_ms=now_ms, limits=limits)
    return EventImport(name, read, Prepared(columns, errors, read.records))


def summary(ev: EventImport, samples: int, series: int) -> str:
    """Return the line `gpuwatch import` prints for one folder or file."""
    r = ev.read
    parts = [f"{r.files} event file(s)", f"{r.records} records"]
    if r.skipped:
        parts.append(f"{r.skipped} corrupt record(s) skipped")
    if r.ignored:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(r.ignored.items()))
        parts.append(f"values not stored: {kinds}")
    return f"imported {samples} samples in {series} series from {ev.name} ({'; '.join(parts)})"


def write_local(store: SeriesSink, runs: Any, ev: EventImport) -> tuple[int, int]:
    """Write the samples and record each run (`runs.upsert_run`); return (samples, series)."""
    result = write(store, ev.prepared)
    for run, (first, newest, step) in sorted(ev.read.runs.items()):
        for update in (*run_updates(run, first, newest, step), _finish(run, newest, step)):
            runs.upsert_run(update)
    return result.samples, result.series


def _finish(run: str, newest_ms: int, step: float) -> RunUpdate:
    """A backfilled run is finished at its newest event; a watcher that sees more starts it again."""
    return RunUpdate(run, "finish", newest_ms, status="ok", last_step=step)


def _number(v: float) -> float | str:
    if math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("+Inf" if v > 0 else "-Inf")


def push_objects(ev: EventImport) -> list[dict[str, Any]]:
    """Return the samples as `POST /api/v1/push` objects: one a run and time, the step as `step`."""
    points: dict[tuple[str, int], dict[str, Any]] = {}
    for s in ev.prepared.series:
        run = dict(s.labels).get("run", "")
        for t, v in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True):
            obj = points.setdefault((run, t), {"run": run, "time": t / 1000, "metrics": {}})
            if s.name == "training_step":
                obj["step"] = _number(v)
            else:
                obj["metrics"][s.name] = _number(v)
    out: list[dict[str, Any]] = []
    for key in sorted(points, key=lambda k: (k[1], k[0])):
        obj = points[key]
        names = list(obj["metrics"])
        for i in range(0, max(len(names), 1), OBJECT_METRICS):  # very many tags at one time: split
            out.append({**obj, "metrics": {n: obj["metrics"][n] for n in names[i : i + OBJECT_METRICS]}})
    return out


def _bodies(objects: list[dict[str, Any]]) -> list[bytes]:
    """Return the objects as JSON arrays of at most POST_OBJECTS objects and about POST_BYTES each."""
    bodies: list[bytes] = []
    chunk: list[bytes] = []
    size = 0
    for obj in objects:
        item = json.dumps(obj).encode()
        if chunk and (len(chunk) >= POST_OBJECTS or size + len(item) > POST_BYTES):
            bodies.append(b"[" + b",".join(chunk) + b"]")
            chunk, size = [], 0
        chunk.append(item)
        size += len(item) + 1
    if chunk:
        bodies.append(b"[" + b",".join(chunk) + b"]")
    return bodies


def post(url: str, ev: EventImport, auth: dict[str, str] | None = None) -> tuple[int, int]:
    """Send the samples to a running gpuwatch (with `auth`'s Authorization header) and record the runs;
    return (samples, series) as it counted them."""
    samples = 0
    runs = sorted(ev.read.runs.items())
    for run, (first, _, _) in runs:
        _send(url, "/api/v1/runs", ev.name, {"run": run, "action": "init", "time": first / 1000}, auth)
    for body in _bodies(push_objects(ev)):
        samples += int(_send(url, "/api/v1/push", ev.name, body, auth)["samples"])
    for run, (_, newest, step) in runs:
        finish = {"run": run, "action": "finish", "status": "ok", "time": newest / 1000, "step": step}
        _send(url, "/api/v1/runs", ev.name, finish, auth)
    return samples, len(ev.prepared.series)


def _send(
    url: str, path: str, name: str, body: bytes | dict[str, Any], auth: dict[str, str] | None
) -> dict[str, Any]:
    """POST one JSON body; return the answer's `data`, or raise ConnectionError / GpuwatchError."""
    endpoint = url.rstrip("/") + path
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        resp = requests.post(
            endpoint,
            data=data,
            headers={**(auth or {}), "Content-Type": "application/json"},
            timeout=HTTP_TIMEOUT_S,
        )
        answer = resp.json()
    except requests.RequestException as exc:
        raise ConnectionError(f"cannot reach {url.rstrip('/')}: {type(exc).__name__}") from None
    except ValueError:
        raise ConnectionError(f"{endpoint} answered HTTP {resp.status_code} without JSON") from None
    if answer.get("status") != "success":
        raise GpuwatchError(f"{name}: server refused the import: {answer.get('error')}")
    return dict(answer.get("data") or {})
