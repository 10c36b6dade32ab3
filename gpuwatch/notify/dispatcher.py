"""Alertmanager's dispatcher, in-process: route alerts into groups, wait, mute, deduplicate, notify.

`put(alerts, now_ms)` takes alerts as Prometheus would post them (a firing alert's `endsAt` a few
evaluation intervals ahead, a resolved one's the resolve time). Each matching route puts the alert into
the aggregation group named by its `group_by` labels. `flush_due(now_ms)` flushes every group whose time
has come: first `group_wait` after the group was created (at once if its alerts are older than that),
then every `group_interval`. A flush drops alerts that are inhibited or silenced, then notifies only if
Alertmanager would (`needs_update`): new firing alerts, newly resolved ones (if the receiver wants them),
all resolved, or `repeat_interval` passed. What was notified is kept per group and receiver
(`NotifyEntry`, persisted by the caller) so a restart does not notify the same alerts again.

Pure with respect to time and I/O: the caller passes `now_ms` and gets `Notification`s back.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuwatch.notify.alert import NotifyAlert
from gpuwatch.notify.config import InhibitRule, NotifyConfig
from gpuwatch.notify.matchers import matches_all
from gpuwatch.notify.route import Route
from gpuwatch.store.notify import NotifyEntry

MutedBy = Callable[[Mapping[str, str], int], Sequence[str]]
STATE_RETENTION_MS = 120 * 3600 * 1000  # Alertmanager keeps its notification log 120h
_RESOLVED_KEEP_MS = 15 * 60 * 1000


def no_silences(labels: Mapping[str, str], now_ms: int) -> Sequence[str]:
    """Return no silence ids (the default until silences are wired in)."""
    return ()


@dataclass(frozen=True)
class Notification:
    """What to send one receiver for one alert group at one flush (alerts after muting)."""

    receiver: str
    integration: str
    group_key: str
    group_labels: tuple[tuple[str, str], ...]
    alerts: tuple[NotifyAlert, ...]
    at_ms: int

    @property
    def is_firing(self) -> bool:
        return any(not a.is_resolved(self.at_ms) for a in self.alerts)


@dataclass
class _Group:
    route: Route
    labels: tuple[tuple[str, str], ...]
    key: str
    alerts: dict[str, NotifyAlert] = field(default_factory=dict)
    next_flush_ms: int = 0
    has_flushed: bool = False


def format_label_set(labels: Iterable[tuple[str, str]]) -> str:
    """Return a label set as Go's model.LabelSet.String(): `{a="1", b="2"}`."""
    import json

    return "{" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in sorted(labels)) + "}"


def needs_update(
    entry: NotifyEntry | None,
    firing: set[str],
    resolved: set[str],
    *,
    send_resolved: bool,
    repeat_ms: float,
    now_ms: int,
) -> bool:
    """Tell whether Alertmanager's dedup stage would notify (notify/notify.go DedupStage.needsUpdate)."""
    if entry is None:
        return bool(firing)
    if not firing <= set(entry.firing):
        return True
    if not firing:
        return bool(entry.firing)
    if send_resolved and not resolved <= set(entry.resolved):
        return True
    return entry.notified_ms < now_ms - repeat_ms


