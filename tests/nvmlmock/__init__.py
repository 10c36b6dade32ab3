"""A mock of NVIDIA's driver library (libnvidia-ml.so.1), loaded by the real nvidia-ml-py in a subprocess.

`build` compiles `mock_nvml.c` with gcc; `run` starts a Python subprocess that finds the mock through
LD_LIBRARY_PATH, so `import pynvml` (the installed binding, or one named by `binding_dir`) talks to it
through its real ctypes layer. Inside that subprocess `tests.nvmlmock.control.MockDriver` steers the
mock. Scenarios and control functions: README.md next to this file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SOURCE = HERE / "mock_nvml.c"
VARIANTS = {"current": [], "r535_54": ["-DMOCK_R535_54"]}
SONAME = "libnvidia-ml.so.1"

__all__ = ["SONAME", "VARIANTS", "GccMissing", "MockRunError", "build", "run"]


class GccMissing(RuntimeError):
    """gcc is not installed, so the mock library cannot be built."""


class MockRunError(RuntimeError):
    """The subprocess against the mock failed; the message carries its stdout and stderr."""


def build(dest: Path, variant: str = "current") -> Path:
    """Compile the mock into `dest/<variant>/libnvidia-ml.so.1`; return that folder."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown mock variant {variant!r} (known: {', '.join(VARIANTS)})")
    gcc = shutil.which("gcc")
    if gcc is None:
        raise GccMissing("gcc is not installed; the NVML mock needs it (apt-get install gcc)")
    out = Path(dest) / variant
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        gcc,
        "-shared",
        "-fPIC",
        "-O1",
        "-Wall",
        "-Werror",
        *VARIANTS[variant],
        f"-Wl,-soname,{SONAME}",
        "-o",
        str(out / SONAME),
        str(SOURCE),
        "-lpthread",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"building the NVML mock failed ({' '.join(cmd)}):\n{proc.stdout}{proc.stderr}")
    return out


def run(
    script: str,
    *,
    lib_dir: Path,
    scenario: str,
    binding_dir: Path | None = None,
    timeout: float = 60,
) -> Any:
    """Run `script` in a fresh Python against the mock in `lib_dir`; return the JSON of its last stdout line.

    `binding_dir`: a folder holding another pynvml.py, put first on the path (the installed one otherwise).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    path = [str(binding_dir)] if binding_dir is not None else []
    env.update(
        LD_LIBRARY_PATH=str(lib_dir),
        MOCK_NVML_SCENARIO=scenario,
        PYTHONPATH=os.pathsep.join([*path, str(ROOT)]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise MockRunError(
            f"script against the NVML mock (scenario {scenario}) exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
        )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise MockRunError(f"script printed nothing (scenario {scenario})\n--- stderr\n{proc.stderr}")
    return json.loads(lines[-1])
