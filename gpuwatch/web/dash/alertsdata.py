"""What the alerts page shows: firing and pending alerts with how long and the silences muting them,
rule groups with their state, last evaluation and errors, the recent transitions, and for each alert
the Explore link's query and time range. Silences themselves go through `/api/v2/silences`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuwatch.notify.api import AmAlert
from gpuwatch.rules.api import rule_json
from gpuwatch.rules.evaluate import FIRING, INACTIVE, PENDING, Alert
from gpuwatch.rules.load import Rule
from gpuwatch.rules.state import GroupState, HistoryEntry

MutedBy = Callable[[Mapping[str, str], int], list[str]]
EXPLORE_BEFORE_MS = 3600_000  # an alert's Explore range starts this long before it became active
SILENCE_SKIP = frozenset({"alertstate", "__name__"})  # never matchers of a silence made from an alert


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


def silence_matchers(labels: Mapping[str, str]) -> list[dict[str, Any]]:
    """The matchers a silence made from an alert starts with: every label, equal (as amtool does)."""
    return [
        {"name": k, "value": v, "isRegex": False, "isEqual": True}
        for k, v in sorted(labels.items())
        if k not in SILENCE_SKIP
    ]


def alert_row(group: str, rule: Rule, a: Alert, now_ms: int, muted_by: MutedBy | None) -> dict[str, Any]:
    """One pending or firing alert as the page lists it."""
    labels = dict(a.labels)
    since = a.fired_at_ms if a.state == FIRING and a.fired_at_ms is not None else a.active_at_ms
    return {
        "group": group,
        "rule": rule.name,
        "state": a.state,
        "labels": labels,
        "annotations": dict(a.annotations),
        "value": _finite(a.value),
        "value_text": repr(a.value) if not math.isfinite(a.value) else None,
        "active_at": a.active_at_ms,
        "fired_at": a.fired_at_ms,
        "for_ms": max(0, now_ms - since),
        "active_for_ms": max(0, now_ms - a.active_at_ms),
        "silenced_by": muted_by(labels, now_ms) if muted_by is not None else [],
        "expr": rule.expr,
        "explore": {"expr": rule.expr, "start": a.active_at_ms - EXPLORE_BEFORE_MS, "end": now_ms},
        "silence_matchers": silence_matchers(labels),
    }


def received_row(a: AmAlert, now_ms: int, muted_by: MutedBy | None) -> dict[str, Any]:
    """An alert another Prometheus posted (`POST /api/v2/alerts`): firing, with no rule of ours."""
    labels = dict(a.labels)
    return {
        "group": "received",
        "rule": labels.get("alertname", ""),
        "state": FIRING,
        "labels": labels,
        "annotations": dict(a.annotations),
        "value": None,
        "value_text": None,
        "active_at": a.starts_at_ms,
        "fired_at": a.starts_at_ms,
        "for_ms": max(0, now_ms - a.starts_at_ms),
        "active_for_ms": max(0, now_ms - a.starts_at_ms),
        "silenced_by": muted_by(labels, now_ms) if muted_by is not None else [],
        "expr": None,
        "explore": None,
        "generator_url": a.generator_url,
        "silence_matchers": silence_matchers(labels),
    }


def active(
    groups: Sequence[GroupState],
    now_ms: int,
    muted_by: MutedBy | None,
    received: Sequence[AmAlert] = (),
) -> list[dict[str, Any]]:
    """Firing alerts first, then pending, each the longest active first; the rules' alerts and
    those other senders posted."""
    rows = [
        alert_row(g.group.name, rule, a, now_ms, muted_by)
        for g in groups
        for rule, alerts in zip(g.group.rules, g.alerts, strict=True)
        for a in alerts.values()
        if a.state != INACTIVE
    ]
    rows += [received_row(a, now_ms, muted_by) for a in received]
    rows.sort(key=lambda r: (r["state"] != FIRING, r["active_at"], r["rule"]))
    return rows


def group_rows(groups: Sequence[GroupState]) -> list[dict[str, Any]]:
    """Each rule group: its file, interval, last evaluation, state (firing / pending / ok / err) and
    rules with health and last error."""
    out = []
    for g in groups:
        rules = [rule_json(r, a, st) for r, a, st in zip(g.group.rules, g.alerts, g.status, strict=True)]
        errors = [{"rule": r["name"], "error": r["lastError"]} for r in rules if r.get("lastError")]
        states = {r.get("state") for r in rules}
        state = "err" if errors else FIRING if FIRING in states else PENDING if PENDING in states else "ok"
        out.append(
            {
                "name": g.group.name,
                "file": g.group.file,
                "interval_s": g.interval_s,
                "last_eval": g.last_eval_ms,
                "duration_s": g.duration_s,
                "state": state,
                "errors": errors,
                "rules": [
                    {
                        "name": r["name"],
                        "type": r["type"],
                        "state": r.get("state"),
                        "health": r["health"],
                        "error": r.get("lastError", ""),
                        "query": r["query"],
                    }
                    for r in rules
                ],
            }
        )
    return out


def history_rows(entries: Sequence[HistoryEntry]) -> list[dict[str, Any]]:
    """The transitions, newest first, as the page lists them."""
    return [
        {
            "group": e.group,
            "rule": e.rule,
            "labels": dict(e.transition.labels),
            "from": e.transition.before,
            "to": e.transition.after,
            "at": e.transition.at_ms,
        }
        for e in entries
    ]
