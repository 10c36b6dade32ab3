"""What the rule manager keeps of its groups between evaluations, and across a restart.

Each loaded group has a `GroupState`: its rules' alerts, their `RuleStatus` and the series each wrote
last time. Alert state is saved in the store after every evaluation that changed it (queued behind what
was appended before it when a round cache lets reads see those samples meanwhile); `manager.py` reads it
back at start and matches it to the loaded rules. Each transition is kept for the alerts page
(`HistoryEntry`) and queued for the store's history table; the latest are read back at start.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from gpuwatch.core.errors import StoreError
from gpuwatch.core.model import Batch, Labels
from gpuwatch.rules.evaluate import Alert, Transition
from gpuwatch.rules.load import Group
from gpuwatch.rules.roundcache import RoundCache
from gpuwatch.store.alerthistory import StoredTransition
from gpuwatch.store.alerts import StoredAlert

log = logging.getLogger("gpuwatch.rules")
# The transitions the alerts page can list (in memory, read back from the store at start).
HISTORY_LENGTH = 2000


@dataclass(frozen=True)
class HistoryEntry:
    """One alert transition with the group and rule it belongs to, for the alerts page."""

    group: str
    rule: str
    transition: Transition


class RuleStore(Protocol):
    """What the manager needs of the store."""

    def append(self, batch: Batch) -> None: ...
    def flush(self) -> None: ...
    def save_alerts(self, group_key: str, alerts: Sequence[StoredAlert]) -> None: ...
    def save_alerts_soon(self, group_key: str, alerts: Sequence[StoredAlert]) -> Future[Any]:
        """Queue the save behind what was appended before it; the future tells when it is done."""
        ...

    def alerts(self) -> list[StoredAlert]: ...
    def save_alert_history_soon(self, rows: Sequence[StoredTransition]) -> Future[Any]:
        """Queue transitions for the history table; the future tells when they are stored."""
        ...

    def alert_history(self, limit: int) -> list[StoredTransition]: ...


@dataclass
class RuleStatus:
    """How a rule's last evaluation went."""

    health: str = "unknown"
    last_error: str = ""
    last_eval_ms: int | None = None
    duration_s: float = 0.0


@dataclass
class GroupState:
    """A loaded group, its rules' alerts and status, and the series it wrote last time."""

    group: Group
    interval_s: float
    alerts: list[dict[Labels, Alert]]
    status: list[RuleStatus]
    written: list[set[tuple[str, Labels]]]
    last_eval_ms: int | None = None
    duration_s: float = 0.0
    saved: tuple[Any, ...] = ()


def _log_history_failure(fut: Future[Any]) -> None:
    e = fut.exception()
    if e is not None:
        log.warning("rules: cannot store alert transitions: %s", e)


class AlertPersistence:
    """Mixed into `RuleManager`, which provides the store, its lock, the round cache and what rules
    appended since the store last flushed (a save through the store's writer flushes it)."""

    _store: RuleStore
    _lock: threading.Lock
    _cache: RoundCache | None
    _history: deque[HistoryEntry]
    _saving: list[tuple[GroupState, Future[Any]]]
    _unflushed: set[str]
    _flush_owed: bool
    _store_owed: bool

    def _restore_history(self) -> None:
        try:
            stored = self._store.alert_history(HISTORY_LENGTH)
        except StoreError as e:
            log.warning("rules: cannot read the alert history: %s", e)
            return
        with self._lock:
            self._history.extend(
                HistoryEntry(r.group, r.rule, Transition(r.labels, r.before, r.after, r.at_ms))
                for r in stored
            )

    def _remember(self, entries: list[HistoryEntry]) -> None:
        """Keep transitions for the alerts page and queue them for the store (not waited for)."""
        with self._lock:
            self._history.extend(entries)
        rows = [
            StoredTransition(e.group, e.rule, e.transition.labels, e.transition.before, e.transition.after,
                             e.transition.at_ms)
            for e in entries
        ]  # fmt: skip
        try:
            fut = self._store.save_alert_history_soon(rows)
        except StoreError as e:
            log.warning("rules: cannot store %d alert transition(s): %s", len(rows), e)
            return
        fut.add_done_callback(_log_history_failure)

    @staticmethod
    def _fingerprint(g: GroupState) -> tuple[Any, ...]:
        return tuple(
            (
                i,
                a.labels,
                a.annotations,
                a.state,
                a.active_at_ms,
                a.fired_at_ms,
                a.resolved_at_ms,
                a.keep_firing_since_ms,
            )
            for i, alerts in enumerate(g.alerts)
            for a in alerts.values()
        )

    def _save(self, g: GroupState) -> None:
        fp = self._fingerprint(g)
        if fp == g.saved:
            return
        rows = [
            StoredAlert(
                g.group.key,
                g.group.rules[i].name,
                a.labels,
                a.annotations,
                a.state,
                a.active_at_ms,
                a.value,
                a.fired_at_ms,
                a.resolved_at_ms,
                a.keep_firing_since_ms,
                a.last_eval_ms,
            )
            for i, alerts in enumerate(g.alerts)
            for a in alerts.values()
        ]
        if self._cache is not None:
            # Queued, not waited for (the writer flushes what was appended before it, then saves):
            # what rules appended is readable through the cache from here, as after a `_flush`.
            try:
                self._saving.append((g, self._store.save_alerts_soon(g.group.key, rows)))
            except StoreError as e:
                log.warning("rules: cannot save the alerts of group %s: %s", g.group.name, e)
                return
            g.saved = fp
            self._cache.publish()
            self._flush_owed, self._store_owed = False, True
            return
        try:
            self._store.save_alerts(g.group.key, rows)
        except StoreError as e:
            log.warning("rules: cannot save the alerts of group %s: %s", g.group.name, e)
            return
        g.saved = fp
        # The writer flushed all appended samples before saving: readable now, as after `_flush`.
        self._unflushed.clear()
        self._flush_owed = self._store_owed = False

    def _check_saves(self) -> None:
        """Log the queued alert saves that failed; their groups save again at their next evaluation."""
        pending = []
        for g, fut in self._saving:
            if not fut.done():
                pending.append((g, fut))
                continue
            e = fut.exception()
            if e is not None:
                log.warning("rules: cannot save the alerts of group %s: %s", g.group.name, e)
                g.saved = ()
        self._saving = pending

    def history(self, limit: int = HISTORY_LENGTH) -> list[HistoryEntry]:
        """Return the latest alert transitions, newest first (at most HISTORY_LENGTH kept)."""
        with self._lock:
            entries = list(self._history)
        return entries[::-1][:limit]
