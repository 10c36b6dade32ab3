"""The training SDK against a real `gpuwatch serve --demo`, including one that goes away and comes back."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

import gpuwatch.client
from gpuwatch.client import Backoff
from tests.conftest import Server, clean_env, free_port, wait_until

pytestmark = pytest.mark.slow


def steps(server: Server, run: str, name: str = "training_step") -> list[tuple[float, float]]:
    resp = server.get("/api/v1/query", params={"query": f'{name}{{run="{run}"}}[1h]'})
    assert resp.status_code == 200, resp.text
    result = resp.json()["data"]["result"]
    assert len(result) <= 1, result
    return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []


def runs(server: Server) -> dict[str, dict[str, Any]]:
    return {r["run"]: r for r in server.get("/api/v1/runs").json()["data"]}


def test_sdk_logs_a_run_end_to_end(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve("--demo")
    run = gpuwatch.client.init(
        run="llama-7b-sft",
        total_steps=100,
        url=server.url,
        config={"lr": 3e-4},
        gpus="0,1",
        flush_interval_s=0.1,
    )
    for step in range(50):
        run.log({"loss": 3.0 - step / 50, "lr": 3e-4, "grad_norm": 1.5, "tokens": 4096}, step=step)
    with run.checkpoint():
        pass
    assert run.finish(status="ok", timeout_s=30), run.last_error
    wait_until(
        lambda: len(steps(server, "llama-7b-sft", "training_loss")) == 50, 30, "training_loss did not arrive"
    )
    loss = steps(server, "llama-7b-sft", "training_loss")
    assert [v for _, v in loss] == pytest.approx([3.0 - s / 50 for s in range(50)])
    assert steps(server, "llama-7b-sft", "training_checkpoint_seconds")
    assert steps(server, "llama-7b-sft", "training_throughput_tokens_per_second")
    info = runs(server)["llama-7b-sft"]
    assert info["status"] == "ok" and info["last_step"] == 49 and info["total_steps"] == 100
    assert info["progress"] == 0.49 and info["gpus"] == ["0", "1"] and info["config"] == {"lr": 3e-4}
    assert info["end"] is not None and info["eta_seconds"] is None


def test_sdk_survives_a_server_restart(tmp_path: Path) -> None:
    port, data_dir = free_port(), tmp_path / "data"
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.5s")
    first = Server(["--demo"], data_dir, port, env).start()
    second: Server | None = None
    try:
        run = gpuwatch.client.init(
            run="r",
            total_steps=40,
            url=first.url,
            flush_interval_s=0.1,
            backoff=Backoff(0.05, 0.5),
            timeout_s=5,
        )
        for step in range(20):
            run.log({"loss": float(step)}, step=step)
        assert run.flush(30), run.last_error
        assert first.stop(signal.SIGTERM) == 0
        for step in range(20, 40):  # the server is away: log must neither block nor raise
            run.log({"loss": float(step)}, step=step)
        wait_until(lambda: run.last_error is not None, 30, "the client never noticed the server was away")
        assert run.pending == 20
        second = Server(["--demo"], data_dir, port, env).start()
        assert run.finish(status="ok", timeout_s=60), run.last_error
        assert run.dropped == 0 and run.rejected == 0
        wait_until(lambda: len(steps(second, "r")) == 40, 30, "the steps logged while away did not arrive")
        got = steps(second, "r")
        assert [v for _, v in got] == [float(s) for s in range(40)]  # once each, in order
        times = [t for t, _ in got]
        assert times == sorted(times) and len(set(times)) == 40
        info = runs(second)["r"]
        assert (
            info["status"] == "ok" and info["last_step"] == 39 and info["progress"] == pytest.approx(39 / 40)
        )
    finally:
        for srv in (first, second):
            if srv is not None and srv.proc is not None:
                srv.stop(signal.SIGKILL)
