"""The built-in rule pack as configured: disabled rules left out, overrides applied, texts in one language;
and every active rule written back out as one Prometheus rule file (`gpuwatch rules export`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import yaml

from gpuwatch.core.units import format_duration
from gpuwatch.rules.config import LANGUAGES, BuiltinRules
from gpuwatch.rules.load import Group, Rule


class _Dumper(yaml.SafeDumper):
    """Write multi-line text (long expressions) as YAML literal blocks, as people write rule files."""


def _text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _text)


def _suffix(language: str) -> str:
    """Return the suffix of built-in annotations in `language` other than English (`summary_zh`)."""
    return f"_{language}"


def localize(
    annotations: Iterable[tuple[str, str]], language: str, languages: Sequence[str]
) -> tuple[tuple[str, str], ...]:
    """Return `annotations` in `language`: `summary_zh` becomes `summary` for zh; other languages' keys go."""
    others = tuple(_suffix(lang) for lang in languages if lang != "en")
    items = dict(annotations)
    out = {k: v for k, v in items.items() if not k.endswith(others)}
    if language != "en":
        for k, v in items.items():
            if k.endswith(_suffix(language)):
                out[k[: -len(_suffix(language))]] = v
    return tuple(sorted(out.items()))


def apply_builtin(groups: Sequence[Group], config: BuiltinRules, language: str) -> list[Group]:
    """Return the built-in `groups` as `config` and `language` say (empty when the pack is off)."""
    if not config.enabled:
        return []
    disabled = set(config.disable)
    overrides = dict(config.override)
    out: list[Group] = []
    for g in groups:
        rules: list[Rule] = []
        for rule in g.rules:
            if rule.name in disabled:
                continue
            rule = replace(rule, annotations=localize(rule.annotations, language, LANGUAGES))
            o = overrides.get(rule.name)
            if o is not None:
                rule = replace(
                    rule,
                    expr=o.expr if o.expr is not None else rule.expr,
                    for_s=o.for_s if o.for_s is not None else rule.for_s,
                    keep_firing_for_s=o.keep_firing_for_s
                    if o.keep_firing_for_s is not None
                    else rule.keep_firing_for_s,
                    labels=tuple(sorted({**dict(rule.labels), **dict(o.labels)}.items())),
                    annotations=tuple(sorted({**dict(rule.annotations), **dict(o.annotations)}.items())),
                )
            rules.append(rule)
        if rules:
            out.append(replace(g, rules=tuple(rules)))
    return out


def _rule_dict(rule: Rule) -> dict[str, Any]:
    out: dict[str, Any] = {rule.kind: rule.name, "expr": rule.expr}
    if rule.for_s:
        out["for"] = format_duration(rule.for_s)
    if rule.keep_firing_for_s:
        out["keep_firing_for"] = format_duration(rule.keep_firing_for_s)
    if rule.labels:
        out["labels"] = dict(rule.labels)
    if rule.annotations:
        out["annotations"] = dict(rule.annotations)
    return out


def export_text(groups: Sequence[Group]) -> str:
    """Return `groups` as one Prometheus rule file; group names that repeat across files get a suffix."""
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for g in groups:
        name, n = g.name, 1
        while name in seen:  # two files may each have a group `gpu`; one file may not
            n += 1
            name = f"{g.name}-{n}"
        seen.add(name)
        body: dict[str, Any] = {"name": name}
        if g.interval_s:
            body["interval"] = format_duration(g.interval_s)
        body["rules"] = [_rule_dict(r) for r in g.rules]
        out.append(body)
    header = (
        "# Written by `gpuwatch rules export`: gpuwatch's active rules (built-in, as configured, and\n"
        "# rule_files), for Prometheus's rule_files. Check it with `promtool check rules`.\n"
    )
    return header + yaml.dump(
        {"groups": out}, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=10_000
    )
