"""Read `notify:` (alertmanager.yml's `global`, `route`, `receivers`, `inhibit_rules`, `time_intervals` and
`templates`) into one frozen `NotifyConfig`; every problem is one sentence naming its path. A receiver is
read in `receiverconfig.py`, a route in `route.py`, the time intervals in `timeintervals.py`, and
prometheus.yml's `alerting:` in `alerting.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuwatch.notify.matchers import Matchers
from gpuwatch.notify.receiverconfig import Receiver, http_url, parse_receiver
from gpuwatch.notify.route import Route, parse_route
from gpuwatch.notify.templates import template_set
from gpuwatch.notify.timeintervals import TimeInterval, parse_time_intervals
from gpuwatch.notify.yamlread import (
    check_keys,
    duration,
    fail,
    label_names,
    listing,
    mapping,
    matchers_from,
    text,
    yaml_value,
)
from gpuwatch.templating.template import TemplateError


@dataclass(frozen=True)
class InhibitRule:
    """Mute alerts matching `target` while an alert matching `source` fires with the same `equal` labels."""

    source: Matchers
    target: Matchers
    equal: tuple[str, ...] = ()


@dataclass(frozen=True)
class NotifyConfig:
    """The whole `notify:` block; `route` None means notifications are off."""

    route: Route | None = None
    receivers: tuple[Receiver, ...] = ()
    inhibit_rules: tuple[InhibitRule, ...] = ()
    ignored: tuple[str, ...] = field(default=(), compare=False)  # keys read but not used (templates)
    time_intervals: tuple[TimeInterval, ...] = ()
    template_files: tuple[str, ...] = ()  # `templates:` globs, read by load_templates

    def time_interval(self, name: str) -> TimeInterval:
        return next(t for t in self.time_intervals if t.name == name)

    def receiver(self, name: str) -> Receiver | None:
        return next((r for r in self.receivers if r.name == name), None)

    def public(self) -> dict[str, Any]:
        """Return a summary without secrets (for /-/settings)."""
        return {
            "receivers": [
                {"name": r.name, "integrations": [i.name for i in r.integrations]} for r in self.receivers
            ],
            "routes": len(self.route.walk()) if self.route else 0,
            "inhibit_rules": len(self.inhibit_rules),
            "time_intervals": [t.name for t in self.time_intervals],
        }


def load_templates(config: NotifyConfig, base: Path | None) -> NotifyConfig:
    """Read `notify.templates` (globs, relative ones against `base`, the config file's folder) and give every
    integration the template set; raise ConfigError naming the file and the problem."""

    try:
        ts = template_set(config.template_files, base)
    except TemplateError as e:
        raise fail("notify.templates", str(e)) from None
    except OSError as e:
        raise fail("notify.templates", f"cannot read {e.filename}: {e.strerror}") from None
    receivers = tuple(
        replace(r, integrations=tuple(replace(i, templates=ts) for i in r.integrations))
        for r in config.receivers
    )
    return replace(config, receivers=receivers)


def _inhibit(path: str, raw: object) -> InhibitRule:
    data = mapping(path, raw)
    keys = (
        "source_matchers",
        "target_matchers",
        "source_match",
        "source_match_re",
        "target_match",
        "target_match_re",
        "equal",
    )
    check_keys(path, data, keys)
    return InhibitRule(
        matchers_from(path, data, "source_"),
        matchers_from(path, data, "target_"),
        label_names(f"{path}.equal", data.get("equal")),
    )


_GLOBAL_KEYS = (
    "resolve_timeout",
    "smtp_from",
    "smtp_smarthost",
    "smtp_hello",
    "smtp_auth_username",
    "smtp_auth_password",
    "smtp_auth_identity",
    "smtp_auth_secret",
    "smtp_require_tls",
    "slack_api_url",
    "slack_api_url_file",
    "http_config",
    "pagerduty_url",
    "opsgenie_api_url",
    "opsgenie_api_key",
    "wechat_api_url",
    "victorops_api_url",
    "telegram_api_url",
    "webex_api_url",
)


def parse_notify(raw: object) -> NotifyConfig:
    """Validate the `notify:` block (YAML text from the environment is accepted too)."""
    if isinstance(raw, str):
        raw = yaml_value("notify", raw)
    data = mapping("notify", raw)
    if not data:
        return NotifyConfig()
    check_keys(
        "notify",
        data,
        (
            "global",
            "route",
            "receivers",
            "inhibit_rules",
            "templates",
            "time_intervals",
            "mute_time_intervals",
        ),
    )
    glob = mapping("notify.global", data.get("global"))
    check_keys("notify.global", glob, _GLOBAL_KEYS)
    if "resolve_timeout" in glob:
        duration("notify.global.resolve_timeout", glob["resolve_timeout"])
    if "slack_api_url" in glob:
        glob["slack_api_url"] = http_url("notify.global.slack_api_url", glob["slack_api_url"])
    ignored: list[str] = []
    template_files = tuple(
        text(f"notify.templates[{i}]", t)
        for i, t in enumerate(listing("notify.templates", data.get("templates")))
    )
    receivers = tuple(
        parse_receiver(f"notify.receivers[{i}]", r, glob, ignored)
        for i, r in enumerate(listing("notify.receivers", data.get("receivers")))
    )
    names = [r.name for r in receivers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise fail(f"notify.receivers[{i}].name", f"receiver {name!r} is defined twice")
    if "route" not in data:
        if receivers:
            raise fail("notify.route", "a route is needed to send alerts to the receivers")
        return NotifyConfig()
    intervals = parse_time_intervals(data)
    route = parse_route("notify.route", data["route"])
    for r in route.walk():
        if r.receiver and r.receiver not in names:
            raise fail(
                f"{r.path}.receiver",
                f"unknown receiver {r.receiver!r}; defined receivers: {', '.join(names) or '(none)'}",
            )
        for key in ("mute_time_intervals", "active_time_intervals"):
            for i, name in enumerate(getattr(r, key)):
                if name not in intervals:
                    raise fail(
                        f"{r.path}.{key}[{i}]",
                        f"unknown time interval {name!r}; defined: {', '.join(intervals) or '(none)'}",
                    )
    inhibit = tuple(
        _inhibit(f"notify.inhibit_rules[{i}]", x)
        for i, x in enumerate(listing("notify.inhibit_rules", data.get("inhibit_rules")))
    )
    return NotifyConfig(route, receivers, inhibit, tuple(ignored), tuple(intervals.values()), template_files)
