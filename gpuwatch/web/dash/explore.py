"""Explore `/explore`: a PromQL box with completion of metric and label names, graph and table views,
the step shown, parse errors pointed at where they are; state (`expr`, `view`, range) in the URL.
JSON twin `/api/ui/explore`; `/api/ui/explore/parse?expr=` checks a query with gpuwatch's parser."""

from __future__ import annotations

import re

from flask import Blueprint, jsonify, request
from flask.typing import ResponseReturnValue

from gpuwatch.core.errors import QueryError
from gpuwatch.query.errors import PromQLParseError
from gpuwatch.query.parse import parse
from gpuwatch.web.dash.page import page_json, render_page

bp = Blueprint("dash_explore", __name__)

STRINGS = {
    "explore.title": ("Explore", "查询"),
    "explore.run": ("Run", "执行"),
    "explore.graph": ("Graph", "图"),
    "explore.table": ("Table", "表"),
    "explore.placeholder": ("PromQL, e.g. avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "PromQL，例如 avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)"),
    "explore.series": ("series", "条序列"),
    "explore.hint": ("Enter runs the query, Shift+Enter adds a line, Tab completes.", "回车执行，Shift+回车换行，Tab 补全。"),
    "explore.parse_error": ("parse error at", "解析错误，位置"),
    "explore.empty": ("Type a query.", "请输入查询。"),
    "common.value": ("value", "值"),
}  # fmt: skip

# Past this many characters a query's error is not located (each candidate prefix is parsed).
LOCATE_MAX = 2000


# PromQL's tokens, roughly: enough to try the text a token at a time.
_TOKEN = re.compile(
    r"""\s+|#[^\n]*|"(?:\\.|[^"\\])*"?|'(?:\\.|[^'\\])*'?|`[^`]*`?|[A-Za-z_:][A-Za-z0-9_:.]*"""
    r"|0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?:\d*[a-z]+)*|=~|!~|!=|==|<=|>=|."
)


def _prefix_ok(text: str) -> bool:
    """Whether `text` is valid PromQL or a valid beginning of some (it only ends too early)."""
    try:
        parse(text)
    except PromQLParseError as e:
        msg = str(e)
        return "end of input" in msg or "unclosed" in msg or msg.endswith("empty query")
    except QueryError:
        return True
    return True


def _unclosed(text: str) -> int | None:
    """The index of the first bracket that is never closed (quotes skipped), else None."""
    stack: list[int] = []
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'`":
            quote = ch
        elif ch == "#":
            while i < len(text) and text[i] != "\n":
                i += 1
        elif ch in "([{":
            stack.append(i)
        elif ch in ")]}" and stack:
            stack.pop()
        i += 1
    return stack[0] if stack else None


def locate_error(text: str) -> dict[str, object] | None:
    """None when `text` parses; else {"error", "position"} with the 0-based character where the
    parser stops making sense of it. promql-parser reports no position, so it is found: an unclosed
    bracket, the end for a query that ends too early, else the first token through which the text is
    no longer the valid beginning of any query (None when that cannot be told)."""
    try:
        parse(text)
        return None
    except PromQLParseError as e:
        message = str(e)
    except QueryError as e:  # valid PromQL that gpuwatch does not evaluate: not a parse error
        return {"error": str(e), "position": None}
    position: int | None
    if "unclosed" in message:
        position = _unclosed(text)
    elif "end of input" in message:
        position = len(text.rstrip())
    elif len(text) > LOCATE_MAX:
        position = None
    else:
        position = None
        for m in _TOKEN.finditer(text):
            if not m.group().isspace() and not _prefix_ok(text[: m.end()]):
                position = m.start()
                break
    return {"error": message, "position": position}


def _variables() -> dict[str, str]:
    return {
        "expr": request.args.get("expr", ""),
        "view": "table" if request.args.get("view") == "table" else "graph",
    }


@bp.get("/explore")
def explore() -> ResponseReturnValue:
    return render_page(
        "explore.html", page="explore", variables=_variables(), tables=[STRINGS], title="Explore"
    )


@bp.get("/api/ui/explore")
def explore_json() -> ResponseReturnValue:
    v = _variables()
    return page_json("explore", (), {"parse": locate_error(v["expr"]) if v["expr"] else None}, v, [STRINGS])


@bp.get("/api/ui/explore/parse")
def explore_parse() -> ResponseReturnValue:
    expr = request.args.get("expr", "")
    found = locate_error(expr)
    return jsonify({"status": "success", "data": {"valid": found is None, **(found or {})}})
