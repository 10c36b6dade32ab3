"""Pushed metrics: Pushgateway grouping keys and groups, and JSON training pushes, turned into Samples.

Pushgateway semantics (`PUT`/`POST`/`DELETE /metrics/job/<job>{/<label>/<value>}`): a group is the set
of metrics pushed under one grouping key. PUT replaces the whole group, POST replaces only the metric
families present in the body, DELETE removes the group. Every pushed series carries the grouping-key
labels, and each group has `push_time_seconds`.

Storing: a Pushgateway keeps the last pushed values and Prometheus scrapes them every 15 s, so rules and
`rate()` see a steady series. gpuwatch writes the samples at push time and, while the group exists,
writes its last values again every `REEMIT_INTERVAL_S` (`PushGroups.current`). Series that a PUT or POST
removes, and every series of a deleted group, get a staleness marker, so queries stop seeing them at
once rather than after the 5-minute lookback. Groups live in memory: after a restart they are gone
until the next push (a Pushgateway without `--persistence.file` behaves the same).

Everything here is pure: the caller stamps the time and hands the returned samples to the store.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatch.core.errors import GpuwatchError
from gpuwatch.core.model import (
    DEFAULT_LABEL_LIMITS,
    STALE_NAN,
    LabelLimits,
    Labels,
    MetricInfo,
    Sample,
    is_utf8,
    make_labels,
)
from gpuwatch.promtext.result import ParseResult

REEMIT_INTERVAL_S = 15.0
MAX_SERIES_PER_GROUP = 50_000
MAX_GROUPS = 10_000
MAX_POINTS = 10_000  # objects in one JSON push
MAX_METRICS = 1_000  # metrics in one JSON object
MAX_NAME = 200  # characters of a run or metric name

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created", "_gcount", "_gsum", "_info")

TRAINING_JOB = "training"
# Short names a training loop uses -> the stored metric name (anything else: training_<name>).
TRAINING_NAMES: dict[str, str] = {
    "step": "training_step",
    "loss": "training_loss",
    "lr": "training_learning_rate",
    "learning_rate": "training_learning_rate",
    "grad_norm": "training_grad_norm",
    "tokens_per_second": "training_throughput_tokens_per_second",
    "samples_per_second": "training_throughput_samples_per_second",
    "checkpoint_seconds": "training_checkpoint_seconds",
}

PUSH_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "push_time_seconds", "gauge", "Last time a group was pushed (Pushgateway).", "seconds", ("job",)
    ),
    MetricInfo("training_step", "gauge", "Last step a training run logged.", "", ("run", "job")),
    MetricInfo("training_loss", "gauge", "Training loss.", "", ("run", "job")),
    MetricInfo("training_learning_rate", "gauge", "Learning rate.", "", ("run", "job")),
    MetricInfo("training_grad_norm", "gauge", "Gradient norm.", "", ("run", "job")),
    MetricInfo(
        "training_throughput_tokens_per_second", "gauge", "Training throughput in tokens.", "", ("run", "job")
    ),
    MetricInfo(
        "training_throughput_samples_per_second",
        "gauge",
        "Training throughput in samples.",
        "",
        ("run", "job"),
    ),
    MetricInfo(
        "training_checkpoint_seconds",
        "gauge",
        "How long the last checkpoint took.",
        "seconds",
        ("run", "job"),
    ),
)


class PushError(GpuwatchError):
    """A push was malformed or over a limit; the message names the problem."""

    http_status = 400


# -- Pushgateway ------------------------------------------------------------------------------------


def _check_label(name: str, value: str, where: str) -> None:
    if not LABEL_NAME.fullmatch(name) or name.startswith("__"):
        raise PushError(f"{where}: invalid label name {name!r}")


def _check_limits(labels: Mapping[str, str], where: str, limits: LabelLimits) -> None:
    problem = limits.problem(labels.items())
    if problem is not None:
        raise PushError(f"{where}: {problem}")


def parse_grouping_key(path: str, limits: LabelLimits = DEFAULT_LABEL_LIMITS) -> Labels:
    """Turn `job/<job>{/<label>/<value>}` (as after `/metrics/`) into the group's labels.

    A `<label>@base64` segment means the value is URL-safe base64 (padding optional; `=` is empty).
    """
    parts = path.split("/")
    if len(parts) < 2 or parts[0] not in ("job", "job@base64"):
        raise PushError("the path must be /metrics/job/<job>{/<label>/<value>}")
    if len(parts) % 2:
        raise PushError(f"grouping key: label {parts[-1]!r} has no value")
    key: dict[str, str] = {}
    for i in range(0, len(parts), 2):
        name, value = parts[i], parts[i + 1]
        if name.endswith("@base64"):
            name = name[: -len("@base64")]
            try:
                padded = value.rstrip("=") + "=" * (-len(value.rstrip("=")) % 4)
                value = base64.b64decode(padded.encode("ascii"), altchars=b"-_", validate=True).decode(
                    "utf-8"
                )
            except (binascii.Error, ValueError, UnicodeError):
                raise PushError(f"grouping key: value of {name!r} is not valid base64") from None
        _check_label(name, value, "grouping key")
        if name in key:
            raise PushError(f"grouping key: label {name!r} appears twice")
        key[name] = value
    if not key.get("job"):
        raise PushError("grouping key: the job name is empty")
    _check_limits(key, "grouping key", limits)
    return make_labels(key)


def _family(name: str, metadata: Mapping[str, Any]) -> str:
    """Return the metric family a sample name belongs to (`x_bucket` -> `x` when `x` is typed)."""
    if name in metadata:
        return name
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in metadata:
            return name[: -len(suffix)]
    return name


# family name -> {(sample name, labels): value}
Families = dict[str, dict[tuple[str, Labels], float]]


def families_from(result: ParseResult, key: Labels, limits: LabelLimits = DEFAULT_LABEL_LIMITS) -> Families:
    """Group a parsed push body by family, adding the grouping-key labels; raise PushError if invalid."""
    if result.errors:
        first = result.errors[0]
        more = f" (and {len(result.errors) - 1} more)" if len(result.errors) > 1 else ""
        raise PushError(f"invalid push body: {first}{more}")
    if len(result.samples) > MAX_SERIES_PER_GROUP:
        raise PushError(f"push has {len(result.samples)} samples, more than {MAX_SERIES_PER_GROUP}")
    key_map = dict(key)
    out: Families = {}
    for name, labels, ts, value in result.samples:
        if ts is not None:
            raise PushError(f"pushed metrics must not carry timestamps ({name})")
        merged = dict(labels)
        for k, v in labels:
            _check_label(k, v, name)
            if k in key_map and v != key_map[k]:
                raise PushError(
                    f"{name}: label {k}={v!r} conflicts with the grouping key's {k}={key_map[k]!r}"
                )
        merged.update(key_map)
        _check_limits({"__name__": name, **merged}, name, limits)
        fam = out.setdefault(_family(name, result.metadata), {})
        series = (name, make_labels(merged))
        if series in fam:
            raise PushError(f"{name}{{{','.join(f'{k}={v!r}' for k, v in series[1])}}} appears twice")
        fam[series] = value
    return out


@dataclass
class _Group:
    families: Families
    push_time_s: float


class PushGroups:
    """The pushed groups held in memory; thread-safe. Each method returns the samples to store."""

    def __init__(self) -> None:
        self._groups: dict[Labels, _Group] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._groups)

    def push(self, key: Labels, families: Families, now_ms: int, *, replace_all: bool) -> list[Sample]:
        """Apply a PUT (`replace_all`) or POST; return the new values and markers for dropped series."""
        with self._lock:
            old = self._groups.get(key)
            if old is None and len(self._groups) >= MAX_GROUPS:
                raise PushError(f"too many push groups (at most {MAX_GROUPS}); DELETE some first")
            before = old.families if old is not None else {}
            after: Families = dict(families) if replace_all else {**before, **families}
            if sum(len(f) for f in after.values()) > MAX_SERIES_PER_GROUP:
                raise PushError(f"the group would hold more than {MAX_SERIES_PER_GROUP} series")
            self._groups[key] = _Group(after, now_ms / 1000.0)
        kept = {s for fam in after.values() for s in fam}
        out = [Sample(n, lb, STALE_NAN) for fam in before.values() for (n, lb) in fam if (n, lb) not in kept]
        out.extend(_values(after))
        out.append(Sample("push_time_seconds", key, now_ms / 1000.0))
        return out

    def delete(self, key: Labels) -> list[Sample]:
        """Remove a group (absent is fine, as in Pushgateway); return staleness markers for its series."""
        with self._lock:
            old = self._groups.pop(key, None)
        if old is None:
            return []
        out = [Sample(n, lb, STALE_NAN) for fam in old.families.values() for (n, lb) in fam]
        out.append(Sample("push_time_seconds", key, STALE_NAN))
        return out

    def current(self) -> list[Sample]:
        """Return every group's last values and push time (written again every REEMIT_INTERVAL_S)."""
        with self._lock:
            groups = list(self._groups.items())
        out: list[Sample] = []
        for key, group in groups:
            out.extend(_values(group.families))
            out.append(Sample("push_time_seconds", key, group.push_time_s))
        return out


