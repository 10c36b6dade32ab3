"""Prometheus's alert templates (a subset of Go's text/template), rendered without evaluating code.

Supported: text with `{{ ... }}` actions (and `{{-`/`-}}` trimming); operands `$labels.NAME`,
`$value`, `$externalLabels.NAME`, `.Labels.NAME`, `.Value`, string and number literals; pipelines
`a | f`; functions `humanize`, `humanize1024`, `humanizePercentage`, `humanizeDuration`, `printf`,
`toUpper`, `toLower`, `title`. Anything else is an error, shown in the text as Prometheus shows it
(`<error expanding template: ...>`); values from labels are substituted, never parsed again.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from decimal import Decimal

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)
_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<raw>`[^`]*`)|(?P<num>[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)'
    r"|(?P<var>\$[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*|\$)|(?P<field>(?:\.[A-Za-z_]\w*)+|\.)"
    r"|(?P<ident>[A-Za-z_]\w*)|(?P<pipe>\|))"
)
_VERB = re.compile(r"%([-+ #0]*)(\d+)?(?:\.(\d+))?([a-zA-Z%])")
_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "r": "\r"}
NO_VALUE = "<no value>"


class TemplateError(Exception):
    """A template could not be parsed or expanded."""


Value = str | float


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


def _g4(v: float) -> str:
    """Go's `%.4g`."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return f"{v:.4g}"


def humanize(v: float) -> str:
    if v == 0 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return _g4(v) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return _g4(v) + prefix


