"""`GET /api/v1/logs`: stored lines of tailed training logs, newest first, as JSON."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import BadRequest

from gpuwatch.collect.logs import detect_event
from gpuwatch.web.queryapi import BadData, time_ms

bp = Blueprint("logs", __name__)

DEFAULT_LIMIT = 200
MAX_LIMIT = 5000
LEVELS = ("ERROR", "WARN", "INFO", "DEBUG", "")


def _limit(text: str | None) -> int:
    if text is None or text == "":
        return DEFAULT_LIMIT
    try:
        n = int(text)
    except ValueError:
        raise BadData(f'invalid parameter "limit": expected a whole number from 1 to {MAX_LIMIT}') from None
    if not 1 <= n <= MAX_LIMIT:
        raise BadData(f'invalid parameter "limit": expected a whole number from 1 to {MAX_LIMIT}')
    return n


@bp.get("/api/v1/logs")
def logs() -> ResponseReturnValue:
    try:
        return _logs()
    except BadData as exc:
        raise BadRequest(str(exc)) from None


def _logs() -> ResponseReturnValue:
    args = request.args
    level = args.get("level")
    if level is not None:
        level = level.upper()
        if level == "WARNING":
            level = "WARN"
        if level not in LEVELS:
            raise BadData('invalid parameter "level": expected ERROR, WARN, INFO, DEBUG or empty')
    start = args.get("start")
    end = args.get("end")
    lines = current_app.extensions["gpuwatch"].store.log_lines(
        run=args.get("run") or None,
        text=args.get("q") or None,
        level=level,
        start_ms=time_ms(start, "start") if start else None,
        end_ms=time_ms(end, "end") if end else None,
        limit=_limit(args.get("limit")),
    )
    data = [
        {
            "time": x.time_ms / 1000,
            "file": x.file,
            "run": x.run,
            "level": x.level,
            "text": x.text,
            "event": detect_event(x.text),
        }
        for x in lines
    ]
    return jsonify({"status": "success", "data": data})
