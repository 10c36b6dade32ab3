"""Introspection and scrape endpoints: /-/health, /-/jobs, /-/settings, /-/version, /metrics."""

from __future__ import annotations

from flask import Blueprint, Response, current_app, jsonify

from gpuwatch import __version__
from gpuwatch.promtext.writer import CONTENT_TYPE

bp = Blueprint("ops", __name__)


def _runtime():  # type: ignore[no-untyped-def]
    return current_app.extensions["gpuwatch"]


@bp.get("/-/health")
def health():  # type: ignore[no-untyped-def]
    return jsonify(_runtime().status())


@bp.get("/-/ready")
def ready():  # type: ignore[no-untyped-def]
    return jsonify({"status": "ready"})


@bp.get("/-/version")
def version():  # type: ignore[no-untyped-def]
    return jsonify({"version": __version__})


@bp.get("/-/jobs")
def jobs():  # type: ignore[no-untyped-def]
    return jsonify({"jobs": _runtime().jobs.states()})


@bp.get("/-/settings")
def settings():  # type: ignore[no-untyped-def]
    return jsonify(_runtime().settings.public())


@bp.get("/metrics")
def metrics() -> Response:
    return Response(_runtime().exposition(), mimetype=None, content_type=CONTENT_TYPE)
