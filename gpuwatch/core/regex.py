"""Regular expressions as Prometheus and Alertmanager read them: Go's RE2 syntax, matched in linear time.

Python's `re` backtracks: `(a+)+$` against 28 characters holds the GIL for seconds, so one request could
stop the sampler. RE2 (the `google-re2` bindings) never backtracks and has the syntax users' rules,
silences and relabel configs were written in. Every PromQL selector, `label_replace`, relabel rule,
Alertmanager matcher (silences, inhibition, routes) and template regex goes through here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any, Protocol

import re2


class Match(Protocol):
    """A match, as RE2's (and `re`'s) match objects give it."""

    def group(self, *groups: int | str) -> Any: ...
    def groups(self) -> tuple[str | None, ...]: ...


class Regex(Protocol):
    """A compiled expression: the methods of `re.Pattern` that gpuwatch uses."""

    def search(self, text: str) -> Match | None: ...
    def fullmatch(self, text: str) -> Match | None: ...
    def sub(self, repl: Callable[[Match], str], text: str) -> str: ...


class RegexError(ValueError):
    """A pattern RE2 does not accept; the message names the pattern and RE2's reason."""

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"invalid regular expression {pattern!r}: {reason}")
        self.pattern = pattern
        self.reason = reason


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would print every rejected pattern to stderr
    return options


_OPTIONS = _options()


def _reason(error: Exception) -> str:
    raw = error.args[0] if error.args else error
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


_SURROGATE = re.compile("[\ud800-\udfff]")


def as_utf8(text: str) -> str:
    """`text` with each lone surrogate (JSON's "\\udcff", which a label value may hold) as U+FFFD, as
    Go's regexp and JSON decoder read invalid UTF-8: one character for one, so positions stay put."""
    return _SURROGATE.sub("\ufffd", text)


class _Pattern:
    """An RE2 pattern that also matches a text RE2 cannot encode (a lone surrogate): as Go would."""

    __slots__ = ("_rx",)

    def __init__(self, rx: Any) -> None:
        self._rx = rx

    def search(self, text: str) -> Match | None:
        try:
            return self._rx.search(text)
        except UnicodeEncodeError:
            return self._rx.search(as_utf8(text))

    def fullmatch(self, text: str) -> Match | None:
        try:
            return self._rx.fullmatch(text)
        except UnicodeEncodeError:
            return self._rx.fullmatch(as_utf8(text))

    def sub(self, repl: Callable[[Match], str], text: str) -> str:
        try:
            return self._rx.sub(repl, text)
        except UnicodeEncodeError:
            return self._rx.sub(repl, as_utf8(text))


@functools.lru_cache(maxsize=1024)
def compile(pattern: str) -> Regex:
    """Compile `pattern` (RE2 syntax, unanchored); raise RegexError."""
    try:
        return _Pattern(re2.compile(pattern, options=_OPTIONS))
    except re2.error as e:
        raise RegexError(pattern, _reason(e)) from None
    except UnicodeEncodeError:  # a lone surrogate: Go's regexp refuses invalid UTF-8 alike
        raise RegexError(pattern, "invalid UTF-8") from None


def compile_anchored(value: str, *, dot_all: bool = True) -> Regex:
    """Compile `value` anchored at both ends, as Prometheus (`^(?s:v)$`) or Alertmanager (`^(?:v)$`,
    `dot_all=False`) do; match with `.search`, as Go's MatchString does (`a)|(b` is accepted and
    matches `axyz`). The error, if any, names the user's own text."""
    try:
        return compile(("^(?s:" if dot_all else "^(?:") + value + ")$")
    except RegexError:
        compile(value)  # raises with the reason for the user's text, without the wrapper
        raise RegexError(value, "unbalanced parentheses") from None


def check(pattern: str) -> None:
    """Raise RegexError when `pattern` is not valid RE2 on its own."""
    compile(pattern)


_GO_TEMPLATE = re.compile(r"\$\$|\$\{([A-Za-z0-9_]+)\}|\$([A-Za-z0-9_]+)")


def expand(template: str, match: Match) -> str:
    """Expand `$1`, `${1}`, `$name`, `${name}` (and `$$`) as Go's Regexp.Expand does.

    A group that does not exist, or did not take part in the match, expands to nothing."""
    if "$" not in template:
        return template

    def one(m: re.Match[str]) -> str:
        ref = m.group(1) or m.group(2)
        if ref is None:
            return "$"
        try:
            value = match.group(int(ref)) if ref.isdigit() else match.group(ref)
        except (IndexError, KeyError):
            return ""
        return value or ""

    return _GO_TEMPLATE.sub(one, template)
