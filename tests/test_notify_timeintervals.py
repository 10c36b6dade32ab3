"""Alertmanager's time intervals: which moments they contain, what config they accept (checked against
Debian's amtool), and routes muted by them: nothing sent while muted, sent at the first flush after."""

from __future__ import annotations

import datetime as dt
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ConfigError
from gpuwatch.notify.config import parse_notify
from gpuwatch.notify.timeintervals import parse_time_intervals
from tests.conftest import require_tool
from tests.test_notify_dispatch import Harness

# 2027-01-15 08:00:00 UTC, a Friday.
T0 = 1_800_000_000.0


def at(iso: str) -> int:
    return int(dt.datetime.fromisoformat(iso).timestamp() * 1000)


def contains(spec: dict[str, Any], iso: str) -> bool:
    [interval] = parse_time_intervals({"time_intervals": [{"name": "x", "time_intervals": [spec]}]}).values()
    return interval.contains(at(iso))


@pytest.mark.parametrize(
    ("spec", "iso", "inside"),
    [
        ({"times": [{"start_time": "09:00", "end_time": "17:00"}]}, "2027-01-15T09:00:00+00:00", True),
        ({"times": [{"start_time": "09:00", "end_time": "17:00"}]}, "2027-01-15T16:59:59+00:00", True),
        ({"times": [{"start_time": "09:00", "end_time": "17:00"}]}, "2027-01-15T17:00:00+00:00", False),
        ({"times": [{"start_time": "22:00", "end_time": "24:00"}]}, "2027-01-15T23:59:00+00:00", True),
        ({"weekdays": ["monday:friday"]}, "2027-01-15T12:00:00+00:00", True),  # Friday
        ({"weekdays": ["monday:friday"]}, "2027-01-16T12:00:00+00:00", False),  # Saturday
        ({"weekdays": ["saturday", "sunday"]}, "2027-01-17T12:00:00+00:00", True),
        ({"days_of_month": ["-1"]}, "2027-02-28T12:00:00+00:00", True),  # last day of February
        ({"days_of_month": ["-1"]}, "2027-01-30T12:00:00+00:00", False),
        ({"days_of_month": ["-3:-1"]}, "2027-01-29T00:00:00+00:00", True),
        ({"days_of_month": ["1:7"]}, "2027-01-08T00:00:00+00:00", False),
        ({"days_of_month": ["31"]}, "2027-02-28T12:00:00+00:00", False),  # no 31st in February
        ({"months": ["december:february"]}, "2027-01-15T12:00:00+00:00", False),  # amtool rejects it too
        ({"months": ["january:march", "12"]}, "2027-12-01T12:00:00+00:00", True),
        ({"years": ["2026:2027"]}, "2028-01-01T00:00:00+00:00", False),
        # 08:30 UTC is 09:30 in Berlin (CET, UTC+1 in January) and 03:30 in New York.
        (
            {"times": [{"start_time": "09:00", "end_time": "17:00"}], "location": "Europe/Berlin"},
            "2027-01-15T08:30:00+00:00",
            True,
        ),
        (
            {"times": [{"start_time": "09:00", "end_time": "17:00"}], "location": "America/New_York"},
            "2027-01-15T08:30:00+00:00",
            False,
        ),
        # Fields combine with AND: Friday, but not in the hours.
        (
            {"weekdays": ["friday"], "times": [{"start_time": "18:00", "end_time": "24:00"}]},
            "2027-01-15T12:00:00+00:00",
            False,
        ),
        ({}, "2027-01-15T12:00:00+00:00", True),  # an empty spec is always
    ],
)
def test_a_spec_contains_the_moments_alertmanager_says(spec: dict[str, Any], iso: str, inside: bool) -> None:
    if spec.get("months") == ["december:february"]:
        with pytest.raises(ConfigError, match="ends"):
            contains(spec, iso)
        return
    assert contains(spec, iso) is inside


def test_an_interval_holds_when_any_spec_does() -> None:
    [interval] = parse_time_intervals(
        {
            "time_intervals": [
                {
                    "name": "off-hours",
                    "time_intervals": [
                        {"weekdays": ["saturday", "sunday"]},
                        {
                            "times": [
                                {"start_time": "00:00", "end_time": "08:00"},
                                {"start_time": "20:00", "end_time": "24:00"},
                            ]
                        },
                    ],
                }
            ]
        }
    ).values()
    assert interval.contains(at("2027-01-16T12:00:00+00:00"))  # Saturday noon
    assert interval.contains(at("2027-01-15T07:59:00+00:00"))  # Friday early
    assert not interval.contains(at("2027-01-15T12:00:00+00:00"))  # Friday noon


ROUTE = """
route:
  receiver: team
  group_by: [alertname]
  group_wait: 30s
  group_interval: 5m
  routes:
    - matchers: ['severity="warning"']
      receiver: team
      mute_time_intervals: [{mute}]
    - matchers: ['severity="page"']
      receiver: pager
      active_time_intervals: [{active}]
receivers:
  - name: team
    webhook_configs: [{{url: "http://127.0.0.1:1/team"}}]
  - name: pager
    webhook_configs: [{{url: "http://127.0.0.1:1/pager"}}]
time_intervals:
  - name: mornings
    time_intervals: [{{times: [{{start_time: "08:00", end_time: "09:00"}}]}}]
mute_time_intervals:
  - name: weekends
    time_intervals: [{{weekdays: ["saturday", "sunday"]}}]
"""


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path, FakeClock(T0), ROUTE.format(mute="mornings", active="mornings"))
    yield harness
    harness.store.close()


