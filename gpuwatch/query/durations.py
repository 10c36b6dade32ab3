"""Duration expressions (`[5m+1m]`, `[step()]`, `offset -(1m*2)`), which promql-parser 0.12 cannot read.

Prometheus 3.x accepts arithmetic in range brackets, subquery steps and after `offset`
(`+ - * / % ^`, parentheses, numbers as seconds, `step()`, `range()`, `min_of()`, `max_of()`).
`rewrite` evaluates each such expression for one query (it depends on the query's step and
range) and writes it back as a plain millisecond duration, so the text can be parsed again.
"""

from __future__ import annotations

import math
import re

from gpuwatch.query.errors import PromQLParseError

_DURATION_PART = re.compile(r"(\d+)(ms|y|w|d|h|m|s)")
_UNIT_MS = {"y": 365 * 86_400_000, "w": 7 * 86_400_000, "d": 86_400_000, "h": 3_600_000, "m": 60_000}
_UNIT_MS |= {"s": 1000, "ms": 1}
_DURATION = re.compile(r"(?:\d+(?:ms|y|w|d|h|m|s))+")
_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_:]*")
# What promql-parser reads itself: a duration or a number, optionally signed (signs only after offset).
_PLAIN = re.compile(rf"\s*[-+]?\s*(?:{_DURATION.pattern}|{_NUMBER.pattern})\s*")
_MODIFIER_KEYWORDS = re.compile(r"\b(anchored|smoothed)\b", re.IGNORECASE)


class _Reader:
    """Recursive-descent reader of one duration expression; values are seconds."""

    def __init__(self, text: str, pos: int, step_s: float, range_s: float) -> None:
        self.text = text
        self.pos = pos
        self.step_s = step_s
        self.range_s = range_s

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        self.skip()
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expect(self, ch: str) -> None:
        if self.peek() != ch:
            raise ValueError(f"expected {ch!r} in duration expression")
        self.pos += 1

    def expr(self) -> float:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> float:
        value = self.unary()
        while self.peek() in ("*", "/", "%"):
            op = self.text[self.pos]
            self.pos += 1
            rhs = self.unary()
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise PromQLParseError("division by zero in duration expression")
            elif op == "/":
                value /= rhs
            else:
                value = math.fmod(value, rhs)
        return value

    def unary(self) -> float:
        ch = self.peek()
        if ch in ("-", "+") and ch:
            self.pos += 1
            value = self.unary()
            return -value if ch == "-" else value
        return self.power()

    def power(self) -> float:
        base = self.primary()
        if self.peek() == "^":
            self.pos += 1
            return math.pow(base, self.unary())
        return base

    def primary(self) -> float:
        ch = self.peek()
        if ch == "(":
            self.pos += 1
            value = self.expr()
            self.expect(")")
            return value
        m = _DURATION.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return sum(int(n) * _UNIT_MS[u] for n, u in _DURATION_PART.findall(m.group(0))) / 1000
        m = _NUMBER.match(self.text, self.pos)
        if m:
            self.pos = m.end()
            return float(m.group(0))
        m = _IDENT.match(self.text, self.pos)
        if not m:
            raise ValueError("not a duration expression")
        name = m.group(0).lower()
        self.pos = m.end()
        self.expect("(")
        if name in ("step", "range"):
            self.expect(")")
            return self.step_s if name == "step" else self.range_s
        if name in ("min_of", "max_of"):
            a = self.expr()
            self.expect(",")
            b = self.expr()
            self.expect(")")
            return min(a, b) if name == "min_of" else max(a, b)
        raise ValueError(f"unknown function {name}() in duration expression")

    def offset_atom(self) -> float:
        """Read what `offset` binds: a signed literal, call or parenthesised expression."""
        ch = self.peek()
        if ch in ("-", "+") and ch:
            self.pos += 1
            value = self.offset_atom()
            return -value if ch == "-" else value
        return self.primary()


def _to_ms(seconds: float) -> int:
    """Convert seconds to milliseconds as Prometheus does (nanosecond Duration, truncated)."""
    if not math.isfinite(seconds) or abs(seconds) > 9.2e9:
        raise PromQLParseError(f"duration expression out of range: {seconds}")
    ns = int(math.trunc(abs(seconds) * 1e9))
    return ns // 1_000_000 if seconds >= 0 else -(ns // 1_000_000)


def _skip_string(text: str, i: int) -> int:
    quote = text[i]
    j = i + 1
    while j < len(text):
        if text[j] == "\\" and quote != "`":
            j += 2
            continue
        if text[j] == quote:
            return j + 1
        j += 1
    return len(text)


def _bracket(text: str, start: int, end: int, step_s: float, range_s: float) -> str:
    """Rewrite the inside of `[...]` (a range, or a subquery's range and step)."""
    parts = _split_colon(text[start:end])
    out = []
    for pos, part in enumerate(parts):
        if not part.strip() or _PLAIN.fullmatch(part):
            out.append(part)
            continue
        reader = _Reader(part, 0, step_s, range_s)
        value = reader.expr()
        reader.skip()
        if reader.pos != len(part):
            raise ValueError("trailing text in duration expression")
        ms = _to_ms(value)
        if ms <= 0:
            what = "subquery step" if pos else "range"
            raise PromQLParseError(f"duration must be greater than 0 ({what} {part.strip()!r})")
        out.append(f"{ms}ms")
    return ":".join(out)