def _values(families: Families) -> Iterable[Sample]:
    return (Sample(n, lb, v) for fam in families.values() for (n, lb), v in fam.items())


# -- JSON training pushes ---------------------------------------------------------------------------


def training_name(name: str) -> str:
    """Map a metric name a training loop logs to the stored name (`lr` -> `training_learning_rate`)."""
    if name in TRAINING_NAMES:
        return TRAINING_NAMES[name]
    return name if name.startswith("training_") else f"training_{name}"


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or value is None:
        raise PushError(f"{where}: expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:
            raise PushError(f"{where}: number out of range") from None
    if isinstance(value, str):
        spelled = value.strip().lower().lstrip("+")
        if spelled in ("nan", "inf", "infinity", "-inf", "-infinity"):
            return float(spelled)
    raise PushError(f"{where}: expected a number, got {value!r}"[:300])


@dataclass(frozen=True)
class TrainingPoint:
    """One validated JSON push object: its run, step, time and the samples it makes."""

    run: str
    step: float | None
    time_ms: int
    samples: list[Sample]


def parse_training(body: Any, now_ms: int, limits: LabelLimits = DEFAULT_LABEL_LIMITS) -> list[TrainingPoint]:
    """Validate a JSON push (one object or a list) and turn it into samples; raise PushError if invalid."""
    items = body if isinstance(body, list) else [body]
    if len(items) > MAX_POINTS:
        raise PushError(f"{len(items)} objects in one push, at most {MAX_POINTS}")
    return [
        _training_point(item, i if isinstance(body, list) else None, now_ms, limits)
        for i, item in enumerate(items)
    ]


def _training_point(item: Any, index: int | None, now_ms: int, limits: LabelLimits) -> TrainingPoint:
    where = "body" if index is None else f"body[{index}]"
    if not isinstance(item, dict):
        raise PushError(f"{where}: expected an object with run and metrics")
    unknown = sorted(set(item) - {"run", "step", "metrics", "time", "labels"})
    if unknown:
        raise PushError(f"{where}: unknown field {unknown[0]!r}")
    run = item.get("run")
    if not isinstance(run, str) or not run or len(run) > MAX_NAME or not is_utf8(run):
        raise PushError(f"{where}.run: expected a non-empty UTF-8 string of at most {MAX_NAME} characters")
    metrics = item.get("metrics", {})
    if not isinstance(metrics, dict):
        raise PushError(f"{where}.metrics: expected an object of name: number")
    if len(metrics) > MAX_METRICS:
        raise PushError(f"{where}.metrics: more than {MAX_METRICS} metrics")
    time_ms = now_ms
    if item.get("time") is not None:
        t = _number(item["time"], f"{where}.time")
        if not math.isfinite(t) or not 0 <= t < 1e11:
            raise PushError(f"{where}.time: expected Unix seconds, got {item['time']!r}")
        time_ms = int(round(t * 1000))
    labels: dict[str, str] = {}
    extra = item.get("labels") or {}
    if not isinstance(extra, dict):
        raise PushError(f"{where}.labels: expected an object of name: string")
    for k, v in extra.items():
        if not isinstance(v, str):
            raise PushError(f"{where}.labels.{k}: expected a string")
        _check_label(str(k), v, f"{where}.labels")
        labels[k] = v
    labels.setdefault("job", TRAINING_JOB)
    labels["run"] = run
    _check_label("run", run, where)
    _check_limits({"__name__": "training_step", **labels}, f"{where}.labels", limits)
    key = make_labels(labels)
    samples: list[Sample] = []
    step: float | None = None
    if item.get("step") is not None:
        step = _number(item["step"], f"{where}.step")
        samples.append(Sample("training_step", key, step))
    for name, value in metrics.items():
        if not isinstance(name, str) or len(name) > MAX_NAME:
            raise PushError(f"{where}.metrics: invalid metric name {str(name)[:MAX_NAME]!r}")
        stored = training_name(name)
        if not METRIC_NAME.fullmatch(stored):
            raise PushError(f"{where}.metrics: invalid metric name {name!r}")
        samples.append(Sample(stored, key, _number(value, f"{where}.metrics.{name}")))
    return TrainingPoint(run, step, time_ms, samples)
