"""A Hugging Face `Trainer` callback that logs the run to gpuwatch (needs `transformers`).

    from gpuwatch.integrations.hf import GpuwatchCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[GpuwatchCallback()])

On `train_begin` it starts the run (name: `run=`, else GPUWATCH_RUN, else the arguments' `run_name`)
with `max_steps` as total steps and the training arguments (and the model's config, when it has one)
as config; every `on_log` (training loss, learning rate, grad norm, evaluation metrics) goes in at
`global_step`; each checkpoint save is timed as `training_checkpoint_seconds`; `train_end` finishes the
run `ok`, and an exception that ends the script finishes it `failed`. Only the world's process zero logs.
Where the script already started a run (`gpuwatch.client.init`), the callback logs into that one, adds
the arguments to its config and leaves finishing it to the script.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from gpuwatch import client


class GpuwatchCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]  # Any without transformers' types
    """Log a Trainer's run to gpuwatch; `url`, `token` and other options go to `gpuwatch.client.Run`."""

    def __init__(self, run: str | None = None, **options: Any) -> None:
        self._name = run
        self._options = options
        self.run: client.Run | None = None
        self._owns_run = False
        self._save_started: float | None = None

    def _clock(self) -> float:
        return self.run.monotonic() if self.run is not None else 0.0

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        if self.run is not None and self._owns_run and not self.run.is_finished:
            self.run.finish(status="ok")
        config: dict[str, Any] = dict(args.to_dict())
        model_config = getattr(model, "config", None)
        if model_config is not None and hasattr(model_config, "to_dict"):
            config["model_config"] = model_config.to_dict()
        active = client.active_run()
        if active is not None and self._name in (None, active.name):
            self.run, self._owns_run = active, False
            self.run.config.update(config)
            return
        name = self._name or client.env_setting("GPUWATCH_RUN") or getattr(args, "run_name", None)
        self.run = client.init(
            run=name, total_steps=int(state.max_steps) or None, config=config, **self._options
        )
        self._owns_run = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None and control.should_save:
            self._save_started = self._clock()  # logging and evaluation come first: they restart it

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.run is None or not logs:
            return
        self.run.log({k: v for k, v in logs.items() if _is_number(v)}, step=int(state.global_step))
        if self._save_started is not None:
            self._save_started = self._clock()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._save_started is not None:
            self._save_started = self._clock()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is None or self._save_started is None:
            return
        seconds = self._clock() - self._save_started
        self._save_started = None
        self.run.log({"checkpoint_seconds": seconds}, step=int(state.global_step))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None and self._owns_run:
            self.run.finish(status="ok")
        elif self.run is not None:
            self.run.flush(timeout_s=10.0)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
