"""What a request's queries noted (query/notices.py), passed on with its answer: a JSON answer under
`/api/` carries the warnings in a top-level `warnings` list, as Prometheus's HTTP API does (a face whose
remote store is down: `remote query backend ... unreachable: ...; answered from the local buffer (last
15 minutes)`), and every answer whose queries asked a remote store says who answered in the
`Gpuwatch-Answered-By` header (`remote` or `local-buffer`), which the dashboard's banner follows.
Pages rendered on the server show the same line (`remote_warning()` in base.html).
"""

from __future__ import annotations

import json

from flask import Flask, Response, request

from gpuwatch.query import notices

HEADER = "Gpuwatch-Answered-By"


def remote_warning() -> str:
    """The current request's first warning where the local buffer answered it, else ''."""
    found = notices.current()
    return found.warnings[0] if found is not None and found.from_buffer and found.warnings else ""


def _with_warnings(response: Response, warnings: list[str]) -> None:
    """Put `warnings` first in the JSON object `response` holds (with those it has, each once)."""
    try:
        body = json.loads(response.get_data())
    except ValueError:
        return
    if not isinstance(body, dict):
        return
    had = [w for w in body.get("warnings") or [] if isinstance(w, str) and w not in warnings]
    # an answer the dashboard reads first: status, then the warnings, then the rest
    out = {k: v for k, v in body.items() if k == "status"}
    out["warnings"] = [*warnings, *had]
    out.update((k, v) for k, v in body.items() if k not in ("status", "warnings"))
    response.set_data(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n")


def install(app: Flask) -> None:
    """Open a request's notices before it is answered and pass them on with its answer (installed
    first: a request another hook answers early still opens its own)."""

    @app.before_request
    def _listen() -> None:
        notices.listen()

    @app.after_request
    def _pass_on(response: Response) -> Response:
        found = notices.current()
        if found is None or found.answered_by is None:
            return response
        response.headers[HEADER] = found.answered_by
        if found.warnings and request.path.startswith("/api/") and response.is_json:
            _with_warnings(response, found.warnings)
        return response

    @app.teardown_request
    def _close(_: BaseException | None) -> None:
        notices.close()

    app.jinja_env.globals["remote_warning"] = remote_warning
