"""Alerts: `/alerts` (firing and pending alerts, rule groups, transitions, silences) and its JSON twin
`/api/ui/alerts`. Silences are made, listed and expired through `/api/v2/silences`."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, render_template
from flask.typing import ResponseReturnValue

from gpuwatch.web.dash.alertsdata import active, group_rows, history_rows
from gpuwatch.web.runtime import runtime

bp = Blueprint("alerts", __name__)
HISTORY_SHOWN = 500


def _alerts() -> dict[str, Any]:
    rt = runtime()
    now = rt.clock.now_ms()
    manager = rt.rules
    silences = rt.silences
    muted_by = silences.muted_by if silences is not None else None
    groups = manager.groups() if manager is not None else []
    return {
        "now_ms": now,
        "rules_enabled": manager is not None,
        "silences_enabled": silences is not None,
        "alerts": active(groups, now, muted_by),
        "groups": group_rows(groups),
        "history": history_rows(manager.history(HISTORY_SHOWN)) if manager is not None else [],
        "silences": [s.to_json(now) for s in silences.list()] if silences is not None else [],
    }


@bp.get("/api/ui/alerts")
def alerts_json() -> ResponseReturnValue:
    return jsonify(_alerts())


@bp.get("/alerts")
def alerts_page() -> ResponseReturnValue:
    return render_template("alerts.html", data=_alerts())
