"""The training SDK: log a run's metrics to gpuwatch from a training loop. Needs only `requests`.

The W&B-style module API (one current run, as `wandb` has):

    import gpuwatch.client as gw

    gw.init(run="llama-7b-sft", total_steps=10000, config={"lr": 3e-4})  # url/run/token from GPUWATCH_*
    gw.config.update({"batch_size": 64})
    for step in range(10000):
        gw.log({"loss": train_step()}, step=step)
    gw.finish()

or the run object:

    import gpuwatch.client

    run = gpuwatch.client.init(run="llama-7b-sft", total_steps=10000, url="http://127.0.0.1:9842",
                               config={"lr": 3e-4, "batch_size": 64})
    for step in range(10000):
        loss = train_step()
        run.log({"loss": loss, "lr": sched.get_last_lr()[0], "grad_norm": norm, "tokens": n_tokens}, step=step)
        if step % 1000 == 0:
            with run.checkpoint():
                save(model)
    run.finish(status="ok")

`log` never blocks and never raises into the training loop: it converts the values to floats, stamps
the time and puts the point in a bounded buffer. A background thread sends the buffer in batches
(`POST /api/v1/push`) in order; while the server is away it retries with exponential backoff, and when
the buffer is full the oldest points are dropped and counted (`Run.dropped`). Points carry their own
timestamps, so a batch sent twice (a retry after a lost answer) is stored once. The buffer is flushed on
`finish` and at interpreter exit (`atexit`, for at most `exit_timeout_s`).

Names: `loss` -> `training_loss`, `lr` -> `training_learning_rate`, `grad_norm` -> `training_grad_norm`,
anything else `x` -> `training_x` (characters a metric name cannot hold become `_`: `eval/loss` ->
`training_eval_loss`). `tokens` (or `samples`), counted since the previous `log`, also give
`tokens_per_second` (`samples_per_second`) -> `training_throughput_tokens_per_second`.

Where arguments are left out, `GPUWATCH_URL`, `GPUWATCH_RUN` and `GPUWATCH_TOKEN` give the server, the
run's name and the bearer token, so a job scheduler can point a script at gpuwatch without editing it.
The SDK runs in the user's process, not gpuwatch's: it reads its own environment (ruff TID251 is waived
for this module). `init` also reports the process (pid, a torchrun launcher's pid, CUDA_VISIBLE_DEVICES,
torch's current device when torch is imported and CUDA initialised), which gpuwatch joins with NVML's
process table to find the GPUs the run used.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import logging
import math
import re
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from gpuwatch.client.runmeta import RunConfig, declared_gpus, env_setting, process_report
from gpuwatch.client.sender import Backoff, Outbox, Sender, Transport, requests_transport
from gpuwatch.core.clock import Clock, SystemClock

__all__ = [
    "Backoff",
    "Outbox",
    "Run",
    "RunConfig",
    "Sender",
    "active_run",
    "config",
    "declared_gpus",
    "env_setting",
    "finish",
    "init",
    "log",
    "process_report",
    "requests_transport",
]

logger = logging.getLogger("gpuwatch.client")  # not `log`: that is the W&B-style function

DEFAULT_URL = "http://127.0.0.1:9842"

_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_:]")


def metric_name(key: str) -> str:
    """Make a logged key a valid metric name (`eval/loss` -> `eval_loss`), so the server never refuses it.

    TensorBoard tags are made metric names the same way (gpuwatch.collect.tensorboard)."""
    name = _INVALID_NAME_CHARS.sub("_", key)[:150] or "_"
    return "_" + name if name[0].isdigit() else name


def _json_number(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def default_run_name(now: float) -> str:
    """A name for a run nobody named: the script's name and the start time (`train-20260101-120000`)."""
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] not in ("", "-c") else ""
    stamp = dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{metric_name(script or 'run')}-{stamp}"


