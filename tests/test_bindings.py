"""gpuwatch on each NVML binding it may meet: the installed nvidia-ml-py, the oldest one pyproject allows
(12.535.77) and the old `pynvml` 11.5.3 package that shadows it (tests/bindings.py finds them).

Each binding runs in a subprocess with its directory first on PYTHONPATH, as `pip install` of it would
leave the environment. No GPU is needed: the demo's simulated NVML borrows the binding's constants and
exception classes, so `gpuwatch smi --demo` runs the collector against the binding's names.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pynvml
import pytest

from gpuwatch.core.bindings import FLOOR, INSTALL, REQUIRED, binding_problem
from gpuwatch.demo.nvmlnames import FALLBACKS
from tests.bindings import binding_dirs, require_floor
from tests.conftest import ROOT, clean_env

BINDINGS = binding_dirs()
# The demo modules that read pynvml's names: a real start must not import them.
NVML_DEMO = (
    "gpuwatch.demo.nvml",
    "gpuwatch.demo.nvmldevice",
    "gpuwatch.demo.nvmlnames",
    "gpuwatch.demo.nvmlstructs",
    "gpuwatch.demo.workload",
)


def _python(
    path: Path | None, *args: str, cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run this Python with the binding in `path` (None: the installed one) first on the import path."""
    pythonpath = os.pathsep.join([*([str(path)] if path is not None else []), str(ROOT)])
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=clean_env(PYTHONPATH=pythonpath),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _params() -> list[object]:
    return [pytest.param(name, path, id=name) for name, path in BINDINGS]


def test_the_floor_binding_is_tested() -> None:
    """Skips here without TEST_PYNVML_FLOOR; fails in CI, which installs it."""
    require_floor()


@pytest.mark.parametrize(("name", "path"), _params())
def test_gpuwatch_imports_on_the_binding(name: str, path: Path | None, tmp_path: Path) -> None:
    code = (
        "import sys, pynvml, gpuwatch, gpuwatch.app.build, gpuwatch.cli.main\n"
        "print(pynvml.__file__)\n"
        "print(gpuwatch.__file__)\n"
        f"print(sorted(m for m in sys.modules if m in {NVML_DEMO!r}))\n"
    )
    proc = _python(path, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    binding, package, demo = proc.stdout.splitlines()
    if path is not None:
        assert Path(binding).is_relative_to(path), f"{name}: imported {binding}, not the binding in {path}"
    assert Path(package).is_relative_to(ROOT), package
    assert demo == "[]", f"a real start imports the simulated NVML: {demo}"


@pytest.mark.parametrize(("name", "path"), _params())
def test_demo_smi_on_the_binding(name: str, path: Path | None, tmp_path: Path) -> None:
    proc = _python(path, "-m", "gpuwatch.cli.main", "smi", "--demo", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("gpuwatch smi"), proc.stdout
    assert sum(" NVIDIA " in line for line in lines) == 8, proc.stdout  # the demo's eight GPUs


@pytest.mark.parametrize(("name", "path"), _params())
def test_binding_problem_on_the_binding(name: str, path: Path | None, tmp_path: Path) -> None:
    code = (
        "import pynvml\nfrom gpuwatch.core.bindings import binding_problem\nprint(binding_problem(pynvml))\n"
    )
    proc = _python(path, "-c", code, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    if name == "pynvml11":
        assert "pip uninstall pynvml" in line and "nvidia-ml-py" in line and "\n" not in line, line
    else:
        assert line == "None"


def test_real_start_on_the_old_pynvml_package_is_one_line_with_the_fix(tmp_path: Path) -> None:
    old = dict(BINDINGS).get("pynvml11")
    if old is None:
        pytest.skip("TEST_PYNVML11 is not set (pip install --target DIR pynvml==11.5.3)")
    proc = _python(old, "-m", "gpuwatch.cli.main", "smi", cwd=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err, proc.stderr
    assert err.startswith("gpuwatch: ") and "pip uninstall pynvml" in err and "nvidia-ml-py" in err, err


# -- binding_problem on modules made to look like each install ------------------------------------


def _module(file: str, names: tuple[str, ...] = REQUIRED, **attrs: object) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.__file__ = file
    for name in names:
        setattr(module, name, 0)
    for name, value in attrs.items():
        setattr(module, name, value)
    return module


def test_binding_problem_accepts_nvidia_ml_py() -> None:
    assert binding_problem(_module("/venv/lib/python3.11/site-packages/pynvml.py")) is None
    assert binding_problem(pynvml) is None  # the installed one


def test_binding_problem_names_the_shadowing_pynvml_package() -> None:
    shadow = _module("/venv/lib/python3.11/site-packages/pynvml/__init__.py", __version__="11.5.3")
    line = binding_problem(shadow)
    assert line is not None and "\n" not in line
    assert line.startswith("the pynvml module at /venv/lib/python3.11/site-packages/pynvml/__init__.py is ")
    assert "`pynvml` package 11.5.3" in line
    assert line.endswith(
        "fix: pip uninstall pynvml && pip install --force-reinstall 'nvidia-ml-py>=12.535.77,<14'"
    )
    package = _module("/x/pynvml.py", __path__=["/x/pynvml"])  # a package, wherever its file is
    assert binding_problem(package) is not None and "`pynvml` package," in str(binding_problem(package))


def test_binding_problem_names_what_an_old_nvidia_ml_py_lacks() -> None:
    old = _module("/venv/pynvml.py", names=REQUIRED[:2])
    line = binding_problem(old)
    assert line == (
        f"the pynvml module at /venv/pynvml.py lacks {REQUIRED[2]}, {REQUIRED[3]}: nvidia-ml-py older than "
        "12.535.77; fix: pip install --upgrade 'nvidia-ml-py>=12.535.77,<14'"
    )


def test_demo_fallbacks_are_nvml_values() -> None:
    """The values the demo uses where a binding lacks a name are the installed binding's own."""
    known = {name: getattr(pynvml, name) for name in FALLBACKS if hasattr(pynvml, name)}
    assert known, "the installed binding has none of the names: check FALLBACKS against nvml.h"
    assert known == {name: FALLBACKS[name] for name in known}


def test_the_floor_is_one_version_everywhere() -> None:
    """pyproject's bound, CI's floor install and binding_problem's fix name the same nvidia-ml-py."""
    (spec,) = re.findall(r'^\s*"(nvidia-ml-py[^"]*)",', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert spec == f"nvidia-ml-py>={FLOOR},<14"
    assert f"'{spec}'" in INSTALL
    assert f"nvidia-ml-py=={FLOOR}" in (ROOT / ".ci" / "run").read_text()
