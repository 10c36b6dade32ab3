"""Read Prometheus's promqltest DSL (`.test` files): loads, clears and eval cases (HARNESS.md section 2)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuwatch.core.model import STALE_NAN
from gpuwatch.query.nativehist import NativeHistogram


class HarnessFileError(Exception):
    """The file is not valid test DSL."""


_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNITS = (365 * 86400_000, 7 * 86400_000, 86400_000, 3600_000, 60_000, 1000, 1)


def parse_duration(text: str) -> int:
    """Parse a Prometheus duration (`1h30m`, `10s53ms`, `0`) into milliseconds."""
    text = text.strip()
    if text == "0":
        return 0
    m = _DURATION.match(text)
    if not text or m is None or not any(m.groups()):
        raise HarnessFileError(f"bad duration {text!r}")
    return sum(int(g) * u for g, u in zip(m.groups(), _UNITS, strict=True) if g)


_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
}


def _unquote(text: str, i: int) -> tuple[str, int]:
    """Read a Go-quoted string starting at text[i]; return (value, index after it)."""
    quote = text[i]
    if quote == "`":
        end = text.index("`", i + 1)
        return text[i + 1 : end], end + 1
    out: list[str] = []
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == quote:
            return "".join(out), j + 1
        if ch != "\\":
            out.append(ch)
            j += 1
            continue
        nxt = text[j + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            j += 2
        elif nxt == "x":
            out.append(chr(int(text[j + 2 : j + 4], 16)))
            j += 4
        elif nxt == "u":
            out.append(chr(int(text[j + 2 : j + 6], 16)))
            j += 6
        elif nxt == "U":
            out.append(chr(int(text[j + 2 : j + 10], 16)))
            j += 10
        elif nxt in "01234567":
            out.append(chr(int(text[j + 1 : j + 4], 8)))
            j += 4
        else:
            raise HarnessFileError(f"bad escape in {text!r}")
    raise HarnessFileError(f"unterminated string in {text!r}")


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:.]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.]*")


def parse_series(line: str) -> tuple[dict[str, str], str, bool]:
    """Split `name{l="v"} values` into (labels incl. __name__, values text, has @st)."""
    labels: dict[str, str] = {}
    i = 0
    m = _NAME.match(line, i)
    if m:
        labels["__name__"] = m.group(0)
        i = m.end()
    if i < len(line) and line[i] == "{":
        i += 1
        while True:
            while i < len(line) and line[i] in " \t,":
                i += 1
            if i >= len(line):
                raise HarnessFileError(f"unterminated label set in {line!r}")
            if line[i] == "}":
                i += 1
                break
            if line[i] in "\"'`":
                name, i = _unquote(line, i)
            else:
                lm = _LABEL.match(line, i)
                if not lm:
                    raise HarnessFileError(f"bad label name in {line!r}")
                name, i = lm.group(0), lm.end()
            while line[i] == " ":
                i += 1
            if line[i] != "=":
                if "__name__" not in labels and not labels:  # a quoted metric name: {"name", l="v"}
                    labels["__name__"] = name
                    continue
                raise HarnessFileError(f"expected '=' in {line!r}")
            i += 1
            while line[i] == " ":
                i += 1
            value, i = _unquote(line, i)
            labels[name] = value
    elif not m:
        raise HarnessFileError(f"bad series {line!r}")
    has_st = line.startswith("@st", i)
    if has_st:
        i += 3
    return {k: v for k, v in labels.items() if v != ""}, line[i:].strip(), has_st


def parse_number(text: str) -> float:
    t = text.strip()
    low = t.lower()
    if low in ("inf", "+inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low in ("nan", "+nan", "-nan"):
        return math.nan
    try:
        return float(t)
    except ValueError:
        pass
    try:
        return float(int(t, 0))
    except ValueError:
        raise HarnessFileError(f"bad number {text!r}") from None


_NUM = r"[+-]?(?:[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?|[Ii]nf|NaN|nan)"
_SERIES_ITEM = re.compile(rf"^({_NUM})(?:([+-])({_NUM}))?x(\d+)$")
OMITTED = None  # a slot without a sample
HISTOGRAM = NativeHistogram  # the type of a native histogram slot


def _histogram(text: str) -> NativeHistogram:
    """Parse the inside of `{{schema:0 sum:10 count:20 buckets:[1 2] ...}}` (absolute counts)."""
    fields: dict[str, str] = {}
    for m in re.finditer(r"(\w+):(\[[^\]]*\]|\S+)", text):
        fields[m.group(1)] = m.group(2)
    known = {"schema", "sum", "count", "z_bucket", "z_bucket_w", "buckets", "offset", "n_buckets"}
    known |= {"n_offset", "counter_reset_hint", "custom_values"}
    if set(fields) - known:
        raise HarnessFileError(f"unknown histogram field in {text!r}")

    def numbers(key: str) -> list[float]:
        return [parse_number(x) for x in fields.get(key, "[]").strip("[]").split()]

    def buckets(key: str, offset_key: str) -> dict[int, float]:
        start = int(fields.get(offset_key, "0"))
        return {start + i: c for i, c in enumerate(numbers(key))}

    return NativeHistogram(
        schema=int(fields.get("schema", "0")),
        count=parse_number(fields.get("count", "0")),
        sum=parse_number(fields.get("sum", "0")),
        zero_threshold=parse_number(fields.get("z_bucket_w", "0")),
        zero_count=parse_number(fields.get("z_bucket", "0")),
        positive=buckets("buckets", "offset"),
        negative=buckets("n_buckets", "n_offset"),
        custom_values=tuple(numbers("custom_values")),
        counter_reset_hint=fields.get("counter_reset_hint", "unknown"),
    )


def _reduce(h: NativeHistogram, schema: int) -> NativeHistogram:
    """`h` at a lower resolution `schema` (Prometheus merges buckets: ((i - 1) >> delta) + 1)."""
    if schema == h.schema:
        return h
    delta = h.schema - schema

    def merge(b: dict[int, float]) -> dict[int, float]:
        out: dict[int, float] = {}
        for i, c in b.items():
            j = ((i - 1) >> delta) + 1
            out[j] = out.get(j, 0.0) + c
        return out

    return NativeHistogram(
        schema, h.count, h.sum, h.zero_threshold, h.zero_count, merge(h.positive), merge(h.negative),
        h.custom_values, h.counter_reset_hint,
    )  # fmt: skip


def _add(a: NativeHistogram, b: NativeHistogram, sign: float) -> NativeHistogram:
    """`a + sign*b` bucket by bucket, as the DSL's `{{A}}+{{B}}xN` series steps do."""
    if (a.custom_values or b.custom_values) and a.schema != b.schema:
        raise HarnessFileError("cannot add custom-bucket and exponential histograms")
    schema = min(a.schema, b.schema)
    a, b = _reduce(a, schema), _reduce(b, schema)

    def add(x: dict[int, float], y: dict[int, float]) -> dict[int, float]:
        out = dict(x)
        for i, c in y.items():
            out[i] = out.get(i, 0.0) + sign * c
        return out

    return NativeHistogram(
        schema, a.count + sign * b.count, a.sum + sign * b.sum, max(a.zero_threshold, b.zero_threshold),
        a.zero_count + sign * b.zero_count, add(a.positive, b.positive), add(a.negative, b.negative),
        a.custom_values, a.counter_reset_hint,
    )  # fmt: skip


