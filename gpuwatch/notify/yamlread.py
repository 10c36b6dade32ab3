"""The small YAML readers every notify config module shares: each problem is one sentence naming its
path (`config error: notify.route.group_wait: ...`). Also the matchers of routes and inhibit rules,
`matchers:` and the older `match`/`match_re` maps, read into `gpuwatch.notify.matchers.LabelMatcher`s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwatch.core.errors import ConfigError
from gpuwatch.core.units import parse_duration
from gpuwatch.notify.matchers import (
    LABEL_NAME,
    LabelMatcher,
    MatcherError,
    MatcherRegexError,
    Matchers,
    parse_matchers,
    sort_matchers,
)


def fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"config error: {path}: {message}")


def mapping(path: str, raw: object) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise fail(path, f"expected a mapping, got {raw!r}")
    return {str(k): v for k, v in raw.items()}


def listing(path: str, raw: object) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise fail(path, f"expected a list, got {raw!r}")
    return raw


def text(path: str, raw: object) -> str:
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise fail(path, f"expected a text value, got {raw!r}")
    return str(raw)


def boolean(path: str, raw: object) -> bool:
    if not isinstance(raw, bool):
        raise fail(path, f"expected true or false, got {raw!r}")
    return raw


def duration(path: str, raw: object, *, allow_zero: bool = False) -> float:

    try:
        value = parse_duration(raw)
    except ValueError:
        raise fail(path, f"expected a duration like 30s or 4h, got {raw!r}") from None
    if value <= 0 and not allow_zero:
        raise fail(path, f"expected a duration above zero, got {raw!r}")
    return value


def check_keys(path: str, data: Mapping[str, Any], known: tuple[str, ...], hint: str = "") -> None:
    for key in data:
        if key not in known:
            raise ConfigError(
                f"config error: {path}.{key}: unknown key{hint}; known keys: {', '.join(known)}"
            )


def label_names(path: str, raw: object) -> tuple[str, ...]:
    out = []
    for i, item in enumerate(listing(path, raw)):
        name = text(f"{path}[{i}]", item)
        if name != "..." and not LABEL_NAME.fullmatch(name):
            raise fail(f"{path}[{i}]", f"expected a label name, got {name!r}")
        out.append(name)
    return tuple(out)


def _say(e: MatcherError) -> str:
    if isinstance(e, MatcherRegexError):
        return f"invalid regular expression {e.pattern!r} ({e.reason})"
    return str(e)


def matchers_from(path: str, data: Mapping[str, Any], prefix: str = "") -> Matchers:
    """Read `<prefix>matchers` (list of matcher texts) and the older `<prefix>match`/`<prefix>match_re`.

    Return them in Alertmanager's order (as its route keys write them).
    """
    out: list[LabelMatcher] = []
    for op, key in (("=", f"{prefix}match"), ("=~", f"{prefix}match_re")):
        for k, v in mapping(f"{path}.{key}", data.get(key)).items():
            if not LABEL_NAME.fullmatch(k):
                raise fail(f"{path}.{key}.{k}", "expected a label name")
            try:
                out.append(LabelMatcher(k, op, text(f"{path}.{key}.{k}", v)))
            except MatcherError as e:
                raise fail(f"{path}.{key}.{k}", _say(e)) from None
    for i, item in enumerate(listing(f"{path}.{prefix}matchers", data.get(f"{prefix}matchers"))):
        where = f"{path}.{prefix}matchers[{i}]"
        try:
            out.extend(parse_matchers(text(where, item)))
        except MatcherError as e:
            raise fail(where, _say(e)) from None
    return sort_matchers(out)


def yaml_value(key: str, raw: str) -> object:
    import yaml

    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        raise fail(key, "expected YAML") from None
