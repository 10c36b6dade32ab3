"""Careful, character-level scanning of one exposition line, for lines the fast path in `textformat` skips.

Everything here raises `LineError` with a one-line message saying what is wrong; nothing is guessed.
Handles both Prometheus text 0.0.4 (blanks and tabs between tokens, trailing comma in label sets) and
OpenMetrics 1.0 (single spaces, no trailing comma, float-second timestamps, exemplars), plus the
quoted UTF-8 names of newer exporters: `{"my.metric", "my.label"="v"} 1`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import NamedTuple

from gpuwatch.core.model import Labels

METRIC_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
# Go's strconv.ParseFloat without hex floats and underscores, as prometheus/common's parser accepts it.
FLOAT = (
    r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?"
    r"|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)|[nN][aA][nN]"
)
INT = r"[-+]?\d+"

METRIC_NAME_RE = re.compile(METRIC_NAME)
LABEL_NAME_RE = re.compile(LABEL_NAME)
FLOAT_RE = re.compile(FLOAT)
INT_RE = re.compile(INT)
_TOKEN_RE = re.compile(r"[^ \t]*")
_BLANKS_RE = re.compile(r"[ \t]*")
_STRING_BODY_RE = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*')
_ESCAPE_RE = re.compile(r"\\(.)", re.S)
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_HELP_ESCAPES_TEXT = {"\\": "\\", "n": "\n"}

TEXT_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
OM_TYPES = frozenset(
    {"counter", "gauge", "histogram", "gaugehistogram", "stateset", "info", "summary", "unknown"}
)
_INT64 = 2**63
BAD_LINE = "\x00"  # stands in for a line that is not valid UTF-8; never matches a sample


class LineError(Exception):
    """One line cannot be used; the message says why."""


class ScannedSample(NamedTuple):
    """A sample line taken apart but not yet converted: texts as they appear, escapes decoded."""

    name: str
    pairs: list[tuple[str, str]]
    value: str
    timestamp: str | None
    exemplar: tuple[list[tuple[str, str]], str, str | None] | None


class Metadata(NamedTuple):
    """A `# HELP`, `# TYPE` or `# UNIT` line; kind is HELP, TYPE, UNIT, EOF, or '' for a plain comment."""

    kind: str
    name: str
    text: str


def unescape(value: str, table: dict[str, str] = _ESCAPES) -> str:
    """Decode `\\\\`, `\\"` and `\\n`; any other escape stays as written, as Prometheus's scraper keeps it."""
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: table.get(m.group(1), m.group(0)), value)


def parse_float(text: str) -> float:
    """Convert a value token checked by FLOAT_RE, rejecting overflow as Go's ParseFloat does."""
    value = float(text)
    if value - value and value == value and text[-1] not in "fFyY":
        raise LineError(f"value out of range: {text!r}")
    return value


def timestamp_ms(text: str, is_openmetrics: bool) -> int:
    """Convert a timestamp token: integer milliseconds (text format) or float seconds (OpenMetrics)."""
    if is_openmetrics:
        if FLOAT_RE.fullmatch(text) is None:
            raise LineError(f"invalid timestamp {text!r}: expected seconds since the epoch")
        seconds = float(text)
        if seconds - seconds:
            raise LineError(f"invalid timestamp {text!r}")
        return round(seconds * 1000)
    if INT_RE.fullmatch(text) is None:
        raise LineError(f"invalid timestamp {text!r}: expected integer milliseconds")
    ms = int(text)
    if not -_INT64 <= ms < _INT64:
        raise LineError(f"timestamp out of range: {text!r}")
    return ms


