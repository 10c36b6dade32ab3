"""Alert state machines and recording-rule results: pure functions of a query result and the time.

`evaluate(rule, samples, state, now_ms)` follows Prometheus's `AlertingRule.Eval`: a series in the
result starts a pending alert (active_at = now); it fires once it has been active for `for`; when it
leaves the result a pending alert is dropped and a firing one resolves, unless `keep_firing_for`
keeps it firing that much longer; resolved alerts stay 15 minutes (for notifications), then go.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gpuwatch.core.model import Labels, Sample, make_labels, stable_labels
from gpuwatch.rules.load import Rule
from gpuwatch.rules.template import render

PENDING, FIRING, INACTIVE = "pending", "firing", "inactive"
RESOLVED_RETENTION_MS = 15 * 60 * 1000


class EvaluationError(Exception):
    """A rule's result cannot be turned into alerts or samples (duplicate label sets)."""


@dataclass(frozen=True)
class Alert:
    """One alert of an alerting rule; `labels` include `alertname`; times in Unix milliseconds."""

    labels: Labels
    annotations: Labels
    state: str
    active_at_ms: int
    value: float
    fired_at_ms: int | None = None
    resolved_at_ms: int | None = None
    keep_firing_since_ms: int | None = None
    last_eval_ms: int = 0


@dataclass(frozen=True)
class Transition:
    """An alert changing state (from `inactive` when new, to `inactive` when resolved or dropped)."""

    labels: Labels
    before: str
    after: str
    at_ms: int


# Alerts of one rule by their label set.
AlertState = Mapping[Labels, Alert]


def _expand(
    templates: Labels, labels: Mapping[str, str], value: float, external: Mapping[str, str]
) -> dict[str, str]:
    return {k: render(v, labels, value, external) for k, v in templates}


def alert_candidates(
    rule: Rule, samples: Sequence[tuple[Mapping[str, str], float]], external: Mapping[str, str] | None = None
) -> dict[Labels, tuple[Labels, float]]:
    """Return each result series' alert labels -> (annotations, value), with templates expanded."""
    external = external or {}
    out: dict[Labels, tuple[Labels, float]] = {}
    for sample_labels, value in samples:
        base = {k: v for k, v in sample_labels.items() if k != "__name__"}
        labels = {**base, **_expand(rule.labels, base, value, external), "alertname": rule.name}
        key = make_labels(labels)
        if key in out:
            raise EvaluationError(
                "vector contains metrics with the same labelset after applying alert labels"
            )
        annotations = make_labels(_expand(rule.annotations, base, value, external))
        out[key] = (annotations, value)
    return out


def evaluate(
    rule: Rule,
    samples: Sequence[tuple[Mapping[str, str], float]],
    state: AlertState,
    now_ms: int,
    external_labels: Mapping[str, str] | None = None,
) -> tuple[dict[Labels, Alert], list[Transition]]:
    """Advance one alerting rule's alerts by one evaluation of its expression's result `samples`."""
    found = alert_candidates(rule, samples, external_labels)
    hold_ms = int(rule.for_s * 1000)
    keep_ms = int(rule.keep_firing_for_s * 1000)
    active: dict[Labels, Alert] = dict(state)
    transitions: list[Transition] = []
    for key, (notes, value) in found.items():
        old = active.get(key)
        if old is not None and old.state != INACTIVE:
            active[key] = replace(old, value=value, annotations=notes)
            continue
        active[key] = Alert(key, notes, PENDING, now_ms, value)
        transitions.append(Transition(key, INACTIVE, PENDING, now_ms))
    out: dict[Labels, Alert] = {}
    for key, a in active.items():
        if key not in found:
            keep_firing = False
            if a.state == FIRING and keep_ms > 0:
                if a.keep_firing_since_ms is None:
                    a = replace(a, keep_firing_since_ms=now_ms)
                keep_firing = now_ms - (a.keep_firing_since_ms or now_ms) < keep_ms
            if a.state == PENDING or (
                a.resolved_at_ms is not None and now_ms - a.resolved_at_ms > RESOLVED_RETENTION_MS
            ):
                if a.state == PENDING:
                    transitions.append(Transition(key, PENDING, INACTIVE, now_ms))
                continue
            if a.state != INACTIVE and not keep_firing:
                transitions.append(Transition(key, a.state, INACTIVE, now_ms))
                a = replace(a, state=INACTIVE, resolved_at_ms=now_ms)
            if not keep_firing:
                out[key] = a
                continue
        elif a.keep_firing_since_ms is not None:
            a = replace(a, keep_firing_since_ms=None)
        if a.state == PENDING and now_ms - a.active_at_ms >= hold_ms:
            a = replace(a, state=FIRING, fired_at_ms=now_ms)
            transitions.append(Transition(key, PENDING, FIRING, now_ms))
        out[key] = replace(a, last_eval_ms=now_ms)
    return out, transitions


def alert_series(alerts: AlertState) -> list[Sample]:
    """Return the `ALERTS` (1, by state) and `ALERTS_FOR_STATE` (active_at seconds) samples of active alerts."""
    out: list[Sample] = []
    for a in alerts.values():
        if a.state == INACTIVE:
            continue
        out.append(Sample("ALERTS", stable_labels({**dict(a.labels), "alertstate": a.state}), 1.0))
        out.append(Sample("ALERTS_FOR_STATE", a.labels, a.active_at_ms / 1000))
    return out


def record_samples(rule: Rule, samples: Sequence[tuple[Mapping[str, str], float]]) -> list[Sample]:
    """Return a recording rule's result as samples named `rule.name` with the rule's labels."""
    out: list[Sample] = []
    seen: set[Labels] = set()
    extra = dict(rule.labels)
    for sample_labels, value in samples:
        labels = stable_labels({**{k: v for k, v in sample_labels.items() if k != "__name__"}, **extra})
        if labels in seen:
            raise EvaluationError("vector contains metrics with the same labelset after applying rule labels")
        seen.add(labels)
        out.append(Sample(rule.name, labels, value))
    return out
