"""Parse PromQL with promql-parser, keeping the user's text and refusing unsupported features early."""

from __future__ import annotations

import functools
import itertools
import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import promql_parser as pp

from gpuwatch.core.model import Matcher
from gpuwatch.query.durations import (
    check_modifier_use,
    has_negative_at,
    rewrite,
    stand_in_negative_ats,
    unsupported_modifier,
)
from gpuwatch.query.errors import PromQLParseError, Unsupported
from gpuwatch.query.limits import MAX_DEPTH, MAX_LENGTH, check_text, walk

# Functions that only make sense on native histograms (the store holds floats only).
NATIVE_HISTOGRAM_FUNCTIONS = frozenset(
    {
        "histogram_count",
        "histogram_sum",
        "histogram_avg",
        "histogram_fraction",
        "histogram_stddev",
        "histogram_stdvar",
        "histogram_quantiles",
    }
)

# Experimental functions the engine implements anyway (Prometheus gates them behind a flag).
IMPLEMENTED_EXPERIMENTAL = frozenset(
    {
        "first_over_time",
        "mad_over_time",
        "ts_of_first_over_time",
        "ts_of_last_over_time",
        "ts_of_max_over_time",
        "ts_of_min_over_time",
        "sort_by_label",
        "sort_by_label_desc",
        "double_exponential_smoothing",
        "start",
        "end",
        "range",
        "step",
        "min_of",
        "max_of",
    }
)

UNSUPPORTED_AGGREGATIONS = frozenset({"limitk", "limit_ratio"})
# Node attributes holding times and durations, converted by promql-parser only when read.
_TIMES = ("at", "offset", "range", "step")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@dataclass(frozen=True)
class ParsedQuery:
    """A parsed expression together with the text the user wrote."""

    text: str
    expr: Any
    # String literals whose Go bytes are not valid UTF-8 (promql-parser reads "\xff" as "ÿ").
    invalid_utf8: frozenset[str] = frozenset()


_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"|\'((?:[^\'\\]|\\.)*)\'')
_BYTE_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def _invalid_utf8_literals(text: str) -> frozenset[str]:
    """Find string literals with \\x escapes that make invalid UTF-8, keyed by promql-parser's reading."""
    out = set()
    for m in _STRING.finditer(text):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        if not _BYTE_ESCAPE.search(body):
            continue
        raw = bytearray()
        latin = []
        for part in re.split(r"(\\x[0-9a-fA-F]{2})", body):
            if part.startswith("\\x") and len(part) == 4:
                raw.append(int(part[2:], 16))
                latin.append(chr(int(part[2:], 16)))
            else:
                raw.extend(part.encode())
                latin.append(part)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            out.add("".join(latin))
    return frozenset(out)


_TOKEN = re.compile(
    r"\s+|#[^\n]*|(?P<str>\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|`[^`]*`)"
    r"|(?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?:[a-zA-Z]+\d*)*)"
    r"|(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:.]*)|(?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){}\[\],@]|.)"
)
_TRAILING = frozenset(
    [
        "+",
        "-",
        "*",
        "/",
        "%",
        "^",
        "==",
        "!=",
        ">",
        "<",
        ">=",
        "<=",
        "and",
        "or",
        "unless",
        "atan2",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "@",
        ",",
    ]
)


def explain_generic(text: str) -> str | None:
    """Say what promql-parser's bare "invalid promql query" means, as Prometheus would: the query ends too
    early (`up ==`, `sum(x) by`), or two operands follow each other (`foo bar`). None when neither."""
    tokens: list[tuple[str, str]] = []
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind is not None:
            tokens.append((kind, m.group(kind)))
    if not tokens:
        return None
    if tokens[-1][1] in _TRAILING:
        return "unexpected end of input"
    operand = {"str", "num", "ident"}
    keywords = _TRAILING | {"offset"}
    for (k1, v1), (k2, v2) in itertools.pairwise(tokens):
        ends_operand = (k1 in operand and v1 not in keywords) or v1 in (")", "]", "}")
        if ends_operand and k2 in operand and v2 not in keywords:
            kind = {"str": "string", "num": "number", "ident": "identifier"}[k2]
            return f"unexpected {kind} {json.dumps(v2)}"
    return None


def _parse_text(text: str) -> Any:
    """Call promql-parser, turning its errors (ValueError, or a Rust panic) into PromQLParseError."""
    try:
        return pp.parse(text)
    except ValueError as exc:
        message = str(exc)
        if message == "invalid promql query":
            message = explain_generic(text) or message
        raise PromQLParseError(f"parse error: {message}") from None
    except BaseException as exc:  # the Rust extension can raise a PanicException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise PromQLParseError(f"parse error: {exc}") from None


