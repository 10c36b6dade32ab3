"""The `builtin_rules` and `language` settings: which built-in rules run, changed how, with which texts.

```yaml
builtin_rules:
  disable: [GPUUtilizationLow]
  override:
    GPUTemperatureHigh: {for: 5m, labels: {severity: warning}}
language: zh
```

`builtin_rules: true` (the default) loads the whole pack, `false` none of it. Rule names are checked
against the pack at load, so a misspelt name stops gpuwatch with a config error naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuwatch.core.errors import ConfigError, QueryError
from gpuwatch.core.units import parse_duration
from gpuwatch.query.parse import parse as parse_promql
from gpuwatch.rules.load import load_builtin
from gpuwatch.rules.template import check_template

LANGUAGES = ("en", "zh")
_KEYS = ("disable", "override")
_OVERRIDE_KEYS = ("expr", "for", "keep_firing_for", "labels", "annotations")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class RuleOverride:
    """What `builtin_rules.override.<name>` changes; None (or empty) keeps the built-in value.

    `labels` and `annotations` are merged into the rule's own (a key given here wins).
    """

    expr: str | None = None
    for_s: float | None = None
    keep_firing_for_s: float | None = None
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()

    def public(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.expr is not None:
            out["expr"] = self.expr
        if self.for_s is not None:
            out["for"] = self.for_s
        if self.keep_firing_for_s is not None:
            out["keep_firing_for"] = self.keep_firing_for_s
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


@dataclass(frozen=True)
class BuiltinRules:
    """The parsed `builtin_rules` setting."""

    enabled: bool = True
    disable: tuple[str, ...] = ()
    override: tuple[tuple[str, RuleOverride], ...] = ()

    def __str__(self) -> str:  # docs/configuration.md's settings table shows the default as `true`
        return "true" if self.enabled else "false"

    def public(self) -> Any:
        """Return the setting as JSON-friendly values (for /-/settings)."""
        if not self.disable and not self.override:
            return self.enabled
        return {"disable": list(self.disable), "override": {n: o.public() for n, o in self.override}}


def _fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"config error: {path}: {message}")


def builtin_rule_names() -> list[str]:
    """Return the names of every rule in the built-in pack, in file order."""

    return [r.name for g in load_builtin() for r in g.rules]


def _check_name(path: str, name: object, known: list[str]) -> str:
    if not isinstance(name, str) or name not in known:
        raise _fail(path, f"unknown built-in rule {name!r}; the built-in rules are {', '.join(known)}")
    return name


def _string_map(path: str, raw: object) -> tuple[tuple[str, str], ...]:

    if not isinstance(raw, dict):
        raise _fail(path, "expected a mapping of names to text")
    out: list[tuple[str, str]] = []
    for k, v in raw.items():
        if not isinstance(k, str) or not _LABEL_NAME.match(k):
            raise _fail(f"{path}.{k}", "expected a name like severity")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise _fail(f"{path}.{k}", f"expected a text value, got {v!r}")
        problem = check_template(str(v))
        if problem:
            raise _fail(f"{path}.{k}", problem)
        out.append((k, str(v)))
    return tuple(sorted(out))


def _duration(path: str, raw: object) -> float:

    try:
        return parse_duration(raw)
    except ValueError as e:
        raise _fail(path, f"{e}, got {raw!r}") from None


def _override(path: str, raw: object) -> RuleOverride:

    if not isinstance(raw, dict) or not raw:
        raise _fail(path, f"expected a mapping with some of {', '.join(_OVERRIDE_KEYS)}")
    unknown = sorted(str(k) for k in raw if k not in _OVERRIDE_KEYS)
    if unknown:
        raise _fail(f"{path}.{unknown[0]}", f"unknown key; known keys: {', '.join(_OVERRIDE_KEYS)}")
    expr = raw.get("expr")
    if expr is not None:
        if not isinstance(expr, str) or not expr.strip():
            raise _fail(f"{path}.expr", "expected a PromQL expression")
        try:
            parse_promql(expr)
        except QueryError as e:
            raise _fail(f"{path}.expr", str(e)) from None
    return RuleOverride(
        expr=expr,
        for_s=_duration(f"{path}.for", raw["for"]) if raw.get("for") is not None else None,
        keep_firing_for_s=(
            _duration(f"{path}.keep_firing_for", raw["keep_firing_for"])
            if raw.get("keep_firing_for") is not None
            else None
        ),
        labels=_string_map(f"{path}.labels", raw["labels"]) if raw.get("labels") is not None else (),
        annotations=(
            _string_map(f"{path}.annotations", raw["annotations"])
            if raw.get("annotations") is not None
            else ()
        ),
    )


def parse_builtin_rules(raw: object) -> BuiltinRules:
    """Parse `builtin_rules`: true, false, or `{disable: [names], override: {name: {...}}}`."""
    if isinstance(raw, BuiltinRules):
        return raw
    if isinstance(raw, (bool, str)):
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return BuiltinRules(enabled=True)
        if text in ("0", "false", "no", "off", ""):
            return BuiltinRules(enabled=False)
        raise _fail("builtin_rules", f"expected true, false or a mapping with disable/override, got {raw!r}")
    if not isinstance(raw, dict):
        raise _fail("builtin_rules", f"expected true, false or a mapping with disable/override, got {raw!r}")
    unknown = sorted(str(k) for k in raw if k not in _KEYS)
    if unknown:
        raise _fail(f"builtin_rules.{unknown[0]}", f"unknown key; known keys: {', '.join(_KEYS)}")
    known = builtin_rule_names()
    disable = raw.get("disable") or []
    if isinstance(disable, str):
        disable = [disable]
    if not isinstance(disable, list):
        raise _fail("builtin_rules.disable", "expected a list of built-in rule names")
    names = tuple(dict.fromkeys(_check_name("builtin_rules.disable", n, known) for n in disable))
    override = raw.get("override") or {}
    if not isinstance(override, dict):
        raise _fail("builtin_rules.override", "expected a mapping of built-in rule names to changes")
    changes: list[tuple[str, RuleOverride]] = []
    for name, body in override.items():
        _check_name("builtin_rules.override", name, known)
        if name in names:
            raise _fail(f"builtin_rules.override.{name}", "the rule is also in disable; keep one of the two")
        changes.append((name, _override(f"builtin_rules.override.{name}", body)))
    return BuiltinRules(True, names, tuple(changes))


def parse_language(raw: object) -> str:
    """Parse `language`: en or zh."""
    if not isinstance(raw, str) or raw.strip().lower() not in LANGUAGES:
        raise ValueError(f"expected one of {', '.join(LANGUAGES)}")
    return raw.strip().lower()
