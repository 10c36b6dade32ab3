"""Alertmanager's label matchers (`pkg/labels` of prometheus/alertmanager): `alertname="GPULost"`,
`severity=~"warning|critical"`; used by routes, inhibit rules, silences and API filters alike.

A matcher has a name, an operator (`=`, `!=`, `=~`, `!~`) and a value. A label an alert lacks matches
as the empty string. A regex matches the whole value: Alertmanager compiles `^(?:value)$` with Go's
RE2, so `.` does not match a newline, and the anchors wrap the text as written (`a)|(b` is accepted and
matches values starting with `a` or ending with `b`, as in Alertmanager); `gpuwatch.core.regex` is RE2 too.
Not PromQL's selector matcher (`gpuwatch.core.model.Matcher`).

Two textual forms, both Alertmanager's: one matcher as amtool and the API's `filter` take it
(`parse_matcher`, Go's `labels.ParseMatcher`) and a comma list, optionally in braces, as the
`matchers:` of routes and inhibit rules (`parse_matchers`, `labels.ParseMatchers`). `str()` writes a
matcher back as Alertmanager does (`name=~"value"`, with `\\`, `"` and newlines escaped).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.core import regex
from gpuwatch.core.errors import GpuwatchError
from gpuwatch.core.regex import Regex

OPS = ("=", "!=", "=~", "!~")  # Alertmanager's MatchType order, which sorting uses
_OP_FLAGS = {"=": (False, True), "!=": (False, False), "=~": (True, True), "!~": (True, False)}
_OP_OF_FLAGS = {v: k for k, v in _OP_FLAGS.items()}

# A label name as Prometheus checks it (API v2 silences, `match:` keys, `group_by`).
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Go's `^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(=~|=|!=|!~)\s*((?s).*?)\s*$`; RE2's \s is [\t\n\f\r ].
_ONE = re.compile(
    r"[\t\n\f\r ]*([a-zA-Z_:][a-zA-Z0-9_:]*)[\t\n\f\r ]*(=~|=|!=|!~)[\t\n\f\r ]*((?s:.*?))[\t\n\f\r ]*\Z"
)
# Go's unicode.IsSpace, which strings.TrimSpace uses (Python's str.strip also takes \x1c-\x1f).
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
)
_UNESCAPE = {"n": "\n", '"': '"', "\\": "\\"}


class MatcherError(GpuwatchError, ValueError):
    """A matcher's text or regular expression is invalid (HTTP 400)."""

    http_status = 400


class MatcherRegexError(MatcherError):
    """A matcher's regular expression does not compile; `pattern` and `reason` say which and why."""

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"invalid regular expression {pattern!r}: {reason}")
        self.pattern = pattern
        self.reason = reason


class MatcherFormatError(MatcherError):
    """A text is not `name<op>value` at all."""


def compile_anchored(value: str) -> Regex:
    """Compile `value` as Alertmanager does (`^(?:value)$`, RE2); raise MatcherRegexError."""
    try:
        return regex.compile_anchored(value, dot_all=False)
    except regex.RegexError as e:
        raise MatcherRegexError(e.pattern, e.reason) from None


