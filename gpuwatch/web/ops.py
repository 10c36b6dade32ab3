"""Introspection and scrape endpoints: /-/health, /-/healthy, /-/ready, /-/jobs, /-/settings, /-/version,
/metrics."""

from __future__ import annotations

from flask import Blueprint, Response, jsonify
from flask.typing import ResponseReturnValue

from gpuwatch import __version__
from gpuwatch.promtext.writer import CONTENT_TYPE, encode_text
from gpuwatch.web.runtime import runtime

bp = Blueprint("ops", __name__)


@bp.get("/-/health")
def health() -> ResponseReturnValue:
    status = runtime().status()
    return jsonify(status), 503 if status["status"] != "ok" else 200


@bp.route("/-/healthy", methods=["GET", "HEAD"])
def healthy() -> ResponseReturnValue:
    """Prometheus's liveness probe: 200 and one line of text while the process serves requests."""
    return Response("gpuwatch is Healthy.\n", content_type="text/plain; charset=utf-8")


@bp.route("/-/ready", methods=["GET", "HEAD"])
def ready() -> ResponseReturnValue:
    """Prometheus's readiness probe: 200 and one line of text once gpuwatch serves queries (it does as
    soon as it listens: the store is open before the server starts)."""
    return Response("gpuwatch is Ready.\n", content_type="text/plain; charset=utf-8")


@bp.get("/-/version")
def version() -> ResponseReturnValue:
    return jsonify({"version": __version__})


@bp.get("/-/jobs")
def jobs() -> ResponseReturnValue:
    return jsonify({"jobs": runtime().jobs.states()})


@bp.get("/-/settings")
def settings() -> ResponseReturnValue:
    return jsonify(runtime().settings.public())


@bp.get("/metrics")
def metrics() -> Response:
    return Response(encode_text(runtime().exposition()), mimetype=None, content_type=CONTENT_TYPE)
