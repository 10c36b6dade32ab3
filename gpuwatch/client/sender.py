"""How the training SDK sends: a transport (`requests`, with a bearer token), a bounded outbox that drops
the oldest when full, exponential backoff, and the sender thread's one attempt at a batch. The SDK's
`__init__.py` builds runs on them; like it, this needs only `requests`."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

import requests

logger = logging.getLogger("gpuwatch.client")  # the SDK's one logger

# (method, url, JSON body, timeout seconds) -> HTTP status; raises OSError/requests errors when unreachable
Transport = Callable[[str, str, Any, float], int]


def requests_transport(session: requests.Session | None = None, token: str | None = None) -> Transport:
    """Return a transport that sends JSON with `requests` (one keep-alive session), with
    `Authorization: Bearer <token>` when a token is given (a machine token; docs/security.md)."""
    http = session or requests.Session()
    headers = {"Authorization": f"Bearer {token}"} if token else None

    def send(method: str, url: str, body: Any, timeout: float) -> int:
        return int(http.request(method, url, json=body, timeout=timeout, headers=headers).status_code)

    return send


class Backoff:
    """Exponential backoff: `initial_s`, doubling up to `max_s`; `reset()` after a success."""

    def __init__(self, initial_s: float = 0.5, max_s: float = 30.0, factor: float = 2.0) -> None:
        self.initial_s, self.max_s, self.factor = initial_s, max_s, factor
        self._next = initial_s
        self.failures = 0

    def failure(self) -> float:
        """Record a failed attempt; return how long to wait before the next one."""
        delay = self._next
        self._next = min(self.max_s, self._next * self.factor)
        self.failures += 1
        return delay

    def reset(self) -> None:
        self._next = self.initial_s
        self.failures = 0


class Outbox:
    """A bounded FIFO of points; when full, the oldest is dropped and counted. Thread-safe."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._items: collections.deque[tuple[int, dict[str, Any]]] = collections.deque()
        self._seq = 0
        self._lock = threading.Lock()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._items)

    def put(self, point: dict[str, Any]) -> int:
        """Append a point; return the buffer length."""
        with self._lock:
            if len(self._items) >= self.capacity:
                self._items.popleft()
                self.dropped += 1
            self._seq += 1
            self._items.append((self._seq, point))
            return len(self._items)

    def peek(self, n: int) -> tuple[int, list[dict[str, Any]]]:
        """Return the last sequence number and the points of the oldest `n` (not removed)."""
        with self._lock:
            items = [self._items[i] for i in range(min(n, len(self._items)))]
        return (items[-1][0] if items else 0), [p for _, p in items]

    def commit(self, upto_seq: int) -> None:
        """Remove every point up to `upto_seq` (some may already be gone: dropped while in flight)."""
        with self._lock:
            while self._items and self._items[0][0] <= upto_seq:
                self._items.popleft()


class Sender:
    """Deliver a run's messages in order: init, then points in batches, then finish.

    `send_once()` makes at most one request and returns how long to wait before calling again: 0 when
    more is ready, None when there is nothing to send, a backoff delay after a failure. A 4xx answer
    (other than 408/429) means the server will never take that message: it is dropped and counted in
    `rejected`; anything else that fails is retried.
    """

    def __init__(
        self,
        url: str,
        transport: Transport,
        outbox: Outbox,
        *,
        backoff: Backoff | None = None,
        batch_size: int = 500,
        timeout_s: float = 10.0,
    ) -> None:
        self.url = url.rstrip("/")
        self.transport = transport
        self.outbox = outbox
        self.backoff = backoff or Backoff()
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.pending_init: dict[str, Any] | None = None
        self.pending_finish: dict[str, Any] | None = None
        self.sent_points = 0
        self.rejected = 0
        self.last_error: str | None = None

    def is_idle(self) -> bool:
        return self.pending_init is None and self.pending_finish is None and len(self.outbox) == 0

    def send_once(self) -> float | None:
        """Try to send the next message; return the wait before the next call (see the class doc)."""
        if self.pending_init is not None:
            init = self.pending_init
            done = self._post("/api/v1/runs", init)
            if done and self.pending_init is init:  # a config change while in flight is sent next
                self.pending_init = None
        elif len(self.outbox):
            upto, points = self.outbox.peek(self.batch_size)
            done = self._post("/api/v1/push", points)
            if done:
                self.outbox.commit(upto)
                self.sent_points += len(points)
        elif self.pending_finish is not None:
            done = self._post("/api/v1/runs", self.pending_finish)
            if done:
                self.pending_finish = None
        else:
            return None
        if not done:
            return self.backoff.failure()
        self.backoff.reset()
        return None if self.is_idle() else 0.0

    def _post(self, path: str, body: Any) -> bool:
        """Return True when the message is done with (delivered or rejected for good)."""
        try:
            status = self.transport("POST", self.url + path, body, self.timeout_s)
        except (OSError, requests.RequestException, ValueError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            return False
        if 200 <= status < 300:
            self.last_error = None
            return True
        self.last_error = f"HTTP {status} from {path}"
        if status == 413 and isinstance(body, list) and len(body) > 1:
            self.batch_size = max(1, len(body) // 2)  # too big for the server: send halves
            return False
        if 400 <= status < 500 and status not in (408, 429):
            self.rejected += len(body) if isinstance(body, list) else 1
            if status in (401, 403):
                logger.warning(
                    "gpuwatch refused a message (HTTP %d on %s: pass token= a machine token); it is dropped",
                    status,
                    path,
                )
            else:
                logger.warning("gpuwatch rejected a message (HTTP %d on %s); it is dropped", status, path)
            return True
        return False