@dataclass(frozen=True)
class LabelMatcher:
    """One matcher; invalid ones (unknown operator, bad regex) cannot be built."""

    name: str
    op: str
    value: str
    regex: Regex | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in _OP_FLAGS:
            raise MatcherError(f"unknown matcher operator {self.op!r}; expected one of =, !=, =~, !~")
        if self.is_regex and self.regex is None:
            object.__setattr__(self, "regex", compile_anchored(self.value))

    @classmethod
    def of(cls, name: str, value: str, is_regex: bool = False, is_equal: bool = True) -> LabelMatcher:
        """Build a matcher from API v2's terms (`isRegex`, `isEqual`)."""
        return cls(name, _OP_OF_FLAGS[(is_regex, is_equal)], value)

    @property
    def is_regex(self) -> bool:
        return self.op in ("=~", "!~")

    @property
    def is_equal(self) -> bool:
        return self.op in ("=", "=~")

    def matches_value(self, value: str) -> bool:
        """Tell whether a label value (empty when the label is absent) satisfies this matcher."""
        hit = self.regex.search(value) is not None if self.regex is not None else value == self.value
        return hit == self.is_equal

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Tell whether `labels` satisfy this matcher (an absent label is the empty string)."""
        return self.matches_value(labels.get(self.name, ""))

    def to_json(self) -> dict[str, Any]:
        """Return the matcher as API v2 writes it."""
        return {"name": self.name, "value": self.value, "isRegex": self.is_regex, "isEqual": self.is_equal}

    def __str__(self) -> str:
        return format_matcher(self.name, self.value, self.is_regex, self.is_equal)


Matchers = tuple[LabelMatcher, ...]


def format_matcher(name: str, value: str, is_regex: bool = False, is_equal: bool = True) -> str:
    """Write a matcher as Alertmanager does: `name=~"value"`, with `\\`, `"` and newlines escaped."""
    escaped = value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return f'{name}{_OP_OF_FLAGS[(is_regex, is_equal)]}"{escaped}"'


def matches_all(matchers: Iterable[LabelMatcher], labels: Mapping[str, str]) -> bool:
    """Tell whether every matcher matches `labels` (an absent label counts as empty)."""
    return all(m.matches(labels) for m in matchers)


def sort_matchers(matchers: Iterable[LabelMatcher]) -> Matchers:
    """Return matchers in Alertmanager's order (name, then value, then operator), as routes keep them."""
    return tuple(sorted(matchers, key=lambda m: (m.name, m.value, OPS.index(m.op))))


def format_matchers(matchers: Sequence[LabelMatcher]) -> str:
    """Return matchers as Alertmanager writes them in route keys: `{a="b",c=~"d"}`."""
    return "{" + ",".join(str(m) for m in matchers) + "}"


def parse_matcher(text: str) -> LabelMatcher:
    """Parse one matcher as Alertmanager's `labels.ParseMatcher` (amtool, API `filter`); raise MatcherError.

    The value may be double-quoted; `\\"`, `\\\\` and `\\n` are escapes, any other backslash is literal.
    """
    m = _ONE.match(text)
    if m is None:
        raise MatcherFormatError(f"bad matcher format: {text}")
    raw = m.group(3)
    quoted = raw.startswith('"')
    body = raw[1:] if quoted else raw
    out: list[str] = []
    escaped = False
    last = len(body) - 1
    for i, c in enumerate(body):
        if escaped:
            escaped = False
            out.append(_UNESCAPE.get(c, "\\" + c))
        elif c == "\\" and i < last:
            escaped = True
        elif c == '"':
            if not quoted or i < last:
                raise MatcherError(f"matcher value contains unescaped double quote: {raw}")
            quoted = False
        else:
            out.append(c)
    if quoted:
        raise MatcherError(f"matcher value contains unescaped double quote: {raw}")
    return LabelMatcher(m.group(1), m.group(2), "".join(out))


def parse_matchers(text: str) -> list[LabelMatcher]:
    """Parse a comma list of matchers, optionally in braces, as Alertmanager's `labels.ParseMatchers`.

    Commas inside double quotes do not separate; a trailing comma is allowed, an empty item is not.
    Raise MatcherError, with a hint when an item is not a matcher at all.
    """
    s = text.removeprefix("{").removesuffix("}")
    tokens: list[str] = []
    cur: list[str] = []
    inside = escaped = False
    for c in s:
        if c == ",":
            if not inside:
                tokens.append("".join(cur))
                cur = []
                continue
        elif c == '"':
            if escaped:
                escaped = False
            else:
                inside = not inside
        elif c == "\\":
            escaped = not escaped
        else:
            escaped = False
        cur.append(c)
    if inside:  # Alertmanager fails on that item too, with "unescaped double quote"
        raise MatcherError("a quoted value is not closed")
    last = "".join(cur).strip(_GO_SPACE)
    if last:
        tokens.append(last)
    out = []
    for token in tokens:
        try:
            out.append(parse_matcher(token))
        except MatcherFormatError:
            raise MatcherFormatError(
                f'expected a matcher like alertname="GPULost" or severity=~"warn|crit", got {token.strip()!r}'
            ) from None
    return out
