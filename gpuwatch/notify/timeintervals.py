"""Alertmanager's time intervals: `time_intervals:` (and the older top-level `mute_time_intervals:`),
used by routes' `mute_time_intervals` and `active_time_intervals`.

An interval is a list of specs; it contains a moment when any spec does. A spec contains a moment when
every field it sets does: `times` (`start_time`/`end_time` as HH:MM, end exclusive, `24:00` allowed),
`weekdays` (`monday` or `monday:friday`), `days_of_month` (`1`, `1:7`, negative counts from the month's
end: `-1` is its last day), `months` (`january`, `1`, `january:march`), `years` (`2026:2027`), all
inclusive ranges, read in `location` (an IANA time zone such as `Europe/Berlin`, `Local` for the
machine's, UTC by default). The same rules and errors as Alertmanager's timeinterval package.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatch.notify.yamlread import check_keys, fail, listing, mapping, text

WEEKDAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
MONTHS = (
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
)
_TIME = re.compile(r"(?:([01][0-9]|2[0-3]):([0-5][0-9])|(24):(00))")
_SPEC_KEYS = ("times", "weekdays", "days_of_month", "months", "years", "location")

Range = tuple[int, int]


@dataclass(frozen=True)
class Spec:
    """One entry of an interval's `time_intervals` list; an empty field matches everything."""

    times: tuple[Range, ...] | None = None  # minutes of the day, [start, end)
    weekdays: tuple[Range, ...] | None = None  # 0 = Sunday
    days_of_month: tuple[Range, ...] | None = None
    months: tuple[Range, ...] | None = None
    years: tuple[Range, ...] | None = None
    location: dt.tzinfo | None = dt.timezone.utc  # None: the machine's local time zone

    def contains(self, when: dt.datetime) -> bool:
        t = when.astimezone(self.location)
        if self.times is not None:
            minute = t.hour * 60 + t.minute
            if not any(a <= minute < b for a, b in self.times):
                return False
        if self.days_of_month is not None and not self._day_matches(t):
            return False
        if self.months is not None and not any(a <= t.month <= b for a, b in self.months):
            return False
        if self.weekdays is not None:
            weekday = (t.weekday() + 1) % 7  # Python: Monday 0; Go: Sunday 0
            if not any(a <= weekday <= b for a, b in self.weekdays):
                return False
        return self.years is None or any(a <= t.year <= b for a, b in self.years)

    def _day_matches(self, t: dt.datetime) -> bool:
        days = calendar.monthrange(t.year, t.month)[1]
        for begin, end in self.days_of_month or ():
            b = days + begin + 1 if begin < 0 else begin
            e = days + end + 1 if end < 0 else end
            if b > days:
                continue
            b, e = max(-days, min(b, days)), max(-days, min(e, days))
            if b <= t.day <= e:
                return True
        return False


@dataclass(frozen=True)
class TimeInterval:
    """A named interval: it contains a moment when any of its specs does."""

    name: str
    specs: tuple[Spec, ...]

    def contains(self, now_ms: int) -> bool:
        when = dt.datetime.fromtimestamp(now_ms / 1000, dt.timezone.utc)
        return any(s.contains(when) for s in self.specs)


def parse_time_intervals(data: Mapping[str, Any]) -> dict[str, TimeInterval]:
    """Read `notify.time_intervals` and `notify.mute_time_intervals` (same shape; names unique across both)."""
    out: dict[str, TimeInterval] = {}
    for key in ("mute_time_intervals", "time_intervals"):
        for i, raw in enumerate(listing(f"notify.{key}", data.get(key))):
            path = f"notify.{key}[{i}]"
            item = mapping(path, raw)
            check_keys(path, item, ("name", "time_intervals"))
            name = text(f"{path}.name", item.get("name", ""))
            if not name:
                raise fail(f"{path}.name", "a time interval needs a name")
            if name in out:
                raise fail(f"{path}.name", f"time interval {name!r} is defined twice")
            specs = listing(f"{path}.time_intervals", item.get("time_intervals"))
            out[name] = TimeInterval(
                name, tuple(_spec(f"{path}.time_intervals[{j}]", s) for j, s in enumerate(specs))
            )
    return out


