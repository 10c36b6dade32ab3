"""Go's text/template, interpreted (no code is evaluated): the language of Prometheus's rule templates
(`rules/template.py`) and of Alertmanager's notification templates (`notify/templates.py`).

Supported: text and `{{ }}` actions with `{{-`/`-}}` trimming and `{{/* comments */}}`; `if`/`else if`/
`else`, `range` (lists, maps in key order, `$i, $e :=`, `else`, `break`, `continue`), `with`/`else`,
`define`, `template`, `block`; variables (`$x := ...`, `$x = ...`, `$`); pipelines with `|`; fields and
methods of the data (`.CommonLabels.SortedPairs`, `.Labels.Remove (stringSlice "a")`), `(pipeline).Field`;
string, raw string, number, `true`/`false`/`nil` literals; Go's functions `and`, `or`, `not`, `len`, `index`,
`print`, `printf`, `println`, `eq`, `ne`, `lt`, `le`, `gt`, `ge`, `html`, `js`, `urlquery`, plus the
functions a `TemplateSet` is given. Values print as Go's fmt prints them.

Only attributes whose names start with an upper-case letter are reachable from a template (Go's
exported fields), so a template sees nothing of the Python objects but the data they are meant to show.
"""

from __future__ import annotations

import html as _html
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import quote_plus


def go_float(v: float) -> str:
    """Format a float as Go's `%v` does: shortest digits, an exponent below 1e-4 and from 1e6."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "-0" if math.copysign(1, v) < 0 else "0"
    sign, digits, exponent = Decimal(repr(v)).normalize().as_tuple()
    ds = "".join(str(d) for d in digits)
    exp = len(ds) + int(exponent) - 1
    neg = "-" if sign else ""
    if exp < -4 or exp >= 6:  # Go's shortest %v switches to %e at 6 digits before the point
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{neg}{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    text = format(Decimal(repr(abs(v))), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return neg + text


def regex_match(pattern: str, text: str) -> bool:
    """Go's regexp.MatchString (unanchored), as `match` in Prometheus's and Alertmanager's templates."""
    return _regex(pattern).search(text) is not None


def re_replace_all(pattern: str, repl: str, text: str) -> str:
    """Go's Regexp.ReplaceAllString: `$1`, `${1}`, `${name}` in the replacement; `$$` is a dollar."""

    def expand(m: re.Match[str]) -> str:
        return "$" if m.group(1) == "$" else f"\\g<{m.group(2) or m.group(3)}>"

    py = re.sub(r"\$(\$|\{(\w+)\}|(\w+))", expand, repl.replace("\\", "\\\\"))
    try:
        return _regex(pattern).sub(py, text)
    except (re.error, IndexError) as e:
        raise TemplateError(f"reReplaceAll: {e}") from None


def _regex(pattern: str) -> re.Pattern[str]:
    from gpuwatch.matchers import compile_quietly

    try:
        return compile_quietly(pattern)
    except re.error as e:
        raise TemplateError(f"invalid regular expression {pattern!r}: {e}") from None


MAX_DEPTH = 200
MAX_STEPS = 200_000  # actions executed in one rendering: a runaway `range` fails instead of hanging


class TemplateError(Exception):
    """A template could not be parsed or executed; the message says where and why."""


# -- syntax tree -------------------------------------------------------------------------------------


@dataclass
class Arg:
    kind: str  # lit, var, field, func, pipe
    value: Any = None  # literal value, variable or function name, or a Pipeline
    fields: tuple[str, ...] = ()


@dataclass
class Pipeline:
    commands: list[list[Arg]]
    decl: tuple[str, ...] = ()
    assign: bool = False  # `=` rather than `:=`


@dataclass
class Node:
    kind: str  # text, print, if, range, with, template, break, continue
    text: str = ""
    pipe: Pipeline | None = None
    body: list[Node] = field(default_factory=list)
    orelse: list[Node] = field(default_factory=list)


