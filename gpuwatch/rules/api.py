"""Rules and alerts in the JSON shapes of Prometheus's `/api/v1/rules` and `/api/v1/alerts`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from gpuwatch.core.model import Labels
from gpuwatch.core.units import format_rfc3339
from gpuwatch.rules.evaluate import FIRING, INACTIVE, PENDING, Alert
from gpuwatch.rules.load import Rule

if TYPE_CHECKING:
    from gpuwatch.rules.state import GroupState, RuleStatus


def format_value_e(v: float) -> str:
    """Return `v` as Go's strconv.FormatFloat(v, 'e', -1, 64), as Prometheus's alert API shows values."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "0e+00"
    sign, digits, exponent = Decimal(repr(v)).normalize().as_tuple()
    ds = "".join(str(d) for d in digits)
    exp = len(ds) + int(exponent) - 1
    mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
    return f"{'-' if sign else ''}{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"


def alert_json(a: Alert) -> dict[str, Any]:
    """Return one alert as Prometheus's /api/v1/alerts shows it."""
    out: dict[str, Any] = {
        "labels": dict(a.labels),
        "annotations": dict(a.annotations),
        "state": a.state,
        "activeAt": format_rfc3339(a.active_at_ms),
        "value": format_value_e(a.value),
    }
    if a.keep_firing_since_ms is not None:
        out["keepFiringSince"] = format_rfc3339(a.keep_firing_since_ms)
    return out


def rule_json(rule: Rule, alerts: Mapping[Labels, Alert], st: RuleStatus) -> dict[str, Any]:
    """Return one rule as Prometheus's /api/v1/rules shows it."""
    common: dict[str, Any] = {"name": rule.name, "query": rule.expr}
    tail: dict[str, Any] = {
        "health": st.health,
        "evaluationTime": st.duration_s,
        "lastEvaluation": format_rfc3339(st.last_eval_ms),
    }
    if st.last_error:
        tail["lastError"] = st.last_error
    if rule.kind == "record":
        return {**common, "labels": dict(rule.labels), **tail, "type": "recording"}
    active = [a for a in alerts.values() if a.state != INACTIVE]
    state = (
        FIRING
        if any(a.state == FIRING for a in active)
        else PENDING
        if any(a.state == PENDING for a in active)
        else INACTIVE
    )
    return {
        "state": state,
        **common,
        "duration": rule.for_s,
        "keepFiringFor": rule.keep_firing_for_s,
        "labels": dict(rule.labels),
        "annotations": dict(rule.annotations),
        "alerts": [alert_json(a) for a in active],
        **tail,
        "type": "alerting",
    }


def group_json(g: GroupState) -> dict[str, Any]:
    """Return one group as Prometheus's /api/v1/rules shows it."""
    return {
        "name": g.group.name,
        "file": g.group.file,
        "rules": [rule_json(r, a, s) for r, a, s in zip(g.group.rules, g.alerts, g.status, strict=True)],
        "interval": g.interval_s,
        "limit": 0,
        "evaluationTime": g.duration_s,
        "lastEvaluation": format_rfc3339(g.last_eval_ms),
    }
