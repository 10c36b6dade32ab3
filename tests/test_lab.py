"""A small lab: a hub gpuwatch scrapes other gpuwatch nodes; their GPUs show on the hub with the node's
Hostname, and each node is Ready or NotReady by `up`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.app import Runtime, build_runtime
from gpuwatch.clock import FakeClock
from gpuwatch.collect.scrape import FetchResult, TargetSpec
from gpuwatch.collect.scrapeconfig import parse_scrape_configs
from gpuwatch.collect.scrapepool import ScrapePool
from gpuwatch.config import load
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.errors import ScrapeError
from gpuwatch.web import create_app
from tests.conftest import Server, clean_env, wait_until


def runtime_for(tmp_path: Path, clock: FakeClock, hostname: str, gpus: int) -> Runtime:
    settings = load(None, {}, {"data_dir": str(tmp_path / hostname), "demo": True, "demo_sources": False})
    nvml = FakeNvml(gpu_count=gpus, clock=clock, blocking_event_wait=False)
    return build_runtime(settings, hostname, clock=clock, nvml=nvml)


def test_hub_lists_nodes_ready_and_not_ready(tmp_path: Path) -> None:
    clock = FakeClock(1_800_000_000)
    node, hub = runtime_for(tmp_path, clock, "node-a", 2), runtime_for(tmp_path, clock, "hub", 1)
    answer: dict[str, Any] = {}

    def fetch(spec: TargetSpec, timeout_s: float) -> FetchResult:
        if "down" in answer:
            raise ScrapeError("connection refused")
        return FetchResult(node.exposition().encode(), "text/plain; version=0.0.4")  # the node's /metrics

    jobs = [{"job_name": "gpuwatch-nodes", "static_configs": [{"targets": ["node-a:9842"]}]}]
    pool = ScrapePool(parse_scrape_configs(jobs), default_interval_s=15, sink=hub.store.append, clock=clock, fetch=fetch)  # fmt: skip
    client = create_app(hub).test_client()
    try:
        assert client.get("/api/overview").get_json()["nodes"] == []
        for _ in range(3):
            node.jobs.run("sample")
            hub.jobs.run("sample")
            pool.scrape_all()
            clock.advance(5)
        hub.store.flush()
        data = client.get("/api/overview").get_json()
        (row,) = data["nodes"]
        assert row["instance"] == "node-a:9842" and row["job"] == "gpuwatch-nodes"
        assert row["state"] == "Ready" and row["is_ready"] is True and row["gpus"] == 2
        hosts = sorted((g["hostname"], g["gpu"]) for g in data["gpus_seen"])
        assert hosts == [("hub", "0"), ("node-a", "0"), ("node-a", "1")]
        page = client.get("/").get_data(as_text=True)
        assert 'data-node="node-a:9842"' in page and ">Ready<" in page and "<th>Host</th>" in page

        answer["down"] = True
        pool.scrape_all()
        hub.store.flush()
        (row,) = client.get("/api/overview").get_json()["nodes"]
        assert row["state"] == "NotReady" and row["is_ready"] is False
        # The page tells a node it cannot scrape (Unreachable) from one whose GPU samples are stale.
        page = client.get("/").get_data(as_text=True)
        assert 'data-node="node-a:9842" data-host="node-a" data-state="Unreachable"' in page
    finally:
        node.close()
        hub.close()


@pytest.mark.slow
def test_two_gpuwatch_processes_hub_and_node(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    base = {
        "GPUWATCH_DEMO_SOURCES": "false",
        "GPUWATCH_FLUSH_INTERVAL": "0.5s",
        "GPUWATCH_LOG_LEVEL": "warning",
    }
    node: Server = serve(
        "--demo",
        data_dir=tmp_path / "node",
        env=clean_env(**base, GPUWATCH_HOSTNAME="node-a", GPUWATCH_DEMO_GPUS="2"),
    )
    config = tmp_path / "hub.yml"
    config.write_text(
        json.dumps(
            {
                "scrape_configs": [
                    {
                        "job_name": "gpuwatch-nodes",
                        "scrape_interval": "1s",
                        "static_configs": [{"targets": [f"127.0.0.1:{node.port}"]}],
                    }
                ]
            }
        )
    )
    hub: Server = serve(
        "--demo",
        "--config",
        str(config),
        data_dir=tmp_path / "hub",
        env=clean_env(**base, GPUWATCH_HOSTNAME="hub", GPUWATCH_DEMO_GPUS="1"),
    )

    def nodes() -> list[dict[str, Any]]:
        return list(hub.get("/api/overview").json()["nodes"])

    wait_until(
        lambda: [n["state"] for n in nodes()] == ["Ready"], 30, f"node not Ready on the hub:\n{hub.log}"
    )
    query = hub.get("/api/v1/query", params={"query": 'DCGM_FI_DEV_GPU_UTIL{job="gpuwatch-nodes"}'}).json()
    got = sorted((r["metric"]["Hostname"], r["metric"]["gpu"]) for r in query["data"]["result"])
    assert got == [("node-a", "0"), ("node-a", "1")]
    assert node.stop() == 0
    wait_until(lambda: [n["state"] for n in nodes()] == ["NotReady"], 30, "a stopped node stays Ready")
    assert hub.stop() == 0
    assert "Traceback" not in hub.log
