"""Flask application factory: pages, JSON twins, introspection, /metrics and the Prometheus API."""

from __future__ import annotations

from pathlib import Path

from flask import Flask

from gpuwatch.web.alertmanager import bp as alertmanager_bp
from gpuwatch.web.dash.alerts import bp as alerts_page_bp
from gpuwatch.web.dash.inference import bp as inference_bp
from gpuwatch.web.dash.logs import bp as logs_page_bp
from gpuwatch.web.dash.targets import bp as targets_page_bp
from gpuwatch.web.dash.training import bp as training_bp
from gpuwatch.web.errors import register_error_handlers
from gpuwatch.web.importapi import bp as import_bp
from gpuwatch.web.logs import bp as logs_bp
from gpuwatch.web.notify import bp as notify_bp
from gpuwatch.web.ops import bp as ops_bp
from gpuwatch.web.pages import bp as pages_bp
from gpuwatch.web.promapi import bp as prom_bp
from gpuwatch.web.push import bp as push_bp
from gpuwatch.web.rules import bp as rules_bp
from gpuwatch.web.runtime import WebRuntime
from gpuwatch.web.targets import bp as targets_bp


def _asset_dir(name: str) -> str:
    """Find top-level templates/ or static/: inside the wheel, else in the source tree."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / f"_{name}", here.parent / name):
        if candidate.is_dir():
            return str(candidate)
    raise FileNotFoundError(f"gpuwatch is installed without its {name}/ folder")


def create_app(runtime: WebRuntime) -> Flask:
    """Build the Flask app around `runtime`; opens no files and starts no threads."""
    app = Flask(
        __name__,
        template_folder=_asset_dir("templates"),
        static_folder=_asset_dir("static"),
        static_url_path="/static",
    )
    app.extensions["gpuwatch"] = runtime
    app.json.sort_keys = False  # type: ignore[attr-defined]

    for bp in (ops_bp, pages_bp, prom_bp, import_bp, push_bp, targets_bp, logs_bp, rules_bp):
        app.register_blueprint(bp)
    app.register_blueprint(alertmanager_bp)
    app.register_blueprint(notify_bp)
    for bp in (training_bp, inference_bp, alerts_page_bp, targets_page_bp, logs_page_bp):
        app.register_blueprint(bp)
    register_error_handlers(app)
    return app