_ACTION = re.compile(r"\{\{(-[ \t\r\n])?(.*?)([ \t\r\n]-)?\}\}", re.S)
_TOKEN = re.compile(
    r"""(?P<ws>\s+)
    |(?P<str>"(?:[^"\\\n]|\\.)*")
    |(?P<raw>`[^`]*`)
    |(?P<num>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?))
    |(?P<decl>:=)
    |(?P<assign>=)
    |(?P<pipe>\|)
    |(?P<lp>\()
    |(?P<rp>\))
    |(?P<comma>,)
    |(?P<var>\$[A-Za-z_0-9]*)
    |(?P<field>(?:\.[A-Za-z_][A-Za-z_0-9]*)+|\.)
    |(?P<ident>[A-Za-z_][A-Za-z_0-9]*)
    |(?P<bad>.)""",
    re.X | re.S,
)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)", re.S)
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_SIMPLE_ESCAPES.update({"\\": "\\", '"': '"', "'": "'"})
_SPACE = " \t\r\n"
_KEYWORDS = ("if", "else", "end", "range", "with", "define", "template", "block", "break", "continue")


def _unquote(token: str) -> str:
    if token.startswith("`"):
        return token[1:-1]

    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        if e[0].isdigit():
            return chr(int(e, 8))
        if e in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[e]
        raise TemplateError(f"unknown escape sequence \\{e}")

    return _ESCAPE.sub(one, token[1:-1])


@dataclass
class _Tok:
    kind: str
    text: str
    attached: bool  # no space before it


def _lex(action: str) -> list[_Tok]:
    out: list[_Tok] = []
    spaced = True
    for m in _TOKEN.finditer(action):
        kind = m.lastgroup or "bad"
        if kind == "ws":
            spaced = True
            continue
        if kind == "bad":
            raise TemplateError(f"unexpected {m.group()!r} in action")
        out.append(_Tok(kind, m.group(), not spaced))
        spaced = False
    return out


