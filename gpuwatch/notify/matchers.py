"""Alertmanager's label matchers: `alertname="GPULost"`, `severity=~"warning|critical"`, and the older
`match`/`match_re` maps; plus the small YAML readers every notify config module shares."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.errors import ConfigError

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ONE = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$", re.S)
_OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class LabelMatcher:
    """One matcher; regexes are anchored as in Alertmanager; a missing label matches as ''."""

    name: str
    op: str
    value: str
    regex: re.Pattern[str] | None = field(default=None, compare=False)

    @classmethod
    def make(cls, name: str, op: str, value: str) -> LabelMatcher:
        """Build a matcher; raise ValueError for a bad regular expression."""
        regex = None
        if op in ("=~", "!~"):
            try:
                re.compile(value)  # for an error message about the user's text, not the anchored form
                regex = re.compile(f"(?:{value})\\Z", re.S)
            except re.error as e:
                raise ValueError(f"invalid regular expression {value!r} ({e})") from None
        return cls(name, op, value, regex)

    def matches(self, labels: Mapping[str, str]) -> bool:
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        assert self.regex is not None
        found = self.regex.match(v) is not None
        return found if self.op == "=~" else not found

    def __str__(self) -> str:
        return f"{self.name}{self.op}{json.dumps(self.value, ensure_ascii=False)}"


Matchers = tuple[LabelMatcher, ...]


def matches_all(matchers: Matchers, labels: Mapping[str, str]) -> bool:
    """Tell whether every matcher matches `labels`."""
    return all(m.matches(labels) for m in matchers)


def format_matchers(matchers: Matchers) -> str:
    """Return matchers as Alertmanager writes them in route keys: `{a="b",c=~"d"}`."""
    return "{" + ",".join(str(m) for m in matchers) + "}"


def _split(text: str) -> list[str]:
    parts, cur, quoted, escaped = [], "", False, False
    for ch in text:
        if escaped:
            cur, escaped = cur + ch, False
        elif ch == "\\" and quoted:
            cur, escaped = cur + ch, True
        elif ch == '"':
            cur, quoted = cur + ch, not quoted
        elif ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if quoted:
        raise ValueError("a quoted value is not closed")
    parts.append(cur)
    return [p for p in parts if p.strip()]


def parse_matchers(text: str) -> list[LabelMatcher]:
    """Parse `name="value"` matchers, comma-separated, optionally in braces; raise ValueError."""
    s = text.strip()
    if s.startswith("{"):
        if not s.endswith("}"):
            raise ValueError("a '{' is not closed")
        s = s[1:-1]
    out = []
    for part in _split(s):
        m = _ONE.fullmatch(part)
        if m is None:
            raise ValueError(
                f'expected a matcher like alertname="GPULost" or severity=~"warn|crit", got {part.strip()!r}'
            )
        name, op, raw = m.groups()
        if raw.startswith('"'):
            if len(raw) < 2 or not raw.endswith('"'):
                raise ValueError(f"bad quoting in {part.strip()!r}")
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                raise ValueError(f"bad quoting in {part.strip()!r}") from None
        else:
            if '"' in raw:
                raise ValueError(f"bad quoting in {part.strip()!r}")
            value = raw
        out.append(LabelMatcher.make(name, op, value))
    return out


# -- YAML readers shared by the notify config modules -------------------------------------------------


def fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"config error: {path}: {message}")


def mapping(path: str, raw: object) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise fail(path, f"expected a mapping, got {raw!r}")
    return {str(k): v for k, v in raw.items()}


def listing(path: str, raw: object) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise fail(path, f"expected a list, got {raw!r}")
    return raw


def text(path: str, raw: object) -> str:
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise fail(path, f"expected a text value, got {raw!r}")
    return str(raw)


def boolean(path: str, raw: object) -> bool:
    if not isinstance(raw, bool):
        raise fail(path, f"expected true or false, got {raw!r}")
    return raw


def duration(path: str, raw: object, *, allow_zero: bool = False) -> float:
    from gpuwatch.config import parse_duration

    try:
        value = parse_duration(raw)
    except ValueError:
        raise fail(path, f"expected a duration like 30s or 4h, got {raw!r}") from None
    if value <= 0 and not allow_zero:
        raise fail(path, f"expected a duration above zero, got {raw!r}")
    return value


def check_keys(path: str, data: Mapping[str, Any], known: tuple[str, ...], hint: str = "") -> None:
    for key in data:
        if key not in known:
            raise ConfigError(
                f"config error: {path}.{key}: unknown key{hint}; known keys: {', '.join(known)}"
            )


def label_names(path: str, raw: object) -> tuple[str, ...]:
    out = []
    for i, item in enumerate(listing(path, raw)):
        name = text(f"{path}[{i}]", item)
        if name != "..." and not LABEL_NAME.fullmatch(name):
            raise fail(f"{path}[{i}]", f"expected a label name, got {name!r}")
        out.append(name)
    return tuple(out)


def matchers_from(path: str, data: Mapping[str, Any], prefix: str = "") -> Matchers:
    """Read `<prefix>matchers` (list of matcher texts) and the older `<prefix>match`/`<prefix>match_re`."""
    out: list[LabelMatcher] = []
    for k, v in mapping(f"{path}.{prefix}match", data.get(f"{prefix}match")).items():
        if not LABEL_NAME.fullmatch(k):
            raise fail(f"{path}.{prefix}match.{k}", "expected a label name")
        out.append(LabelMatcher.make(k, "=", text(f"{path}.{prefix}match.{k}", v)))
    for k, v in mapping(f"{path}.{prefix}match_re", data.get(f"{prefix}match_re")).items():
        if not LABEL_NAME.fullmatch(k):
            raise fail(f"{path}.{prefix}match_re.{k}", "expected a label name")
        try:
            out.append(LabelMatcher.make(k, "=~", text(f"{path}.{prefix}match_re.{k}", v)))
        except ValueError as e:
            raise fail(f"{path}.{prefix}match_re.{k}", str(e)) from None
    for i, item in enumerate(listing(f"{path}.{prefix}matchers", data.get(f"{prefix}matchers"))):
        where = f"{path}.{prefix}matchers[{i}]"
        try:
            out.extend(parse_matchers(text(where, item)))
        except ValueError as e:
            raise fail(where, str(e)) from None
    return tuple(sorted(out, key=lambda m: (m.name, m.value, _OPS.index(m.op))))