class Run:
    """A training run being logged; create it with `init`."""

    def __init__(
        self,
        name: str | None = None,
        *,
        url: str | None = None,
        total_steps: int | None = None,
        config: Mapping[str, Any] | None = None,
        gpus: list[Any] | str | None = None,
        token: str | None = None,
        transport: Transport | None = None,
        clock: Clock | None = None,
        flush_interval_s: float = 1.0,
        max_buffer: int = 100_000,
        batch_size: int = 500,
        timeout_s: float = 10.0,
        backoff: Backoff | None = None,
        exit_timeout_s: float = 10.0,
        report_process: bool = True,
        fail_on_exception: bool = True,
    ) -> None:
        """`name`, `url` and `token` default to GPUWATCH_RUN, GPUWATCH_URL and GPUWATCH_TOKEN (then a
        generated name, http://127.0.0.1:9842 and no token). With `fail_on_exception`, an exception
        that ends the script finishes the run as `failed` (a `sys.excepthook` that calls the previous one)."""
        self._clock = clock or SystemClock()
        self.name = name or env_setting("GPUWATCH_RUN") or default_run_name(self._clock.now())
        self.url = url or env_setting("GPUWATCH_URL") or DEFAULT_URL
        token = token or env_setting("GPUWATCH_TOKEN")
        self._outbox = Outbox(max_buffer)
        self._sender = Sender(
            self.url,
            transport or requests_transport(token=token),
            self._outbox,
            backoff=backoff,
            batch_size=batch_size,
            timeout_s=timeout_s,
        )
        self._flush_interval_s = flush_interval_s
        self._batch_size = batch_size
        self._exit_timeout_s = exit_timeout_s
        self._cond = threading.Condition()
        self._urgent = False
        self._closing = False
        self._finished = False
        self._next_step = 0
        self._last_step: float | None = None  # the step of the latest log
        self._last_log_time: float | None = None
        self._last_ms = 0
        self._pending: dict[str, Any] = {}  # `log(..., commit=False)` accumulates here
        self._pending_step: int | None = None
        self.invalid_values = 0
        if isinstance(gpus, str):
            gpus = [g.strip() for g in gpus.split(",") if g.strip()]
        process = process_report() if report_process else None
        if gpus is None and process is not None:
            gpus = declared_gpus(process)
        self._init_message: dict[str, Any] = {
            "run": self.name,
            "action": "init",
            "total_steps": total_steps,
            "config": _jsonable(dict(config)) if config is not None else None,
            "host": socket.gethostname(),
            "gpus": gpus,
            "time": round(self._clock.now(), 3),
        }
        if process is not None:
            self._init_message["process"] = process
        self._sender.pending_init = dict(self._init_message)
        self.config = RunConfig(config, self._config_changed)
        self._thread = threading.Thread(target=self._loop, name=f"gpuwatch-client-{self.name}", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)
        self._previous_hook: Any = None
        if fail_on_exception:
            self._previous_hook = sys.excepthook
            sys.excepthook = self._excepthook

    def _excepthook(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        """An uncaught exception ends the script: the run failed."""
        with contextlib.suppress(Exception):
            self.finish(status="failed", timeout_s=self._exit_timeout_s)
        (self._previous_hook or sys.__excepthook__)(kind, value, tb)

    def _restore_hook(self) -> None:
        if self._previous_hook is not None and sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_hook

    def _config_changed(self, config: dict[str, Any]) -> None:
        """Send the whole config again (an init of a running run replaces its config, keeps its start)."""
        if self._finished:
            return
        self._init_message["config"] = _jsonable(config)
        self._sender.pending_init = dict(self._init_message)
        with self._cond:
            self._cond.notify_all()

    # -- what the training loop calls ---------------------------------------------------------------

    def log(self, metrics: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        """Queue one step's metrics; never blocks, never raises (bad values are skipped and counted).

        As in W&B, `commit=False` keeps the metrics for the step and sends them with the next `log`
        that commits; a `step` other than the one kept sends what was kept first, at its own step.
        """
        try:
            if self._pending and step is not None and step != self._pending_step:
                self._commit_pending()
            if commit is False:
                if not self._pending:
                    self._pending_step = step if step is not None else self._next_step
                self._pending.update(metrics)
                return
            if self._pending:
                merged = {**self._pending, **metrics}
                step = self._pending_step if step is None else step
                self._pending, self._pending_step = {}, None
                metrics = merged
            self._log(metrics, step)
        except Exception:  # noqa: BLE001 - the training loop must never see our trouble
            self.invalid_values += 1

    def _commit_pending(self) -> None:
        pending, step = self._pending, self._pending_step
        self._pending, self._pending_step = {}, None
        self._log(pending, step)

    def _log(self, metrics: Mapping[str, Any], step: int | None) -> None:
        if self._finished:
            return
        now = self._clock.now()
        number = float(self._next_step if step is None else step)
        step_json: int | float = int(number) if number.is_integer() else number
        values: dict[str, float | str] = {}
        for key, raw in metrics.items():
            try:
                value = float(raw)
            except Exception:  # noqa: BLE001 - a tensor's __float__ may raise anything; skip just this value
                self.invalid_values += 1
                continue
            values[metric_name(str(key))] = _json_number(value)
        elapsed = now - self._last_log_time if self._last_log_time is not None else None
        for count, rate in (("tokens", "tokens_per_second"), ("samples", "samples_per_second")):
            n = values.get(count)
            if isinstance(n, float) and rate not in values and elapsed and elapsed > 0:
                values[rate] = _json_number(n / elapsed)
        self._last_log_time = now
        # Stored timestamps are milliseconds and a repeated one overwrites: keep them strictly rising.
        t_ms = max(int(round(now * 1000)), self._last_ms + 1)
        self._last_ms = t_ms
        point = {"run": self.name, "step": step_json, "time": t_ms / 1000, "metrics": values}
        self._last_step = number
        self._next_step = int(number) + 1
        if self._outbox.put(point) >= self._batch_size:
            with self._cond:
                self._cond.notify_all()

    @contextlib.contextmanager
    def checkpoint(self) -> Iterator[None]:
        """Time the block (saving a checkpoint) and log it as `training_checkpoint_seconds`."""
        start = self._clock.monotonic()
        yield
        seconds = self._clock.monotonic() - start
        self.log({"checkpoint_seconds": seconds}, step=int(self._last_step or 0))

    def finish(self, status: str = "ok", timeout_s: float = 30.0) -> bool:
        """Mark the run finished (`ok` or `failed`), send what is buffered; True if all arrived in time."""
        if self._finished:
            return self._sender.is_idle()
        if self._pending:
            with contextlib.suppress(Exception):
                self._commit_pending()
        self._sender.pending_finish = {
            "run": self.name,
            "action": "finish",
            "status": status,
            "step": self._last_step,
            "time": round(self._clock.now(), 3),
        }
        self._finished = True
        delivered = self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        atexit.unregister(self._at_exit)
        self._restore_hook()
        return delivered

    @property
    def is_finished(self) -> bool:
        return self._finished

    def monotonic(self) -> float:
        """The run's clock's monotonic seconds (integrations time things with it)."""
        return self._clock.monotonic()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything logged so far is sent (or `timeout_s` passes); True if it was."""
        with self._cond:
            self._urgent = True
            self._cond.notify_all()
            return self._cond.wait_for(self._sender.is_idle, timeout_s)

    @property
    def dropped(self) -> int:
        """Points dropped because the buffer was full while the server was away."""
        return self._outbox.dropped

    @property
    def rejected(self) -> int:
        """Points (or init/finish messages) the server refused with a 4xx answer."""
        return self._sender.rejected

    @property
    def pending(self) -> int:
        """Points waiting to be sent."""
        return len(self._outbox)

    @property
    def last_error(self) -> str | None:
        return self._sender.last_error

    # -- the background thread ----------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            try:
                delay = self._sender.send_once()
            except Exception as exc:  # noqa: BLE001 - the sender thread must outlive any bug; retry later
                self._sender.last_error = f"{type(exc).__name__}: {exc}"
                delay = self._sender.backoff.failure()
            with self._cond:
                self._cond.notify_all()  # flush() waiters re-check
                if delay is None:
                    is_idle = self._sender.is_idle()
                    if is_idle:
                        self._urgent = False
                        if self._closing:
                            return
                    if not self._urgent and len(self._outbox) < self._batch_size:
                        self._cond.wait(self._flush_interval_s)
                elif delay > 0:
                    if self._closing:
                        return
                    self._cond.wait(delay)

    def _at_exit(self) -> None:
        if not self.flush(self._exit_timeout_s):
            logger.warning(
                "gpuwatch: %d points of run %s were not delivered before exit (%s)",
                self.pending,
                self.name,
                self.last_error,
            )


def _jsonable(value: Any) -> Any:
    """Make a config JSON-safe: unknown objects become strings, NaN/Inf become strings."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


# The module-level API's one current run, as `wandb.run`: a deliberate exception to gpuwatch's "no
# globals" rule, for the user's training script (the SDK is a library in their process, not part of
# gpuwatch's object graph). It is this one variable; everything else lives on the Run.
_current: Run | None = None


def init(
    run: str | None = None,
    total_steps: int | None = None,
    url: str | None = None,
    config: Mapping[str, Any] | None = None,
    **options: Any,
) -> Run:
    """Start logging a training run and make it the current run of `log`, `finish` and `config`.

    `run`, `url` and the `token` option default to GPUWATCH_RUN, GPUWATCH_URL, GPUWATCH_TOKEN; see `Run`
    for the other options. A run that was current before goes on (its `Run` object still logs and
    finishes it), so two runs can log side by side as before the module API existed.
    """
    global _current  # the module API's one current run (see above)
    _current = Run(run, url=url, total_steps=total_steps, config=config, **options)
    return _current


def active_run() -> Run | None:
    """The current run while it is not finished (integrations log into it rather than start another)."""
    return _current if _current is not None and not _current.is_finished else None


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    """Log to the current run (`Run.log`): `step=`, and `commit=False` to accumulate, as in W&B."""
    if _current is None:
        raise RuntimeError("gpuwatch.client.log() called before gpuwatch.client.init()")
    _current.log(data, step=step, commit=commit)


def finish(status: str = "ok", exit_code: int | None = None, timeout_s: float = 30.0) -> bool:
    """Finish the current run (`exit_code` other than 0 means `failed`); True if everything arrived."""
    global _current  # the module API's one current run (see above)
    current, _current = _current, None
    if current is None:
        return True
    if exit_code is not None:
        status = "ok" if exit_code == 0 else "failed"
    return current.finish(status=status, timeout_s=timeout_s)


class _CurrentConfig(MutableMapping[str, Any]):
    """`gpuwatch.client.config`: the current run's `RunConfig` (as `wandb.config`); holds no state."""

    @staticmethod
    def _config() -> RunConfig:
        if _current is None:
            raise RuntimeError("gpuwatch.client.config used before gpuwatch.client.init()")
        return _current.config

    def __getitem__(self, key: str) -> Any:
        return self._config()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._config()[key] = value

    def __delitem__(self, key: str) -> None:
        del self._config()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._config())

    def __len__(self) -> int:
        return len(self._config())

    def update(self, other: Any = (), /, **kw: Any) -> None:
        self._config().update(other, **kw)

    def __getattr__(self, key: str) -> Any:
        return getattr(self._config(), key)

    def __setattr__(self, key: str, value: Any) -> None:
        self._config()[key] = value


config: MutableMapping[str, Any] = _CurrentConfig()


def __getattr__(name: str) -> Any:
    """`gpuwatch.client.run`: the current run (None before `init` and after `finish`), as `wandb.run`."""
    if name == "run":
        return _current
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
