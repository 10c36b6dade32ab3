"""Alerts as Alertmanager sees them (labels, annotations, startsAt, endsAt), their fingerprints, and
the messages built from a group of them: Alertmanager's webhook payload (version 4) and a short text."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatch.core.model import Labels
from gpuwatch.core.units import format_rfc3339 as format_time

_FNV_OFFSET = 14695981039346656037
_FNV_PRIME = 1099511628211
_MASK = (1 << 64) - 1


def fingerprint(labels: Labels | Mapping[str, str]) -> str:
    """Return Alertmanager's fingerprint of a label set (FNV-1a 64 over sorted names and values) as 16 hex
    digits; a lone surrogate (from a posted alert's JSON) is hashed as its bytes, not refused."""
    items = sorted(labels.items() if isinstance(labels, Mapping) else labels)
    h = _FNV_OFFSET
    for name, value in items:
        for part in (name, value):
            for b in part.encode("utf-8", "surrogatepass"):
                h = ((h ^ b) * _FNV_PRIME) & _MASK
            h = ((h ^ 0xFF) * _FNV_PRIME) & _MASK
    return f"{h:016x}"


@dataclass(frozen=True)
class NotifyAlert:
    """One alert as posted to Alertmanager; times in Unix ms; resolved once `ends_at_ms` has passed."""

    labels: Labels
    annotations: Labels
    starts_at_ms: int
    ends_at_ms: int
    generator_url: str = ""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.labels)

    def is_resolved(self, now_ms: int) -> bool:
        return self.ends_at_ms <= now_ms

    def label_map(self) -> dict[str, str]:
        return dict(self.labels)

    def api_json(self) -> dict[str, Any]:
        """Return the alert as Prometheus posts it to Alertmanager's /api/v2/alerts."""
        return {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": format_time(self.starts_at_ms),
            "endsAt": format_time(self.ends_at_ms),
            "generatorURL": self.generator_url,
        }


def _common(maps: Sequence[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    out = dict(maps[0])
    for m in maps[1:]:
        out = {k: v for k, v in out.items() if m.get(k) == v}
    return dict(sorted(out.items()))


def webhook_payload(
    *,
    receiver: str,
    group_key: str,
    group_labels: Mapping[str, str],
    alerts: Sequence[NotifyAlert],
    now_ms: int,
    external_url: str,
    max_alerts: int = 0,
) -> dict[str, Any]:
    """Return Alertmanager's webhook message (version 4) for a group of alerts at `now_ms`.

    As Alertmanager's, `receiver` is the receiver's name with regex metacharacters escaped (`team\\.gpu`).
    """
    firing = any(not a.is_resolved(now_ms) for a in alerts)
    shown = list(alerts[:max_alerts]) if max_alerts else list(alerts)
    return {
        "receiver": re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", receiver),
        "status": "firing" if firing else "resolved",
        "alerts": [
            {
                "status": "resolved" if a.is_resolved(now_ms) else "firing",
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "startsAt": format_time(a.starts_at_ms),
                # Alertmanager hides an end time that has not come yet.
                "endsAt": format_time(a.ends_at_ms if a.is_resolved(now_ms) else None),
                "generatorURL": a.generator_url,
                "fingerprint": a.fingerprint,
            }
            for a in shown
        ],
        "groupLabels": dict(sorted(group_labels.items())),
        "commonLabels": _common([dict(a.labels) for a in alerts]),
        "commonAnnotations": _common([dict(a.annotations) for a in alerts]),
        "externalURL": external_url,
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": len(alerts) - len(shown),
    }


def title(payload: Mapping[str, Any]) -> str:
    """Return Alertmanager's default subject: `[FIRING:2] GPUHot node-1 (critical)`."""
    status = str(payload["status"]).upper()
    alerts = payload["alerts"]
    n = sum(1 for a in alerts if a["status"] == "firing")
    head = f"[{status}:{n}]" if status == "FIRING" else f"[{status}]"
    group = payload["groupLabels"]
    parts = [head, *(group[k] for k in sorted(group))]
    rest = {k: v for k, v in payload["commonLabels"].items() if k not in group}
    if rest:
        parts.append("(" + " ".join(rest[k] for k in sorted(rest)) + ")")
    return " ".join(p for p in parts if p)


def body_lines(payload: Mapping[str, Any]) -> list[str]:
    """Return one line an alert: status, name, the summary or description, and the other labels."""
    lines = []
    for a in payload["alerts"]:
        labels = a["labels"]
        notes = a["annotations"]
        what = notes.get("summary") or notes.get("description") or notes.get("message") or ""
        extra = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
        line = f"[{a['status']}] {labels.get('alertname', '')}"
        if what:
            line += f": {what}"
        if extra:
            line += f" ({extra})"
        lines.append(line)
    if payload.get("truncatedAlerts"):
        lines.append(f"... and {payload['truncatedAlerts']} more")
    return lines


def text(payload: Mapping[str, Any]) -> str:
    """Return a plain-text message for chat and e-mail receivers."""
    return "\n".join([title(payload), "", *body_lines(payload)])
