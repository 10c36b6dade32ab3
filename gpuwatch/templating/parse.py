"""Go's text/template syntax: a template's text lexed and parsed into its syntax tree (`Node`,
`Pipeline`, `Arg`) and the templates it `define`s, checking as Go's parser does that the functions it
calls exist. `template.py` executes the tree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwatch.templating.functions import BUILTINS, TemplateError

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
        if (
            pos < len(toks)
            and toks[pos].kind == "field"
            and toks[pos].attached
            and toks[pos].text != "."
            and arg.kind in ("var", "pipe")
        ):
            arg.fields = tuple(toks[pos].text.split(".")[1:])
            pos += 1
        return arg, pos
