"""How many costly requests (PromQL queries, the dashboard's JSON twins) run at once, and how many wait.

waitress hands requests to its workers in arrival order from one queue. When dashboards ask more than
the CPU answers, that queue grew to 150-270 requests and `/-/health` waited behind them for up to
15 s (bench/README.md, "Soak"). Here at most `running` costly requests are evaluated at once and at
most `waiting` more wait for a turn; past that a costly request is answered at once with Prometheus's
503 `unavailable` and a `Retry-After` (as Prometheus's `--query.max-concurrency` bounds its queries),
which the dashboard takes as "busy, ask again next refresh". Workers then seldom sit in the queue, so
`/-/health` and other cheap requests get one within moments. The server has that many workers plus a
few spare (`web/serving.py`: `threads_for`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from flask import Flask, g, jsonify, request
from flask.typing import ResponseReturnValue

# Routes whose answer is computed from the store: the PromQL evaluations and the pages' JSON twins.
COSTLY_PATHS = ("/api/v1/query", "/api/v1/query_range", "/api/export")
COSTLY_PREFIXES = ("/api/ui/",)
RETRY_AFTER_S = 1


class Admission:
    """At most `running` holders of a turn at once and `waiting` more waiting for one, each at most
    `wait_s` (then, or when the waiting are already `waiting`, `enter` answers False at once)."""

    def __init__(self, running: int, waiting: int, wait_s: float) -> None:
        self.running_max = running
        self.waiting_max = waiting
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self.running = 0
        self.waiting = 0
        self.refused = 0  # requests answered 503 since start
        self.is_closed = False

    @classmethod
    def of(cls, settings: object) -> Admission:
        """The turns `settings` allow (`query_max_concurrency`, `query_max_queued`, waiting at most
        `query_timeout`); a partial settings object (a test's, a bench's) gets `app/options.py`'s defaults."""
        return cls(
            getattr(settings, "query_max_concurrency", 4),
            getattr(settings, "query_max_queued", 16),
            getattr(settings, "query_timeout", 120.0),
        )

    def enter(self) -> bool:
        """Take a turn (waiting for one if few enough wait already); False: none, nothing taken."""
        with self._cond:
            if self.is_closed:
                self.refused += 1
                return False
            if self.running < self.running_max and not self.waiting:
                self.running += 1
                return True
            if self.waiting >= self.waiting_max:
                self.refused += 1
                return False
            self.waiting += 1
            try:
                admitted = self._cond.wait_for(
                    lambda: self.running < self.running_max or self.is_closed, self.wait_s
                )
            finally:
                self.waiting -= 1
            if not admitted or self.is_closed:
                self.refused += 1
                return False
            self.running += 1
            return True

    def leave(self) -> None:
        """Give back a turn `enter` gave."""
        with self._cond:
            self.running -= 1
            self._cond.notify()

    def close(self) -> None:
        """Refuse the waiting and every later request (shutting down: the workers finish sooner)."""
        with self._cond:
            self.is_closed = True
            self._cond.notify_all()


def admission_of(app: Flask) -> Admission:
    """The `Admission` that `install` put in front of `app`."""
    found: Admission = app.extensions["gpuwatch.admission"]
    return found


def is_costly(path: str) -> bool:
    """Whether a request for `path` takes a turn."""
    return path in COSTLY_PATHS or path.startswith(COSTLY_PREFIXES)


def install(app: Flask, admission: Admission, is_costly: Callable[[str], bool] = is_costly) -> None:
    """Make every costly request of `app` take a turn of `admission` (after the access checks, which
    run first), or answer 503 `unavailable` at once."""
    app.extensions["gpuwatch.admission"] = admission

    @app.before_request
    def _admit() -> ResponseReturnValue | None:
        if not is_costly(request.path):
            return None
        if not admission.enter():
            body = {
                "status": "error",
                "errorType": "unavailable",
                "error": (
                    f"too many concurrent queries ({admission.running_max} running, "
                    f"{admission.waiting_max} waiting); retry later "
                    "(query_max_concurrency, query_max_queued)"
                ),
            }
            return jsonify(body), 503, {"Retry-After": str(RETRY_AFTER_S)}
        g.gpuwatch_admitted = True
        return None

    @app.teardown_request
    def _leave(exc: BaseException | None) -> None:
        if g.pop("gpuwatch_admitted", False):
            admission.leave()
