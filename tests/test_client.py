"""The training SDK's buffer, backoff and sender, with an injected transport and clock (no server)."""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

import pytest
import requests

from gpuwatch.client import Backoff, Outbox, Run, Sender
from gpuwatch.core.clock import FakeClock
from tests.conftest import wait_until


class FakeTransport:
    """Records requests; answers `status`, or raises while `is_down`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.is_down = False
        self.status = 200
        self.lock = threading.Lock()

    def __call__(self, method: str, url: str, body: Any, timeout: float) -> int:
        if self.is_down:
            raise requests.ConnectionError("connection refused")
        with self.lock:
            self.calls.append((url.rsplit("/api/v1/", 1)[1], body))
        return self.status

    def points(self) -> list[dict[str, Any]]:
        with self.lock:
            return [p for path, body in self.calls if path == "push" for p in body]

    def runs(self) -> list[dict[str, Any]]:
        with self.lock:
            return [body for path, body in self.calls if path == "runs"]


def test_backoff_doubles_to_a_ceiling_and_resets() -> None:
    b = Backoff(initial_s=0.5, max_s=4)
    assert [b.failure() for _ in range(6)] == [0.5, 1, 2, 4, 4, 4]
    b.reset()
    assert b.failure() == 0.5


def test_outbox_drops_oldest_and_commit_survives_drops_in_flight() -> None:
    box = Outbox(3)
    for i in range(5):
        box.put({"i": i})
    assert box.dropped == 2 and len(box) == 3
    upto, points = box.peek(2)
    assert [p["i"] for p in points] == [2, 3]
    box.put({"i": 5})  # drops 2 while 2 and 3 are "in flight"
    box.commit(upto)
    assert [p["i"] for p in box.peek(10)[1]] == [4, 5]


def test_sender_order_batches_and_backoff() -> None:
    t = FakeTransport()
    box = Outbox(100)
    sender = Sender("http://gw/", t, box, backoff=Backoff(1, 8), batch_size=2)
    sender.pending_init = {"run": "r", "action": "init"}
    for i in range(5):
        box.put({"i": i})
    sender.pending_finish = {"run": "r", "action": "finish"}
    t.is_down = True
    assert [sender.send_once() for _ in range(3)] == [1, 2, 4]  # nothing is lost while down
    t.is_down = False
    delays = []
    while (d := sender.send_once()) is not None:
        delays.append(d)
    assert delays == [0, 0, 0, 0]
    assert [path for path, _ in t.calls] == ["runs", "push", "push", "push", "runs"]
    assert [p["i"] for p in t.points()] == [0, 1, 2, 3, 4]
    assert t.calls[-1][1]["action"] == "finish" and sender.is_idle()


def test_sender_drops_what_the_server_refuses_and_retries_5xx() -> None:
    t = FakeTransport()
    box = Outbox(100)
    sender = Sender("http://gw", t, box, backoff=Backoff(1, 8), batch_size=10)
    box.put({"i": 0})
    t.status = 503
    assert sender.send_once() == 1 and len(box) == 1
    t.status = 400
    assert sender.send_once() is None and len(box) == 0 and sender.rejected == 1
    assert sender.last_error == "HTTP 400 from /api/v1/push"


def test_sender_halves_batches_the_server_finds_too_large() -> None:
    t = FakeTransport()
    box = Outbox(100)
    sender = Sender("http://gw", t, box, backoff=Backoff(1, 8), batch_size=8)
    for i in range(8):
        box.put({"i": i})
    t.status = 413
    assert sender.send_once() == 1 and sender.batch_size == 4 and len(box) == 8
    t.status = 200
    while sender.send_once() is not None:
        pass
    assert [len(body) for _, body in t.calls] == [8, 4, 4] and sender.rejected == 0


def test_run_delivers_everything_in_order_then_finish() -> None:
    t = FakeTransport()
    clock = FakeClock(1_790_000_000)
    run = Run("r", url="http://gw", total_steps=100, config={"lr": 1e-3, "f": math.inf, "o": object()},
              transport=t, clock=clock, batch_size=7, flush_interval_s=0.05)  # fmt: skip
    for step in range(20):
        run.log({"loss": 1 / (step + 1), "lr": 0.1, "tokens": 1000})
        clock.advance(2)
    with run.checkpoint():
        clock.advance(3)
    assert run.finish(status="ok", timeout_s=10)
    init, finish = t.runs()
    assert init["action"] == "init" and init["total_steps"] == 100 and init["config"]["f"] == "inf"
    assert finish == {"run": "r", "action": "finish", "status": "ok", "step": 19.0, "time": clock.now()}
    points = t.points()
    assert [p["step"] for p in points] == [*range(20), 19]
    assert points[0]["metrics"] == {"loss": 1.0, "lr": 0.1, "tokens": 1000.0}  # no rate before a 2nd log
    assert points[1]["metrics"]["tokens_per_second"] == 500.0
    assert points[-1]["metrics"] == {"checkpoint_seconds": 3.0}
    assert [p["time"] for p in points] == sorted(p["time"] for p in points)


def test_log_never_raises_and_skips_bad_values() -> None:
    class Bad:
        def __float__(self) -> float:
            raise RuntimeError("tensor on a dead device")

    t = FakeTransport()
    run = Run("r", transport=t, clock=FakeClock(), flush_interval_s=0.05)
    run.log({"loss": "n/a", "x": None, "y": Bad(), "z": float("nan"), "w": float("-inf"), "eval/ok": 1})
    run.log(None)  # type: ignore[arg-type]
    run.log({"loss": 1}, step="ten")  # type: ignore[arg-type]
    assert run.finish(timeout_s=10)
    assert t.points()[0]["metrics"] == {"z": "NaN", "w": "-Inf", "eval_ok": 1.0}
    assert run.invalid_values == 5


def test_log_does_not_block_while_the_server_is_down_and_the_buffer_is_bounded() -> None:
    t = FakeTransport()
    t.is_down = True
    run = Run("r", transport=t, clock=FakeClock(), max_buffer=1000, backoff=Backoff(0.01, 0.05))
    for step in range(20_000):  # a log that waited for the server would never get through these
        run.log({"loss": 1.0}, step=step)
    assert run.pending == 1000 and run.dropped == 19_000
    assert not run.flush(timeout_s=0.2)
    t.is_down = False
    assert run.finish(timeout_s=10)
    assert [p["step"] for p in t.points()] == list(range(19_000, 20_000))


def test_a_failing_transport_bug_does_not_kill_the_thread() -> None:
    calls = []

    def flaky(method: str, url: str, body: Any, timeout: float) -> int:
        calls.append(url)
        if len(calls) < 3:
            raise KeyError("bug")  # not a network error: the loop must survive it
        return 200

    run = Run("r", transport=flaky, clock=FakeClock(), backoff=Backoff(0.01, 0.02), flush_interval_s=0.05)
    run.log({"loss": 1.0})
    wait_until(lambda: run.pending == 0, 10, "the sender thread died")
    assert run.finish(timeout_s=10)


@pytest.mark.parametrize("status", ["ok", "failed"])
def test_finish_is_idempotent(status: str) -> None:
    t = FakeTransport()
    run = Run("r", transport=t, clock=FakeClock())
    assert run.finish(status=status, timeout_s=10) and run.finish(timeout_s=10)
    run.log({"loss": 1})  # after finish: ignored
    assert [r["action"] for r in t.runs()] == ["init", "finish"] and t.runs()[1]["status"] == status


# -- the W&B-style module API, the environment, the process report --------------------------------


@pytest.fixture
def gw(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The module API with a recording transport; no GPUWATCH_* from the developer's shell."""
    import gpuwatch.client as module

    for name in (
        "GPUWATCH_URL",
        "GPUWATCH_RUN",
        "GPUWATCH_TOKEN",
        "CUDA_VISIBLE_DEVICES",
        "TORCHELASTIC_RUN_ID",
    ):
        monkeypatch.delenv(name, raising=False)
    yield module
    module.finish()


