"""The `log_files` setting: which training logs to tail and which figures to pull out of their lines."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpuwatch.core.errors import ConfigError

_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_KEYS = ("path", "run", "patterns", "from_beginning", "job")


@dataclass(frozen=True)
class LogFileConfig:
    """One `log_files` entry: a path or glob, the run it belongs to (empty: the file's stem) and regexes."""

    path: str
    run: str = ""
    patterns: tuple[str, ...] = ()
    from_beginning: bool = True
    job: str = ""

    def public(self) -> dict[str, Any]:
        """Return the entry as JSON-friendly values (for /-/settings)."""
        return {
            "path": self.path,
            "run": self.run,
            "patterns": list(self.patterns),
            "from_beginning": self.from_beginning,
            "job": self.job,
        }


def _fail(path: str, message: str) -> ConfigError:
    return ConfigError(f"config error: {path}: {message}")


def _text(path: str, raw: object, *, empty_ok: bool = False) -> str:
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise _fail(path, f"expected a text value, got {raw!r}")
    s = str(raw)
    if not s.strip() and not empty_ok:
        raise _fail(path, "expected a non-empty text value")
    return s


def _entry(path: str, raw: object) -> LogFileConfig:
    if isinstance(raw, str):
        raw = {"path": raw}
    if not isinstance(raw, dict):
        raise _fail(path, f"expected a mapping with at least `path`, got {raw!r}")
    unknown = sorted(str(k) for k in raw if k not in _KEYS)
    if unknown:
        raise _fail(f"{path}.{unknown[0]}", f"unknown key; known keys: {', '.join(_KEYS)}")
    if "path" not in raw:
        raise _fail(f"{path}.path", "missing; give a file path or a glob")
    file_path = _text(f"{path}.path", raw["path"])
    run = _text(f"{path}.run", raw.get("run") or "", empty_ok=True)
    patterns_raw = raw.get("patterns") or []
    if isinstance(patterns_raw, str):
        patterns_raw = [patterns_raw]
    if not isinstance(patterns_raw, list):
        raise _fail(f"{path}.patterns", f"expected a list of regexes, got {patterns_raw!r}")
    patterns = []
    for i, p in enumerate(patterns_raw):
        where = f"{path}.patterns[{i}]"
        text = _text(where, p)
        try:
            compiled = re.compile(text)
        except re.error as e:
            raise _fail(where, f"invalid regex: {e}") from None
        if not compiled.groupindex:
            raise _fail(where, "has no named group; write (?P<loss>[0-9.eE+-]+) for training_loss")
        for name in compiled.groupindex:
            if not _NAME.match(name):
                raise _fail(where, f"group name {name!r} is not a valid metric name part")
        patterns.append(text)
    from_beginning = raw.get("from_beginning", True)
    if not isinstance(from_beginning, bool):
        raise _fail(f"{path}.from_beginning", f"expected true or false, got {from_beginning!r}")
    job = _text(f"{path}.job", raw.get("job") or "", empty_ok=True)
    return LogFileConfig(file_path, run, tuple(patterns), from_beginning, job)


def parse_log_files(raw: object) -> tuple[LogFileConfig, ...]:
    """Validate a `log_files` list (YAML text from the environment is accepted too)."""
    if isinstance(raw, str):
        import yaml

        try:
            raw = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise _fail("log_files", f"expected a YAML list of files, got {raw!r}") from None
    if raw is None:
        return ()
    if isinstance(raw, tuple) and all(isinstance(e, LogFileConfig) for e in raw):
        return raw
    if not isinstance(raw, list):
        raise _fail("log_files", f"expected a list of files, got {raw!r}")
    return tuple(_entry(f"log_files[{i}]", e) for i, e in enumerate(raw))