class _Parser:
    """Parse one template text into nodes and `define`d templates."""

    def __init__(self, name: str, text: str, funcs: Mapping[str, Any]) -> None:
        self.name = name
        self.where = f"{name}: " if name else ""
        self.range_depth = 0  # break and continue only inside a range
        self.funcs = funcs
        self.defines: dict[str, list[Node]] = {}
        self.items = self._split(text)
        self.pos = 0

    def _split(self, text: str) -> list[tuple[str, str]]:
        items: list[tuple[str, str]] = []
        pos = 0
        trim_next = False
        for m in _ACTION.finditer(text):
            chunk = text[pos : m.start()]
            if trim_next:
                chunk = chunk.lstrip(_SPACE)
            if m.group(1):
                chunk = chunk.rstrip(_SPACE)
            if chunk:
                items.append(("text", chunk))
            body = m.group(2).strip()
            if not (body.startswith("/*") and body.endswith("*/")):
                items.append(("action", body))
            trim_next = bool(m.group(3))
            pos = m.end()
        rest = text[pos:]
        if trim_next:
            rest = rest.lstrip(_SPACE)
        if "{{" in rest:
            raise TemplateError(f"{self.where}unclosed action")
        if rest:
            items.append(("text", rest))
        return items

    def parse(self) -> list[Node]:
        nodes, stop = self._list()
        if stop is not None:
            raise TemplateError(f"{self.where}unexpected {{{{{stop[0]}}}}}")
        return nodes

    def _list(self) -> tuple[list[Node], tuple[str, list[_Tok]] | None]:
        """Parse nodes up to `end` or `else` (returned as the stop) or the end of the text."""
        nodes: list[Node] = []
        while self.pos < len(self.items):
            kind, body = self.items[self.pos]
            self.pos += 1
            if kind == "text":
                nodes.append(Node("text", text=body))
                continue
            try:
                toks = _lex(body)
            except TemplateError as e:
                raise TemplateError(f"{self.where}{e}") from None
            if not toks:
                raise TemplateError(f"{self.where}missing value for command")
            head = toks[0].text if toks[0].kind == "ident" else ""
            if head in ("end", "else"):
                return nodes, (head, toks[1:])
            if head in ("if", "with", "range"):
                nodes.append(self._control(head, toks[1:]))
            elif head in ("define", "block"):
                name, rest = self._name(head, toks[1:])
                outer, self.range_depth = self.range_depth, 0
                body_nodes, stop = self._list()
                self.range_depth = outer
                if stop is None or stop[0] != "end":
                    raise TemplateError(f"{self.where}{head} {name!r} has no {{{{end}}}}")
                self.defines[name] = body_nodes
                if head == "block":
                    nodes.append(Node("template", text=name, pipe=self._pipeline(rest)))
                elif rest:
                    raise TemplateError(f"{self.where}unexpected text after define {name!r}")
            elif head == "template":
                name, rest = self._name(head, toks[1:])
                nodes.append(Node("template", text=name, pipe=self._pipeline(rest) if rest else None))
            elif head in ("break", "continue"):
                if not self.range_depth:
                    raise TemplateError(f"{self.where}{{{{{head}}}}} outside {{{{range}}}}")
                nodes.append(Node(head))
            else:
                nodes.append(Node("print", pipe=self._pipeline(toks, decl_ok=True)))
        return nodes, None

    def _name(self, head: str, toks: list[_Tok]) -> tuple[str, list[_Tok]]:
        if not toks or toks[0].kind not in ("str", "raw"):
            raise TemplateError(f"{self.where}{head} needs a quoted template name")
        return _unquote(toks[0].text), toks[1:]

    def _control(self, head: str, toks: list[_Tok]) -> Node:
        node = Node(head, pipe=self._pipeline(toks, decl_ok=True, range_decl=head == "range"))
        self.range_depth += head == "range"
        node.body, stop = self._list()
        self.range_depth -= head == "range"
        if stop is None:
            raise TemplateError(f"{self.where}{{{{{head}}}}} has no {{{{end}}}}")
        word, rest = stop
        if word == "else":
            if rest and rest[0].kind == "ident" and rest[0].text in ("if", "with") and head != "range":
                node.orelse = [self._control(rest[0].text, rest[1:])]  # its {{end}} closes this one too
                return node
            if rest:
                raise TemplateError(f"{self.where}unexpected text after else")
            node.orelse, stop = self._list()
            if stop is None or stop[0] != "end":
                raise TemplateError(f"{self.where}{{{{{head}}}}} has no {{{{end}}}}")
        if stop[1]:
            raise TemplateError(f"{self.where}unexpected text after end")
        return node

    def _pipeline(self, toks: list[_Tok], *, decl_ok: bool = False, range_decl: bool = False) -> Pipeline:
        decl: tuple[str, ...] = ()
        assign = False
        if decl_ok and len(toks) >= 2 and toks[0].kind == "var":
            if toks[1].kind in ("decl", "assign"):
                decl, assign, toks = (toks[0].text,), toks[1].kind == "assign", toks[2:]
            elif (
                range_decl
                and len(toks) >= 4
                and toks[1].kind == "comma"
                and toks[2].kind == "var"
                and toks[3].kind in ("decl", "assign")
            ):
                decl, assign, toks = (toks[0].text, toks[2].text), toks[3].kind == "assign", toks[4:]
        commands, pos = self._commands(toks, 0)
        if pos != len(toks):
            raise TemplateError(f"{self.where}unexpected {toks[pos].text!r} in pipeline")
        if not commands:
            raise TemplateError(f"{self.where}missing value for command")
        return Pipeline(commands, decl, assign)

    def _commands(self, toks: list[_Tok], pos: int) -> tuple[list[list[Arg]], int]:
        commands: list[list[Arg]] = []
        current: list[Arg] = []
        while pos < len(toks):
            t = toks[pos]
            if t.kind == "rp":
                break
            if t.kind == "pipe":
                if not current:
                    raise TemplateError(f"{self.where}missing command before |")
                commands.append(current)
                current = []
                pos += 1
                continue
            arg, pos = self._operand(toks, pos)
            current.append(arg)
        if current:
            commands.append(current)
        elif commands:
            raise TemplateError(f"{self.where}missing command after |")
        return commands, pos

    def _operand(self, toks: list[_Tok], pos: int) -> tuple[Arg, int]:
        t = toks[pos]
        pos += 1
        if t.kind in ("str", "raw"):
            arg = Arg("lit", _unquote(t.text))
        elif t.kind == "num":
            text = t.text
            try:
                is_int = not any(c in text for c in ".eE") or text.lower().startswith(("0x", "-0x", "+0x"))
                arg = Arg("lit", int(text, 0) if is_int else float(text))
            except ValueError:
                raise TemplateError(f"{self.where}bad number {text!r}") from None
        elif t.kind == "var":
            arg = Arg("var", t.text)
        elif t.kind == "field":
            arg = Arg("field", fields=tuple(t.text.split(".")[1:]) if t.text != "." else ())
        elif t.kind == "ident":
            if t.text in ("true", "false"):
                arg = Arg("lit", t.text == "true")
            elif t.text == "nil":
                arg = Arg("lit", None)
            elif t.text in self.funcs or t.text in BUILTINS:
                arg = Arg("func", t.text)
            elif t.text in _KEYWORDS:
                raise TemplateError(f"{self.where}unexpected {t.text!r} in pipeline")
            else:
                raise TemplateError(f'{self.where}function "{t.text}" not defined')
        elif t.kind == "lp":
            commands, pos = self._commands(toks, pos)
            if pos >= len(toks) or toks[pos].kind != "rp":
                raise TemplateError(f"{self.where}unclosed left paren")
            pos += 1
            arg = Arg("pipe", Pipeline(commands))
        else:
            raise TemplateError(f"{self.where}unexpected {t.text!r} in operand")
        if pos < len(toks) and toks[pos].kind == "field" and toks[pos].attached and toks[pos].text != ".":
            if arg.kind in ("var", "pipe"):
                arg.fields = tuple(toks[pos].text.split(".")[1:])
                pos += 1
        return arg, pos


