"""Limits a query text must meet before the parser sees it, and a walk over parsed trees.

promql-parser builds its tree recursively: 10,000 nested `(` or a sum of 10,000 terms overflows its
stack and kills the process (a segfault, nothing logged), and a sum of 2,000 terms takes 1.5 s to
parse, holding the GIL. So the text's length and its nesting (brackets, plus the binary and unary
operators, each of which the parser nests one level deeper) are measured by a plain scan first.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import promql_parser as pp

from gpuwatch.query.errors import PromQLParseError

MAX_LENGTH = 16_384  # bytes of query text (VictoriaMetrics' -search.maxQueryLen default)
MAX_DEPTH = 100  # nesting levels, brackets and operators; the engine recurses about 170 levels deep at most

# What the scan steps over (strings and comments may hold anything) or counts (brackets, operators).
_TOKEN = re.compile(
    r"""
      "(?:[^"\\]|\\.)*"? | '(?:[^'\\]|\\.)*'? | `[^`]*`?   # string literals (an unclosed one runs to the end)
    | \#[^\n]*                                          # a comment
    | (?P<open>[(\[{]) | (?P<close>[)\]}])
    | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>]|\b(?:and|or|unless|atan2)\b)
    """,
    re.VERBOSE | re.IGNORECASE,
)


def nesting(text: str) -> int:
    """Return an upper bound of how deep the parser will nest `text`: its deepest bracket plus the
    number of operators (a chain `1+1+...+1` nests one level per `+`)."""
    depth = deepest = operators = 0
    for m in _TOKEN.finditer(text):
        if m.group("open"):
            depth += 1
            deepest = max(deepest, depth)
        elif m.group("close"):
            depth -= 1
        elif m.group("op"):
            operators += 1
    return deepest + operators


def check_text(text: str, *, max_length: int = MAX_LENGTH, max_depth: int = MAX_DEPTH) -> None:
    """Raise PromQLParseError (a 400 `bad_data`) when `text` is longer or nests deeper than allowed."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_length:
        raise PromQLParseError(
            f"query is {size} bytes long; the limit is {max_length} (setting query_max_length)"
        )
    levels = nesting(text)
    if levels > max_depth:
        raise PromQLParseError(
            f"query nests {levels} levels deep (brackets and operators); the limit is {max_depth} "
            "(setting query_max_depth)"
        )


def children(node: Any) -> list[Any]:
    """Return the subexpressions of one parsed node, in the order they are written."""
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pp.AggregateExpr):
        return [node.param, node.expr] if node.param is not None else [node.expr]
    if isinstance(node, pp.Call):
        return list(node.args)
    if isinstance(node, (pp.ParenExpr, pp.UnaryExpr, pp.SubqueryExpr)):
        return [node.expr]
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    return []


def walk(node: Any) -> Iterator[Any]:
    """Yield every node of a parsed tree, parents before children, left to right.

    promql-parser's own `walk` copies each subtree it visits: 4 s for a sum of 400 terms."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(children(n)))
