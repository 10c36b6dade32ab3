"""A Lightning logger that logs the run to gpuwatch (needs `lightning`, or `pytorch_lightning`).

    from gpuwatch.integrations.lightning import GpuwatchLogger

    trainer = lightning.Trainer(max_steps=1000, logger=GpuwatchLogger(total_steps=1000))

`log_metrics` logs at Lightning's step, `log_hyperparams` (what `save_hyperparameters()` saved, flattened
as `a/b`) goes into the run's config, and `finalize` finishes the run: `ok` on success, `failed` when
training raised. Lightning calls these on the global rank zero only. The run starts at the first call
(name: `run=`, else GPUWATCH_RUN, else generated); `url`, `token` and other options go to
`gpuwatch.client.Run`. Where the script already started a run (`gpuwatch.client.init`), the logger
logs into that one and leaves finishing it to the script.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from typing import Any

try:
    from lightning.pytorch.loggers import Logger
    from lightning.pytorch.utilities import rank_zero_only
except ImportError:  # the older package name
    from pytorch_lightning.loggers import Logger  # type: ignore[no-redef,assignment,unused-ignore]
    from pytorch_lightning.utilities import rank_zero_only  # type: ignore[no-redef,unused-ignore]

from gpuwatch import client


class GpuwatchLogger(Logger):  # type: ignore[misc,unused-ignore]  # Any without Lightning's types
    """Log a Lightning run to gpuwatch."""

    def __init__(self, run: str | None = None, total_steps: int | None = None, **options: Any) -> None:
        super().__init__()
        self._name = run
        self._total_steps = total_steps
        self._options = options
        self._run: client.Run | None = None
        self._owns_run = False

    @property
    def name(self) -> str:
        return "gpuwatch"

    @property
    def version(self) -> str:
        return self.experiment.name

    @property
    def experiment(self) -> client.Run:
        """The SDK's run (started on first use)."""
        if self._run is None:
            active = client.active_run()
            if active is not None and self._name in (None, active.name):
                self._run = active
            else:
                self._run = client.init(run=self._name, total_steps=self._total_steps, **self._options)
                self._owns_run = True
        return self._run

    @rank_zero_only  # type: ignore[untyped-decorator,misc,unused-ignore]
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        values = vars(params) if isinstance(params, Namespace) else dict(params or {})
        self.experiment.config.update(_flatten(values))

    @rank_zero_only  # type: ignore[untyped-decorator,misc,unused-ignore]
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.experiment.log(dict(metrics), step=step)

    @rank_zero_only  # type: ignore[untyped-decorator,misc,unused-ignore]
    def finalize(self, status: str) -> None:
        if self._run is None or self._run.is_finished:
            return
        if self._owns_run:
            self._run.finish(status="failed" if status == "failed" else "ok")
        else:
            self._run.flush(timeout_s=10.0)


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, name + "/"))
        elif isinstance(value, Namespace):
            out.update(_flatten(vars(value), name + "/"))
        else:
            out[name] = value
    return out
