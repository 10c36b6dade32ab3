"""The demo's training run: a fine-tuning job that logs through the SDK (`gpuwatch.client`) each tick,
saves checkpoints now and then, and writes a trainer's text log that gpuwatch tails (demo.py runs it)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import random
from pathlib import Path
from typing import IO, Any

from gpuwatch import client
from gpuwatch.collect.logconfig import LogFileConfig
from gpuwatch.core.clock import Clock
from gpuwatch.demo.incidents import STALL, IncidentSchedule

log = logging.getLogger("gpuwatch.demo.sources")

TRAINING_RUN = "demo-llama-7b-sft"
TRAINING_LOG_JOB = "demo-log"  # the tailed log's figures get their own series next to the SDK's
TRAINING_LOG_MAX_BYTES = 4 * 1024 * 1024  # then the log is rotated to <name>.1, as logrotate would
TRAINING_CONFIG = {"model": "llama-7b", "lr": 3e-4, "batch_size": 16, "seq_len": 2048, "demo": True}


def learning_rate(step: int, total_steps: int) -> float:
    """Return the learning rate at `step`: linear warmup, then cosine decay to a tenth."""
    peak, warmup = 3e-4, max(1, total_steps // 30)
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def mean_loss(step: float, total_steps: int) -> float:
    """Return the loss before noise: falling fast, then slowly."""
    return 1.4 + 1.2 * math.exp(-step / (total_steps / 10)) + 0.3 * (1 - step / total_steps)


def training_log_file(path: Path) -> LogFileConfig:
    """Return the `log_files` entry that tails the demo trainer's log at `path`."""
    return LogFileConfig(
        path=str(path),
        run=TRAINING_RUN,
        patterns=(
            r"\| loss (?P<loss>[0-9.eE+-]+|nan|inf) \|",
            r"\| lr (?P<learning_rate>[0-9.eE+-]+) \|",
            r"\| grad_norm (?P<grad_norm>[0-9.eE+-]+) \|",
        ),
        job=TRAINING_LOG_JOB,
    )


class TrainerLog:
    """The text log a trainer writes (Python logging's default-ish format), rotated past `max_bytes`."""

    def __init__(self, path: Path, clock: Clock, max_bytes: int = TRAINING_LOG_MAX_BYTES) -> None:
        self.path = path
        self.clock = clock
        self.max_bytes = max_bytes
        self._file: IO[str] | None = None

    def write(self, level: str, text: str) -> None:
        """Append one line `<time> - <level> - trainer - <text>`; a disk problem only costs the line."""
        stamp = dt.datetime.fromtimestamp(self.clock.now(), dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S,%f")
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("a", encoding="utf-8")
            self._file.write(f"{stamp[:-3]} - {level} - trainer - {text}\n")
            self._file.flush()
            if self._file.tell() >= self.max_bytes:
                self._file.close()
                self._file = None
                self.path.replace(self.path.with_name(self.path.name + ".1"))
        except OSError as e:
            log.warning("demo: cannot write the training log %s: %s", self.path, e)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TrainingSim:
    """A supervised fine-tuning run logging through the SDK: one step a tick, a checkpoint now and then.

    With `log_path` it also writes the text log a trainer prints (step, loss, lr, grad norm, throughput;
    warnings when gradients are clipped; checkpoint lines), which gpuwatch tails like any `log_files` entry.
    """

    def __init__(
        self,
        url: str,
        rng: random.Random,
        clock: Clock,
        *,
        total_steps: int = 3000,
        checkpoint_every: int = 300,
        checkpoint_ticks: int = 4,
        log_path: Path | None = None,
        incidents: IncidentSchedule | None = None,
        first_step: int = 0,
        **options: Any,
    ) -> None:
        """`first_step`: the step the run is at when this starts (a demo going on from its history)."""
        self.url = url
        self.rng = rng
        self.clock = clock
        self.total_steps = total_steps
        self.checkpoint_every = checkpoint_every
        self.checkpoint_ticks = checkpoint_ticks
        self.options = options
        self.incidents = incidents
        self.run: client.Run | None = None
        self.step = 0
        self._resume_at = first_step
        self.text_log = TrainerLog(log_path, clock) if log_path is not None else None
        self._saving: contextlib.ExitStack | None = None
        self._saving_left = 0

    def _log(self, level: str, text: str) -> None:
        if self.text_log is not None:
            self.text_log.write(level, text)

    def _start(self) -> client.Run:
        self.step, self._resume_at = self._resume_at, 0
        self._log("INFO", "***** Running training *****")
        self._log("INFO", f"  Num steps = {self.total_steps}, batch size = 16, seq len = 2048")
        return client.init(
            run=TRAINING_RUN,
            total_steps=self.total_steps,
            url=self.url,
            config=dict(TRAINING_CONFIG),
            clock=self.clock,
            flush_interval_s=2.0,
            **self.options,
        )

    def learning_rate(self, step: int) -> float:
        """Return the learning rate at `step` (`learning_rate`)."""
        return learning_rate(step, self.total_steps)

    def loss(self, step: int) -> float:
        """Return a loss that falls fast, then slowly, with noise."""
        return max(0.5, mean_loss(step, self.total_steps) + self.rng.gauss(0, 0.04))

    def tick(self) -> None:
        """Train one step (or go on saving a checkpoint); finish and start over at the end.

        While the schedule says the run is stalled (a hung collective), nothing is logged at all."""
        if self.incidents is not None and self.incidents.active(self.clock.now(), STALL) is not None:
            return
        if self.run is None:
            self.run = self._start()
        if self._saving is not None:
            self._saving_left -= 1
            if self._saving_left <= 0:
                self._saving.close()  # logs training_checkpoint_seconds
                self._saving = None
            return
        self.step += 1
        grad_norm = abs(self.rng.gauss(0.9, 0.15)) * (
            self.rng.uniform(3, 6) if self.rng.random() < 0.01 else 1.0
        )
        loss, lr = self.loss(self.step), self.learning_rate(self.step)
        tokens = int(16 * 2048 * self.rng.uniform(0.95, 1.05))
        self.run.log({"loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens": tokens}, step=self.step)
        self._log(
            "INFO",
            f"step {self.step}/{self.total_steps} | loss {loss:.4f} | lr {lr:.4e} | grad_norm {grad_norm:.3f} "
            f"| {tokens} tokens",
        )
        if grad_norm > 2.5:
            self._log("WARNING", f"grad_norm {grad_norm:.2f} exceeds max_grad_norm 1.0; gradients clipped")
        if self.step >= self.total_steps:
            self._log("INFO", f"Training completed. Final loss {loss:.4f}")
            self.run.finish(status="ok", timeout_s=2.0)
            self.run = None
        elif self.step % self.checkpoint_every == 0:
            self._log(
                "INFO", f"Saving model checkpoint to /checkpoints/{TRAINING_RUN}/checkpoint-{self.step}"
            )
            self._saving = contextlib.ExitStack()
            self._saving.enter_context(self.run.checkpoint())
            self._saving_left = self.checkpoint_ticks

    def close(self) -> None:
        """Finish the run (status `ok`); what the server does not take within a second is dropped."""
        if self._saving is not None:
            self._saving.close()
            self._saving = None
        if self.run is not None:
            self.run.finish(status="ok", timeout_s=1.0)
            self.run = None
        if self.text_log is not None:
            self.text_log.close()
