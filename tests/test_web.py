"""Pages, JSON twins and /metrics through Flask's test client over a real store and the simulated NVML."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.model import Matcher
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.web import create_app


def tick(runtime: Runtime, clock: FakeClock, n: int = 3) -> None:
    for _ in range(n):
        runtime.jobs.run("sample")
        clock.advance(1)
    runtime.store.flush()


def test_overview_page_and_json(runtime: Runtime, client: FlaskClient, clock: FakeClock) -> None:
    empty = client.get("/")
    assert empty.status_code == 200 and b"Waiting for the first samples of 4 GPU(s)" in empty.data
    tick(runtime, clock)
    data = client.get("/api/overview").get_json()
    assert data["hostname"] == "node-1" and data["gpus"] == 4
    gpus = data["gpus_seen"]
    assert [g["gpu"] for g in gpus] == ["0", "1", "2", "3"]
    for g in gpus:
        assert g["model"] == "NVIDIA H100 80GB HBM3" and g["hostname"] == "node-1"
        assert g["figures"]["DCGM_FI_DEV_FB_TOTAL"] == 81559
        assert 0 <= g["figures"]["DCGM_FI_DEV_GPU_UTIL"] <= 100
        assert g["is_lost"] is False
    assert any(g["processes"] for g in gpus), "the busy demo GPUs run processes"
    page = client.get("/").get_data(as_text=True)
    assert page.count("data-uuid=") == 4 and "node-1" in page


def test_lost_gpu_is_shown_and_others_keep_coming(
    runtime: Runtime, client: FlaskClient, clock: FakeClock, nvml: FakeNvml
) -> None:
    tick(runtime, clock)
    nvml.lose_gpu(2)
    tick(runtime, clock)
    gpus = {g["gpu"]: g for g in client.get("/api/overview").get_json()["gpus_seen"]}
    assert gpus["2"]["is_lost"] is True
    assert all(not gpus[i]["is_lost"] for i in ("0", "1", "3"))
    assert "fell off the bus" in client.get("/").get_data(as_text=True)


def test_metrics_endpoint_has_dcgm_names_and_self_metrics(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    tick(runtime, clock, 2)
    resp = client.get("/metrics")
    assert resp.content_type.startswith("text/plain; version=0.0.4")
    fams = {f.name: f for f in text_string_to_metric_families(resp.get_data(as_text=True))}
    assert len(fams["DCGM_FI_DEV_GPU_UTIL"].samples) == 4
    assert fams["DCGM_FI_DEV_POWER_USAGE"].type == "gauge"
    s = fams["DCGM_FI_DEV_GPU_TEMP"].samples[0]
    assert {"gpu", "UUID", "modelName", "Hostname", "pci_bus_id"} <= set(s.labels)
    assert fams["gpuwatch_nvml_up"].samples[0].value == 1
    assert fams["gpuwatch_gpus"].samples[0].value == 4
    jobs = {
        x.labels["task"]: x.value
        for x in fams["gpuwatch_job_runs"].samples
        if x.name == "gpuwatch_job_runs_total"
    }
    assert jobs["sample"] >= 1
    # where gpuwatch's memory goes: the process, DuckDB's buffers, the decoded chunks (none read yet)
    assert fams["process_resident_memory_bytes"].samples[0].value > 20 * 2**20
    assert fams["process_cpu_seconds"].samples[0].value > 0
    assert 0 < fams["gpuwatch_store_duckdb_memory_bytes"].samples[0].value <= 64 * 2**20
    assert fams["gpuwatch_store_duckdb_dead_queue_nodes"].samples[0].value >= 0
    assert fams["gpuwatch_store_chunk_cache_bytes"].samples[0].value == 0


def test_introspection_and_errors(runtime: Runtime, client: FlaskClient, clock: FakeClock) -> None:
    tick(runtime, clock, 1)
    assert client.get("/-/health").get_json()["status"] == "ok"
    jobs = {j["name"]: j for j in client.get("/-/jobs").get_json()["jobs"]}
    assert jobs["sample"]["runs"] == 1 and jobs["sample"]["last_error"] is None
    assert client.get("/-/settings").get_json()["demo"] is True
    assert client.get("/-/version").get_json()["version"]
    r = client.get("/api/nothing")
    assert r.status_code == 404 and r.get_json()["status"] == "error"
    r = client.get("/nothing")
    assert r.status_code == 404 and b"<h1>404</h1>" in r.data and b"Traceback" not in r.data


def test_sample_job_failure_is_recorded_not_raised(
    runtime: Runtime, clock: FakeClock, nvml: FakeNvml
) -> None:
    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("driver hiccup")

    runtime.gpu.collect = broken  # type: ignore[method-assign, union-attr]
    assert runtime.jobs.run("sample") is False
    state = {j["name"]: j for j in runtime.jobs.states()}["sample"]
    assert state["failures"] == 1 and "driver hiccup" in state["last_error"]


def test_label_values_are_escaped(tmp_path: Path, clock: FakeClock) -> None:
    settings = load(None, {}, {"data_dir": str(tmp_path / "d2"), "demo": True})
    nvml = FakeNvml(gpu_count=1, clock=clock, blocking_event_wait=False)
    rt = build_runtime(settings, "<script>alert(1)</script>", clock=clock, nvml=nvml)
    try:
        tick(rt, clock)
        page = create_app(rt).test_client().get("/").get_data(as_text=True)
        assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page
    finally:
        rt.close()


def test_unknown_demo_model_is_a_config_error(tmp_path: Path, clock: FakeClock) -> None:
    settings = load(None, {}, {"data_dir": str(tmp_path / "d3"), "demo": True})
    settings = type(settings)(**{**settings.__dict__, "demo_model": "GeForce 256"})
    with pytest.raises(ConfigError, match="demo_model"):
        build_runtime(settings, "h", clock=clock)


def test_the_docs_have_the_gpu_metric_table() -> None:
    import subprocess
    import sys

    from tests.conftest import ROOT

    table = subprocess.run(
        [sys.executable, "-m", "gpuwatch.collect.gpu_metrics"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert table in (ROOT / "docs" / "metrics.md").read_text(), "docs/metrics.md's metric table is stale"


def test_health_is_degraded_while_writes_fail_and_recovers(
    runtime: Runtime, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import duckdb

    from gpuwatch.core.errors import StoreError
    from gpuwatch.store import sqlrows

    real = sqlrows.insert_columns
    full = {"on": True}

    def disk(cur: duckdb.DuckDBPyConnection, table: str, columns: dict, computed: str = "") -> None:
        if full["on"]:
            raise duckdb.IOException("Could not write file: No space left on device")
        real(cur, table, columns, computed)

    monkeypatch.setattr(sqlrows, "insert_columns", disk)
    client = create_app(runtime).test_client()
    runtime.jobs.run("sample")
    with pytest.raises(StoreError, match="No space left"):
        runtime.store.flush()
    r = client.get("/-/health")
    body = r.get_json()
    assert r.status_code == 503 and body["status"] == "degraded"
    assert "store writes fail" in body["problem"] and "No space left on device" in body["problem"]
    full["on"] = False  # space is back: what waited in memory is written
    runtime.store.flush()
    r = client.get("/-/health")
    assert r.status_code == 200 and r.get_json()["status"] == "ok" and r.get_json()["problem"] is None
    got = runtime.store.select([Matcher("__name__", "=", "DCGM_FI_DEV_GPU_UTIL")], 0, 2**62)
    assert len(got) == 4 and all(sd.timestamps_ms.size == 1 for sd in got)