# -- values -------------------------------------------------------------------------------------------

_MISSING = object()


def truth(v: Any) -> bool:
    """Go's template truth: false, 0, nil and empty strings, lists and maps are false."""
    if v is None or v is _MISSING:
        return False
    if isinstance(v, (bool, int, float, str, list, tuple, dict)):
        return bool(v)
    return True


def sprint(v: Any) -> str:
    """Print a value as Go's fmt.Sprint does."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return go_float(v)
    if v is None or v is _MISSING:
        return "<no value>"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{sprint(k)}:{sprint(x)}" for k, x in sorted(v.items())) + "]"
    if isinstance(v, (list, tuple)):
        return "[" + " ".join(sprint(x) for x in v) + "]"
    return str(v)


def _field(v: Any, name: str) -> Any:
    if isinstance(v, dict):
        if name[:1].isupper() and type(v) is not dict and hasattr(type(v), name):
            return getattr(v, name)  # a method of a map type comes before its keys, as in Go
        return v.get(name, getattr(v, "missing", None))
    if v is None or not name[:1].isupper():
        raise TemplateError(f"can't evaluate field {name} in type {_type(v)}")
    try:
        return getattr(v, name)
    except AttributeError:
        raise TemplateError(f"can't evaluate field {name} in type {_type(v)}") from None


def _type(v: Any) -> str:
    if v is None:
        return "<nil>"
    return {str: "string", int: "int", float: "float64", bool: "bool", list: "[]interface {}"}.get(
        type(v), type(v).__name__
    )


def _call(v: Any, args: Sequence[Any]) -> Any:
    if callable(v):
        try:
            return v(*args)
        except TypeError as e:
            raise TemplateError(f"wrong arguments: {e}") from None
    if args:
        raise TemplateError(f"can't give argument to non-function {sprint(v)}")
    return v


def _compare(name: str, a: Any, b: Any) -> int:
    if isinstance(a, bool) or isinstance(b, bool) or type(a) is not type(b):
        numbers = (int, float)
        if (
            not (isinstance(a, numbers) and isinstance(b, numbers))
            or isinstance(a, bool)
            or isinstance(b, bool)
        ):
            raise TemplateError(f"error calling {name}: incompatible types for comparison")
    if not isinstance(a, (int, float, str)):
        raise TemplateError(f"error calling {name}: invalid type for comparison")
    return (a > b) - (a < b)


def _eq(a: Any, *bs: Any) -> bool:
    if not bs:
        raise TemplateError("error calling eq: missing argument for comparison")
    for b in bs:
        if isinstance(a, (int, float, str)) and isinstance(b, (int, float, str)):
            if _compare("eq", a, b) == 0:
                return True
        elif a == b:
            return True
    return False


def _len(v: Any) -> int:
    if isinstance(v, (str, list, tuple, dict)):
        return len(v)
    raise TemplateError(f"error calling len: len of type {_type(v)}")


def _index(v: Any, *keys: Any) -> Any:
    for k in keys:
        try:
            v = v.get(k, getattr(v, "missing", None)) if isinstance(v, dict) else v[k]
        except (IndexError, TypeError, KeyError):
            raise TemplateError(f"error calling index: cannot index {_type(v)} with {sprint(k)}") from None
    return v


_VERB = re.compile(r"%([-+ #0]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])")


def printf(fmt: str, *args: Any) -> str:
    """Go's fmt.Sprintf for the common verbs: %s %v %d %f %e %g %q %t %x %%."""
    out, pos, i = [], 0, 0
    for m in _VERB.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        flags, width, prec, verb = m.groups()
        if verb == "%":
            out.append("%")
            continue
        if i >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        arg = args[i]
        i += 1
        spec = "%" + flags + (width or "") + (f".{prec}" if prec is not None else "")
        try:
            if verb in "sv":
                out.append((spec + "s") % sprint(arg))
            elif verb == "q":
                out.append('"' + sprint(arg).replace("\\", "\\\\").replace('"', '\\"') + '"')
            elif verb == "t" and isinstance(arg, bool):
                out.append(sprint(arg))
            elif verb in "dxXo" and isinstance(arg, int) and not isinstance(arg, bool):
                out.append((spec + verb) % arg)
            elif verb in "fFeEgG" and isinstance(arg, (int, float)) and not isinstance(arg, bool):
                out.append((spec + verb) % float(arg))
            else:
                out.append(f"%!{verb}({_type(arg)}={sprint(arg)})")
        except (TypeError, ValueError):
            out.append(f"%!{verb}({_type(arg)}={sprint(arg)})")
    out.append(fmt[pos:])
    if i < len(args):
        out.append("%!(EXTRA " + ", ".join(f"{_type(a)}={sprint(a)}" for a in args[i:]) + ")")
    return "".join(out)


