"""The notifier: takes each rule evaluation's alerts, feeds the dispatcher and the Alertmanagers, and
delivers the durable queue, all off the rule evaluation path.

- `observe(...)` is called by the rule manager after each group evaluation. It only picks the alerts
  Prometheus would send now (firing ones every `RESEND_DELAY_S`, resolved ones at once and then again
  every `RESEND_DELAY_S` while the rule keeps them), hands them over and wakes the worker.
- The worker thread (`start()`) sleeps on an Event until the next group flush, retry or new input; each
  wake-up runs `tick()`: flush due alert groups into the queue (with their notification state, in one
  transaction), then deliver queued notifications, each integration in order, on a small thread pool so
  a receiver that is down delays only itself.
- Failed deliveries retry with backoff (5s doubling to 5m) for `GIVE_UP_S` (12h), then are logged as
  failed; a 4xx answer fails at once. Every outcome is a row of the delivery log.

Tests drive `tick()` with a FakeClock and no thread: sends then run inline.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol
from urllib.parse import quote

from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import StoreError
from gpuwatch.core.model import Labels, MetricInfo, Sample, is_utf8, make_labels, stable_labels
from gpuwatch.core.regex import as_utf8
from gpuwatch.core.units import format_rfc3339 as format_time
from gpuwatch.notify.alert import NotifyAlert, webhook_payload
from gpuwatch.notify.alerting import AlertingConfig
from gpuwatch.notify.config import NotifyConfig
from gpuwatch.notify.delivery import DeliveryError, backoff_s
from gpuwatch.notify.dispatcher import Dispatcher, MutedBy, Notification, no_silences
from gpuwatch.notify.forward import Forwarder
from gpuwatch.notify.receiverconfig import Integration
from gpuwatch.notify.receivers import send as send_integration
from gpuwatch.rules.evaluate import FIRING, INACTIVE, Alert
from gpuwatch.rules.load import Rule
from gpuwatch.store.notify import Delivery, NewNotification, NotifyEntry, QueuedNotification

log = logging.getLogger("gpuwatch.notify")

RESEND_DELAY_S = 60.0  # Prometheus's --rules.alert.resend-delay
GIVE_UP_S = 12 * 3600.0
LOG_RETENTION_MS = 7 * 86400 * 1000
_IDLE_WAIT_S = 3600.0

NOTIFY_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "gpuwatch_notifications_total",
        "counter",
        "Notification delivery attempts by receiver and result (success, failure, dropped = given up).",
        "",
        ("receiver", "result"),
    ),
    MetricInfo("gpuwatch_notifications_queued", "gauge", "Notifications waiting to be delivered.", ""),
    MetricInfo(
        "gpuwatch_alertmanager_posts_total",
        "counter",
        "Alert batches posted to each Alertmanager of `alerting`, by result (success, failure).",
        "",
        ("alertmanager", "result"),
    ),
)


class NotifyStore(Protocol):
    """What the notifier needs of the store."""

    def enqueue_notifications(
        self, items: Sequence[NewNotification], states: Sequence[NotifyEntry]
    ) -> None: ...
    def retry_notification(self, id_: int, attempts: int, next_ms: int, error: str) -> None: ...
    def finish_notification(self, delivery: Delivery) -> None: ...
    def prune_notifications(self, log_before_ms: int, state_before_ms: int) -> None: ...
    def queued_notifications(self) -> list[QueuedNotification]: ...
    def notify_states(self) -> list[NotifyEntry]: ...
    def notification_log(self, *, receiver: str | None = None, limit: int = 200) -> list[Delivery]: ...


Sender = Callable[..., None]


class PostedAlert(Protocol):
    """An alert another sender posted (gpuwatch.notify.api.AmAlert)."""

    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def starts_at_ms(self) -> int: ...
    @property
    def ends_at_ms(self) -> int: ...
    @property
    def generator_url(self) -> str: ...


def _as_utf8(pairs: Labels) -> Labels:
    """`pairs` with each lone surrogate in a value (JSON's "\\udcff" in a pushed label) as U+FFFD, as
    Alertmanager, the receivers and the queue's table take text: UTF-8."""
    if all(is_utf8(v) for _, v in pairs):
        return pairs
    return tuple((k, as_utf8(v)) for k, v in pairs)


class Notifier:
    """Route alerts to receivers and Alertmanagers; own the worker thread and the delivery pool."""

    def __init__(
        self,
        config: NotifyConfig,
        alerting: AlertingConfig,
        store: NotifyStore,
        clock: Clock,
        *,
        external_url: str,
        muted_by: MutedBy = no_silences,
        sender: Sender = send_integration,
    ) -> None:
        self.config = config
        self._store = store
        self._clock = clock
        self._external_url = external_url.rstrip("/")
        self._sender = sender
        entries: list[NotifyEntry] = []
        if config.route is not None:
            try:
                entries = store.notify_states()
            except StoreError as e:
                log.warning("notify: cannot read what was notified before: %s", e)
        self.dispatcher = (
            Dispatcher(config, muted_by=muted_by, entries=entries) if config.route is not None else None
        )
        self._integrations: dict[str, Integration] = {
            f"{r.name}/{i.name}": i for r in config.receivers for i in r.integrations
        }
        self.forwarder = Forwarder(
            alerting, clock, on_result=lambda url, r: self._count(url, r, "alertmanager")
        )
        self._last_sent: dict[Labels, int] = {}
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # integrations with a delivery in flight
        self._counts: dict[tuple[str, str, str], int] = {}
        self._queued = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self.wakeups = 0
        self._last_prune_ms = 0

    @property
    def muted_by(self) -> MutedBy:
        return self.dispatcher.muted_by if self.dispatcher is not None else no_silences

    @muted_by.setter
    def muted_by(self, fn: MutedBy) -> None:
        if self.dispatcher is not None:
            self.dispatcher.muted_by = fn

    def inhibited_by(self, labels: Mapping[str, str], now_ms: int) -> list[str]:
        """Return the fingerprints of the firing alerts that inhibit an alert with these labels."""
        return self.dispatcher.inhibited_by(labels, now_ms) if self.dispatcher is not None else []

    # -- input from the rule manager (on the rule evaluation thread: cheap, never blocks on I/O) --------
    def observe(self, alerts: Sequence[tuple[Rule, Alert]], interval_s: float, now_ms: int) -> None:
        """Take one group evaluation's alerts and send those Prometheus would send now."""
        delta_ms = int(max(RESEND_DELAY_S, interval_s) * 1000)
        out: list[NotifyAlert] = []
        with self._lock:
            for rule, a in alerts:
                if a.state != FIRING and not (a.state == INACTIVE and a.resolved_at_ms is not None):
                    continue
                last = self._last_sent.get(a.labels)
                resolved_since = a.resolved_at_ms is not None and (last is None or a.resolved_at_ms > last)
                if not resolved_since and last is not None and last + RESEND_DELAY_S * 1000 >= now_ms:
                    continue
                self._last_sent[a.labels] = now_ms
                ends = a.resolved_at_ms if a.resolved_at_ms is not None else now_ms + 4 * delta_ms
                out.append(
                    NotifyAlert(
                        _as_utf8(a.labels),
                        _as_utf8(a.annotations),
                        a.fired_at_ms if a.fired_at_ms is not None else a.active_at_ms,
                        ends,
                        f"{self._external_url}/api/v1/query?query={quote(rule.expr, safe='')}",
                    )
                )
            # Alerts that are gone (rule removed, resolved and forgotten) stop being tracked after an hour.
            for labels in [k for k, t in self._last_sent.items() if t < now_ms - 3600_000]:
                del self._last_sent[labels]
        if out:
            self.forwarder.add(out)
            if self.dispatcher is not None:
                self.dispatcher.put(out, now_ms)
            self._wake.set()

    def observe_received(self, alerts: Sequence[PostedAlert], now_ms: int) -> None:
        """Route alerts another sender posted to `/api/v2/alerts`, as Alertmanager would (not forwarded)."""
        if self.dispatcher is None:
            return
        out = [
            NotifyAlert(
                make_labels(a.labels),
                make_labels(a.annotations),
                a.starts_at_ms,
                a.ends_at_ms,
                a.generator_url,
            )
            for a in alerts
        ]
        self.dispatcher.put(out, now_ms)
        self._wake.set()

    # -- one round of work ------------------------------------------------------------------------------
    def tick(self) -> None:
        """Flush due alert groups into the queue, then deliver what is due (inline without the thread)."""
        now_ms = self._clock.now_ms()
        if self.dispatcher is not None:
            notes, states = self.dispatcher.flush_due(now_ms)
            if notes or states:
                items = [self._queue_item(n) for n in notes]
                self._store.enqueue_notifications(items, states)
                self.dispatcher.commit(states)
                for n in notes:
                    log.info(
                        "notify: queued %s notification of %d alert(s) for %s/%s",
                        "firing" if n.is_firing else "resolved",
                        len(n.alerts),
                        n.receiver,
                        n.integration,
                    )
        self._deliver_due(now_ms)
        self._forward_due(now_ms)
        if now_ms - self._last_prune_ms > 3600_000:
            self._last_prune_ms = now_ms
            self._store.prune_notifications(now_ms - LOG_RETENTION_MS, now_ms - 120 * 3600_000)

    def _queue_item(self, n: Notification) -> NewNotification:
        integration = self._integrations[f"{n.receiver}/{n.integration}"]
        payload = webhook_payload(
            receiver=n.receiver,
            group_key=n.group_key,
            group_labels=dict(n.group_labels),
            alerts=n.alerts,
            now_ms=n.at_ms,
            external_url=self._external_url,
            max_alerts=integration.max_alerts,
        )
        status = "firing" if n.is_firing else "resolved"
        return NewNotification(n.receiver, n.integration, n.group_key, status, json.dumps(payload), n.at_ms)

    def _deliver_due(self, now_ms: int) -> None:
        queued = self._store.queued_notifications()
        self._queued = len(queued)
        due: dict[str, int] = {}
        for q in queued:
            due.setdefault(f"{q.receiver}/{q.integration}", q.next_attempt_ms)  # the oldest decides
        for key, at_ms in due.items():
            with self._lock:
                if key in self._busy or at_ms > now_ms:
                    continue
                self._busy.add(key)
            self._run(functools.partial(self._deliver, key))

    def _run(self, fn: Callable[[], None]) -> None:
        if self._pool is None:
            fn()
            return
        fut: Future[None] = self._pool.submit(fn)
        fut.add_done_callback(lambda f: self._wake.set())

    def _deliver(self, key: str) -> None:
        """Deliver one integration's queued notifications in order, stopping at the first failure.

        Only one delivery per integration runs at a time (`_busy`), and it reads the queue itself, so a
        notification is never sent twice from a stale snapshot.
        """
        try:
            items = [q for q in self._store.queued_notifications() if f"{q.receiver}/{q.integration}" == key]
            for q in items:
                if q.next_attempt_ms > self._clock.now_ms() or self._stop.is_set():
                    return
                if not self._attempt(key, q):
                    return
        except StoreError as e:
            log.warning("notify: cannot update the queue: %s", e)
        finally:
            with self._lock:
                self._busy.discard(key)

    def _attempt(self, key: str, q: QueuedNotification) -> bool:
        integration = self._integrations.get(key)
        attempts = q.attempts + 1
        if integration is None:
            error, permanent = f"receiver {q.receiver!r} has no integration {q.integration!r} any more", True
        else:
            try:
                self._sender(integration, json.loads(q.payload), now_ms=self._clock.now_ms())
            except DeliveryError as e:
                error, permanent = str(e), e.permanent
            else:
                self._count(q.receiver, "success")
                self._store.finish_notification(self._delivery(q, attempts, "success", ""))
                log.info(
                    "notify: delivered %s notification to %s after %d attempt(s)", q.status, key, attempts
                )
                return True
        self._count(q.receiver, "failure")
        now_ms = self._clock.now_ms()
        if permanent or now_ms - q.created_ms >= GIVE_UP_S * 1000:
            self._count(q.receiver, "dropped")
            self._store.finish_notification(self._delivery(q, attempts, "failed", error))
            log.error("notify: giving up on a %s notification to %s: %s", q.status, key, error)
            return True  # the next one may go through
        next_ms = now_ms + int(backoff_s(attempts) * 1000)
        self._store.retry_notification(q.id, attempts, next_ms, error)
        log.warning(
            "notify: %s failed (attempt %d, next in %gs): %s", key, attempts, backoff_s(attempts), error
        )
        return False

    def _delivery(self, q: QueuedNotification, attempts: int, result: str, error: str) -> Delivery:
        n = len(json.loads(q.payload).get("alerts", []))
        return Delivery(
            q.id,
            q.receiver,
            q.integration,
            q.group_key,
            q.status,
            n,
            q.created_ms,
            self._clock.now_ms(),
            attempts,
            result,
            error,
        )

    def _count(self, receiver: str, result: str, metric: str = "notifications") -> None:
        with self._lock:
            k = (metric, receiver, result)
            self._counts[k] = self._counts.get(k, 0) + 1

    def _forward_due(self, now_ms: int) -> None:
        for job in self.forwarder.due(now_ms):
            self._run(functools.partial(self._post, job))

    @staticmethod
    def _post(job: Callable[[], None]) -> None:
        try:
            job()
        except DeliveryError as e:
            log.warning("notify: cannot post alerts to an Alertmanager: %s", e)

    # -- the worker thread ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker thread and the delivery pool (only `gpuwatch serve` calls this)."""
        n = max(1, min(8, len(self._integrations) + len(self.forwarder.urls)))
        self._pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="gpuwatch-notify-send")
        self._thread = threading.Thread(target=self._loop, name="gpuwatch-notify", daemon=True)
        self._thread.start()

    def _next_wake_s(self) -> float:
        now_ms = self._clock.now_ms()
        times: list[int] = []
        if self.dispatcher is not None:
            due = self.dispatcher.next_due_ms()
            if due is not None:
                times.append(due)
        forward = self.forwarder.next_ms()
        if forward is not None:
            times.append(forward)
        with self._lock:
            busy = set(self._busy)
        if self._queued:
            try:
                queued = self._store.queued_notifications()
            except StoreError:
                queued, times = [], [*times, now_ms + 5000]
            # An integration with a delivery in flight wakes the loop when it is done.
            times.extend(q.next_attempt_ms for q in queued if f"{q.receiver}/{q.integration}" not in busy)
        if not times:
            return _IDLE_WAIT_S
        return min(_IDLE_WAIT_S, max(0.05, (min(times) - now_ms) / 1000))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.wakeups += 1
            try:
                self.tick()
                timeout = self._next_wake_s()
            except Exception as e:  # noqa: BLE001 - the worker is its own job wrapper: log and go on
                log.warning("notify: %s: %s", type(e).__name__, e)
                timeout = 5.0
            self._wake.wait(timeout)
            self._wake.clear()

    def stop(self) -> None:
        """Stop the worker and wait for deliveries in flight; queued notifications stay queued."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    # -- reading ------------------------------------------------------------------------------------------
    def samples(self) -> list[Sample]:
        """Return gpuwatch_notifications_* figures for /metrics."""
        with self._lock:
            counts = dict(self._counts)
            out = [Sample("gpuwatch_notifications_queued", (), float(self._queued))]
        for r in self.config.receivers:
            for result in ("success", "failure", "dropped"):
                counts.setdefault(("notifications", r.name, result), 0)
        for url in self.forwarder.urls:
            for result in ("success", "failure"):
                counts.setdefault(("alertmanager", url, result), 0)
        for (metric, who, result), n in sorted(counts.items()):
            if metric == "notifications":
                out.append(
                    Sample(
                        "gpuwatch_notifications_total",
                        stable_labels({"receiver": who, "result": result}),
                        float(n),
                    )
                )
            else:
                out.append(
                    Sample(
                        "gpuwatch_alertmanager_posts_total",
                        stable_labels({"alertmanager": who, "result": result}),
                        float(n),
                    )
                )
        return out

    def status(self, *, receiver: str | None = None, limit: int = 200) -> dict[str, Any]:
        """Return the delivery log, the queue and the Alertmanagers' state as JSON-friendly values."""

        log_rows = self._store.notification_log(receiver=receiver, limit=limit)
        queued = [q for q in self._store.queued_notifications() if receiver is None or q.receiver == receiver]
        return {
            "deliveries": [
                {
                    "id": d.id,
                    "receiver": d.receiver,
                    "integration": d.integration,
                    "groupKey": d.group_key,
                    "status": d.status,
                    "alerts": d.alerts,
                    "createdAt": format_time(d.created_ms),
                    "finishedAt": format_time(d.finished_ms),
                    "attempts": d.attempts,
                    "result": d.result,
                    "error": d.error,
                }
                for d in log_rows
            ],
            "queue": [
                {
                    "id": q.id,
                    "receiver": q.receiver,
                    "integration": q.integration,
                    "groupKey": q.group_key,
                    "status": q.status,
                    "createdAt": format_time(q.created_ms),
                    "attempts": q.attempts,
                    "nextAttemptAt": format_time(q.next_attempt_ms),
                    "lastError": q.last_error,
                }
                for q in queued
            ],
            "alertmanagers": self.forwarder.status(),
            "groups": self.dispatcher.groups(self._clock.now_ms()) if self.dispatcher is not None else [],
            "worker": {"wakeups": self.wakeups},
        }
