"""Forward alerts to the Alertmanagers of `alerting:` as Prometheus does.

Each Alertmanager gets a POST of a JSON list of alerts to `/api/v2/alerts`. The notifier hands over what
Prometheus would send at each evaluation (firing alerts every minute with `endsAt` ahead, resolved ones
with `endsAt` = resolve time); alerts waiting for an Alertmanager that does not answer are kept, the
newest version of each, and the batch is retried with backoff up to every minute.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.core.clock import Clock
from gpuwatch.core.units import format_rfc3339 as format_time
from gpuwatch.notify.alert import NotifyAlert
from gpuwatch.notify.alerting import AlertingConfig, AlertmanagerTarget
from gpuwatch.notify.delivery import DeliveryError, backoff_s
from gpuwatch.notify.receivers import post_json

RETRY_MAX_S = 60.0


@dataclass
class _Target:
    """Alerts waiting to be posted to one Alertmanager (the newest version of each), and how it went."""

    target: AlertmanagerTarget
    pending: dict[str, NotifyAlert] = field(default_factory=dict)
    attempts: int = 0
    next_ms: int = 0
    last_error: str = ""
    last_success_ms: int | None = None
    busy: bool = False


class Forwarder:
    """Keep alerts for each Alertmanager until a POST succeeds; thread-safe."""

    def __init__(
        self, config: AlertingConfig, clock: Clock, *, on_result: Callable[[str, str], None]
    ) -> None:
        self._targets = [_Target(t) for t in config.alertmanagers]
        self._clock = clock
        self._on_result = on_result  # (url, "success" | "failure") for the counters
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        return [t.target.url for t in self._targets]

    def add(self, alerts: Iterable[NotifyAlert]) -> None:
        """Queue alerts for every Alertmanager (a newer version of an alert replaces the older)."""
        alerts = list(alerts)
        with self._lock:
            for t in self._targets:
                for a in alerts:
                    t.pending[a.fingerprint] = a

    def due(self, now_ms: int) -> list[Callable[[], None]]:
        """Return one job per Alertmanager whose batch is due now (each runs on the caller's pool)."""
        jobs: list[Callable[[], None]] = []
        with self._lock:
            for t in self._targets:
                if t.busy or not t.pending or t.next_ms > now_ms:
                    continue
                t.busy = True
                batch = dict(t.pending)
                jobs.append(functools.partial(self._post, t, batch))
        return jobs

    def next_ms(self) -> int | None:
        """Return when the next batch is due, or None."""
        with self._lock:
            return min((t.next_ms for t in self._targets if t.pending and not t.busy), default=None)

    def _post(self, t: _Target, batch: dict[str, NotifyAlert]) -> None:

        body = [a.api_json() for a in sorted(batch.values(), key=lambda a: a.labels)]
        try:
            post_json(t.target.url, body, http=t.target.http, timeout_s=t.target.timeout_s)
        except DeliveryError as e:
            with self._lock:
                t.attempts += 1
                t.last_error = str(e)
                t.next_ms = self._clock.now_ms() + int(min(RETRY_MAX_S, backoff_s(t.attempts)) * 1000)
                t.busy = False
            self._on_result(t.target.url, "failure")
            raise
        with self._lock:
            for fp, a in batch.items():
                if t.pending.get(fp) is a:
                    del t.pending[fp]
            t.attempts, t.last_error, t.busy = 0, "", False
            t.last_success_ms = self._clock.now_ms()
        self._on_result(t.target.url, "success")

    def status(self) -> list[dict[str, Any]]:
        """Return each Alertmanager's URL, alerts waiting, last error and last success."""
        with self._lock:
            return [
                {
                    "url": t.target.url,
                    "pending": len(t.pending),
                    "lastError": t.last_error,
                    "lastSuccess": format_time(t.last_success_ms) if t.last_success_ms else None,
                }
                for t in self._targets
            ]
