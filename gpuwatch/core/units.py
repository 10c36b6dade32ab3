"""Durations and times as users write them: the one parser of each, used by config, CLIs, APIs and rules.

Durations are Prometheus's (`500ms`, `15s`, `1h30m`, `30d`; units y w d h m s ms, in any order, with
fractions) or plain seconds. Times are Unix seconds (fractions allowed) or RFC 3339 with a zone
(`2024-05-01T12:00:00Z`, `...12:00:00.5+02:00`). Each parser raises `ValueError` with a short text;
callers add where the value came from and turn it into their own error (config, 400, usage).
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta, timezone

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})"
)
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
# The times gpuwatch takes, in Unix ms: half of what int64 holds, so that adding a range cannot overflow.
MAX_TIME_MS = 2**62
MIN_TIME_MS = -(2**62)
MAX_TIME_S = MAX_TIME_MS / 1000
MIN_TIME_S = MIN_TIME_MS / 1000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def parse_duration(text: object, signed: bool = False) -> float:
    """Return seconds for a duration like `15s`, `1h30m`, `30d` or a plain number of seconds; `signed`:
    the number may be negative (as Prometheus's HTTP API reads `timeout` and `step`)."""
    if isinstance(text, bool) or not isinstance(text, (int, float, str)):
        raise ValueError("expected a duration like 15s")
    if isinstance(text, str):
        s = text.strip()
        try:
            value = float(s)
        except ValueError:
            value = _parse_units(s)
    else:
        value = float(text)
    if not math.isfinite(value):
        raise ValueError("expected a finite duration")
    if value < 0 and not signed:
        raise ValueError("expected a positive duration")
    return value


def _parse_units(s: str) -> float:
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if pos != len(s) or not s:
        raise ValueError("expected a duration like 15s")
    return total


def parse_duration_ms(text: object, signed: bool = False) -> int:
    """Return milliseconds for a duration (see `parse_duration`), at most 2^62 either way."""
    ms = parse_duration(text, signed) * 1000
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:  # `step=1e308` would otherwise be an OverflowError
        raise ValueError(f"duration out of range: more than {MAX_TIME_S:.0f} seconds")
    return int(round(ms))


def format_duration(seconds: float) -> str:
    """Return a short duration text (`30d`, `1s`, `500ms`)."""
    for unit in ("y", "w", "d", "h", "m", "s"):
        size = UNIT_SECONDS[unit]
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{round(seconds * 1000)}ms"


def parse_time_ms(text: str) -> int:
    """Return Unix milliseconds for Unix seconds (`1714564800.5`) or an RFC 3339 time with a zone."""
    s = text.strip()
    try:
        seconds = float(s)
    except ValueError:
        return parse_rfc3339_ms(s)
    if not math.isfinite(seconds):
        raise ValueError("expected a finite time")
    if not MIN_TIME_S <= seconds <= MAX_TIME_S:
        raise ValueError(f"time out of range: more than {MAX_TIME_S:.0f} seconds from 1970")
    return int(round(seconds * 1000))


def parse_rfc3339_ms(text: str) -> int:
    """Return Unix milliseconds for an RFC 3339 time (`2024-05-01T12:00:00Z`, fractions and offsets)."""
    m = _RFC3339.fullmatch(text.strip())
    if m is None:
        raise ValueError("expected an RFC 3339 time like 2024-05-01T12:00:00Z")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac, zone = m.group(7) or "", m.group(8)
    offset = timedelta(0)
    if zone not in ("Z", "z"):
        sign = -1 if zone[0] == "-" else 1
        offset = sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6]))
    try:
        when = datetime(year, month, day, hour, minute, second, tzinfo=timezone(offset))
    except ValueError as e:
        raise ValueError(f"not a time: {e}") from None
    return int(when.timestamp()) * 1000 + int((frac + "000")[:3])


def format_rfc3339(ms: int | None) -> str:
    """Return Unix milliseconds as Go's RFC 3339 text (UTC, fraction without trailing zeros); None: Go's zero time."""
    if ms is None:
        return GO_ZERO_TIME
    frac = f"{ms % 1000:03d}".rstrip("0")
    return _seconds_text(ms) + (f".{frac}" if frac else "") + "Z"


def format_rfc3339_millis(ms: int) -> str:
    """Return Unix milliseconds as Alertmanager writes times: `2024-05-01T12:00:00.000Z`."""
    return _seconds_text(ms) + f".{ms % 1000:03d}Z"


def _seconds_text(ms: int) -> str:
    d = _EPOCH + timedelta(milliseconds=ms - ms % 1000)
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}"
