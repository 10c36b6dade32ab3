"""`POST /api/v1/write`: Prometheus remote write 1.0 into the store (gpuwatch/remote/).

204 when every series was stored. 400 for a body that is not a snappy-compressed `WriteRequest`, and
for refused series (the others are stored; the answer names the refused ones: a sender drops a batch
answered 4xx, so nothing is lost that could have been kept). 413 for a body over the cap or more new
series than `max_new_series_per_request`, 429 over `max_new_series_per_minute`, 503 when the store
cannot write (a sender retries 5xx and 429). Never a 5xx for the sender's own fault: senders retry
those forever. A machine token, as for pushes and imports.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, jsonify, request
from flask.typing import ResponseReturnValue

from gpuwatch.core.errors import SeriesLimitExceeded, StoreError
from gpuwatch.remote.receive import Receiver
from gpuwatch.remote.wire import WireError, decompress
from gpuwatch.web.runtime import runtime

bp = Blueprint("remotewrite", __name__)

MAX_BODY_BYTES = 16 * 1024 * 1024  # compressed; Prometheus sends 2,000 samples a request by default
MAX_INFLATED_BYTES = 64 * 1024 * 1024
MAX_REASONS = 10


def _error(error_type: str, message: str, status: int, **extra: Any) -> ResponseReturnValue:
    body: dict[str, Any] = {"status": "error", "errorType": error_type, "error": message}
    body.update(extra)
    return jsonify(body), status


@bp.route("/api/v1/write", methods=["POST"])
def remote_write() -> ResponseReturnValue:
    """Store one remote-write request."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        return _error("bad_data", f"request body larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB", 413)
    data = request.stream.read(MAX_BODY_BYTES + 1)
    if len(data) > MAX_BODY_BYTES:
        return _error("bad_data", f"request body larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB", 413)
    encoding = request.headers.get("Content-Encoding", "snappy").strip().lower()
    if encoding not in ("snappy", ""):
        return _error("bad_data", f"Content-Encoding {encoding!r}: remote write bodies are snappy", 400)
    receiver: Receiver = current_app.extensions.setdefault("gpuwatch.remote_write", Receiver())
    rt = runtime()
    try:
        got = receiver.read(decompress(data, MAX_INFLATED_BYTES), limits=rt.settings.label_limits)
    except WireError as exc:
        return _error("bad_data", f"not a remote-write request: {exc}", 400)
    try:
        if got.columns.samples:
            rt.store.write_columns(got.columns, rt.settings.series_limits)
    except SeriesLimitExceeded as exc:
        return _error("bad_data", str(exc), exc.http_status)
    except StoreError as exc:
        return _error("unavailable", str(exc), 503)
    if got.refused:
        more = len(got.refused) - MAX_REASONS
        message = "; ".join(got.refused[:MAX_REASONS]) + (f" (and {more} more)" if more > 0 else "")
        return _error(
            "bad_data",
            f"{len(got.refused)} series refused, the other {len(got.columns)} stored: {message}",
            400,
            data={"stored_samples": got.columns.samples, "refused_samples": got.samples_refused},
        )
    return Response(status=204)
