"""Alertmanager's routing tree: which receivers an alert goes to, grouped how, and how often.

A route matches an alert when all its matchers do; the alert then goes down the first child route that
matches (and on to later siblings only while the matching child has `continue: true`); a route none of
whose children match takes the alert itself. Children inherit `receiver`, `group_by` and the three
intervals from their parent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatch.notify.matchers import Matchers, format_matchers, matches_all
from gpuwatch.notify.yamlread import (
    boolean,
    check_keys,
    duration,
    fail,
    label_names,
    listing,
    mapping,
    matchers_from,
    text,
)

DEFAULT_GROUP_WAIT_S = 30.0
DEFAULT_GROUP_INTERVAL_S = 300.0
DEFAULT_REPEAT_INTERVAL_S = 4 * 3600.0

_ROUTE_KEYS = (
    "receiver",
    "group_by",
    "group_wait",
    "group_interval",
    "repeat_interval",
    "matchers",
    "match",
    "match_re",
    "continue",
    "routes",
    "mute_time_intervals",
    "active_time_intervals",
)


@dataclass(frozen=True)
class Route:
    """One node of the routing tree, with inherited settings filled in."""

    key: str  # Alertmanager's route key: `{}` for the root, then `/`-joined matchers of each level
    receiver: str
    group_by: tuple[str, ...]
    group_wait_s: float
    group_interval_s: float
    repeat_interval_s: float
    matchers: Matchers = ()
    is_continue: bool = False
    routes: tuple[Route, ...] = ()
    path: str = "notify.route"
    mute_time_intervals: tuple[str, ...] = ()  # not inherited, as in Alertmanager
    active_time_intervals: tuple[str, ...] = ()

    @property
    def group_by_all(self) -> bool:
        return "..." in self.group_by

    def match(self, labels: Mapping[str, str]) -> list[Route]:
        """Return the routes that take an alert with these labels (empty if this route does not match)."""
        if not matches_all(self.matchers, labels):
            return []
        found: list[Route] = []
        for child in self.routes:
            got = child.match(labels)
            found.extend(got)
            if got and not child.is_continue:
                break
        return found or [self]

    def group_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        """Return the labels that name the alert group of an alert on this route."""
        if self.group_by_all:
            return dict(labels)
        return {k: labels[k] for k in self.group_by if labels.get(k, "") != ""}

    def walk(self) -> list[Route]:
        """Return this route and every route below it."""
        out = [self]
        for child in self.routes:
            out.extend(child.walk())
        return out


def parse_route(path: str, raw: object, parent: Route | None = None) -> Route:
    """Validate one route (and its children); the root needs a receiver and no matchers."""
    data = mapping(path, raw)
    check_keys(path, data, _ROUTE_KEYS)
    intervals = {
        key: tuple(
            text(f"{path}.{key}[{i}]", n) for i, n in enumerate(listing(f"{path}.{key}", data.get(key)))
        )
        for key in ("mute_time_intervals", "active_time_intervals")
    }
    matchers = matchers_from(path, data)
    if parent is None:
        for key, names in intervals.items():
            if names:
                raise fail(
                    f"{path}.{key}", "the root route cannot have time intervals; put them on a child route"
                )
        if matchers:
            raise fail(path, "the root route must not have matchers (it takes every alert)")
        if data.get("continue"):
            raise fail(f"{path}.continue", "the root route cannot have continue set")
        if not data.get("receiver"):
            raise fail(f"{path}.receiver", "the root route needs a receiver")
    receiver = text(f"{path}.receiver", data["receiver"]) if "receiver" in data else ""
    group_by = label_names(f"{path}.group_by", data["group_by"]) if "group_by" in data else None
    if group_by and "..." in group_by and len(group_by) > 1:
        raise fail(f"{path}.group_by", "'...' groups by every label and cannot be combined with other names")
    waits = {}
    for key in ("group_wait", "group_interval", "repeat_interval"):
        if key in data:
            waits[key] = duration(f"{path}.{key}", data[key], allow_zero=key == "group_wait")
    key = "{}" if parent is None else f"{parent.key}/{format_matchers(matchers)}"
    node = Route(
        key=key,
        receiver=receiver or (parent.receiver if parent else ""),
        group_by=group_by if group_by is not None else (parent.group_by if parent else ()),
        group_wait_s=waits.get("group_wait", parent.group_wait_s if parent else DEFAULT_GROUP_WAIT_S),
        group_interval_s=waits.get(
            "group_interval", parent.group_interval_s if parent else DEFAULT_GROUP_INTERVAL_S
        ),
        repeat_interval_s=waits.get(
            "repeat_interval", parent.repeat_interval_s if parent else DEFAULT_REPEAT_INTERVAL_S
        ),
        matchers=matchers,
        is_continue=boolean(f"{path}.continue", data.get("continue", False)),
        path=path,
        mute_time_intervals=intervals["mute_time_intervals"],
        active_time_intervals=intervals["active_time_intervals"],
    )
    children: list[Any] = listing(f"{path}.routes", data.get("routes"))
    kids = tuple(parse_route(f"{path}.routes[{i}]", c, node) for i, c in enumerate(children))
    return Route(**{**node.__dict__, "routes": kids})