def parse(
    text: str,
    *,
    step_ms: int = 0,
    range_ms: int = 0,
    max_length: int = MAX_LENGTH,
    max_depth: int = MAX_DEPTH,
) -> ParsedQuery:
    """Parse `text`, raising PromQLParseError or Unsupported.

    `step_ms` and `range_ms` are the query's step and end - start (0 for an instant query): the
    values of `step()` and `range()` in duration expressions, which promql-parser cannot read and
    which are therefore evaluated into plain durations before parsing. A text longer than
    `max_length` bytes or nesting deeper than `max_depth` is refused before the parser sees it.
    """
    if not text.strip():
        raise PromQLParseError("empty query")
    check_text(text, max_length=max_length, max_depth=max_depth)
    written, ats = text, dict[int, int]()
    if has_negative_at(text):  # promql-parser panics on these: parse stand-ins, then put them back
        text, ats = stand_in_negative_ats(text)
        if has_negative_at(text):
            raise PromQLParseError("parse error: at out of range (before 1970)")
    try:
        if ats:
            raise PromQLParseError("")  # the tree is changed below: not the cached one
        return _parse_as_written(text)
    except PromQLParseError as first:
        modifier = unsupported_modifier(text)
        if modifier is not None:
            check_modifier_use(text)
            raise Unsupported(f"the '{modifier}' range modifier") from None
        rewritten = rewrite(text, step_ms, range_ms)
        if rewritten == text and not ats:
            raise first from None
        expr = _parse_text(rewritten)
    check_supported(expr)
    if ats:
        _restore_negative_ats(expr, ats)
    return ParsedQuery(text=written, expr=expr, invalid_utf8=_invalid_utf8_literals(written))


def _restore_negative_ats(expr: Any, ats: dict[int, int]) -> None:
    """Make each selector or subquery that reads at a stand-in time (`stand_in_negative_ats`) read at
    the time written instead: `x @ -60 offset 5m` reads what `x @ <stand-in> offset (5m + 60s +
    <stand-in>)` reads, since an `@` time less the offset is where a selector reads."""
    found = 0
    for node in walk(expr):
        at = getattr(node, "at", None)
        if not isinstance(at, pp.AtModifier) or at.at is None:  # not `@ start()`, `@ end()`
            continue
        when = at.at if at.at.tzinfo is not None else at.at.replace(tzinfo=timezone.utc)
        at_ms = (when - _EPOCH) // timedelta(milliseconds=1)
        if at_ms in ats:
            node.offset = (node.offset or timedelta(0)) + timedelta(milliseconds=at_ms - ats[at_ms])
            found += 1
    if found != len(ats):  # a stand-in time also written as it is: refuse as before
        raise PromQLParseError("parse error: at out of range (before 1970)")


@functools.lru_cache(maxsize=1024)
def _parse_as_written(text: str) -> ParsedQuery:
    """`parse` of a text that promql-parser reads as written (without `step()` or `range()` to fill
    in), which therefore does not depend on the step or range: kept for the next query with the
    same text (a dashboard's panels come back at every refresh; the tree is only read, never
    changed). Errors are not kept."""
    expr = _parse_text(text)
    check_supported(expr)
    return ParsedQuery(text=text, expr=expr, invalid_utf8=_invalid_utf8_literals(text))


def _check_time(node: Any, name: str) -> None:
    """Raise PromQLParseError when promql-parser cannot hand over `node`'s time `name`."""
    try:
        value = getattr(node, name, None)
        if isinstance(value, pp.AtModifier):
            value.at  # noqa: B018 - reading it is the check
    except (ValueError, OverflowError) as e:
        raise PromQLParseError(f"parse error: {name} out of range: {e}") from None
    except BaseException as e:  # a Rust panic: promql-parser's `@ -1` (before 1970)
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        raise PromQLParseError(f"parse error: {name} out of range (before 1970 or too far out)") from None


def check_supported(expr: Any) -> None:
    """Raise Unsupported when `expr` uses a feature gpuwatch does not evaluate, PromQLParseError when
    a time or duration in it is beyond what promql-parser can hand over (`up @ 1e20`, `x[1e9y]`)."""
    for node in walk(expr):
        for name in _TIMES:
            _check_time(node, name)
        if isinstance(node, pp.Call):
            name = node.func.name
            if name in NATIVE_HISTOGRAM_FUNCTIONS:
                raise Unsupported(f"native histograms ({name})")
            if node.func.experimental and name not in IMPLEMENTED_EXPERIMENTAL:
                raise Unsupported(f"experimental function {name}()")
        elif isinstance(node, pp.AggregateExpr):
            op = str(node.op)
            if op in UNSUPPORTED_AGGREGATIONS:
                raise Unsupported(f"experimental aggregation {op}()")
        elif isinstance(node, pp.VectorSelector):
            if node.matchers.or_matchers:
                raise Unsupported("'or' inside label matchers")
        elif isinstance(node, pp.BinaryExpr):
            mod = node.modifier
            fill = mod.fill_values if mod is not None else None
            if fill is not None and (fill.lhs is not None or fill.rhs is not None):
                raise Unsupported("fill() modifiers")


_MATCH_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}


def matchers_of(vs: Any) -> tuple[Matcher, ...]:
    """Return a vector selector's matchers (metric name as `__name__`)."""
    out = []
    if vs.name:
        out.append(Matcher("__name__", "=", vs.name))
    for m in vs.matchers.matchers:
        op = _MATCH_OPS[str(m.op)]
        out.append(Matcher(m.name, op, m.value))
    return tuple(out)


def selector_matchers(text: str) -> list[Matcher]:
    """Parse a series selector such as `up{job="node"}` (the API's match[] parameter)."""
    expr = parse(text).expr
    while isinstance(expr, pp.ParenExpr):
        expr = expr.expr
    if not isinstance(expr, pp.VectorSelector):
        raise PromQLParseError(f'invalid parameter "match[]": {text!r} is not a series selector')
    return list(matchers_of(expr))