class _Cursor:
    """A position in one line, with the primitives both formats share."""

    def __init__(self, line: str, is_openmetrics: bool) -> None:
        self.line = line
        self.pos = 0
        self.om = is_openmetrics

    def peek(self) -> str:
        return self.line[self.pos] if self.pos < len(self.line) else ""

    def at_end(self) -> bool:
        return self.pos >= len(self.line)

    def blanks(self) -> int:
        """Skip spaces and tabs (text format); return how many were skipped."""
        end = _BLANKS_RE.match(self.line, self.pos).end()  # type: ignore[union-attr]
        n, self.pos = end - self.pos, end
        return n

    def separator(self, what: str) -> None:
        """Require the blank(s) between two tokens: one space in OpenMetrics, spaces/tabs in text."""
        start = self.pos
        n = self.blanks()
        if n == 0:
            raise LineError(f"expected a space before {what}")
        if self.om and self.line[start : self.pos] != " ":
            raise LineError(f"expected exactly one space before {what}")

    def inner_blanks(self) -> None:
        """Blanks inside `{...}`: allowed in text, not in OpenMetrics."""
        if self.blanks() and self.om:
            raise LineError("unexpected space inside the label set")

    def token(self) -> str:
        m = _TOKEN_RE.match(self.line, self.pos)
        self.pos = m.end()  # type: ignore[union-attr]
        return m.group()  # type: ignore[union-attr]

    def string(self) -> str:
        """Read a double-quoted string starting at the cursor; return it with escapes decoded."""
        start = self.pos + 1
        end = _STRING_BODY_RE.match(self.line, start).end()  # type: ignore[union-attr]
        if end >= len(self.line):
            raise LineError("unterminated quoted string (missing closing '\"')")
        self.pos = end + 1
        return unescape(self.line[start:end])

    def labels(self, allow_name: bool) -> tuple[str | None, list[tuple[str, str]]]:
        """Read `{...}` at the cursor; with `allow_name`, a leading quoted string alone is the metric name."""
        self.pos += 1  # the '{'
        name: str | None = None
        pairs: list[tuple[str, str]] = []
        after_comma = False
        while True:
            self.inner_blanks()
            c = self.peek()
            if c == "}":
                if after_comma and self.om:
                    raise LineError("trailing comma in the label set")
                self.pos += 1
                return name, pairs
            if c == "":
                raise LineError("unterminated label set (missing '}')")
            if c == '"':
                label = self.string()
                if not label:
                    raise LineError("empty quoted label name")
            else:
                m = LABEL_NAME_RE.match(self.line, self.pos)
                if m is None:
                    raise LineError(f"invalid label name at {self.line[self.pos : self.pos + 20]!r}")
                label = m.group()
                self.pos = m.end()
            self.inner_blanks()
            c = self.peek()
            if (
                c in (",", "}")
                and allow_name
                and name is None
                and not pairs
                and self.line[self.pos - 1] == '"'
            ):
                name = label  # {"my.metric", ...}
            else:
                if c != "=":
                    raise LineError(f"expected '=' after label name {label!r}")
                self.pos += 1
                self.inner_blanks()
                if self.peek() != '"':
                    raise LineError(f"expected '\"' to start the value of label {label!r}")
                pairs.append((label, self.string()))
                self.inner_blanks()
                c = self.peek()
            if c == ",":
                self.pos += 1
                after_comma = True
            elif c == "":
                raise LineError("unterminated label set (missing '}')")
            elif c != "}":
                raise LineError(f"expected ',' or '}}' after label {label!r}")
            else:
                after_comma = False
            allow_name = False


def scan_sample(line: str, is_openmetrics: bool) -> ScannedSample:  # noqa: C901 - one branch per token of a sample line
    """Take a sample line apart: name, label pairs (unsorted), value text, timestamp text, exemplar."""
    cur = _Cursor(line, is_openmetrics)
    if not is_openmetrics:
        cur.blanks()
    name: str | None = None
    pairs: list[tuple[str, str]] = []
    if cur.peek() == "{":
        name, pairs = cur.labels(allow_name=True)
        if name is None:
            raise LineError("missing metric name")
    else:
        m = METRIC_NAME_RE.match(line, cur.pos)
        if m is None or (m.end() < len(line) and line[m.end()] not in " \t{"):
            raise LineError(f"invalid metric name at {line[cur.pos : cur.pos + 30]!r}")
        name = m.group()
        cur.pos = m.end()
        gap = 0 if is_openmetrics else cur.blanks()
        if cur.peek() == "{":
            _, pairs = cur.labels(allow_name=False)
        elif gap:
            cur.pos -= gap
    if cur.at_end():
        raise LineError("missing value")
    if not is_openmetrics and line[cur.pos - 1] == "}":
        cur.blanks()  # the text format allows `m{a="1"}1`
    else:
        cur.separator("the value")
    value = cur.token()
    if FLOAT_RE.fullmatch(value) is None:
        raise LineError(f"invalid value {value!r}" if value else "missing value")
    timestamp: str | None = None
    exemplar = None
    if not cur.at_end():
        cur.separator("the timestamp")
        if cur.at_end() and not is_openmetrics:
            return ScannedSample(name, pairs, value, None, None)
        if cur.peek() != "#":
            timestamp = cur.token()
            if not cur.at_end():
                cur.separator("the exemplar")
                if cur.at_end() and not is_openmetrics:
                    return ScannedSample(name, pairs, value, timestamp, None)
        if cur.peek() == "#":
            if not is_openmetrics:
                raise LineError("exemplars ('# {...}' after the value) are only allowed in OpenMetrics")
            exemplar = _exemplar(cur)
        elif not cur.at_end():
            raise LineError(f"unexpected text after the timestamp: {line[cur.pos : cur.pos + 30]!r}")
    return ScannedSample(name, pairs, value, timestamp, exemplar)


