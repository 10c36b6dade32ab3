"""`/api/v1/rules`, `/api/v1/alerts` in Prometheus's JSON shapes and `POST /-/reload` for the rule files."""

from __future__ import annotations

from flask import Blueprint, jsonify, request
from flask.typing import ResponseReturnValue

from gpuwatch.rules.api import alert_json, group_json
from gpuwatch.rules.manager import RuleManager
from gpuwatch.web.runtime import runtime

bp = Blueprint("rules", __name__)


def _manager() -> RuleManager | None:
    return runtime().rules


@bp.get("/api/v1/alerts")
def alerts() -> ResponseReturnValue:
    manager = _manager()
    found = [alert_json(a) for _, a in manager.active_alerts()] if manager is not None else []
    return jsonify({"status": "success", "data": {"alerts": found}})


@bp.get("/api/v1/rules")
def rules() -> ResponseReturnValue:
    kind = request.args.get("type", "")
    if kind not in ("", "alert", "record"):
        return jsonify(
            {"status": "error", "errorType": "bad_data", "error": f'unsupported type "{kind}"'}
        ), 400
    names = set(request.args.getlist("rule_name[]"))
    group_names = set(request.args.getlist("rule_group[]"))
    files = set(request.args.getlist("file[]"))
    manager = _manager()
    groups = []
    for g in manager.groups() if manager is not None else []:
        if (group_names and g.group.name not in group_names) or (files and g.group.file not in files):
            continue
        data = group_json(g)
        data["rules"] = [
            r
            for r in data["rules"]
            if (not kind or r["type"] == {"alert": "alerting", "record": "recording"}[kind])
            and (not names or r["name"] in names)
        ]
        if (kind or names) and not data["rules"]:
            continue
        groups.append(data)
    return jsonify({"status": "success", "data": {"groups": groups}})


@bp.post("/-/reload")
def reload() -> ResponseReturnValue:
    manager = _manager()
    errors = manager.reload() if manager is not None else []
    if errors:
        return jsonify({"status": "error", "error": "; ".join(errors), "errors": errors}), 400
    return jsonify({"status": "success"})
