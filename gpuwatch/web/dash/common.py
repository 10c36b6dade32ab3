"""What the pages of this package share: an instant-query function over the runtime, and the
parsing of a page's number and time parameters (a bad one is a 400 with one line)."""

from __future__ import annotations

from collections.abc import Callable

from flask import abort, request

from gpuwatch.core.units import parse_time_ms
from gpuwatch.query.values import Result
from gpuwatch.web.runtime import WebRuntime

InstantQuery = Callable[[str, int], Result]


def instant_query(rt: WebRuntime) -> InstantQuery:
    """Evaluate PromQL at a time with the limits the settings give (as /api/v1/query does), where the
    runtime's queries are answered (the local engine, or `storage.remote`)."""
    return rt.backend.instant


def float_arg(name: str, default: float, lo: float, hi: float, *, hi_open: bool = False) -> float:
    """Query parameter `name` as a number in [lo, hi] ([lo, hi) with `hi_open`), else 400."""
    text = request.args.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not (lo <= value <= hi) or (hi_open and value >= hi):
        end = ")" if hi_open else "]"
        abort(400, f'invalid parameter "{name}": expected a number in [{lo:g}, {hi:g}{end}')
    return value


def time_arg(name: str) -> int | None:
    """Query parameter `name` as Unix seconds or RFC 3339 (milliseconds), None where absent, else 400."""
    text = request.args.get(name)
    if not text:
        return None
    try:
        return parse_time_ms(text)
    except ValueError:
        abort(400, f'invalid parameter "{name}": cannot parse "{text}" to a valid timestamp')
