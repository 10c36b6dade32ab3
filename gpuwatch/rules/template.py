"""Prometheus's alert templates: labels and annotations of alerting rules, rendered with Go's text/template
(`gpuwatch/templating/template.py`, an interpreter that evaluates no code) as Prometheus renders them.

The data is Prometheus's: `$labels` / `.Labels`, `$value` / `.Value`, `$externalLabels` / `.ExternalLabels`,
`$externalURL`; the functions are Prometheus's `humanize`, `humanize1024`, `humanizePercentage`,
`humanizeDuration`, `humanizeTimestamp`, `printf`, `toUpper`, `toLower`, `title`, `match`, `reReplaceAll`,
`safeHtml`, `stripPort`, `stripDomain`, `args`, with Go's (`if`, `range`, `with`, `eq`, `len`, ...). `query`
and the functions over its results are not available (an error in the text). An error is shown in the
text as Prometheus shows it (`<error expanding template: ...>`); values from labels are substituted,
never parsed again.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any

from gpuwatch.templating.functions import TemplateError, go_float, printf, re_replace_all, regex_match, sprint
from gpuwatch.templating.template import TemplateSet

__all__ = ["TemplateError", "check_template", "go_float", "humanize", "printf", "render"]

Value = str | float


def _g4(v: float) -> str:
    """Go's `%.4g`."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.4g}"


def humanize(v: float) -> str:
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return _g4(v) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return _g4(v) + prefix


def humanize1024(v: float) -> str:
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return _g4(v) + prefix


def humanize_percentage(v: float) -> str:
    return _g4(v * 100) + "%"


def humanize_duration(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return _g4(v)
    if v == 0:
        return _g4(v) + "s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        d = int(v)
        seconds, minutes, hours, days = d % 60, (d // 60) % 60, (d // 3600) % 24, d // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{_g4(v)}{prefix}s"


def _text(v: Any) -> str:
    return v if isinstance(v, str) else sprint(v)


def _number(v: Value) -> float:
    if isinstance(v, float):
        return v
    try:
        return float(v)
    except ValueError:
        raise TemplateError(f"cannot convert {v!r} to a number") from None


def _no_query(*args: Any) -> Any:
    raise TemplateError("query is not supported in gpuwatch's templates")


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "humanize": lambda v: humanize(_number(v)),
    "humanize1024": lambda v: humanize1024(_number(v)),
    "humanizePercentage": lambda v: humanize_percentage(_number(v)),
    "humanizeDuration": lambda v: humanize_duration(_number(v)),
    "humanizeTimestamp": lambda v: _timestamp(_number(v)),
    "printf": printf,
    "toUpper": lambda v: _text(v).upper(),
    "toLower": lambda v: _text(v).lower(),
    "title": lambda v: _text(v).title(),
    "match": regex_match,
    "reReplaceAll": re_replace_all,
    "safeHtml": lambda v: _text(v),
    "stripPort": lambda v: _strip_port(_text(v)),
    "stripDomain": lambda v: _strip_domain(_text(v)),
    "args": lambda *a: {f"arg{i}": x for i, x in enumerate(a)},
    "query": _no_query,
}


def _timestamp(v: float) -> str:
    import datetime as dt

    if math.isnan(v) or math.isinf(v):
        return go_float(v)
    t = dt.datetime.fromtimestamp(v, dt.timezone.utc)
    frac = f".{t.microsecond:06d}".rstrip("0") if t.microsecond else ""
    return (
        f"{t.year:04d}-{t.month:02d}-{t.day:02d} {t.hour:02d}:{t.minute:02d}:{t.second:02d}{frac} +0000 UTC"
    )


def _strip_port(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.index("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _strip_domain(host: str) -> str:
    name = _strip_port(host)
    port = host[len(name) :] if host.startswith(name) else ""
    return (name.split(".", 1)[0] if not name.replace(".", "").isdigit() else name) + port


@functools.cache
def _templates() -> TemplateSet:
    return TemplateSet(FUNCTIONS)


class _Data:
    """The dot of a rule template: .Labels, .ExternalLabels, .ExternalURL, .Value (Go's exported fields)."""

    def __init__(self, labels: Mapping[str, str], value: float, external: Mapping[str, str]) -> None:
        self.Labels = dict(labels)
        self.ExternalLabels = dict(external)
        self.ExternalURL = ""
        self.Value = value


def check_template(text: str) -> str | None:
    """Return why `text` is not a template gpuwatch can render, or None if it is."""
    try:
        _templates().check(text)
    except TemplateError as e:
        return f"template: {e}"
    return None


def render(
    text: str, labels: Mapping[str, str], value: float, external_labels: Mapping[str, str] | None = None
) -> str:
    """Expand `text` for one alert; an error becomes `<error expanding template: ...>`, never raises."""
    if "{{" not in text:
        return text
    data = _Data(labels, float(value), external_labels or {})
    variables = {
        "$labels": data.Labels,
        "$externalLabels": data.ExternalLabels,
        "$externalURL": "",
        "$value": data.Value,
    }
    try:
        return _templates().render(text, data, variables)
    except (TemplateError, TypeError, ValueError, OverflowError) as e:
        return f"<error expanding template: {e}>"
