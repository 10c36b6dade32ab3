"""pytest fixtures for the NVML mock; a test module imports the ones it uses.

`mock_lib`: both variants built once per session (per xdist worker); skipped without gcc, failed under
REQUIRE_TEST_TOOLS=1. `binding_dirs`: the nvidia-ml-py bindings to test, as (id, folder or None for the
installed one); "floor" when TEST_PYNVML_FLOOR names a folder with pynvml.py (tests/bindings.py; CI
installs the oldest supported release there: `pip install --target DIR nvidia-ml-py==12.535.77`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests import bindings
from tests.nvmlmock import VARIANTS, build


def _required() -> bool:
    return os.environ.get("REQUIRE_TEST_TOOLS") == "1"


@pytest.fixture(scope="session")
def mock_lib(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Variant name ("current", "r535_54") -> the folder holding its libnvidia-ml.so.1."""
    if shutil.which("gcc") is None:
        if _required():
            pytest.fail("gcc is not installed (apt-get install gcc); the NVML mock needs it")
        pytest.skip("gcc is not installed; the NVML mock needs it")
    dest = tmp_path_factory.mktemp("nvmlmock")
    return {variant: build(dest, variant) for variant in VARIANTS}


@pytest.fixture(scope="session")
def binding_dirs() -> list[tuple[str, Path | None]]:
    """The bindings to run against the mock: the installed one, and the floor release where configured
    (tests/bindings.py; the old `pynvml` 11.x package is not a binding gpuwatch runs on)."""
    return [(name, folder) for name, folder in bindings.binding_dirs() if name != "pynvml11"]


def binding(binding_dirs: list[tuple[str, Path | None]], which: str) -> Path | None:
    """The folder of binding `which` ("installed": None); skip the test when it is not configured."""
    for ident, folder in binding_dirs:
        if ident == which:
            return folder
    bindings.require_floor()  # skips, or fails in CI
    pytest.skip(f"binding {which!r} not configured")
