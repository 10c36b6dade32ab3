"""Tailed logs through the runtime: stored lines and offsets, resume after a restart, retention, the API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher
from gpuwatch.demo.nvml import FakeNvml

LOSS = r"step (?P<step>\d+).*loss[:=] ?(?P<loss>[0-9.eE+-]+)"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_790_000_000)


def open_runtime(tmp_path: Path, clock: FakeClock, **extra: object) -> Runtime:
    overrides: dict[str, object] = {"data_dir": str(tmp_path / "data"), "demo": True}
    overrides.update(extra)
    settings = load(None, {}, overrides)
    nvml = FakeNvml(gpu_count=1, clock=clock, blocking_event_wait=False)
    return build_runtime(settings, "node-1", clock=clock, nvml=nvml)


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    return d


def log_files(logdir: Path) -> list[dict[str, object]]:
    return [{"path": str(logdir / "*.log"), "patterns": [LOSS], "job": "sft"}]


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock, logdir: Path) -> Iterator[Runtime]:
    rt = open_runtime(tmp_path, clock, log_files=log_files(logdir))
    yield rt
    rt.close()


def stored_texts(rt: Runtime) -> list[str]:
    return [x.text for x in reversed(rt.store.log_lines(limit=5000))]


def test_logs_job_is_registered_only_when_configured(tmp_path: Path, clock: FakeClock) -> None:
    rt = open_runtime(tmp_path, clock, demo_sources=False)
    try:
        assert "logs" not in rt.jobs.names()
    finally:
        rt.close()
    rt = open_runtime(tmp_path, clock)  # the demo's training run writes a log of its own
    try:
        assert "logs" in rt.jobs.names()
    finally:
        rt.close()


def test_lines_and_figures_are_stored(runtime: Runtime, clock: FakeClock, logdir: Path) -> None:
    (logdir / "llama.log").write_text("step 1 loss: 2.5\nstep 2 loss: 2.0\nERROR: CUDA out of memory\n")
    assert runtime.jobs.run("logs")
    runtime.store.flush()
    assert stored_texts(runtime) == ["step 1 loss: 2.5", "step 2 loss: 2.0", "ERROR: CUDA out of memory"]
    now = clock.now_ms()
    (loss,) = runtime.store.select([Matcher("__name__", "=", "training_loss")], now - 60_000, now)
    assert dict(loss.labels) == {"run": "llama", "job": "sft"}
    assert loss.values.tolist() == [2.5, 2.0]
    (step,) = runtime.store.select([Matcher("__name__", "=", "training_step")], now - 60_000, now)
    assert step.values.tolist() == [1.0, 2.0]
    (oom,) = runtime.store.select(
        [Matcher("__name__", "=", "gpuwatch_log_events_total"), Matcher("kind", "=", "cuda_oom")],
        now - 1,
        now,
    )
    assert oom.values.tolist() == [1.0]


def test_resume_after_restart_reads_nothing_twice(tmp_path: Path, clock: FakeClock, logdir: Path) -> None:
    log = logdir / "run.log"
    log.write_text("a\nb\nhalf")
    rt = open_runtime(tmp_path, clock, log_files=log_files(logdir))
    rt.jobs.run("logs")
    rt.close()
    with log.open("a") as f:
        f.write(" done\nc\n")
    clock.advance(10)
    rt = open_runtime(tmp_path, clock, log_files=log_files(logdir))
    try:
        rt.jobs.run("logs")
        clock.advance(1)
        rt.jobs.run("logs")
        assert stored_texts(rt) == ["a", "b", "half done", "c"]
    finally:
        rt.close()


def test_retention_drops_old_lines(runtime: Runtime, clock: FakeClock, logdir: Path) -> None:
    (logdir / "old.log").write_text("old\n")
    runtime.jobs.run("logs")
    clock.advance(runtime.settings.retention + 60)
    with (logdir / "old.log").open("a") as f:
        f.write("new\n")
    runtime.jobs.run("logs")
    runtime.jobs.run("retention")
    assert stored_texts(runtime) == ["new"]


def test_logs_api(runtime: Runtime, client: FlaskClient, clock: FakeClock, logdir: Path) -> None:
    (logdir / "a.log").write_text("INFO step 1 loss: 3.0\nWARNING slow <b>step</b>\n")
    (logdir / "b.log").write_text("ERROR boom\n")
    runtime.jobs.run("logs")
    body = client.get("/api/v1/logs").get_json()
    assert body["status"] == "success"
    data = body["data"]
    assert len(data) == 3 and data[0]["time"] >= data[-1]["time"]
    assert {d["text"] for d in data} == {"INFO step 1 loss: 3.0", "WARNING slow <b>step</b>", "ERROR boom"}
    assert [d["text"] for d in client.get("/api/v1/logs?run=a").get_json()["data"]] == [
        "WARNING slow <b>step</b>",
        "INFO step 1 loss: 3.0",
    ]
    assert [d["file"] for d in client.get("/api/v1/logs?level=error").get_json()["data"]] == [
        str(logdir / "b.log")
    ]
    assert [d["level"] for d in client.get("/api/v1/logs?q=SLOW").get_json()["data"]] == ["WARN"]
    assert len(client.get("/api/v1/logs?limit=1").get_json()["data"]) == 1
    now = clock.now()
    assert client.get(f"/api/v1/logs?start={now + 10}").get_json()["data"] == []
    assert len(client.get(f"/api/v1/logs?start={now - 10}&end={now}").get_json()["data"]) == 3
    for bad in ("limit=0", "limit=5001", "limit=x", "level=LOUD", "start=yesterday"):
        r = client.get(f"/api/v1/logs?{bad}")
        assert r.status_code == 400 and r.get_json()["status"] == "error", bad
