"""Grafana's dashboard model as the check of exported dashboard JSON: Grafana Labs' grafana-foundation-sdk
(the classes generated from Grafana's own schemas, here Grafana 10.4's) decodes the JSON, and:

- every key comes back when the decoded model is written out again (a key the model does not know
  is dropped, so a misspelt `gridpos` or `legendformat` shows), with the same value;
- every value has its field's type: enums (color modes, draw styles, variable refresh, query format,
  ...), literals, numbers, strings, booleans, lists and nested models, down to each panel type's
  options and custom field config, which the SDK decodes by the panel's `type`.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import units

register_default_plugins()

# Every unit id the model lists (`units.py`: one constant per unit of Grafana's unit picker).
UNIT_IDS = frozenset(v for k, v in vars(units).items() if not k.startswith("_") and isinstance(v, str))


def problems(dashboard: dict[str, Any]) -> list[str]:
    """What is wrong with `dashboard` by Grafana's model (empty: nothing)."""
    decoded = model.Dashboard.from_json(dashboard)
    errors = _missing(dashboard, _written(decoded), "$")
    _walk(decoded, "$", errors)
    return errors


def _written(obj: Any) -> Any:
    return json.loads(json.dumps(obj, cls=JSONEncoder))


def _missing(ours: Any, theirs: Any, path: str) -> list[str]:
    """Where `theirs` (the model's rewrite) lacks a key of `ours` or has another value."""
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [f"{path}: an object became {theirs!r}"]
        out = []
        for k, v in ours.items():
            if k in theirs:
                out += _missing(v, theirs[k], f"{path}.{k}")
            else:
                out.append(f"{path}.{k}: not a field of Grafana's model")
        return out
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            return [f"{path}: the list came back as {theirs!r}"]
        return [
            e
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
            for e in _missing(a, b, f"{path}[{i}]")
        ]
    if ours != theirs or isinstance(ours, bool) != isinstance(theirs, bool):
        return [f"{path}: {ours!r} came back as {theirs!r}"]
    return []


def _is_model(value: Any) -> bool:
    return hasattr(value, "to_json") and type(value).__module__.startswith("grafana_foundation_sdk.models")


def _walk(obj: Any, path: str, errors: list[str]) -> None:
    for name, hint in typing.get_type_hints(type(obj)).items():
        _check(getattr(obj, name), hint, f"{path}.{name}", errors)


def _check(value: Any, hint: Any, path: str, errors: list[str]) -> None:  # noqa: C901 - one dispatch on the type
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        if _is_model(value):  # a panel's options and custom field config, decoded by its type's hooks
            _walk(value, path, errors)
    elif origin in (typing.Union, types.UnionType):
        _check_union(value, args, path, errors)
    elif origin is typing.Literal:
        if value not in args:
            errors.append(f"{path}: {value!r} is not one of {args}")
    elif origin is list:
        if not isinstance(value, list):
            errors.append(f"{path}: {value!r} is not a list")
        else:
            for i, item in enumerate(value):
                _check(item, args[0], f"{path}[{i}]", errors)
    elif origin is dict:
        if not isinstance(value, dict):
            errors.append(f"{path}: {value!r} is not an object")
        else:
            for k, item in value.items():
                _check(item, args[1], f"{path}.{k}", errors)
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        if value not in {m.value for m in hint}:
            errors.append(f"{path}: {value!r} is not a {hint.__name__} {sorted(str(m.value) for m in hint)}")
    elif hint in (bool, str):
        if not isinstance(value, hint):
            errors.append(f"{path}: {value!r} is not a {hint.__name__}")
    elif hint in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float) if hint is float else int):
            errors.append(f"{path}: {value!r} is not a {hint.__name__}")
    elif hint is type(None):
        if value is not None:
            errors.append(f"{path}: {value!r} is not null")
    elif isinstance(hint, type) and hasattr(hint, "from_json"):
        if isinstance(value, dict):  # a list the parent left undecoded (panel transformations)
            decoded = hint.from_json(value)
            errors += _missing(value, _written(decoded), path)
            _walk(decoded, path, errors)
        elif isinstance(value, hint):
            _walk(value, path, errors)
        else:
            errors.append(f"{path}: {type(value).__name__} is not a {hint.__name__}")
    elif isinstance(hint, type) and isinstance(value, hint) and _is_model(value):
        _walk(value, path, errors)  # a query, decoded by its data source type (prometheus.Dataquery)
    else:
        errors.append(f"{path}: {type(value).__name__} is not a model of {hint!r}")


def _check_union(value: Any, args: tuple[Any, ...], path: str, errors: list[str]) -> None:
    if value is None:
        if type(None) not in args:
            errors.append(f"{path}: null is not allowed")
        return
    decoded = [a for a in args if isinstance(a, type) and hasattr(a, "from_json") and isinstance(value, a)]
    if decoded:  # Panel | RowPanel and the like: the class the decoder chose
        _check(value, decoded[0], path, errors)
        return
    lists = [a for a in args if typing.get_origin(a) is list]
    if isinstance(value, list) and len(lists) == 1:
        _check(value, lists[0], path, errors)
        return
    tried: list[str] = []
    for a in args:
        found: list[str] = []
        _check(value, a, path, found)
        if not found:
            return
        tried += found
    errors.append(f"{path}: {value!r} fits none of {args}: " + "; ".join(tried[:4]))
