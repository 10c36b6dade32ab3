"""`POST /api/v1/import/prometheus`: Prometheus text or OpenMetrics into the store, all or nothing.

The body may be gzip-compressed (`Content-Encoding: gzip`). `Content-Type:
application/openmetrics-text` (or `?format=openmetrics`) forces OpenMetrics, `text/plain` (or
`?format=text`) the text format; otherwise a final `# EOF` decides. With any invalid line the answer
is 400 with the first 20 errors and nothing is written, unless `?partial=1`. An import that would make
more new series than `max_new_series_per_request` (413) or `max_new_series_per_minute` (429) allow is
refused whole, the answer naming the setting. Dependencies come from
`runtime()`: `store` and `clock`.
"""

from __future__ import annotations

import zlib
from typing import Any

from flask import Blueprint, jsonify, request
from flask.typing import ResponseReturnValue

from gpuwatch.collect.importer import describe_errors, import_text
from gpuwatch.core.errors import SeriesLimitExceeded, StoreError
from gpuwatch.promtext.formats import is_openmetrics_content_type
from gpuwatch.web.runtime import runtime

bp = Blueprint("importapi", __name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_ERRORS = 20
_TRUE = ("1", "true", "yes")


def _error(error_type: str, message: str, status: int, **extra: Any) -> ResponseReturnValue:
    body: dict[str, Any] = {"status": "error", "errorType": error_type, "error": message}
    body.update(extra)
    return jsonify(body), status


def _too_large() -> ResponseReturnValue:
    return _error("bad_data", f"request body larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB", 413)


def _body() -> bytes | None:
    """Read the body, decompressing gzip; None when it exceeds the cap."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        return None
    data = request.stream.read(MAX_BODY_BYTES + 1)
    if len(data) > MAX_BODY_BYTES:
        return None
    if request.headers.get("Content-Encoding", "").strip().lower() == "gzip":
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        data = inflater.decompress(data, MAX_BODY_BYTES + 1)
        if len(data) > MAX_BODY_BYTES or inflater.unconsumed_tail:
            return None
    return data


def _format() -> bool | None:
    chosen = request.args.get("format", "").lower()
    if chosen in ("openmetrics", "om"):
        return True
    if chosen in ("text", "prometheus"):
        return False
    return is_openmetrics_content_type(request.headers.get("Content-Type"))


@bp.route("/api/v1/import/prometheus", methods=["POST", "PUT"])
def import_prometheus() -> ResponseReturnValue:
    """Import an exposition body; 400 with line numbers if any line is bad (nothing written)."""
    try:
        data = _body()
    except zlib.error as exc:
        return _error("bad_data", f"cannot decompress the gzip body: {exc}", 400)
    if data is None:
        return _too_large()
    rt = runtime()
    partial = request.args.get("partial", "").lower() in _TRUE
    try:
        result = import_text(
            rt.store,
            data,
            now_ms=rt.clock.now_ms(),
            openmetrics=_format(),
            partial=partial,
            limits=rt.settings.label_limits,
            series_limits=rt.settings.series_limits,
        )
    except SeriesLimitExceeded as exc:
        return _error("bad_data", str(exc), exc.http_status)
    except StoreError as exc:
        return _error("unavailable", str(exc), 503)
    errors = [{"line": e.line_no, "error": e.message} for e in result.errors[:MAX_ERRORS]]
    if result.errors and not partial:
        return _error(
            "bad_data",
            describe_errors(result.errors, MAX_ERRORS),
            400,
            data={"errors": errors, "errorCount": len(result.errors)},
        )
    return jsonify(
        {
            "status": "success",
            "data": {
                "samples": result.samples,
                "series": result.series,
                "errors": errors,
                "errorCount": len(result.errors),
            },
        }
    )
