"""What the training SDK tells gpuwatch about a run besides its figures: the process it runs in
(pid, a torchrun launcher, CUDA devices), the GPUs that implies, and its config as a dict whose changes
are sent. Read in the user's training process (`gpuwatch.client` re-exports these); needs nothing
beyond the standard library. This module reads that process's environment (ruff TID251 is waived).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any


def env_setting(name: str) -> str | None:
    """Return a non-empty `GPUWATCH_*` variable of the user's environment, or None."""
    return os.environ.get(name) or None


def process_report() -> dict[str, Any]:
    """Describe this process for gpuwatch's process-table join: pid, a torchrun launcher's pid (its
    workers are this process's siblings), CUDA_VISIBLE_DEVICES, and torch's current CUDA device when
    torch is already imported and CUDA initialised (never imports torch or initialises CUDA itself)."""
    report: dict[str, Any] = {"pid": os.getpid()}
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # started by torchrun: follow the launcher's children too
        report["launcher_pid"] = os.getppid()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        report["cuda_visible_devices"] = visible
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            report["cuda_device"] = int(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 - a broken CUDA set-up must not stop the run from logging
        pass
    return report


def declared_gpus(report: Mapping[str, Any]) -> list[str] | None:
    """The GPUs a process says it may use: CUDA_VISIBLE_DEVICES (narrowed to torch's current device
    when known), else torch's current device, else None."""
    visible_text = report.get("cuda_visible_devices")
    device = report.get("cuda_device")
    if visible_text is not None:
        visible = [v.strip() for v in str(visible_text).split(",") if v.strip()]
        if isinstance(device, int) and 0 <= device < len(visible):
            return [visible[device]]
        return visible
    return [str(device)] if isinstance(device, int) else None


class RunConfig(MutableMapping[str, Any]):
    """A run's config as W&B's `wandb.config`: a dict (also by attribute: `config.lr = 3e-4`) whose
    changes are sent to gpuwatch (the run's `config` in /api/v1/runs)."""

    def __init__(self, data: Mapping[str, Any] | None, on_change: Callable[[dict[str, Any]], None]) -> None:
        object.__setattr__(self, "_data", dict(data or {}))
        object.__setattr__(self, "_on_change", on_change)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._data[key] = value
        self._on_change(dict(self._data))

    def __delitem__(self, key: str) -> None:
        del self._data[key]
        self._on_change(dict(self._data))

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def update(self, other: Any = (), /, **kw: Any) -> None:
        """Set several keys at once (one message to gpuwatch)."""
        self._data.update(other, **kw)
        self._on_change(dict(self._data))

    def __getattr__(self, key: str) -> Any:
        try:
            return self._data[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __repr__(self) -> str:
        return f"RunConfig({self._data!r})"