def _sprint_args(*args: Any) -> str:
    out = []
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(sprint(a))
    return "".join(out)


def _js(s: Any) -> str:
    text = sprint(s)
    table = {
        "\\": "\\\\",
        "'": "\\'",
        '"': '\\"',
        "<": "\\u003C",
        ">": "\\u003E",
        "&": "\\u0026",
        "=": "\\u003D",
    }
    return "".join(table.get(c, c if c >= " " else f"\\u{ord(c):04X}") for c in text)


def _html_escape(*args: Any) -> str:
    return _html.escape(_sprint_args(*args), quote=True).replace("&#x27;", "&#39;").replace("&quot;", "&#34;")


BUILTINS: dict[str, Callable[..., Any]] = {
    "not": lambda v: not truth(v),
    "len": _len,
    "index": _index,
    "print": _sprint_args,
    "printf": printf,
    "println": lambda *a: " ".join(sprint(x) for x in a) + "\n",
    "eq": _eq,
    "ne": lambda a, b: not _eq(a, b),
    "lt": lambda a, b: _compare("lt", a, b) < 0,
    "le": lambda a, b: _compare("le", a, b) <= 0,
    "gt": lambda a, b: _compare("gt", a, b) > 0,
    "ge": lambda a, b: _compare("ge", a, b) >= 0,
    "html": _html_escape,
    "js": _js,
    "urlquery": lambda *a: quote_plus(_sprint_args(*a), safe="~"),
    "and": lambda *a: a,  # evaluated lazily in _command
    "or": lambda *a: a,
}


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