def _split_colon(inner: str) -> list[str]:
    parts, depth, last = [], 0, 0
    for i, ch in enumerate(inner):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == ":" and depth == 0:
            parts.append(inner[last:i])
            last = i + 1
    parts.append(inner[last:])
    return parts


def rewrite(text: str, step_ms: int = 0, range_ms: int = 0) -> str:
    """Return `text` with every duration expression replaced by its value in milliseconds.

    `step_ms` and `range_ms` are what `step()` and `range()` stand for (0 in an instant query).
    Text that holds no duration expression comes back unchanged.
    """
    step_s, range_s = step_ms / 1000, range_ms / 1000
    out: list[str] = []
    i = 0
    depth = 0  # inside {...} label matchers nothing is rewritten
    while i < len(text):
        ch = text[i]
        if ch in "\"'`":
            j = _skip_string(text, i)
            out.append(text[i:j])
            i = j
        elif ch == "#":
            j = text.find("\n", i)
            j = len(text) if j < 0 else j
            out.append(text[i:j])
            i = j
        elif ch in "{}":
            depth += 1 if ch == "{" else -1
            out.append(ch)
            i += 1
        elif ch == "[" and depth == 0:
            j = text.find("]", i)
            if j < 0:
                out.append(text[i:])
                break
            try:
                out.append("[" + _bracket(text, i + 1, j, step_s, range_s) + "]")
            except ValueError:
                out.append(text[i : j + 1])
            i = j + 1
        elif depth == 0 and (m := _IDENT.match(text, i)) and (i == 0 or not _is_word(text[i - 1])):
            word = m.group(0)
            i = m.end()
            out.append(word)
            if word.lower() == "offset":
                i = _offset(text, i, out, step_s, range_s)
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _is_word(ch: str) -> bool:
    return ch.isalnum() or ch in "_:."


def _offset(text: str, i: int, out: list[str], step_s: float, range_s: float) -> int:
    """Rewrite the duration after an `offset` at text[i:]; return the index after it."""
    reader = _Reader(text, i, step_s, range_s)
    try:
        value = reader.offset_atom()
    except ValueError:
        return i
    atom = text[i : reader.pos]
    if _PLAIN.fullmatch(atom) and value != 0:
        return i
    ms = _to_ms(value)
    if ms == 0:  # promql-parser refuses `offset 0ms`; no offset is the same thing
        out.pop()
    else:
        out.append(f" {ms}ms" if ms > 0 else f" -{-ms}ms")
    return reader.pos


_MODIFIER_FUNCTIONS = {
    "anchored": "changes, delta, increase, rate, resets",
    "smoothed": "delta, increase, rate",
}
_MODIFIED_CALL = re.compile(
    r"([A-Za-z_][A-Za-z0-9_]*)\s*\(\s*[^()]*?\]\s*(anchored|smoothed)\b", re.IGNORECASE
)


def _strip_strings(text: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', text)


_NEGATIVE_AT = re.compile(r"@\s*-")


# An `@` time before 1970 outside strings and comments; the number is what Prometheus reads as seconds.
_AT_OR_SKIPPED = re.compile(
    r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`|#[^\n]*'
    r"|@(\s*)-\s*((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.])"
)
_BEFORE_1970_BASE_MS = 1_999_999_999_937  # stand-in `@` times count up from here (2033-05-18)
_MAX_AT_MS = 1 << 62


def stand_in_negative_ats(text: str) -> tuple[str, dict[int, int]]:
    """Return `text` with each `@` time before 1970 (`up @ -60`) replaced by a distinct stand-in time
    after it, which promql-parser reads (it panics on a time before 1970), and the stand-ins' times
    mapped to the times written, both in milliseconds. Raise PromQLParseError for one past int64 ms."""
    ats: dict[int, int] = {}

    def stand_in(m: re.Match[str]) -> str:
        if m.group(2) is None:
            return m.group(0)
        written = -round(float(m.group(2)) * 1000)
        if written < -_MAX_AT_MS:
            raise PromQLParseError(f"parse error: timestamp out of bounds for @ modifier: -{m.group(2)}")
        ms = _BEFORE_1970_BASE_MS + len(ats)
        ats[ms] = written
        return f"@{m.group(1)}{ms // 1000}.{ms % 1000:03d}"

    return _AT_OR_SKIPPED.sub(stand_in, text), ats


def has_negative_at(text: str) -> bool:
    """Whether `text` has an `@` time before 1970 (`up @ -1`) outside strings: promql-parser panics
    reading one, and each panic prints Rust's message to stderr, past gpuwatch's log throttle."""
    return _NEGATIVE_AT.search(_strip_strings(text)) is not None


def unsupported_modifier(text: str) -> str | None:
    """Name the range modifier (`anchored`, `smoothed`) `text` uses outside strings, if any."""
    m = _MODIFIER_KEYWORDS.search(_strip_strings(text))
    return m.group(1).lower() if m else None


def check_modifier_use(text: str) -> None:
    """Reject `anchored`/`smoothed` on a function Prometheus does not allow them with."""
    for m in _MODIFIED_CALL.finditer(_strip_strings(text)):
        func, modifier = m.group(1), m.group(2).lower()
        allowed = _MODIFIER_FUNCTIONS[modifier]
        if func not in allowed.split(", "):
            raise PromQLParseError(f"{modifier} modifier can only be used with: {allowed} - not with {func}")
