"""`GET /api/v1/notifications`: the delivery log, the queue and the Alertmanagers' state, read-only."""

from __future__ import annotations

from flask import Blueprint, jsonify, request
from flask.typing import ResponseReturnValue

from gpuwatch.web.runtime import runtime

bp = Blueprint("notify", __name__)


@bp.get("/api/v1/notifications")
def notifications() -> ResponseReturnValue:
    raw = request.args.get("limit", "200")
    if not raw.isdigit() or not 1 <= int(raw) <= 5000:
        return jsonify(
            {"status": "error", "errorType": "bad_data", "error": f"limit: expected 1 to 5000, got {raw!r}"}
        ), 400
    notifier = runtime().notifier
    if notifier is None:
        data = {"deliveries": [], "queue": [], "alertmanagers": [], "groups": [], "worker": {"wakeups": 0}}
    else:
        data = notifier.status(receiver=request.args.get("receiver") or None, limit=int(raw))
    return jsonify({"status": "success", "data": data})
