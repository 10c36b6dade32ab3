"""End to end: `gpuwatch serve --demo` scrapes its simulated vLLM and SGLang servers, gets the training
run and tails its log."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import Server, wait_until

pytestmark = pytest.mark.slow


def query(srv: Server, q: str) -> list[dict[str, Any]]:
    body = srv.get("/api/v1/query", params={"query": q}).json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def demo_run(srv: Server) -> dict[str, Any] | None:
    runs = {r["run"]: r for r in srv.get("/api/v1/runs").json()["data"]}
    return runs.get("demo-llama-7b-sft")


def test_demo_sources_are_scraped_and_pushed(serve) -> None:  # type: ignore[no-untyped-def]
    srv = serve("--demo")

    def up(job: str) -> bool:
        return [r["value"][1] for r in query(srv, f'up{{job="{job}"}}')] == ["1"]

    wait_until(lambda: up("demo-vllm") and up("demo-sglang"), 30, f"demo targets not up; log:\n{srv.log}")
    (running,) = query(srv, "vllm:num_requests_running")
    assert running["metric"]["job"] == "demo-vllm" and running["metric"]["engine"] == "0"
    assert query(srv, "sglang:num_queue_reqs")[0]["metric"]["job"] == "demo-sglang"
    targets = srv.get("/api/v1/targets").json()["data"]["activeTargets"]
    assert sorted(t["labels"]["job"] for t in targets) == ["demo-sglang", "demo-vllm"]

    def trained() -> bool:
        run = demo_run(srv)
        return run is not None and (run["last_step"] or 0) > 0

    wait_until(trained, 30, f"the demo training run did not arrive; log:\n{srv.log}")
    run = demo_run(srv)
    assert run is not None and run["total_steps"] > run["last_step"] and run["status"] == "running"
    assert run["gpus"] == ["0", "4", "5", "7"]  # the simulated training job's GPUs of the 8
    wait_until(lambda: query(srv, 'training_loss{run="demo-llama-7b-sft"}') != [], 30, "no training_loss")

    # The trainer's text log, tailed by the `logs` job: stored lines and figures of their own.
    def logged() -> list[dict[str, Any]]:
        return list(srv.get("/api/v1/logs", params={"run": "demo-llama-7b-sft"}).json()["data"])

    wait_until(lambda: any(" - trainer - step " in line["text"] for line in logged()), 30, "no log lines")
    assert {line["file"] for line in logged()} == {str(srv.data_dir / "demo-logs" / "train.log")}
    wait_until(lambda: query(srv, 'training_loss{job="demo-log"}') != [], 30, "no figures from the log")

    assert srv.stop() == 0
    assert "Traceback" not in srv.log and "ERROR" not in srv.log, srv.log
