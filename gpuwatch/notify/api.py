"""Firing alerts, alert groups and status in the JSON shapes of Alertmanager's API v2.

gpuwatch shows its firing alerts the way an Alertmanager shows the alerts Prometheus sent it:
`startsAt` is when the alert fired, `endsAt` is Prometheus's `ValidUntil` (the last evaluation plus
four times the larger of the group interval and the one-minute resend delay), `updatedAt` the last
evaluation. Pending alerts are not shown (Prometheus does not send them), nor resolved ones (their
`endsAt` has passed). The shapes follow `api/v2/openapi.yaml` of prometheus/alertmanager.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import yaml

from gpuwatch import __version__
from gpuwatch.core.units import format_rfc3339_millis as format_time
from gpuwatch.notify.alert import fingerprint
from gpuwatch.notify.config import NotifyConfig
from gpuwatch.notify.matchers import LabelMatcher, parse_matcher
from gpuwatch.notify.notifier import Notifier
from gpuwatch.notify.route import Route
from gpuwatch.notify.silences import SilenceError, Silences
from gpuwatch.rules.evaluate import FIRING, Alert

RESEND_DELAY_S = 60.0  # Prometheus's --rules.alert.resend-delay default
API_VERSION = "0.25.0"  # the Alertmanager release whose API v2 this follows (amtool compares minor versions)


@dataclass(frozen=True)
class AmAlert:
    """An alert as Alertmanager holds it; times in Unix milliseconds."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at_ms: int
    ends_at_ms: int
    updated_at_ms: int
    generator_url: str = ""


def from_rule(a: Alert, expr: str, interval_s: float, base_url: str) -> AmAlert:
    """Return a rule's firing alert as Prometheus would have sent it to an Alertmanager."""
    return AmAlert(
        labels=dict(a.labels),
        annotations=dict(a.annotations),
        starts_at_ms=a.fired_at_ms if a.fired_at_ms is not None else a.active_at_ms,
        ends_at_ms=a.last_eval_ms + int(4 * max(interval_s, RESEND_DELAY_S) * 1000),
        updated_at_ms=a.last_eval_ms,
        generator_url=f"{base_url.rstrip('/')}/api/v1/query?query={quote(expr, safe='')}",
    )


def firing_alerts(groups: Iterable[Any], base_url: str) -> list[AmAlert]:
    """Return the firing alerts of the rule manager's groups (`RuleManager.groups()`)."""
    out: list[AmAlert] = []
    for g in groups:
        for rule, alerts in zip(g.group.rules, g.alerts, strict=True):
            out.extend(
                from_rule(a, rule.expr, g.interval_s, base_url) for a in alerts.values() if a.state == FIRING
            )
    return out


def parse_filter(texts: Sequence[str]) -> list[LabelMatcher]:
    """Parse the `filter` query parameters; raise MatcherError (400) for a bad one."""
    return [parse_matcher(t) for t in texts]


def matches_filter(matchers: Sequence[LabelMatcher], labels: Mapping[str, str]) -> bool:
    """Tell whether `labels` pass a filter as Alertmanager's `matchFilterLabels` decides."""
    for m in matchers:
        present = m.name in labels
        if m.value == "" and present != m.is_equal:
            continue  # `a!=""` / `a!~""` pass when a is present; `a=""` / `a=~""` when absent
        if not m.matches_value(labels.get(m.name, "")):
            return False
    return True


def parse_bool(name: str, text: str | None, default: bool = True) -> bool:
    """Parse a boolean query parameter as Go's strconv.ParseBool does; raise SilenceError."""
    if text is None or text == "":
        return default
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise SilenceError(f'{name} in query must be of type boolean: "{text}"')


Suppression = Callable[[Mapping[str, str]], tuple[list[str], list[str]]]