def test_a_muted_route_sends_nothing_until_the_interval_ends(h: Harness) -> None:
    h.fire(alertname="DiskFull", severity="warning")
    h.run(55 * 60, every=60)  # 08:00-08:55: inside "mornings"
    assert h.sender.to("team") == []
    groups = h.notifier.status()["groups"]
    assert [g["mutedBy"] for g in groups] == [["mornings"]]
    h.run(10 * 60, every=60)  # 09:00 ends it; the next group flush (every 5m) notifies
    [p] = h.sender.to("team")
    assert p["status"] == "firing" and p["alerts"][0]["labels"]["alertname"] == "DiskFull"


def test_an_active_route_sends_only_inside_its_interval(tmp_path: Path) -> None:
    h = Harness(tmp_path, FakeClock(T0 + 3600), ROUTE.format(mute="weekends", active="mornings"))  # 09:00
    try:
        h.fire(alertname="GPULost", severity="page")
        h.run(23 * 3600 - 5 * 60, every=300)  # until 07:55 the next day
        assert h.sender.to("pager") == []
        h.run(10 * 60, every=60)  # inside 08:00-09:00: the next flush sends
        [p] = h.sender.to("pager")
        assert p["alerts"][0]["labels"]["alertname"] == "GPULost"
    finally:
        h.store.close()


def test_routes_do_not_inherit_time_intervals(tmp_path: Path) -> None:
    cfg = parse_notify(yaml.safe_load(ROUTE.format(mute="mornings", active="weekends")))
    assert cfg.route is not None
    child = cfg.route.routes[0]
    assert child.mute_time_intervals == ("mornings",)
    assert cfg.route.mute_time_intervals == () and cfg.route.routes[1].mute_time_intervals == ()
    assert [t.name for t in cfg.time_intervals] == ["weekends", "mornings"]


BAD: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown interval",
        {"mute": "holidays"},
        "routes[0].mute_time_intervals[0]: unknown time interval 'holidays'",
    ),
    (
        "end before start",
        {"spec": {"times": [{"start_time": "17:00", "end_time": "09:00"}]}},
        "before end_time",
    ),
    ("25 o'clock", {"spec": {"times": [{"start_time": "09:00", "end_time": "25:00"}]}}, "HH:MM"),
    ("half a range", {"spec": {"times": [{"start_time": "09:00"}]}}, "both start_time and end_time"),
    ("funday", {"spec": {"weekdays": ["funday"]}}, "not a day of the week"),
    ("week wraps", {"spec": {"weekdays": ["saturday:sunday"]}}, "start day cannot be after"),
    ("day 0", {"spec": {"days_of_month": ["0"]}}, "not a day of the month"),
    ("negative to positive", {"spec": {"days_of_month": ["-3:5"]}}, "must be negative"),
    ("month 13", {"spec": {"months": ["13"]}}, "not a month"),
    ("years backwards", {"spec": {"years": ["2027:2026"]}}, "ends"),
    ("unknown zone", {"spec": {"location": "Mars/Olympus"}}, "unknown time zone"),
    ("unknown key", {"spec": {"hours": ["9:17"]}}, "unknown key"),
]


def config_text(mute: str = "mornings", spec: dict[str, Any] | None = None) -> str:
    cfg = yaml.safe_load(ROUTE.format(mute=mute, active="weekends"))
    if spec is not None:
        cfg["time_intervals"][0]["time_intervals"] = [spec]
    return yaml.safe_dump(cfg)


@pytest.mark.parametrize(("case", "change", "message"), BAD, ids=[b[0] for b in BAD])
def test_mistakes_are_one_sentence_naming_the_path(case: str, change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_notify(yaml.safe_load(config_text(**change)))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("config error: notify.")


def test_the_root_route_cannot_be_muted() -> None:
    cfg = yaml.safe_load(config_text())
    cfg["route"]["mute_time_intervals"] = ["mornings"]
    with pytest.raises(ConfigError, match=r"notify\.route\.mute_time_intervals: the root route cannot"):
        parse_notify(cfg)


def test_amtool_accepts_and_rejects_the_same_configs(tmp_path: Path) -> None:
    amtool = require_tool("amtool")
    cases = [("good", {})] + [(case, change) for case, change, _ in BAD if case != "unknown key"]
    for case, change in cases:
        path = tmp_path / f"{case.replace(' ', '_')}.yml"
        path.write_text(config_text(**change))
        checked = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)
        try:
            parse_notify(yaml.safe_load(path.read_text()))
            ours = True
        except ConfigError:
            ours = False
        # Alertmanager 0.25 accepts month 13 (and then never matches it); gpuwatch says it is not a month.
        expected = checked.returncode == 0 and case != "month 13"
        assert expected is ours, (case, checked.stdout, checked.stderr)
