"""Alertmanager's notification templates: its template data (`.Status`, `.Alerts`, `.CommonLabels`, ...),
its template functions, its default templates, and the files of `notify.templates`.

A receiver option such as a Slack `title` or an e-mail `html` is a Go template executed with the data of
one notification, exactly as Alertmanager does; `{{ template "slack.default.title" . }}` and friends come
from Alertmanager's own default.tmpl (Apache-2.0, shipped unmodified as `default.tmpl` next to this file).
"""

from __future__ import annotations

import datetime as dt
import glob
import re
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from gpuwatch.templating.functions import TemplateError, re_replace_all, regex_match
from gpuwatch.templating.template import TemplateSet

DEFAULT_FILES = (Path(__file__).with_name("default.tmpl"), Path(__file__).with_name("email.tmpl"))


class KV(dict[str, str]):
    """Alertmanager's template.KV: a label or annotation map; a missing key reads as ""."""

    missing = ""

    def SortedPairs(self) -> Pairs:
        return Pairs(Pair(k, self[k]) for k in sorted(self))

    def Names(self) -> list[str]:
        return sorted(self)

    def Values(self) -> list[str]:
        return [self[k] for k in sorted(self)]

    def Remove(self, keys: Sequence[str]) -> KV:
        drop = set(keys)
        return KV({k: v for k, v in self.items() if k not in drop})


class Pair:
    """One name and value of a KV's SortedPairs."""

    def __init__(self, name: str, value: str) -> None:
        self.Name = name
        self.Value = value

    def __str__(self) -> str:
        return f"{{{self.Name} {self.Value}}}"


class Pairs(list[Pair]):
    def Names(self) -> list[str]:
        return [p.Name for p in self]

    def Values(self) -> list[str]:
        return [p.Value for p in self]


_LAYOUT = re.compile(
    r"January|Jan|Monday|Mon|2006|06|01|02|_2|15|03|04|05|PM|pm|MST|Z07:00|Z0700|-07:00|-0700|-07"
    r"|\.0+|\.9+|1|2|3|4|5"
)


class GoTime:
    """A time.Time as templates use it: printed as Go prints it; Format, Unix, UTC."""

    def __init__(self, when: dt.datetime) -> None:
        self._t = when

    def __str__(self) -> str:
        frac = f".{self._t.microsecond:06d}".rstrip("0").rstrip(".") if self._t.microsecond else ""
        zone = self._t.tzname() or "UTC"
        t = self._t
        stamp = f"{t.year:04d}-{t.month:02d}-{t.day:02d} {t.hour:02d}:{t.minute:02d}:{t.second:02d}"
        return stamp + frac + t.strftime(" %z ") + zone

    def Unix(self) -> int:
        return int(self._t.timestamp())

    def UTC(self) -> GoTime:
        return GoTime(self._t.astimezone(dt.timezone.utc))

    def Local(self) -> GoTime:
        return GoTime(self._t.astimezone())

    def IsZero(self) -> bool:
        return self._t.year == 1

    def Format(self, layout: str) -> str:
        t = self._t
        offset = t.utcoffset() or dt.timedelta()
        minutes = int(offset.total_seconds() // 60)
        sign = "-" if minutes < 0 else "+"
        hh, mm = divmod(abs(minutes), 60)

        def one(m: re.Match[str]) -> str:
            tok = m.group()
            if tok.startswith(".0"):
                return "." + f"{t.microsecond:06d}{'0' * 3}"[: len(tok) - 1]
            if tok.startswith(".9"):
                digits = f"{t.microsecond:06d}000"[: len(tok) - 1].rstrip("0")
                return "." + digits if digits else ""
            if tok in ("Z07:00", "Z0700") and minutes == 0:
                return "Z"
            table = {
                "January": t.strftime("%B"),
                "Jan": t.strftime("%b"),
                "Monday": t.strftime("%A"),
                "Mon": t.strftime("%a"),
                "2006": f"{t.year:04d}",
                "06": f"{t.year % 100:02d}",
                "01": f"{t.month:02d}",
                "1": str(t.month),
                "02": f"{t.day:02d}",
                "_2": f"{t.day:2d}",
                "2": str(t.day),
                "15": f"{t.hour:02d}",
                "03": f"{(t.hour % 12) or 12:02d}",
                "3": str((t.hour % 12) or 12),
                "04": f"{t.minute:02d}",
                "4": str(t.minute),
                "05": f"{t.second:02d}",
                "5": str(t.second),
                "PM": "PM" if t.hour >= 12 else "AM",
                "pm": "pm" if t.hour >= 12 else "am",
                "MST": t.tzname() or "UTC",
                "Z07:00": f"{sign}{hh:02d}:{mm:02d}",
                "Z0700": f"{sign}{hh:02d}{mm:02d}",
                "-07:00": f"{sign}{hh:02d}:{mm:02d}",
                "-0700": f"{sign}{hh:02d}{mm:02d}",
                "-07": f"{sign}{hh:02d}",
            }
            return table[tok]

        return _LAYOUT.sub(one, layout)


def _time(text: str) -> GoTime:
    if text.startswith("0001-01-01"):
        return GoTime(dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc))
    return GoTime(dt.datetime.fromisoformat(text.replace("Z", "+00:00")))