def _spec(path: str, raw: object) -> Spec:
    data = mapping(path, raw)
    check_keys(path, data, _SPEC_KEYS)
    fields: dict[str, Any] = {}
    if data.get("times") is not None:
        fields["times"] = tuple(
            _time_range(f"{path}.times[{i}]", r)
            for i, r in enumerate(listing(f"{path}.times", data["times"]))
        )
    for key, member, check in (
        ("weekdays", _weekday, _check_weekdays),
        ("days_of_month", _integer, _check_days),
        ("months", _month, _check_ordered),
        ("years", _integer, _check_ordered),
    ):
        if data.get(key) is not None:
            ranges = []
            for i, item in enumerate(listing(f"{path}.{key}", data[key])):
                where = f"{path}.{key}[{i}]"
                r = _range(where, item, member)
                check(where, r)
                ranges.append(r)
            fields[key] = tuple(ranges)
    if data.get("location") is not None:
        fields["location"] = _location(f"{path}.location", data["location"])
    return Spec(**fields)


def _time_range(path: str, raw: object) -> Range:
    data = mapping(path, raw)
    check_keys(path, data, ("start_time", "end_time"))
    if not data.get("start_time") or not data.get("end_time"):
        raise fail(path, "both start_time and end_time must be given")
    start = _minutes(f"{path}.start_time", data["start_time"])
    end = _minutes(f"{path}.end_time", data["end_time"])
    if start >= end:
        raise fail(path, "start_time must be before end_time")
    return start, end


def _minutes(path: str, raw: object) -> int:
    value = text(path, raw)
    m = _TIME.fullmatch(value)
    if m is None:
        raise fail(path, f"expected a time of day as HH:MM (00:00 to 24:00), got {value!r}")
    hours, minutes = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
    return int(hours) * 60 + int(minutes)


def _range(path: str, raw: object, member: Any) -> Range:
    value = text(path, raw).lower()
    parts = value.split(":")
    if len(parts) > 2:
        raise fail(path, f"expected a value or a range like a:b, got {value!r}")
    begin = member(path, parts[0])
    end = member(path, parts[-1])
    return begin, end


def _integer(path: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise fail(path, f"expected a whole number, got {value!r}") from None


def _weekday(path: str, value: str) -> int:
    if value not in WEEKDAYS:
        raise fail(path, f"{value!r} is not a day of the week (sunday ... saturday)")
    return WEEKDAYS.index(value)


def _month(path: str, value: str) -> int:
    if value in MONTHS:
        return MONTHS.index(value) + 1
    try:
        month = int(value)
    except ValueError:
        raise fail(path, f"{value!r} is not a month (january ... december, or 1 ... 12)") from None
    if not 1 <= month <= 12:
        raise fail(path, f"{value!r} is not a month (january ... december, or 1 ... 12)")
    return month


def _check_weekdays(path: str, r: Range) -> None:
    if r[0] > r[1]:
        raise fail(path, "the start day cannot be after the end day (a week runs sunday to saturday)")


def _check_ordered(path: str, r: Range) -> None:
    if r[0] > r[1]:
        raise fail(path, f"the range ends ({r[1]}) before it starts ({r[0]})")


def _check_days(path: str, r: Range) -> None:
    for day in r:
        if day == 0 or not -31 <= day <= 31:
            raise fail(path, f"{day} is not a day of the month (1 ... 31, or -31 ... -1 from its end)")
    if r[0] < 0 < r[1]:
        raise fail(path, "the end day must be negative if the start day is")
    b = 28 + r[0] if r[0] < 0 else r[0]
    e = 28 + r[1] if r[1] < 0 else r[1]
    if b > e:
        raise fail(path, f"end day {r[1]} is always before start day {r[0]}")


def _location(path: str, raw: object) -> dt.tzinfo | None:
    name = text(path, raw)
    if name == "Local":
        return None  # datetime.astimezone(None): the machine's zone, with its daylight saving time
    if name == "UTC":
        return dt.timezone.utc
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise fail(path, f"unknown time zone {name!r}; use a name like Europe/Berlin, UTC or Local") from None
