"""Alerts that other senders post to `POST /api/v2/alerts`, held in memory as Alertmanager holds them.

A Prometheus whose `alerting.alertmanagers` names gpuwatch, or `amtool alert add`, sends alerts here.
As in Alertmanager: an alert without `endsAt` resolves by itself `resolve_timeout` (5 minutes) after
it was last sent, so a sender must repeat it (Prometheus does, every minute); one without `startsAt`
starts now; an alert sent again while it is still active keeps its first `startsAt`; empty label
values are dropped. Nothing is written to disk (Alertmanager does not keep alerts either: senders
send them again). Resolved alerts are kept 15 minutes, for notifications, then forgotten.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gpuwatch.core.clock import Clock
from gpuwatch.core.model import DEFAULT_LABEL_LIMITS, LabelLimits
from gpuwatch.core.regex import as_utf8
from gpuwatch.core.units import GO_ZERO_TIME
from gpuwatch.notify.alert import fingerprint
from gpuwatch.notify.api import AmAlert
from gpuwatch.notify.silences import SilenceError, parse_time

RESOLVE_TIMEOUT_MS = 5 * 60 * 1000  # Alertmanager's global.resolve_timeout default
RESOLVED_RETENTION_MS = 15 * 60 * 1000
MAX_ALERTS = 10_000
_GO_ZERO_MS = parse_time(GO_ZERO_TIME)
_NAME_FIRST = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_REST = _NAME_FIRST | set("0123456789")


def _label_set(value: Any, what: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{what} must be an object of strings")
    # Alertmanager's Go decoder reads a lone surrogate ("\udcff") as U+FFFD; so does this, before the
    # value reaches a fingerprint, a group key or the store.
    out = {str(k): as_utf8(v) for k, v in value.items() if v != ""}
    for name in out:
        if not name or name[0] not in _NAME_FIRST or not set(name) <= _NAME_REST:
            raise ValueError(f'invalid {what.rstrip("s")} set: invalid name "{name}"')
    return out


def _time(value: Any) -> int | None:
    """Return a time in ms, or None when absent or Go's zero time (what amtool sends for 'not set')."""
    if not value:
        return None
    try:
        ms = parse_time(value)
    except SilenceError as e:
        raise ValueError(str(e)) from None
    return None if ms == _GO_ZERO_MS else ms


def _parse(item: Any, now_ms: int, timeout_ms: int, limits: LabelLimits) -> AmAlert:
    if not isinstance(item, dict):
        raise ValueError("an alert must be a JSON object")
    if item.get("labels") is None:
        raise ValueError("labels in body is required")
    labels = _label_set(item["labels"], "labels")
    if not labels:
        raise ValueError("at least one label pair required")
    annotations = _label_set(item.get("annotations") or {}, "annotations")
    for what, pairs in (("labels", labels), ("annotations", annotations)):
        problem = limits.problem(pairs.items())
        if problem is not None:
            raise ValueError(f"{what}: {problem}")
    url = item.get("generatorURL") or ""
    if not isinstance(url, str):
        raise ValueError("generatorURL must be a string")
    url = as_utf8(url)
    starts, ends = _time(item.get("startsAt")), _time(item.get("endsAt"))
    if starts is None:
        starts = ends if ends is not None else now_ms
    if ends is None:
        ends = now_ms + timeout_ms
    if ends < starts:
        raise ValueError("start time must be before end time")
    return AmAlert(labels, annotations, starts, ends, now_ms, url)


class ReceivedAlerts:
    """Alerts posted by other senders, by fingerprint."""

    def __init__(
        self,
        clock: Clock,
        *,
        resolve_timeout_ms: int = RESOLVE_TIMEOUT_MS,
        limit: int = MAX_ALERTS,
        label_limits: LabelLimits = DEFAULT_LABEL_LIMITS,
    ) -> None:
        self._clock = clock
        self._label_limits = label_limits
        self._timeout_ms = resolve_timeout_ms
        self._limit = limit
        self._lock = threading.Lock()
        self._by_fp: dict[str, AmAlert] = {}
        self._listeners: list[Callable[[list[AmAlert], int], None]] = []

    def add_listener(self, fn: Callable[[list[AmAlert], int], None]) -> None:
        """Call `fn(alerts, now_ms)` with the alerts each accepted post carried (the notifier routes them)."""
        self._listeners.append(fn)

    def put(self, body: Any) -> int:
        """Take a `postableAlerts` body; keep every valid alert and raise SilenceError (400) naming the bad ones."""
        if not isinstance(body, list):
            raise SilenceError("the body must be a JSON array of alerts (postableAlerts)")
        now_ms = self._clock.now_ms()
        errors: list[str] = []
        taken = 0
        accepted: list[AmAlert] = []
        with self._lock:
            self._forget(now_ms)
            for i, item in enumerate(body):
                try:
                    alert = _parse(item, now_ms, self._timeout_ms, self._label_limits)
                except ValueError as e:
                    errors.append(f"alert {i}: {e}")
                    continue
                fp = fingerprint(alert.labels)
                old = self._by_fp.get(fp)
                if old is None and len(self._by_fp) >= self._limit:
                    errors.append(f"alert {i}: gpuwatch holds {self._limit} alerts already")
                    continue
                if (
                    old is not None
                    and old.starts_at_ms <= alert.ends_at_ms
                    and alert.starts_at_ms <= old.ends_at_ms
                ):
                    alert = replace(alert, starts_at_ms=min(old.starts_at_ms, alert.starts_at_ms))
                self._by_fp[fp] = alert
                accepted.append(alert)
                taken += 1
        if accepted:
            for fn in self._listeners:
                fn(accepted, now_ms)
        if errors:
            raise SilenceError("; ".join(errors))
        return taken

    def _forget(self, now_ms: int) -> None:
        gone = [fp for fp, a in self._by_fp.items() if a.ends_at_ms + RESOLVED_RETENTION_MS < now_ms]
        for fp in gone:
            del self._by_fp[fp]

    def alerts(self) -> list[AmAlert]:
        """Return every held alert, firing or resolved in the last 15 minutes (for a notifier)."""
        with self._lock:
            self._forget(self._clock.now_ms())
            return list(self._by_fp.values())

    def firing(self, now_ms: int) -> list[AmAlert]:
        """Return the alerts whose `endsAt` has not passed."""
        return [a for a in self.alerts() if a.ends_at_ms >= now_ms]