class Dispatcher:
    """Hold aggregation groups and notification state; thread-safe."""

    def __init__(
        self,
        config: NotifyConfig,
        *,
        muted_by: MutedBy = no_silences,
        entries: Iterable[NotifyEntry] = (),
    ) -> None:
        if config.route is None:
            raise ValueError("a dispatcher needs a route")
        self._route = config.route
        self._inhibit = config.inhibit_rules
        self._intervals = {t.name: t for t in config.time_intervals}
        self._integrations = {
            r.name: [(i.name, i.send_resolved) for i in r.integrations] for r in config.receivers
        }
        self.muted_by = muted_by
        self._lock = threading.Lock()
        self._groups: dict[tuple[str, str], _Group] = {}  # (route key, group key)
        self._alerts: dict[str, NotifyAlert] = {}  # every known alert by fingerprint (for inhibition)
        self._entries: dict[tuple[str, str], NotifyEntry] = {(e.group_key, e.receiver): e for e in entries}

    # -- input ------------------------------------------------------------------------------------
    def put(self, alerts: Iterable[NotifyAlert], now_ms: int) -> None:
        """Add or update alerts and put each into the groups of the routes it matches."""
        with self._lock:
            for a in alerts:
                fp = a.fingerprint
                old = self._alerts.get(fp)
                if (
                    old is not None
                    and not old.is_resolved(a.starts_at_ms)
                    and old.starts_at_ms < a.starts_at_ms
                ):
                    a = NotifyAlert(a.labels, a.annotations, old.starts_at_ms, a.ends_at_ms, a.generator_url)
                self._alerts[fp] = a
                labels = a.label_map()
                for route in self._route.match(labels):
                    glabels = tuple(sorted(route.group_labels(labels).items()))
                    gkey = f"{route.key}:{format_label_set(glabels)}"
                    g = self._groups.get((route.key, gkey))
                    if g is None:
                        g = _Group(
                            route, glabels, gkey, next_flush_ms=now_ms + int(route.group_wait_s * 1000)
                        )
                        self._groups[(route.key, gkey)] = g
                    g.alerts[fp] = a
                    # Alertmanager flushes at once when the alert is already older than group_wait.
                    if not g.has_flushed and a.starts_at_ms + route.group_wait_s * 1000 <= now_ms:
                        g.next_flush_ms = min(g.next_flush_ms, now_ms)

    # -- muting -----------------------------------------------------------------------------------
    def inhibited_by(self, labels: Mapping[str, str], now_ms: int) -> list[str]:
        """Return the fingerprints of the firing alerts that inhibit an alert with these labels."""
        with self._lock:
            return self._inhibitors(labels, now_ms)

    def _inhibitors(self, labels: Mapping[str, str], now_ms: int) -> list[str]:
        out: list[str] = []
        for rule in self._inhibit:
            if not matches_all(rule.target, labels):
                continue
            two_sided = matches_all(rule.source, labels)
            for fp, src in self._alerts.items():
                if src.is_resolved(now_ms) or fp in out:
                    continue
                s = src.label_map()
                if not matches_all(rule.source, s) or not _equal(rule, s, labels):
                    continue
                if two_sided and matches_all(rule.target, s):
                    continue  # an alert matching both sides never inhibits one that does too
                out.append(fp)
                break
        return out

    def is_muted(self, labels: Mapping[str, str], now_ms: int) -> bool:
        return bool(self._inhibitors(labels, now_ms)) or bool(self.muted_by(labels, now_ms))

    def time_muted(self, route: Route, now_ms: int) -> list[str]:
        """Return why a route sends nothing now: the mute intervals it is in, or its active ones it is not in.

        Alertmanager's TimeActiveStage and TimeMuteStage: a muted flush sends nothing and records nothing,
        so the alerts still firing are notified at the first flush after the mute ends.
        """
        muted = [n for n in route.mute_time_intervals if self._intervals[n].contains(now_ms)]
        active = route.active_time_intervals
        if active and not any(self._intervals[n].contains(now_ms) for n in active):
            muted.extend(f"outside {n}" for n in active)
        return muted

    # -- flushing ---------------------------------------------------------------------------------
    def next_due_ms(self) -> int | None:
        """Return when the next group is due to flush, or None when there are no groups."""
        with self._lock:
            return min((g.next_flush_ms for g in self._groups.values()), default=None)

    def flush_due(self, now_ms: int) -> tuple[list[Notification], list[NotifyEntry]]:
        """Flush every due group; return the notifications to send and the notification state they imply.

        The caller persists both together, then calls `commit(states)`; until then the dispatcher still
        thinks these alerts were not notified (so a failed write means they are tried again).
        """
        out: list[Notification] = []
        states: list[NotifyEntry] = []
        with self._lock:
            for k, g in list(self._groups.items()):
                if g.next_flush_ms > now_ms:
                    continue
                g.has_flushed = True
                g.next_flush_ms = now_ms + int(g.route.group_interval_s * 1000)
                for note, entry in self._flush(g, now_ms):
                    out.append(note)
                    states.append(entry)
                # As Alertmanager: resolved alerts leave the group once a flush has handled them.
                for fp, a in list(g.alerts.items()):
                    if a.is_resolved(now_ms):
                        del g.alerts[fp]
                if not g.alerts:
                    del self._groups[k]
            self._forget(now_ms)
        return out, states

    def commit(self, states: Iterable[NotifyEntry]) -> None:
        """Record that the notifications of `flush_due` were stored (queued for delivery)."""
        with self._lock:
            for e in states:
                self._entries[(e.group_key, e.receiver)] = e

    def _flush(self, g: _Group, now_ms: int) -> list[tuple[Notification, NotifyEntry]]:
        if self.time_muted(g.route, now_ms):
            return []
        alerts = [a for a in g.alerts.values() if not self.is_muted(a.label_map(), now_ms)]
        if not alerts:
            return []
        alerts.sort(key=lambda a: (a.starts_at_ms, a.labels))
        firing = {a.fingerprint for a in alerts if not a.is_resolved(now_ms)}
        resolved = {a.fingerprint for a in alerts if a.is_resolved(now_ms)}
        receiver = g.route.receiver
        out = []
        # As Alertmanager, each integration of the receiver keeps its own notification log entry.
        for integration, send_resolved in self._integrations.get(receiver, []):
            who = f"{receiver}/{integration}"
            entry = self._entries.get((g.key, who))
            repeat_ms = g.route.repeat_interval_s * 1000
            if not needs_update(
                entry, firing, resolved, send_resolved=send_resolved, repeat_ms=repeat_ms, now_ms=now_ms
            ):
                continue
            new = NotifyEntry(g.key, who, tuple(sorted(firing)), tuple(sorted(resolved)), now_ms)
            shown = tuple(a for a in alerts if send_resolved or not a.is_resolved(now_ms))
            if not shown:  # nothing this integration wants; remember that it is up to date
                self._entries[(g.key, who)] = new
                continue
            out.append((Notification(receiver, integration, g.key, g.labels, shown, now_ms), new))
        return out

    def _forget(self, now_ms: int) -> None:
        grouped = {fp for g in self._groups.values() for fp in g.alerts}
        for fp, a in list(self._alerts.items()):
            if fp not in grouped and a.is_resolved(now_ms - _RESOLVED_KEEP_MS):
                del self._alerts[fp]
        for key, e in list(self._entries.items()):
            if e.notified_ms < now_ms - STATE_RETENTION_MS:
                del self._entries[key]

    # -- reading ----------------------------------------------------------------------------------
    def groups(self, now_ms: int | None = None) -> list[dict[str, object]]:
        """Return the aggregation groups (for introspection); `mutedBy` names the time intervals muting
        a group's route at `now_ms`."""
        with self._lock:
            return [
                {
                    "receiver": g.route.receiver,
                    "groupKey": g.key,
                    "labels": dict(g.labels),
                    "alerts": len(g.alerts),
                    **({"mutedBy": self.time_muted(g.route, now_ms)} if now_ms is not None else {}),
                }
                for g in self._groups.values()
            ]


def _equal(rule: InhibitRule, a: Mapping[str, str], b: Mapping[str, str]) -> bool:
    return all(a.get(n, "") == b.get(n, "") for n in rule.equal)