# -- execution ----------------------------------------------------------------------------------------


class TemplateSet:
    """Named templates (from `define`s) and the functions templates may call."""

    def __init__(self, funcs: Mapping[str, Callable[..., Any]] | None = None) -> None:
        self.funcs: dict[str, Callable[..., Any]] = dict(funcs or {})
        self.defines: dict[str, list[Node]] = {}
        self._cache: dict[str, tuple[list[Node], dict[str, list[Node]]]] = {}  # parsed texts

    def add(self, text: str, source: str) -> None:
        """Parse a file of templates and keep its `define`s (later files override earlier ones)."""
        p = _Parser(source, text, self.funcs)
        p.parse()
        self.defines.update(p.defines)

    def check(self, text: str, source: str = "") -> None:
        """Raise TemplateError when `text` does not parse."""
        _Parser(source, text, self.funcs).parse()

    def render(self, text: str, data: Any, variables: Mapping[str, Any] | None = None) -> str:
        """Execute `text` (which may call the set's templates) with `data` as dot and `variables` (named
        with their `$`) defined, as a template prelude such as Prometheus's `{{ $labels := .Labels }}` would."""
        nodes, defines = self._compiled(text)
        run = _Run({**self.defines, **defines} if defines else self.defines, self.funcs)
        out: list[str] = []
        run.nodes(nodes, data, [("$", data), *(variables or {}).items()], out, 0)
        return "".join(out)

    def _compiled(self, text: str) -> tuple[list[Node], dict[str, list[Node]]]:
        got = self._cache.get(text)
        if got is None:
            p = _Parser("", text, self.funcs)
            got = (p.parse(), p.defines)
            if len(self._cache) >= 1024:
                self._cache.clear()
            self._cache[text] = got
        return got


