"""Read and validate rule files in Prometheus's format (`groups: - name, interval, rules: [...]`)."""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpuwatch.core.errors import GpuwatchError, QueryError
from gpuwatch.core.units import parse_duration
from gpuwatch.query.parse import parse as parse_promql
from gpuwatch.rules.template import check_template

_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_GROUP_KEYS = {"name", "interval", "rules"}
_RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}

BUILTIN = "builtin"


class RuleFileError(GpuwatchError):
    """One or more rule files are invalid; `errors` holds one line each (file, group, rule, reason)."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)


@dataclass(frozen=True)
class Rule:
    """One alerting (`kind == "alert"`) or recording (`kind == "record"`) rule."""

    kind: str
    name: str
    expr: str
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Group:
    """A rule group: its rules are evaluated in order every `interval_s` (None: evaluation_interval)."""

    name: str
    file: str
    interval_s: float | None
    rules: tuple[Rule, ...]

    @property
    def key(self) -> str:
        return f"{self.file};{self.name}"


def builtin_path() -> Path:
    """Return the directory of the built-in rule pack shipped inside the package (one or more *.yml files)."""
    return Path(str(resources.files("gpuwatch.rules").joinpath("builtin")))


def builtin_files() -> list[Path]:
    """Return the built-in rule files, sorted by name."""
    return sorted(builtin_path().glob("*.yml"))


def expand(patterns: Iterable[str], base_dir: Path | None = None) -> list[Path]:
    """Return the files matching `rule_files` globs (relative ones against `base_dir`), sorted, once each."""
    seen: dict[Path, None] = {}
    for pattern in patterns:
        p = Path(pattern).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        for match in sorted(glob.glob(str(p))):
            seen.setdefault(Path(match), None)
    return list(seen)


def _string_map(value: object, where: str, what: str, errors: list[str]) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        errors.append(f"{where}: {what} must be a mapping of names to strings")
        return ()
    out = []
    for k, v in value.items():
        if not isinstance(k, str) or not _LABEL_NAME.match(k):
            errors.append(f"{where}: invalid {what[:-1]} name {k!r}")
            continue
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            errors.append(f"{where}: {what[:-1]} {k!r} must be a string")
            continue
        text = str(v)
        problem = check_template(text)
        if problem:
            errors.append(f"{where}: {what[:-1]} {k!r}: {problem}")
        out.append((k, text))
    return tuple(sorted(out))


def _duration(value: object, where: str, key: str, errors: list[str]) -> float:
    if value is None:
        return 0.0
    try:
        return parse_duration(value)
    except ValueError as e:
        errors.append(f"{where}: {key}: {e}, got {value!r}")
        return 0.0


def _rule(raw: object, where: str, errors: list[str]) -> Rule | None:
    if not isinstance(raw, dict):
        errors.append(f"{where}: a rule must be a mapping with 'alert' or 'record' and 'expr'")
        return None
    n_before = len(errors)
    unknown = sorted(str(k) for k in raw if k not in _RULE_KEYS)
    if unknown:
        errors.append(f"{where}: unknown field(s) {', '.join(unknown)}")
    alert, record = raw.get("alert"), raw.get("record")
    if (alert is None) == (record is None):
        errors.append(f"{where}: exactly one of 'alert' and 'record' must be set")
        return None
    kind = "alert" if alert is not None else "record"
    name = alert if alert is not None else record
    if not isinstance(name, str) or not name.strip():
        errors.append(f"{where}: '{kind}' must be a non-empty string")
        return None
    where = f"{where} ({kind} {name!r})"
    if kind == "record" and not _METRIC_NAME.match(name):
        errors.append(f"{where}: invalid recording rule name (must be a metric name)")
    expr = raw.get("expr")
    if not isinstance(expr, (str, int, float)) or isinstance(expr, bool) or not str(expr).strip():
        errors.append(f"{where}: 'expr' must be a non-empty PromQL expression")
        expr = ""
    else:
        expr = str(expr)
        try:
            parse_promql(expr)
        except QueryError as e:
            errors.append(f"{where}: expr: {e}")
    if kind == "record":
        for key in ("for", "keep_firing_for", "annotations"):
            if key in raw:
                errors.append(f"{where}: '{key}' is only for alerting rules")
    labels = _string_map(raw.get("labels"), where, "labels", errors)
    if kind == "record" and any(k == "__name__" for k, _ in labels):
        errors.append(f"{where}: labels must not set __name__")
    annotations = _string_map(raw.get("annotations"), where, "annotations", errors)
    for_s = _duration(raw.get("for"), where, "for", errors)
    keep_s = _duration(raw.get("keep_firing_for"), where, "keep_firing_for", errors)
    if len(errors) > n_before:
        return None
    return Rule(kind, name, expr, for_s, keep_s, labels, annotations)


def load_groups(text: str, file: str) -> list[Group]:
    """Parse one rule file's text; raise RuleFileError listing every problem found."""
    errors: list[str] = []
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise RuleFileError([f"{file}{line}: {getattr(e, 'problem', None) or 'invalid YAML'}"]) from None
    if data is None:
        return []
    if not isinstance(data, dict) or set(data) - {"groups"}:
        raise RuleFileError([f"{file}: expected a mapping with one key, 'groups'"])
    raw_groups = data.get("groups") or []
    if not isinstance(raw_groups, list):
        raise RuleFileError([f"{file}: 'groups' must be a list"])
    groups: list[Group] = []
    names: set[str] = set()
    for i, g in enumerate(raw_groups):
        if not isinstance(g, dict):
            errors.append(f"{file}: groups[{i}]: a group must be a mapping with 'name' and 'rules'")
            continue
        name = g.get("name")
        if not isinstance(name, str) or not name:
            errors.append(f"{file}: groups[{i}]: 'name' must be a non-empty string")
            continue
        where = f"{file}: group {name!r}"
        if name in names:
            errors.append(f"{where}: repeated group name")
        names.add(name)
        unknown = sorted(str(k) for k in g if k not in _GROUP_KEYS)
        if unknown:
            errors.append(f"{where}: unknown field(s) {', '.join(unknown)}")
        interval = None
        if g.get("interval") is not None:
            interval = _duration(g.get("interval"), where, "interval", errors)
            if interval <= 0:
                errors.append(f"{where}: interval must be positive")
        raw_rules = g.get("rules") or []
        if not isinstance(raw_rules, list):
            errors.append(f"{where}: 'rules' must be a list")
            continue
        rules = [_rule(r, f"{where} rule {j}", errors) for j, r in enumerate(raw_rules)]
        groups.append(Group(name, file, interval, tuple(r for r in rules if r is not None)))
    if errors:
        raise RuleFileError(errors)
    return groups


def load_files(paths: Iterable[Path]) -> list[Group]:
    """Load every rule file; raise RuleFileError listing the problems of all of them."""
    groups: list[Group] = []
    errors: list[str] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            errors.append(f"{path}: cannot read: {e.strerror or e}")
            continue
        try:
            groups.extend(load_groups(text, str(path)))
        except RuleFileError as e:
            errors.extend(e.errors)
    if errors:
        raise RuleFileError(errors)
    return groups


def load_builtin() -> list[Group]:
    """Return the built-in rule groups of every built-in file (their `file` is 'builtin')."""
    groups: list[Group] = []
    for path in builtin_files():
        groups.extend(load_groups(path.read_text(encoding="utf-8"), BUILTIN))
    return groups
