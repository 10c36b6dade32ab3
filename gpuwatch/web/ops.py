"""Introspection and scrape endpoints: /-/health, /-/jobs, /-/settings, /-/version, /metrics."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify

from gpuwatch import __version__
from gpuwatch.promtext.writer import CONTENT_TYPE
from gpuwatch.web.runtime import runtime

bp = Blueprint("ops", __name__)


@bp.get("/-/health")
def health():  # type: ignore[no-untyped-def]
    return jsonify(runtime().status())


@bp.get("/-/ready")
def ready():  # type: ignore[no-untyped-def]
    return jsonify({"status": "ready"})


@bp.get("/-/version")
def version():  # type: ignore[no-untyped-def]
    return jsonify({"version": __version__})


@bp.get("/-/jobs")
def jobs():  # type: ignore[no-untyped-def]
    return jsonify({"jobs": runtime().jobs.states()})


@bp.get("/-/settings")
def settings():  # type: ignore[no-untyped-def]
    return jsonify(runtime().settings.public())


@bp.get("/metrics")
def metrics() -> Response:
    return Response(runtime().exposition(), mimetype=None, content_type=CONTENT_TYPE)
