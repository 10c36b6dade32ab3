"""Translate RE2 (Go) regular expressions into Python `re` syntax for label matchers."""

from __future__ import annotations

import re
import warnings

_FLAGS = re.compile(r"\(\?([imsU-]+)\)")


def translate(pattern: str) -> str:
    """Return `pattern` with RE2-only syntax rewritten for Python's `re`.

    Inline flags in the middle of a pattern (`a(?i)b`, `((?i)x)y`) apply until the end of the
    enclosing group in RE2; Python only allows them at the very start, so they become scoped
    groups `(?i:...)` closed where the enclosing group closes. `\\z` becomes `\\Z`.
    """
    out: list[str] = []
    scoped: list[list[str]] = [[]]  # per open group: the flag groups opened inside it
    i = 0
    n = len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            out.append("\\Z" if nxt == "z" else pattern[i : i + 2])
            i += 2
            continue
        if ch == "[":
            j = i + 1
            if j < n and pattern[j] == "^":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            out.append(pattern[i : j + 1])
            i = j + 1
            continue
        if ch == "(":
            m = _FLAGS.match(pattern, i)
            if m:
                out.append(f"(?{m.group(1)}:")
                scoped[-1].append(m.group(1))
                i = m.end()
                continue
            scoped.append([])
            out.append(ch)
            i += 1
            continue
        if ch == ")" and len(scoped) > 1:
            out.append(")" * len(scoped.pop()))
            out.append(ch)
            i += 1
            continue
        if ch == "|" and scoped[-1]:
            # Flags hold until the group ends, across alternatives: close and reopen around '|'.
            out.append(")" * len(scoped[-1]) + "|" + "".join(f"(?{f}:" for f in scoped[-1]))
            i += 1
            continue
        out.append(ch)
        i += 1
    out.append(")" * len(scoped[0]))
    return "".join(out)


def compile_quietly(pattern: str) -> re.Pattern[str]:
    """`re.compile`, without Python's FutureWarning about RE2-valid text such as `[[` (nested sets)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return re.compile(pattern)