class TemplateAlert:
    """One alert of the data: Status, Labels, Annotations, StartsAt, EndsAt, GeneratorURL, Fingerprint."""

    def __init__(self, a: Mapping[str, Any]) -> None:
        self.Status = a["status"]
        self.Labels = KV(a["labels"])
        self.Annotations = KV(a["annotations"])
        self.StartsAt = _time(a["startsAt"])
        self.EndsAt = _time(a["endsAt"])
        self.GeneratorURL = a.get("generatorURL", "")
        self.Fingerprint = a.get("fingerprint", "")


class Alerts(list[TemplateAlert]):
    def Firing(self) -> Alerts:
        return Alerts(a for a in self if a.Status == "firing")

    def Resolved(self) -> Alerts:
        return Alerts(a for a in self if a.Status == "resolved")


class Data:
    """Alertmanager's template.Data for one notification, built from its webhook payload."""

    def __init__(self, payload: Mapping[str, Any]) -> None:
        self.Receiver = payload["receiver"]  # escaped as Alertmanager escapes it (webhook_payload)
        self.Status = payload["status"]
        self.Alerts = Alerts(TemplateAlert(a) for a in payload["alerts"])
        self.GroupLabels = KV(payload["groupLabels"])
        self.CommonLabels = KV(payload["commonLabels"])
        self.CommonAnnotations = KV(payload["commonAnnotations"])
        self.ExternalURL = payload["externalURL"]


def _join(sep: str, items: Sequence[str]) -> str:
    return sep.join(items)


FUNCS: dict[str, Callable[..., Any]] = {
    "toUpper": lambda s: s.upper(),
    "toLower": lambda s: s.lower(),
    "title": lambda s: s.title(),  # Alertmanager 0.25: cases.Title, which lower-cases the rest of each word
    "trimSpace": lambda s: s.strip(" \t\r\n\v\f"),
    "join": _join,
    "match": regex_match,
    "safeHtml": lambda s: s,
    "reReplaceAll": re_replace_all,
    "stringSlice": lambda *s: list(s),
}


@cache
def default_set() -> TemplateSet:
    """Return Alertmanager's default templates (default.tmpl and email.tmpl of Alertmanager 0.25)."""
    ts = TemplateSet(FUNCS)
    for path in DEFAULT_FILES:
        ts.add(path.read_text(encoding="utf-8"), path.name)
    return ts


def template_set(patterns: Sequence[str] = (), base: Path | None = None) -> TemplateSet:
    """Return the default templates plus those of the files matching `patterns` (globs, relative ones
    against `base`), as `notify.templates` lists them; raise TemplateError or OSError naming the file."""
    ts = TemplateSet(FUNCS)
    ts.defines.update(default_set().defines)
    for pattern in patterns:
        full = str(base / pattern) if base is not None and not Path(pattern).is_absolute() else pattern
        for path in sorted(glob.glob(full)):
            try:
                ts.add(Path(path).read_text(encoding="utf-8"), path)
            except UnicodeDecodeError:
                raise TemplateError(f"{path}: not UTF-8 text") from None
    return ts


def render(ts: TemplateSet, text: str, payload: Mapping[str, Any]) -> str:
    """Execute one option's template for a notification; a failure is a TemplateError naming why."""
    return ts.render(text, Data(payload))
