"""Which GPUs a training run used (the SDK's process report joined with NVML's process table, the
run's child processes included), its energy from the GPUs' counters, its cost, and per-user usage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.collect.proctree import parse_ppid, with_descendants
from gpuwatch.collect.runenergy import held_stretches, increase_within
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher, SeriesData, make_labels
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.web import create_app

DEMO_GPUS = 4  # mixed roles: 0 training, 1 inference, 2 idle, 3 warming up


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock, nvml: FakeNvml) -> Iterator[Runtime]:
    settings = load(
        None,
        {},
        {"data_dir": str(tmp_path / "data"), "demo": True, "energy_price_per_kwh": 0.25},
    )
    rt = build_runtime(settings, "node-1", clock=clock, nvml=nvml)
    yield rt
    rt.close()


@pytest.fixture
def client(runtime: Runtime) -> FlaskClient:
    return create_app(runtime).test_client()


def write_stat(root: Path, pid: int, comm: str, ppid: int) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 0 0\n")


def run_for(runtime: Runtime, clock: FakeClock, seconds: int) -> None:
    """Sample the GPUs every second and run the runs job every 15 s, as `serve` does."""
    for i in range(seconds):
        clock.advance(1)
        runtime.sample()
        if i % 15 == 0:
            runtime.store.flush()
            runtime.sample_runs()
    runtime.store.flush()


def info(runtime: Runtime, clock: FakeClock, run: str) -> set[tuple[str, str, str]]:
    found = runtime.store.select_last(
        [Matcher("__name__", "=", "gpuwatch_run_gpu_info"), Matcher("run", "=", run)],
        clock.now_ms() - 60_000,
        clock.now_ms(),
    )
    return {(s.label_dict()["Hostname"], s.label_dict()["gpu"], s.label_dict()["UUID"]) for s in found}


def runs(client: FlaskClient) -> dict[str, dict[str, Any]]:
    resp = client.get("/api/v1/runs")
    assert resp.status_code == 200, resp.get_json()
    return {r["run"]: r for r in resp.get_json()["data"]}


def test_ppid_is_read_after_a_comm_with_spaces_and_parentheses() -> None:
    assert parse_ppid("4242 (python (rank 0)) S 4100 4242 4242 0 -1") == 4100
    assert parse_ppid("garbage") is None
    assert with_descendants([10], {11: 10, 12: 11, 13: 1, 14: 12}) == {10, 11, 12, 14}


def test_a_torchrun_launcher_s_worker_on_a_gpu_maps_the_run_to_it(
    runtime: Runtime, clock: FakeClock, nvml: FakeNvml, client: FlaskClient
) -> None:
    assert runtime.run_gpus is not None
    root = runtime.run_gpus.proc_root
    worker = nvml.workload.pid_of(0)  # the simulated training process on GPU 0
    write_stat(root, 777, "torchrun", 1)
    write_stat(root, worker, "python", 777)  # a worker of the launcher the run reports
    body = {
        "run": "ddp",
        "action": "init",
        "host": "NODE-1.lab.example",
        "process": {"pid": 778, "launcher_pid": 777},
    }
    assert client.post("/api/v1/runs", json=body).status_code == 200
    run_for(runtime, clock, 31)
    uuid0 = runtime.gpu.gpus[0].uuid if runtime.gpu else ""
    assert info(runtime, clock, "ddp") == {("node-1", "0", uuid0)}
    assert "gpuwatch_run_gpu_info{" in runtime.exposition()


def test_a_run_that_names_its_gpus_gets_their_energy_and_cost(
    runtime: Runtime, clock: FakeClock, client: FlaskClient
) -> None:
    body = {"run": "sft", "action": "init", "host": "node-1", "gpus": ["1", "GPU-nonexistent"]}
    assert client.post("/api/v1/runs", json=body).status_code == 200
    run_for(runtime, clock, 140)
    assert client.post("/api/v1/runs", json={"run": "sft", "action": "finish"}).status_code == 200
    end_ms = clock.now_ms()
    run_for(runtime, clock, 60)  # the run has finished: its GPU keeps drawing power, not charged to it
    assert {g for _, g, _ in info(runtime, clock, "sft")} == set()  # no longer running: no info
    got = runs(client)["sft"]
    assert got["gpus"] == ["1", "GPU-nonexistent"]
    # what GPU 1's counter rose by from the first sample (with the first info sample) to the finish
    series = runtime.store.select(
        [Matcher("__name__", "=", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), Matcher("gpu", "=", "1")],
        0,
        end_ms,
    )[0]
    expected_kwh = (float(series.values[-1]) - float(series.values[0])) / 3.6e9
    assert expected_kwh > 0
    assert got["energy_kwh"] == pytest.approx(expected_kwh, rel=0.02)
    assert got["cost"] == pytest.approx(got["energy_kwh"] * 0.25) and got["currency"] == "EUR"
    assert runs(client)["sft"]["energy_kwh"] == got["energy_kwh"]  # a finished run's figure stays


def test_runs_without_gpus_show_no_energy(runtime: Runtime, clock: FakeClock, client: FlaskClient) -> None:
    assert (
        client.post("/api/v1/runs", json={"run": "cpu", "action": "init", "host": "laptop"}).status_code
        == 200
    )
    run_for(runtime, clock, 40)
    got = runs(client)["cpu"]
    assert got["energy_kwh"] is None and got["cost"] is None


def test_a_bad_process_report_is_refused_with_the_field_named(client: FlaskClient) -> None:
    resp = client.post("/api/v1/runs", json={"run": "x", "action": "init", "process": {"pid": "1"}})
    assert resp.status_code == 400
    assert resp.get_json()["error"] == "process.pid: expected a process id, got '1'"


def test_energy_counts_only_while_the_run_held_the_gpu() -> None:
    labels = make_labels({"Hostname": "h", "gpu": "0", "UUID": "U", "run": "r"})
    import numpy as np

    info = SeriesData(
        "gpuwatch_run_gpu_info", labels, np.array([0, 15_000, 100_000]), np.array([1.0, 1.0, 1.0])
    )
    spans = next(iter(held_stretches([info]).values()))
    assert spans == [(0, 35_000), (100_000, 120_000)]
    samples = [(t * 1000, float(t * 10)) for t in range(0, 130, 5)]  # 10 mJ a second
    assert increase_within(samples, spans, -1, 200_000) == 10 * 35 + 10 * 20 - 50  # 5..35 s, 100..120 s
    reset = [(0, 100.0), (5000, 150.0), (10_000, 20.0)]  # the driver reloaded: counts from 0
    assert increase_within(reset, [(0, 20_000)], -1, 20_000) == 50 + 20


def test_users_are_charged_gpu_seconds_and_energy(runtime: Runtime, clock: FakeClock) -> None:
    run_for(runtime, clock, 30)
    text = runtime.exposition()
    lines = [ln for ln in text.splitlines() if ln.startswith("gpuwatch_user_gpu_seconds_total{")]
    assert lines, text[:2000]
    seconds = {ln.split(" ")[0]: float(ln.split(" ")[1]) for ln in lines}
    # GPU 0 trains, 1 serves, 3 warms up (its process starts after 20 s); the users are the processes' uids
    assert all('Hostname="node-1"' in k for k in seconds)
    assert max(seconds.values()) >= 29
    energy = [ln for ln in text.splitlines() if ln.startswith("gpuwatch_user_gpu_energy_kwh_total{")]
    assert energy and all(float(ln.split(" ")[1]) > 0 for ln in energy)


def test_the_demo_training_run_reports_its_gpus_and_energy(
    runtime: Runtime, clock: FakeClock, client: FlaskClient
) -> None:
    """The demo's fine-tuning run (the real SDK, its requests handed to this app) names GPU 0, the one
    the simulated workload trains on; gpuwatch maps it and sums that GPU's energy."""

    def transport(method: str, url: str, body: Any, timeout: float) -> int:
        return int(client.open(url.split("9842", 1)[-1], method=method, json=body).status_code)

    assert runtime.demo is not None and runtime.demo.training is not None
    sim = runtime.demo.training
    sim.options.update(transport=transport)
    for i in range(100):
        clock.advance(1)
        sim.tick()
        runtime.sample()
        if i % 15 == 0:
            assert sim.run is not None and sim.run.flush(10)
            runtime.store.flush()
            runtime.sample_runs()
    runtime.store.flush()
    got = runs(client)["demo-llama-7b-sft"]
    assert got["gpus"] == ["0"] and got["process"] is None
    assert {g for _, g, _ in info(runtime, clock, "demo-llama-7b-sft")} == {"0"}
    assert got["energy_kwh"] > 0 and got["cost"] == pytest.approx(got["energy_kwh"] * 0.25)
    sim.close()


@pytest.mark.slow
def test_a_real_child_process_is_found_under_proc() -> None:
    """What torchrun's and DataLoader's workers look like to gpuwatch: children in the real /proc."""
    import os
    import subprocess
    import sys

    from gpuwatch.collect.proctree import parent_map

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in with_descendants([os.getpid()], parent_map())
        assert os.getpid() not in with_descendants([child.pid], parent_map())
    finally:
        child.kill()
        child.wait()