def humanize1024(v: float) -> str:
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return _g4(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return _g4(v) + prefix


def humanize_percentage(v: float) -> str:
    return _g4(v * 100) + "%"


def humanize_duration(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return _g4(v)
    if v == 0:
        return _g4(v) + "s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        d = int(v)
        seconds, minutes, hours, days = d % 60, (d // 60) % 60, (d // 3600) % 24, d // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{_g4(v)}{prefix}s"


def _text(v: Value) -> str:
    return go_float(v) if isinstance(v, float) else v


def _number(v: Value) -> float:
    if isinstance(v, float):
        return v
    try:
        return float(v)
    except ValueError:
        raise TemplateError(f"cannot convert {v!r} to a number") from None


def printf(fmt: Value, *args: Value) -> str:
    """Go's fmt.Sprintf for the verbs alert templates use: %s %v %d %f %e %g %q %x %%."""
    if not isinstance(fmt, str):
        raise TemplateError("printf: the format must be a string")
    out, pos, i = [], 0, 0
    for m in _VERB.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        if verb == "%":
            out.append("%")
            continue
        if i >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        arg = args[i]
        i += 1
        spec = "%" + flags + (width or "") + (f".{prec}" if prec is not None else "")
        if verb in "sv":
            text = _text(arg) if verb == "v" or isinstance(arg, str) else go_float(arg)
            out.append((spec + "s") % text)
        elif verb == "q":
            out.append('"' + _text(arg).replace("\\", "\\\\").replace('"', '\\"') + '"')
        elif verb in "fFeEgG":
            if not isinstance(arg, float):
                out.append(f"%!{verb}(string={arg})")
            elif math.isnan(arg) or math.isinf(arg):
                out.append(go_float(arg))
            else:
                out.append((spec + verb) % arg)
        elif verb in "dxX":
            if isinstance(arg, float):
                out.append(f"%!{verb}(float64={go_float(arg)})")
            else:
                out.append(f"%!{verb}(string={arg})")
        else:
            out.append(f"%!{verb}({_text(arg)})")
    out.append(fmt[pos:])
    if i < len(args):
        out.append("%!(EXTRA " + ", ".join(_text(a) for a in args[i:]) + ")")
    return "".join(out)


FUNCTIONS: dict[str, Callable[..., str]] = {
    "humanize": lambda v: humanize(_number(v)),
    "humanize1024": lambda v: humanize1024(_number(v)),
    "humanizePercentage": lambda v: humanize_percentage(_number(v)),
    "humanizeDuration": lambda v: humanize_duration(_number(v)),
    "printf": printf,
    "toUpper": lambda v: _text(v).upper(),
    "toLower": lambda v: _text(v).lower(),
    "title": lambda v: _text(v).title(),
}


def _unquote(token: str) -> str:
    body = token[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


def _tokens(action: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    action = action.strip()
    while pos < len(action):
        m = _TOKEN.match(action, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"unexpected {action[pos:].strip()[:20]!r} in action")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


@functools.lru_cache(maxsize=1024)
def _pipeline(action: str) -> list[list[tuple[str, str]]]:
    commands: list[list[tuple[str, str]]] = [[]]
    for kind, tok in _tokens(action):
        if kind == "pipe":
            commands.append([])
        else:
            commands[-1].append((kind, tok))
    if any(not c for c in commands):
        raise TemplateError("missing value in pipeline")
    for c in commands:
        for kind, tok in c[1:]:
            if kind == "ident":
                raise TemplateError(f"function {tok!r} used as an argument")
        if c[0][0] == "ident" and c[0][1] not in FUNCTIONS:
            raise TemplateError(f'function "{c[0][1]}" not defined')
        if c[0][0] != "ident" and len(c) > 1:
            raise TemplateError(f"can't give argument to non-function {c[0][1]}")
    return commands


@functools.lru_cache(maxsize=1024)
def _parts(text: str) -> list[tuple[bool, str]]:
    """Split into (is_action, text) parts, applying `{{-` / `-}}` whitespace trimming."""
    parts: list[tuple[bool, str]] = []
    pos = 0
    for m in _ACTION.finditer(text):
        literal = text[pos : m.start()]
        if m.group(1):
            literal = literal.rstrip()
        parts.append((False, literal))
        parts.append((True, m.group(2)))
        pos = m.end()
        if m.group(3):
            rest = text[pos:]
            pos += len(rest) - len(rest.lstrip())
    tail = text[pos:]
    if "{{" in tail:
        raise TemplateError("unclosed action")
    parts.append((False, tail))
    return parts


def check_template(text: str) -> str | None:
    """Return why `text` is not a template gpuwatch can render, or None if it is."""
    try:
        for is_action, part in _parts(text):
            if is_action:
                _pipeline(part)
    except TemplateError as e:
        return f"template: {e}"
    return None


class _Data:
    def __init__(self, labels: Mapping[str, str], value: float, external: Mapping[str, str]) -> None:
        self.maps = {"labels": labels, "externalLabels": external}
        self.value = value

    def variable(self, path: str) -> Value:
        name, *fields = path[1:].split(".")
        if name == "value" and not fields:
            return self.value
        if name == "" and not fields:
            raise TemplateError("$ (the whole data) cannot be printed")
        m = self.maps.get(name)
        if m is None:
            raise TemplateError(f'undefined variable "${name}"')
        if len(fields) != 1:
            raise TemplateError(f"${name} needs one field, as in ${name}.gpu")
        return m.get(fields[0], NO_VALUE)

    def field(self, path: str) -> Value:
        fields = path[1:].split(".")
        if fields == ["Value"]:
            return self.value
        top = {"Labels": "labels", "ExternalLabels": "externalLabels"}.get(fields[0])
        if top is None or len(fields) != 2:
            raise TemplateError(f"can't evaluate field {path}")
        return self.maps[top].get(fields[1], NO_VALUE)

    def operand(self, kind: str, tok: str) -> Value:
        if kind == "var":
            return self.variable(tok)
        if kind == "field":
            return self.field(tok)
        if kind == "str":
            return _unquote(tok)
        if kind == "raw":
            return tok[1:-1]
        if kind == "num":
            return float(tok)
        raise TemplateError(f"unexpected {tok!r}")


def render(
    text: str, labels: Mapping[str, str], value: float, external_labels: Mapping[str, str] | None = None
) -> str:
    """Expand `text` for one alert; an error becomes `<error expanding template: ...>`, never raises."""
    if "{{" not in text:
        return text
    data = _Data(labels, float(value), external_labels or {})
    out: list[str] = []
    try:
        for is_action, part in _parts(text):
            if not is_action:
                out.append(part)
                continue
            result: Value | None = None
            for command in _pipeline(part):
                kind, tok = command[0]
                if kind == "ident":
                    args = [data.operand(k, t) for k, t in command[1:]]
                    if result is not None:
                        args.append(result)
                    result = FUNCTIONS[tok](*args)
                else:
                    if result is not None:
                        raise TemplateError(f"can't give argument to non-function {tok}")
                    result = data.operand(kind, tok)
            out.append(_text(result) if result is not None else "")
    except (TemplateError, TypeError, ValueError, OverflowError) as e:
        return f"<error expanding template: {e}>"
    return "".join(out)
