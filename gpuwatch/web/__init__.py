"""Flask application factory: pages, JSON twins, introspection, /metrics and the Prometheus API."""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, Flask

from gpuwatch.core.credentials import AccessFile
from gpuwatch.web import admission, notices
from gpuwatch.web.access import Gate, install
from gpuwatch.web.alertmanager import bp as alertmanager_bp
from gpuwatch.web.dash import alerts as dash_alerts
from gpuwatch.web.dash import assets as dash_assets
from gpuwatch.web.dash import cluster as dash_cluster
from gpuwatch.web.dash import explore as dash_explore
from gpuwatch.web.dash import gpu as dash_gpu
from gpuwatch.web.dash import inference as dash_inference
from gpuwatch.web.dash import logs as dash_logs
from gpuwatch.web.dash import page as dash_page
from gpuwatch.web.dash import targets as dash_targets
from gpuwatch.web.dash import timeline as dash_timeline
from gpuwatch.web.dash import training as dash_training
from gpuwatch.web.dash import usage as dash_usage
from gpuwatch.web.errors import register_error_handlers
from gpuwatch.web.exportapi import bp as export_bp
from gpuwatch.web.federate import bp as federate_bp
from gpuwatch.web.importapi import bp as import_bp
from gpuwatch.web.login import bp as login_bp
from gpuwatch.web.logs import bp as logs_bp
from gpuwatch.web.notify import bp as notify_bp
from gpuwatch.web.ops import bp as ops_bp
from gpuwatch.web.pages import bp as pages_bp
from gpuwatch.web.promapi import bp as prom_bp
from gpuwatch.web.push import bp as push_bp
from gpuwatch.web.remotewrite import bp as remotewrite_bp
from gpuwatch.web.rules import bp as rules_bp
from gpuwatch.web.runtime import WebRuntime
from gpuwatch.web.targets import bp as targets_bp

# The dashboard's pages, one Blueprint per module of gpuwatch/web/dash/ (a new page: one line here).
DASHBOARD_BLUEPRINTS: tuple[Blueprint, ...] = (
    dash_page.bp,
    dash_assets.bp,
    dash_cluster.bp,
    dash_usage.bp,
    dash_gpu.bp,
    dash_explore.bp,
    dash_timeline.bp,
    dash_training.bp,
    dash_inference.bp,
    dash_alerts.bp,
    dash_targets.bp,
    dash_logs.bp,
)


def _asset_dir(name: str) -> str:
    """Find top-level templates/ or static/: inside the wheel, else in the source tree."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / f"_{name}", here.parent / name):
        if candidate.is_dir():
            return str(candidate)
    raise FileNotFoundError(f"gpuwatch is installed without its {name}/ folder")


def create_app(runtime: WebRuntime) -> Flask:
    """Build the Flask app around `runtime`, every route behind the access gate (web/access.py);
    starts no threads."""
    app = Flask(
        __name__,
        template_folder=_asset_dir("templates"),
        static_folder=_asset_dir("static"),
        static_url_path="/static",
    )
    app.extensions["gpuwatch"] = runtime
    app.json.sort_keys = False  # type: ignore[attr-defined]
    notices.install(app)  # before any hook that may answer early

    access = runtime.access or AccessFile(None)  # None: no credentials file (tests, benches): loopback only
    install(app, Gate(runtime.settings, access, runtime.clock), access.session_key())
    # After the access gate: a refused client takes no turn.
    # The runtime's turns when it has them (gpuwatch serve: counted in /metrics), else the settings'.
    turns = getattr(runtime, "admission", None) or admission.Admission.of(runtime.settings)
    admission.install(app, turns)
    for bp in (
        ops_bp,
        login_bp,
        pages_bp,
        prom_bp,
        export_bp,
        federate_bp,
        import_bp,
        remotewrite_bp,
        push_bp,
        targets_bp,
        logs_bp,
        rules_bp,
    ):
        app.register_blueprint(bp)
    for bp in DASHBOARD_BLUEPRINTS:
        app.register_blueprint(bp)
    app.register_blueprint(alertmanager_bp)
    app.register_blueprint(notify_bp)
    register_error_handlers(app)
    return app
