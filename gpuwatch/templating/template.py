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

A text is parsed into its syntax tree in `parse.py`; this module executes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuwatch.templating.functions import (
    BUILTINS,
    MISSING,
    TemplateError,
    call_value,
    field_of,
    sprint,
    truth,
)
from gpuwatch.templating.parse import Arg, Node, Pipeline, _Parser

__all__ = ["TemplateError", "TemplateSet"]


MAX_DEPTH = 200
MAX_STEPS = 200_000  # actions executed in one rendering: a runaway `range` fails instead of hanging


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
        value: Any = MISSING
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
        extra = [final] if final is not MISSING else []
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
            if first.kind == "lit" or (not first.fields and first.kind != "pipe"):
                raise TemplateError(
                    f"can't give argument to non-function {sprint(self._arg(first, dot, scope))}"
                )
            # A method called with arguments: `.Labels.Remove (stringSlice "a")`.
            head = Arg(first.kind, first.value, first.fields[:-1])
            receiver = self._arg(head, dot, scope)
            method = field_of(receiver, first.fields[-1])
            args = [self._arg(a, dot, scope) for a in cmd[1:]] + extra
            return call_value(method, args)
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
            return self._command([a], dot, scope, MISSING)
        for name in a.fields:
            v = field_of(v, name)
            if callable(v):
                v = call_value(v, ())
        return v