def _exemplar(cur: _Cursor) -> tuple[list[tuple[str, str]], str, str | None]:
    cur.pos += 1
    cur.separator("the exemplar's labels")
    if cur.peek() != "{":
        raise LineError("expected '{' to start the exemplar's labels")
    _, pairs = cur.labels(allow_name=False)
    cur.separator("the exemplar's value")
    value = cur.token()
    if FLOAT_RE.fullmatch(value) is None:
        raise LineError(f"invalid exemplar value {value!r}")
    ts = None
    if not cur.at_end():
        cur.separator("the exemplar's timestamp")
        ts = cur.token()
        timestamp_ms(ts, True)
        if not cur.at_end():
            raise LineError("unexpected text after the exemplar")
    if sum(len(k) + len(v) for k, v in pairs) > 128:
        raise LineError("exemplar labels longer than 128 characters")
    return pairs, value, ts


_TEXT_META_RE = re.compile(r"#[ \t]*(HELP|TYPE)(?:[ \t]+(.*))?")
_OM_META_RE = re.compile(r"# (HELP|TYPE|UNIT) (.*)")


def scan_comment(line: str, is_openmetrics: bool) -> Metadata:
    """Read a line starting with '#': HELP/TYPE (and UNIT, EOF in OpenMetrics), or a plain comment."""
    if is_openmetrics:
        if line == "# EOF":
            return Metadata("EOF", "", "")
        m = _OM_META_RE.fullmatch(line)
        if m is None:
            if line.startswith(("# HELP", "# TYPE", "# UNIT")):
                raise LineError("expected '# HELP|TYPE|UNIT name ...' with single spaces")
            raise LineError("comments other than HELP, TYPE, UNIT and EOF are not allowed in OpenMetrics")
    else:
        m = _TEXT_META_RE.fullmatch(line.lstrip(" \t").rstrip("\r"))
        if m is None:
            return Metadata("", "", "")
    kind, rest = m.group(1), m.group(2) or ""
    if not is_openmetrics and not rest.strip(" \t"):
        return Metadata("", "", "")  # `# HELP` alone is a plain comment, as Prometheus's parser reads it
    cur = _Cursor(rest, is_openmetrics)
    if cur.peek() == '"':
        name = cur.string()
    else:
        nm = METRIC_NAME_RE.match(rest)
        if nm is None or not nm.group():
            raise LineError(f"{kind} line without a valid metric name")
        name = nm.group()
        cur.pos = nm.end()
    if cur.at_end():
        text = ""
    else:
        cur.separator(f"the {kind} text")
        text = rest[cur.pos :]
    if kind == "HELP" and not is_openmetrics and not text.strip(" \t"):
        return Metadata("", "", "")  # `# HELP name` without text says nothing (Prometheus ignores it too)
    if kind == "HELP":
        return Metadata(kind, name, unescape(text, _ESCAPES if is_openmetrics else _HELP_ESCAPES_TEXT))
    if kind == "TYPE":
        text = text.rstrip(" \t") if not is_openmetrics else text
        allowed = OM_TYPES if is_openmetrics else TEXT_TYPES
        if text not in allowed:
            raise LineError(f"unknown metric type {text!r} (expected one of {', '.join(sorted(allowed))})")
        return Metadata(kind, name, "unknown" if text == "untyped" else text)
    if text and not (name.endswith("_" + text)):
        raise LineError(f"metric name {name!r} must end with its unit '_{text}'")
    return Metadata(kind, name, text)


def decode_lines(data: bytes) -> tuple[str, list[int]]:
    """Decode UTF-8; lines that are not valid UTF-8 are replaced by a marker and listed (1-based)."""
    try:
        return data.decode("utf-8"), []
    except UnicodeDecodeError:
        pass
    bad: list[int] = []
    lines: list[str] = []
    for i, raw in enumerate(data.split(b"\n"), 1):
        try:
            lines.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            bad.append(i)
            lines.append(BAD_LINE)
    return "\n".join(lines), bad


def label_entry(pairs: Iterable[tuple[str, str]]) -> tuple[Labels, int, int]:
    """Validate and sort label pairs; return (labels, le state, quantile state) or raise LineError.

    States: 0 absent, 1 a float, 2 present but not a float.
    """
    pairs = list(pairs)
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise LineError(f"duplicate label name {k!r}")
            seen.add(k)
    if "__name__" in found:
        raise LineError("label name '__name__' is reserved")
    le = found.get("le")
    q = found.get("quantile")
    return (
        tuple(sorted(pairs)),
        0 if le is None else 1 if FLOAT_RE.fullmatch(le) else 2,
        0 if q is None else 1 if FLOAT_RE.fullmatch(q) else 2,
    )