def alert_json(
    a: AmAlert, silenced_by: list[str], inhibited_by: list[str], receivers: list[str]
) -> dict[str, Any]:
    """Return one alert as Alertmanager's `gettableAlert`."""
    out: dict[str, Any] = {
        "annotations": dict(a.annotations),
        "endsAt": format_time(a.ends_at_ms),
        "fingerprint": fingerprint(a.labels),
        "receivers": [{"name": r} for r in receivers],
        "startsAt": format_time(a.starts_at_ms),
        "status": {
            "inhibitedBy": inhibited_by,
            "silencedBy": silenced_by,
            "state": "suppressed" if silenced_by or inhibited_by else "active",
        },
        "updatedAt": format_time(a.updated_at_ms),
    }
    if a.generator_url:  # Alertmanager leaves it out when the sender gave none
        out["generatorURL"] = a.generator_url
    out["labels"] = dict(a.labels)
    return out


def select_alerts(
    alerts: Iterable[AmAlert],
    suppression: Suppression,
    receivers: Callable[[Mapping[str, str]], list[str]],
    *,
    matchers: Sequence[LabelMatcher] = (),
    active: bool = True,
    silenced: bool = True,
    inhibited: bool = True,
    receiver: Callable[[str], bool] | None = None,
) -> list[dict[str, Any]]:
    """Return the alerts that pass GET /api/v2/alerts's filters, by fingerprint as Alertmanager sorts them."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for a in alerts:
        labels = a.labels
        fp = fingerprint(labels)
        if fp in seen:  # a rule's alert and a received one with the same labels: the first wins
            continue
        seen.add(fp)
        names = receivers(labels)
        if receiver is not None and not any(receiver(n) for n in names):
            continue
        silenced_by, inhibited_by = suppression(labels)
        if not active and not silenced_by and not inhibited_by:
            continue
        if (not silenced and silenced_by) or (not inhibited and inhibited_by):
            continue
        if not matches_filter(matchers, labels):
            continue
        out.append(alert_json(a, silenced_by, inhibited_by, names))
    out.sort(key=lambda a: str(a["fingerprint"]))
    return out


def alert_groups(alerts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Group `gettableAlert`s as an Alertmanager whose root route has no `group_by`: one group a receiver."""
    by_receiver: dict[str, list[dict[str, Any]]] = {}
    for a in alerts:
        for r in a["receivers"] or [{"name": ""}]:
            by_receiver.setdefault(r["name"], []).append(a)
    return [
        {"labels": {}, "receiver": {"name": name}, "alerts": found} for name, found in by_receiver.items()
    ]


# -- hooks: where the notifier is wired in ------------------------------------------------------------


def receivers_for(route: Route | None, labels: Mapping[str, str]) -> list[str]:
    """Return the names of the receivers an alert with `labels` is routed to (none without `notify.route`)."""
    if route is None:
        return []
    return list(dict.fromkeys(r.receiver for r in route.match(labels)))


def receiver_names(notify: NotifyConfig) -> list[str]:
    """Return the names of every configured receiver (GET /api/v2/receivers)."""
    return [r.name for r in notify.receivers]


def config_text(notify: NotifyConfig) -> str:
    """Return the notification configuration as YAML text (`config.original` of GET /api/v2/status)."""
    if notify.route is None:
        return "# no notify: route is configured; gpuwatch only serves Alertmanager's API v2 here\n"
    return str(yaml.safe_dump(notify.public(), sort_keys=False))


def suppression(
    silences: Silences | None, notifier: Notifier | None, labels: Mapping[str, str], now_ms: int
) -> tuple[list[str], list[str]]:
    """Return (silencedBy, inhibitedBy) of an alert with `labels` at `now_ms`."""
    silenced = silences.muted_by(labels, now_ms) if silences is not None else []
    inhibited = notifier.inhibited_by(labels, now_ms) if notifier is not None else []
    return silenced, inhibited


def status_json(started_ms: int, config_text: str) -> dict[str, Any]:
    """Return Alertmanager's `alertmanagerStatus`: no cluster, gpuwatch's version in the build fields."""
    return {
        "cluster": {"status": "disabled", "peers": []},
        "versionInfo": {
            "version": API_VERSION,
            "revision": f"gpuwatch {__version__}",
            "branch": "gpuwatch",
            "buildUser": "gpuwatch",
            "buildDate": "",
            "goVersion": "none (gpuwatch is Python)",
        },
        "config": {"original": config_text},
        "uptime": format_time(started_ms),
    }
