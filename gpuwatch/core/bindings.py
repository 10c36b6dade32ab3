"""Whether an imported `pynvml` is a binding gpuwatch runs on, as one line that names the fix.

gpuwatch needs NVIDIA's nvidia-ml-py (a single `pynvml.py`), 12.535.77 or newer. Two installs give
something else under the same import name:

- the old `pynvml` package from PyPI (11.x, a `pynvml/` directory), which shadows nvidia-ml-py's
  module when both are installed and lacks names gpuwatch calls;
- an nvidia-ml-py older than 12.535.77.

`binding_problem(module)` looks only at the module's attributes (pure: it imports nothing and calls
nothing), so the caller decides what to do with the line (collect/nvml.py's load_nvml raises it as
NvmlUnavailable).
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

FLOOR = "12.535.77"  # the oldest nvidia-ml-py gpuwatch is tested with (pyproject.toml, .ci/run)
INSTALL = "pip install --upgrade 'nvidia-ml-py>=12.535.77,<14'"
# Names every nvidia-ml-py from FLOOR on has and gpuwatch reads without a fallback; pynvml 11.5.3
# lacks the last three (it has nvmlDeviceGetComputeRunningProcesses_v3, so that alone proves nothing).
REQUIRED = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "NVML_VALUE_TYPE_SIGNED_INT",
    "nvmlClocksEventReasonHwSlowdown",
    "NVML_FI_DEV_POWER_INSTANT",
)


def binding_problem(pynvml_module: Any) -> str | None:
    """Return one line saying what is wrong with `pynvml_module` and the command that fixes it, or None."""
    where = getattr(pynvml_module, "__file__", None) or "?"
    if hasattr(pynvml_module, "__path__") or PurePath(where).parent.name == "pynvml":
        version = getattr(pynvml_module, "__version__", None)
        what = f"the old `pynvml` package {version}" if version else "the old `pynvml` package"
        return (
            f"the pynvml module at {where} is {what}, which shadows NVIDIA's nvidia-ml-py; "
            f"fix: pip uninstall pynvml && pip install --force-reinstall 'nvidia-ml-py>=12.535.77,<14'"
        )
    missing = [name for name in REQUIRED if not hasattr(pynvml_module, name)]
    if missing:
        return (
            f"the pynvml module at {where} lacks {', '.join(missing)}: nvidia-ml-py older than {FLOOR}; "
            f"fix: {INSTALL}"
        )
    return None
