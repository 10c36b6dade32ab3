"""binding_problem: the one line a start prints when the imported pynvml is not a binding gpuwatch runs on."""

from __future__ import annotations

import types

import pynvml

from gpuwatch.core.bindings import REQUIRED, binding_problem
from gpuwatch.demo.nvmlnames import FALLBACKS


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