def test_module_api_logs_accumulates_with_commit_false_and_updates_config(gw: Any) -> None:
    transport = FakeTransport()
    gw.init(run="wb", config={"lr": 0.1}, transport=transport, clock=FakeClock(1000), flush_interval_s=0.01)
    assert gw.run is not None and gw.run.name == "wb"
    gw.config.update({"batch_size": 8})
    gw.config.optimizer = "adamw"
    assert gw.config["lr"] == 0.1 and gw.config.batch_size == 8
    gw.log({"loss": 2.0}, commit=False)
    gw.log({"acc": 0.5}, commit=False)
    gw.log({"lr": 0.1})  # commits the three at step 0
    gw.log({"loss": 1.5}, step=5, commit=False)
    gw.log({"loss": 1.0}, step=6)  # another step: step 5 goes first
    assert gw.finish(exit_code=1, timeout_s=5)
    assert gw.run is None
    points = [(p["step"], p["metrics"]) for p in transport.points()]
    assert points == [(0, {"loss": 2.0, "acc": 0.5, "lr": 0.1}), (5, {"loss": 1.5}), (6, {"loss": 1.0})]
    inits = [m for m in transport.runs() if m["action"] == "init"]
    assert inits[-1]["config"] == {"lr": 0.1, "batch_size": 8, "optimizer": "adamw"}
    assert transport.runs()[-1] == {**transport.runs()[-1], "action": "finish", "status": "failed"}