def _histogram_slots(tok: str) -> list[NativeHistogram]:
    """Expand `{{A}}`, `{{A}}xN`, `{{A}}+{{B}}xN` or `{{A}}-{{B}}xN` (repeated addition)."""
    m = re.fullmatch(r"\{\{(.*?)\}\}(?:([+-])\{\{(.*?)\}\})?(?:x(\d+))?", tok)
    if m is None:
        raise HarnessFileError(f"bad histogram series item {tok!r}")
    h = _histogram(m.group(1))
    slots = [h]
    if m.group(4) is not None:
        inc = _histogram(m.group(3)) if m.group(3) is not None else None
        for _ in range(int(m.group(4))):
            if inc is not None:
                h = _add(h, inc, 1.0 if m.group(2) == "+" else -1.0)
            slots.append(h)
    return slots


def _tokens(values: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(values):
        if values[i].isspace():
            i += 1
            continue
        if values.startswith("{{", i):
            depth_end = values.index("}}", i) + 2
            j = depth_end
            while j < len(values) and not values[j].isspace():
                if values.startswith("{{", j):
                    j = values.index("}}", j) + 2
                else:
                    j += 1
            out.append(values[i:j])
            i = j
            continue
        j = i
        while j < len(values) and not values[j].isspace():
            j += 1
        out.append(values[i:j])
        i = j
    return out


def expand_values(values: str) -> list[Any]:
    """Expand `0+10x3 _ stale` into slots: floats, OMITTED, NativeHistogram objects."""
    slots: list[Any] = []
    for tok in _tokens(values):
        if tok.startswith("{{"):
            slots.extend(_histogram_slots(tok))
            continue
        if tok == "_":
            slots.append(OMITTED)
            continue
        if tok.startswith("_x"):
            slots.extend([OMITTED] * int(tok[2:]))
            continue
        if tok == "stale":
            slots.append(STALE_NAN)
            continue
        m = _SERIES_ITEM.match(tok)
        if not m:  # `x` is the repeat operator first; a lone token may be hex (0x1F)
            slots.append(parse_number(tok))
            continue
        v = parse_number(m.group(1))
        step = 0.0 if m.group(2) is None else parse_number(m.group(3)) * (1 if m.group(2) == "+" else -1)
        slots.append(v)
        for _ in range(int(m.group(4))):
            v += step
            slots.append(v)
    return slots


@dataclass
class Case:
    file: str
    line: int
    kind: str  # instant | range
    expr: str
    time_ms: int = 0
    start_ms: int = 0
    end_ms: int = 0
    step_ms: int = 0
    expect_fail: bool = False
    fail_msg: str | None = None
    fail_regex: str | None = None
    ordered: bool = False
    annotations: bool = False
    static_unsupported: str | None = None
    scalar: float | None = None
    series: list[tuple[dict[str, str], list[Any]]] = field(default_factory=list)
    loads: int = 0  # index of the last command before this eval, to replay loads


@dataclass
class Command:
    kind: str  # clear | load | eval
    line: int
    interval_ms: int = 0
    series: list[tuple[dict[str, str], list[Any]]] = field(default_factory=list)
    case: Case | None = None


_INSTANT = re.compile(r"^eval(?:_(fail|warn|ordered|info))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)$")
_RANGE = re.compile(r"^eval(?:_(fail|warn|info))?\s+range\s+from\s+(.+)\s+to\s+(.+)\s+step\s+(.+?)\s+(.+)$")
_LOAD = re.compile(r"^load(?:_(with_nhcb))?\s+(.+?)$")


def parse_file(path: Path) -> list[Command]:
    """Read a .test file into commands (HARNESS.md section 2)."""
    lines = []
    for raw in path.read_text().split("\n"):
        s = raw.strip()
        lines.append("" if s.startswith("#") else s)
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        start = i
        body: list[str] = []
        i += 1
        word = line.split()[0].lower()
        if word == "clear":  # clear has no body: the next line is a command of its own
            commands.append(Command("clear", start + 1))
            continue
        while i < len(lines) and lines[i]:
            body.append(lines[i])
            i += 1
        if word.startswith("load"):
            m = _LOAD.match(line)
            if not m:
                raise HarnessFileError(f"line {start + 1}: bad load {line!r}")
            cmd = Command("load", start + 1, interval_ms=parse_duration(m.group(2)))
            defs: dict[tuple[tuple[str, str], ...], list[Any]] = {}
            for b in body:
                labels, values, has_st = parse_series(b)
                if has_st:
                    continue
                defs[tuple(sorted(labels.items()))] = expand_values(values)
            cmd.series = [(dict(k), v) for k, v in defs.items()]
            commands.append(cmd)
        elif word.startswith("eval"):
            commands.append(Command("eval", start + 1, case=_parse_eval(path.name, start + 1, line, body)))
        else:
            raise HarnessFileError(f"line {start + 1}: unknown command {line!r}")
    return commands


def _parse_eval(file: str, lineno: int, header: str, body: list[str]) -> Case:  # noqa: C901 - one branch per eval directive of the test format
    m = _INSTANT.match(header)
    if m:
        suffix = m.group(1)
        case = Case(file, lineno, "instant", m.group(3), time_ms=parse_duration(m.group(2) or "0"))
    else:
        m = _RANGE.match(header)
        if not m:
            raise HarnessFileError(f"line {lineno}: bad eval {header!r}")
        suffix = m.group(1)
        case = Case(file, lineno, "range", m.group(5))
        case.start_ms, case.end_ms = parse_duration(m.group(2)), parse_duration(m.group(3))
        case.step_ms = parse_duration(m.group(4))
        if case.end_ms < case.start_ms:
            raise HarnessFileError(f"line {lineno}: end before start")
    if suffix == "fail":
        case.expect_fail = True
    elif suffix == "ordered":
        case.ordered = True
    elif suffix in ("warn", "info"):
        case.annotations = True
    for b in body:
        words = b.split(" ")
        if words[0] == "expect":
            rest = b[len("expect") :].strip()
            if rest.startswith("fail"):
                case.expect_fail = True
                tail = rest[4:].strip()
                if tail.startswith("msg:"):
                    case.fail_msg = tail[4:].strip()
                elif tail.startswith("regex:"):
                    case.fail_regex = tail[6:].strip()
            elif rest.startswith("ordered"):
                case.ordered = True
            elif rest.startswith(("warn", "info", "no_warn", "no_info")):
                case.annotations = True
            elif rest.startswith("range vector"):
                case.static_unsupported = "instant query returning a range vector"
            elif rest.startswith("string"):
                case.static_unsupported = "instant query returning a string"
            else:
                raise HarnessFileError(f"line {lineno}: unknown expectation {b!r}")
            continue
        if words[0] == "expected_fail_message":
            case.fail_msg = b[len(words[0]) :].strip()
            break
        if words[0] == "expected_fail_regexp":
            case.fail_regex = b[len(words[0]) :].strip()
            break
        if "{{" in b:
            case.static_unsupported = "native histogram result"
        try:
            case.scalar = parse_number(b)
            break
        except HarnessFileError:
            pass
        labels, values, _ = parse_series(b)
        case.series.append((labels, expand_values(values)))
    return case
