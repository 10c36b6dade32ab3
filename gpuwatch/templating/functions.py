"""Go's side of the template language: values printed as Go's fmt prints them (`sprint`, `printf`,
`go_float`), Go's truth, field and method access on the data, and the functions every template has
(`and`, `or`, `not`, `len`, `index`, `print`, `printf`, `println`, `eq`, `ne`, `lt`, `le`, `gt`, `ge`,
`html`, `js`, `urlquery`), plus the regular-expression functions Prometheus and Alertmanager share.
The language itself (parsing and execution) is in `gotemplate.py`.
"""

from __future__ import annotations

import html as _html
import math
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any
from urllib.parse import quote_plus

from gpuwatch.core import regex
from gpuwatch.core.regex import Regex
from gpuwatch.query.values import format_value


class TemplateError(Exception):
    """A template could not be parsed or executed; the message says where and why."""


def go_float(v: float) -> str:
    """Format a float as Go's `%v` does: shortest digits, an exponent below 1e-4 and from 1e6; in between
    as Go's 'f' format (the API's `format_value`)."""
    if math.isnan(v) or math.isinf(v) or v == 0:
        return format_value(v)
    sign, digits, exponent = Decimal(repr(v)).normalize().as_tuple()
    ds = "".join(str(d) for d in digits)
    exp = len(ds) + int(exponent) - 1
    neg = "-" if sign else ""
    if exp < -4 or exp >= 6:  # Go's shortest %v switches to %e at 6 digits before the point
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{neg}{mant}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    return format_value(v)


def regex_match(pattern: str, text: str) -> bool:
    """Go's regexp.MatchString (unanchored), as `match` in Prometheus's and Alertmanager's templates."""
    return _regex(pattern).search(text) is not None


def re_replace_all(pattern: str, repl: str, text: str) -> str:
    """Go's Regexp.ReplaceAllString: `$1`, `${1}`, `${name}` in the replacement; `$$` is a dollar."""
    return _regex(pattern).sub(lambda m: regex.expand(repl, m), text)


def _regex(pattern: str) -> Regex:
    try:
        return regex.compile(pattern)
    except regex.RegexError as e:
        raise TemplateError(str(e)) from None


# -- values -------------------------------------------------------------------------------------------

MISSING = object()  # no value yet (a pipeline before its first command)


def truth(v: Any) -> bool:
    """Go's template truth: false, 0, nil and empty strings, lists and maps are false."""
    if v is None or v is MISSING:
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
    if v is None or v is MISSING:
        return "<no value>"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{sprint(k)}:{sprint(x)}" for k, x in sorted(v.items())) + "]"
    if isinstance(v, (list, tuple)):
        return "[" + " ".join(sprint(x) for x in v) + "]"
    return str(v)


def field_of(v: Any, name: str) -> Any:
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


def call_value(v: Any, args: Sequence[Any]) -> Any:
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