def test_module_api_before_init_says_so(gw: Any) -> None:
    with pytest.raises(RuntimeError, match=r"before gpuwatch\.client\.init"):
        gw.log({"loss": 1.0})
    assert gw.finish() is True and gw.run is None


def test_environment_names_the_server_run_and_token(gw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str | None]] = []

    class Session(requests.Session):
        def request(self, method: str, url: str, **kw: Any) -> Any:  # type: ignore[override]
            seen.append((url, (kw.get("headers") or {}).get("Authorization")))
            resp = requests.Response()
            resp.status_code = 200
            return resp

    monkeypatch.setenv("GPUWATCH_URL", "http://gpu-node-7:9842")
    monkeypatch.setenv("GPUWATCH_RUN", "job-4711")
    monkeypatch.setenv("GPUWATCH_TOKEN", "s3cret")
    monkeypatch.setattr(requests, "Session", Session)
    run = gw.init(flush_interval_s=0.01)
    assert run.name == "job-4711" and run.url == "http://gpu-node-7:9842"
    assert gw.finish(timeout_s=5)
    assert seen and all(s == ("http://gpu-node-7:9842/api/v1/runs", "Bearer s3cret") for s in seen)
    explicit = Run("mine", url="http://other:1", transport=FakeTransport(), report_process=False)
    assert explicit.name == "mine" and explicit.url == "http://other:1"  # arguments win over the environment
    explicit.finish(timeout_s=5)


def test_init_reports_the_process_and_visible_devices(gw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    transport = FakeTransport()
    gw.init(run="ddp", transport=transport, flush_interval_s=0.01)
    gw.finish(timeout_s=5)
    init = transport.runs()[0]
    assert init["process"] == {
        "pid": os.getpid(),
        "launcher_pid": os.getppid(),
        "cuda_visible_devices": "2,3",
    }
    assert init["gpus"] == ["2", "3"]
    assert gw.declared_gpus({"cuda_visible_devices": "2,3", "cuda_device": 1}) == ["3"]
    assert gw.declared_gpus({"cuda_device": 0}) == ["0"] and gw.declared_gpus({}) is None


def test_a_run_without_a_name_gets_the_script_and_time(gw: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/work/jobs/train.py", "--lr", "3e-4"])
    run = gw.init(transport=FakeTransport(), clock=FakeClock(1_790_000_000), report_process=False)
    assert run.name == "train-20260921-141320", run.name  # the script's name, the start in UTC


def test_an_uncaught_exception_finishes_the_run_failed(gw: Any) -> None:
    import sys

    transport = FakeTransport()
    before = sys.excepthook
    run = Run("crash", transport=transport, flush_interval_s=0.01, exit_timeout_s=5, report_process=False)
    try:
        raise RuntimeError("CUDA out of memory")
    except RuntimeError as exc:
        calls: list[type[BaseException]] = []
        run._previous_hook = lambda kind, value, tb: calls.append(kind)  # instead of printing it
        sys.excepthook(type(exc), exc, exc.__traceback__)
    assert calls == [RuntimeError] and sys.excepthook != run._excepthook  # restored
    assert transport.runs()[-1]["status"] == "failed" and run.is_finished
    sys.excepthook = before


@pytest.mark.slow
def test_the_sdk_imports_nothing_of_the_server() -> None:
    """It ships into training jobs with only `requests`: no Flask, DuckDB, numpy or YAML."""
    import subprocess
    import sys

    code = (
        "import sys, gpuwatch.client\n"
        "bad = sorted({m.split('.')[0] for m in sys.modules} & {'flask', 'duckdb', 'numpy', 'yaml', 'torch'})\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
