"""The NVML bindings the binding tests run gpuwatch against: the installed one, and others put first on
PYTHONPATH from a directory (`pip install --target DIR ...`, as `.ci/run` does).

- ("installed", None): the environment's own nvidia-ml-py; always.
- ("floor", DIR): `TEST_PYNVML_FLOOR` names a directory holding the oldest supported
  nvidia-ml-py's pynvml.py (12.535.77, pyproject's floor).
- ("pynvml11", DIR): `TEST_PYNVML11` names a directory holding the old `pynvml` 11.5.3
  package, which shadows nvidia-ml-py's module where both are installed.

A variable naming a directory without the binding in it counts as unset. Without the floor, its test
skips, except in CI (REQUIRE_TEST_TOOLS=1, where `.ci/run` installs it), where it fails. (Not GPUWATCH_
names: gpuwatch rejects unknown GPUWATCH_* variables, and tests run it with pytest's environment.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FLOOR_ENV = "TEST_PYNVML_FLOOR"
PYNVML11_ENV = "TEST_PYNVML11"


def _dir(env: str, holds: str) -> Path | None:
    """The directory `env` names, where it holds `holds`."""
    value = os.environ.get(env, "")
    return Path(value) if value and (Path(value) / holds).exists() else None


def binding_dirs() -> list[tuple[str, Path | None]]:
    """(name, directory to put first on PYTHONPATH, or None for the installed binding)."""
    found: list[tuple[str, Path | None]] = [("installed", None)]
    floor = _dir(FLOOR_ENV, "pynvml.py")
    if floor is not None:
        found.append(("floor", floor))
    old = _dir(PYNVML11_ENV, "pynvml/__init__.py")
    if old is not None:
        found.append(("pynvml11", old))
    return found


def require_floor() -> None:
    """Skip (fail in CI) when no floor binding is named: the tests then never ran on it."""
    if any(name == "floor" for name, _ in binding_dirs()):
        return
    value = os.environ.get(FLOOR_ENV, "")
    missing = (
        f"{FLOOR_ENV}={value} holds no pynvml.py"
        if value
        else f"{FLOOR_ENV} is not set (pip install --target DIR nvidia-ml-py==12.535.77)"
    )
    if os.environ.get("REQUIRE_TEST_TOOLS") == "1":
        pytest.fail(missing)
    pytest.skip(missing)