class _Run:
    def __init__(self, defines: Mapping[str, list[Node]], funcs: Mapping[str, Callable[..., Any]]) -> None:
        self.defines = defines
        self.funcs = funcs
        self.steps = 0
        self.max_steps = MAX_STEPS

    def nodes(
        self, nodes: list[Node], dot: Any, scope: list[tuple[str, Any]], out: list[str], depth: int
    ) -> None:
        for n in nodes:
            self.steps += 1
            if self.steps > self.max_steps:
                raise TemplateError(f"template ran more than {self.max_steps:,} steps")
            if n.kind == "text":
                out.append(n.text)
            elif n.kind == "print":
                assert n.pipe is not None
                value = self.pipeline(n.pipe, dot, scope)
                if not n.pipe.decl:
                    out.append(sprint(value))
            elif n.kind in ("if", "with"):
                mark = len(scope)
                assert n.pipe is not None
                value = self.pipeline(n.pipe, dot, scope)
                if truth(value):
                    self.nodes(n.body, value if n.kind == "with" else dot, scope, out, depth)
                else:
                    self.nodes(n.orelse, dot, scope, out, depth)
                del scope[mark:]
            elif n.kind == "range":
                self._range(n, dot, scope, out, depth)
            elif n.kind == "template":
                if depth >= MAX_DEPTH:
                    raise TemplateError(f"exceeded maximum template depth ({MAX_DEPTH})")
                body = self.defines.get(n.text)
                if body is None:
                    raise TemplateError(f'no such template "{n.text}"')
                value = self.pipeline(n.pipe, dot, scope) if n.pipe is not None else None
                self.nodes(body, value, [("$", value)], out, depth + 1)
            elif n.kind == "break":
                raise _Break
            elif n.kind == "continue":
                raise _Continue

    def _range(self, n: Node, dot: Any, scope: list[tuple[str, Any]], out: list[str], depth: int) -> None:
        assert n.pipe is not None
        mark = len(scope)
        value = self.pipeline(Pipeline(n.pipe.commands), dot, scope)
        items: Iterable[tuple[Any, Any]]
        if isinstance(value, dict):
            items, empty = ((k, value[k]) for k in sorted(value)), not value
        elif isinstance(value, (list, tuple)):
            items, empty = enumerate(value), not value
        elif isinstance(value, int) and not isinstance(value, bool):
            items, empty = ((i, i) for i in range(value)), value <= 0
        elif value is None:
            items, empty = (), True
        else:
            raise TemplateError(f"range can't iterate over {sprint(value)}")
        if empty:
            self.nodes(n.orelse, dot, scope, out, depth)
            return
        for key, elem in items:
            self.steps += 1
            if self.steps > self.max_steps:
                raise TemplateError(f"template ran more than {self.max_steps:,} steps")
            del scope[mark:]
            if len(n.pipe.decl) == 2:
                scope.extend([(n.pipe.decl[0], key), (n.pipe.decl[1], elem)])
            elif n.pipe.decl:
                scope.append((n.pipe.decl[0], elem))
            try:
                self.nodes(n.body, elem, scope, out, depth)
            except _Continue:
                continue
            except _Break:
                break
        del scope[mark:]

    def pipeline(self, p: Pipeline, dot: Any, scope: list[tuple[str, Any]]) -> Any:
        value: Any = _MISSING
        for cmd in p.commands:
            value = self._command(cmd, dot, scope, value)
        if p.decl:
            if p.assign:
                for i in range(len(scope) - 1, -1, -1):
                    if scope[i][0] == p.decl[0]:
                        scope[i] = (p.decl[0], value)
                        break
                else:
                    raise TemplateError(f"undefined variable: {p.decl[0]}")
            else:
                scope.append((p.decl[0], value))
        return value

    def _command(self, cmd: list[Arg], dot: Any, scope: list[tuple[str, Any]], final: Any) -> Any:
        first = cmd[0]
        extra = [final] if final is not _MISSING else []
        if first.kind == "func":
            name = first.value
            if name in ("and", "or"):
                args = [*cmd[1:]]
                value: Any = None
                for a in args:
                    value = self._arg(a, dot, scope)
                    if truth(value) != (name == "and"):
                        return value
                if extra:
                    value = extra[0]
                return value
            fn = self.funcs.get(name) or BUILTINS[name]
            args = [self._arg(a, dot, scope) for a in cmd[1:]] + extra
            try:
                return fn(*args)
            except TemplateError:
                raise
            except (TypeError, ValueError, AttributeError, LookupError, ArithmeticError, re.error) as e:
                raise TemplateError(f"error calling {name}: {e}") from None
        if len(cmd) > 1 or extra:
            if first.kind == "lit" or not first.fields and first.kind != "pipe":
                raise TemplateError(
                    f"can't give argument to non-function {sprint(self._arg(first, dot, scope))}"
                )
            # A method called with arguments: `.Labels.Remove (stringSlice "a")`.
            head = Arg(first.kind, first.value, first.fields[:-1])
            receiver = self._arg(head, dot, scope)
            method = _field(receiver, first.fields[-1])
            args = [self._arg(a, dot, scope) for a in cmd[1:]] + extra
            return _call(method, args)
        return self._arg(first, dot, scope)

    def _arg(self, a: Arg, dot: Any, scope: list[tuple[str, Any]]) -> Any:
        if a.kind == "lit":
            v = a.value
        elif a.kind == "var":
            for name, value in reversed(scope):
                if name == a.value:
                    v = value
                    break
            else:
                raise TemplateError(f"undefined variable: {a.value}")
        elif a.kind == "field":
            v = dot
        elif a.kind == "pipe":
            v = self.pipeline(a.value, dot, scope)
        else:  # a function used as an argument: call it without arguments, as Go does
            return self._command([a], dot, scope, _MISSING)
        for name in a.fields:
            v = _field(v, name)
            if callable(v):
                v = _call(v, ())
        return v
