"""One error handler: JSON under /api/ and /-/, an error page elsewhere."""

from __future__ import annotations

import logging

from flask import Flask, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from gpuwatch.core.errors import GpuwatchError

log = logging.getLogger("gpuwatch.web")


def _wants_json() -> bool:
    return request.path.startswith(("/api/", "/-/")) or request.accept_mimetypes.best == "application/json"


def register_error_handlers(app: Flask) -> None:
    """Install handlers that answer every error in the right shape, never with a traceback."""

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException):  # type: ignore[no-untyped-def]
        code = e.code or 500
        if _wants_json():
            return jsonify(
                {
                    "status": "error",
                    "errorType": "bad_data" if code < 500 else "internal",
                    "error": e.description,
                }
            ), code
        return render_template("error.html", code=code, message=e.description), code

    @app.errorhandler(GpuwatchError)
    def domain_error(e: GpuwatchError):  # type: ignore[no-untyped-def]
        code = e.http_status
        if _wants_json():
            kind = "unavailable" if code == 503 else "execution"  # 503: a remote store that did not answer
            return jsonify({"status": "error", "errorType": kind, "error": str(e)}), code
        return render_template("error.html", code=code, message=str(e)), code

    @app.errorhandler(Exception)
    def unexpected(e: Exception):  # type: ignore[no-untyped-def]
        log.exception("unhandled error on %s", request.path)
        msg = f"internal error: {type(e).__name__}: {e}"
        if _wants_json():
            return jsonify({"status": "error", "errorType": "internal", "error": msg}), 500
        return render_template("error.html", code=500, message=msg), 500
