"""A small lab: a hub gpuwatch federates its gpuwatch nodes (GPUs, host figures, scraped servers, runs)
and shows each node Ready, NotReady or Unreachable."""

from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import gpuwatch.client
from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.collect.fetch import FetchResult
from gpuwatch.collect.scrapeconfig import parse_scrape_configs
from gpuwatch.collect.scrapepool import ScrapePool
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ScrapeError
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.web import create_app
from tests.conftest import Server, clean_env, wait_until


def runtime_for(tmp_path: Path, clock: FakeClock, hostname: str, gpus: int) -> Runtime:
    settings = load(None, {}, {"data_dir": str(tmp_path / hostname), "demo": True, "demo_sources": False})
    nvml = FakeNvml(gpu_count=gpus, clock=clock, blocking_event_wait=False)
    return build_runtime(settings, hostname, clock=clock, nvml=nvml)


NODE_JOB = {
    "job_name": "gpuwatch-nodes",
    "metrics_path": "/federate",
    "params": {"match[]": ['{__name__=~".+"}']},
    "honor_labels": True,
    "static_configs": [{"targets": ["node-a:9842"]}],
}


def test_hub_federates_a_node_ready_not_ready_unreachable(tmp_path: Path) -> None:
    """The default lab job (/federate, honor_labels): the node's GPUs, its run with progress and ETA and
    its job counters reach the hub with their own labels; the node is Ready, NotReady while its
    samples are stale, Unreachable while it does not answer; the hub does not federate it back."""
    clock = FakeClock(1_800_000_000)
    node, hub = runtime_for(tmp_path, clock, "node-a", 2), runtime_for(tmp_path, clock, "hub", 1)
    node_client = create_app(node).test_client()
    answer: dict[str, Any] = {}

    def fetch(spec: TargetSpec, timeout_s: float) -> FetchResult:
        if "down" in answer:
            raise ScrapeError("connection refused")
        node.store.flush()
        got = node_client.get(spec.metrics_path, query_string=list(spec.params))
        assert got.status_code == 200, got.get_data(as_text=True)
        return FetchResult(got.get_data(), got.headers["Content-Type"])

    pool = ScrapePool(parse_scrape_configs([NODE_JOB]), default_interval_s=15, sink=hub.store.append, clock=clock, fetch=fetch)  # fmt: skip
    hub.scrapes = pool  # the runtime's own pool has no targets: /federate asks this one what it got
    client = create_app(hub).test_client()

    def tick(*, node_samples: bool = True) -> None:
        if node_samples:
            node.jobs.run("sample")
        hub.jobs.run("sample")
        pool.scrape_all()
        hub.store.flush()
        clock.advance(5)

    def nodes() -> list[dict[str, Any]]:
        return list(client.get("/api/overview").get_json()["nodes"])

    try:
        assert nodes() == []
        init = {"run": "sft-a", "action": "init", "total_steps": 1000, "host": "node-a"}
        assert node_client.post("/api/v1/runs", json=init).status_code == 200
        for step in range(0, 101, 20):
            node_client.post("/api/v1/push", json={"run": "sft-a", "step": step, "metrics": {"loss": 1.0}})
            node.jobs.run("runs")
            tick()  # 5 s a tick: 4 steps a second
        data = client.get("/api/overview").get_json()
        (row,) = data["nodes"]
        assert row["instance"] == "node-a:9842" and row["job"] == "gpuwatch-nodes"
        assert row["state"] == "Ready" and row["is_ready"] is True and row["gpus"] == 2
        hosts = sorted((g["hostname"], g["gpu"]) for g in data["gpus_seen"])
        assert hosts == [("hub", "0"), ("node-a", "0"), ("node-a", "1")]
        page = client.get("/").get_data(as_text=True)
        assert 'data-node="node-a:9842"' in page and ">Ready<" in page and "<th>Host</th>" in page

        (run,) = client.get("/api/v1/runs").get_json()["data"]
        assert run["run"] == "sft-a" and run["instance"] == "node-a:9842" and run["host"] == "node-a"
        assert run["status"] == "running" and run["total_steps"] == 1000 and run["last_step"] == 100
        assert run["progress"] == 0.1 and run["steps_per_second"] == pytest.approx(4.0)
        assert run["eta_seconds"] == pytest.approx(225.0)

        # Pushed series keep the node's job; the node's own series get the scrape job's, not "rules".
        q = client.get("/api/v1/query", query_string={"query": 'training_step{run="sft-a"}'}).get_json()
        (step,) = q["data"]["result"]
        assert step["metric"]["job"] == "training" and step["metric"]["instance"] == "node-a:9842"
        q = client.get("/api/v1/query", query_string={"query": 'gpuwatch_job_runs_total{task="rules"}'})
        jobs = sorted(r["metric"].get("job", "") for r in q.get_json()["data"]["result"])
        assert jobs == ["", "gpuwatch-nodes"]  # the hub's own and the node's

        # What the hub got from the node is not served again by the hub's /federate.
        fed = client.get("/federate", query_string={"match[]": '{__name__=~".+"}'}).get_data(as_text=True)
        assert 'Hostname="hub"' in fed and "node-a" not in fed and "gpuwatch-nodes" not in fed
        query = {"match[]": '{__name__=~".+"}', "federated": "true"}  # asked for: all of it
        fed = client.get("/federate", query_string=query).get_data(as_text=True)
        assert 'Hostname="hub"' in fed and 'Hostname="node-a"' in fed and 'job="gpuwatch-nodes"' in fed
        bad = client.get("/federate", query_string={**query, "federated": "maybe"})
        assert bad.status_code == 400 and "federated" in bad.get_data(as_text=True)

        for _ in range(8):  # the node answers but samples nothing for 40 s
            tick(node_samples=False)
        (row,) = nodes()
        assert row["state"] == "NotReady" and row["is_ready"] is False

        answer["down"] = True
        tick()
        (row,) = nodes()
        assert row["state"] == "Unreachable" and row["is_ready"] is False
        assert ">Unreachable<" in client.get("/").get_data(as_text=True)

        del answer["down"]
        tick()
        assert [n["state"] for n in nodes()] == ["Ready"]

        finish = {"run": "sft-a", "action": "finish", "status": "failed"}
        assert node_client.post("/api/v1/runs", json=finish).status_code == 200
        tick()
        (run,) = client.get("/api/v1/runs").get_json()["data"]
        assert run["status"] == "failed" and run["eta_seconds"] is None and run["end"] == clock.now() - 5
    finally:
        node.close()
        hub.close()


def test_a_hub_job_on_metrics_still_sees_nodes(tmp_path: Path) -> None:
    """An older hub job on the nodes' /metrics: GPUs with their Hostname, Ready, then Unreachable."""
    clock = FakeClock(1_800_000_000)
    node, hub = runtime_for(tmp_path, clock, "node-a", 2), runtime_for(tmp_path, clock, "hub", 1)
    answer: dict[str, Any] = {}

    def fetch(spec: TargetSpec, timeout_s: float) -> FetchResult:
        if "down" in answer:
            raise ScrapeError("connection refused")
        return FetchResult(node.exposition().encode(), "text/plain; version=0.0.4")

    jobs = [{"job_name": "gpuwatch-nodes", "static_configs": [{"targets": ["node-a:9842"]}]}]
    pool = ScrapePool(parse_scrape_configs(jobs), default_interval_s=15, sink=hub.store.append, clock=clock, fetch=fetch)  # fmt: skip
    client = create_app(hub).test_client()
    try:
        for _ in range(2):
            node.jobs.run("sample")
            pool.scrape_all()
            clock.advance(5)
        hub.store.flush()
        (row,) = client.get("/api/overview").get_json()["nodes"]
        assert row["state"] == "Ready" and row["gpus"] == 2
        answer["down"] = True
        pool.scrape_all()
        hub.store.flush()
        (row,) = client.get("/api/overview").get_json()["nodes"]
        assert row["state"] == "Unreachable"
        # The page tells a node it cannot scrape (Unreachable) from one whose GPU samples are stale.
        page = client.get("/").get_data(as_text=True)
        assert 'data-node="node-a:9842" data-host="node-a" data-state="Unreachable"' in page
    finally:
        node.close()
        hub.close()


@pytest.mark.slow
def test_a_hub_and_two_nodes(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Real processes: two demo nodes (their own simulated vLLM and SGLang, an SDK run each) and a hub
    with the default lab job. The hub has both nodes' GPUs, host figures, inference servers and runs;
    a killed node is Unreachable and TargetDown goes pending; restarted, it is Ready again."""
    fast = {
        "GPUWATCH_FLUSH_INTERVAL": "0.3s",
        "GPUWATCH_LOG_LEVEL": "warning",
        "GPUWATCH_SCRAPE_INTERVAL": "1s",
    }

    def start_node(name: str) -> Server:
        env = clean_env(**fast, GPUWATCH_HOSTNAME=name, GPUWATCH_DEMO_GPUS="2", GPUWATCH_HOST_INTERVAL="1s")
        return serve("--demo", data_dir=tmp_path / name, env=env)

    with ThreadPoolExecutor(2) as pool:  # both nodes start at once
        nodes: dict[str, Server] = dict(
            zip(("node-a", "node-b"), pool.map(start_node, ("node-a", "node-b")), strict=True)
        )
    address = {name: f"127.0.0.1:{srv.port}" for name, srv in nodes.items()}
    runs = {
        name: gpuwatch.client.init(f"sft-{name}", total_steps=1000, url=srv.url)
        for name, srv in nodes.items()
    }
    for run in runs.values():
        run.log({"loss": 2.0}, step=10)
    config = tmp_path / "hub.yml"
    config.write_text(json.dumps({"scrape_configs": [{**NODE_JOB, "scrape_interval": "1s", "static_configs": [{"targets": list(address.values())}]}]}))  # fmt: skip
    hub: Server = serve(
        "--demo",
        "--config",
        str(config),
        data_dir=tmp_path / "hub",
        env=clean_env(
            **fast,
            GPUWATCH_HOSTNAME="hub",
            GPUWATCH_DEMO_GPUS="1",
            GPUWATCH_DEMO_SOURCES="false",
            GPUWATCH_EVALUATION_INTERVAL="1s",
        ),
    )

    def states() -> dict[str, str]:
        return {n["instance"]: n["state"] for n in hub.get("/api/overview").json()["nodes"]}

    def query(expr: str) -> list[dict[str, str]]:
        return [
            r["metric"] for r in hub.get("/api/v1/query", params={"query": expr}).json()["data"]["result"]
        ]

    def hub_runs() -> dict[str, dict[str, Any]]:
        return {r["run"]: r for r in hub.get("/api/v1/runs").json()["data"] if r["instance"]}

    try:
        ready = {a: "Ready" for a in address.values()}
        wait_until(lambda: states() == ready, 20, f"nodes not Ready on the hub: {states()}\n{hub.log}")
        gpus = query('DCGM_FI_DEV_GPU_UTIL{job="gpuwatch-nodes"}')
        assert sorted((g["Hostname"], g["gpu"]) for g in gpus) == [
            ("node-a", "0"), ("node-a", "1"), ("node-b", "0"), ("node-b", "1"),
        ]  # fmt: skip
        assert len({g["UUID"] for g in gpus}) == 4  # each demo node's UUIDs come from its host name
        overview = hub.get("/api/overview").json()["gpus_seen"]
        assert {g["UUID"] for g in gpus} <= {g["uuid"] for g in overview}
        assert {m["instance"] for m in query('node_load1{job="gpuwatch-nodes"}')} == {"node-a", "node-b"}
        # Each node's own vLLM, under the node's name (its scrape saw 127.0.0.1), with its own job.
        wait_until(
            lambda: (
                {
                    m["instance"].split(":")[0]
                    for m in query('gpuwatch:inference_requests:rate1m{engine="vllm"}')
                }
                == {"node-a", "node-b"}
            ),
            15,
            f"no inference series of both nodes: {query('gpuwatch:inference_requests:rate1m')}",
        )
        assert {m["job"] for m in query('vllm:num_requests_running{instance=~"node-.*"}')} == {"demo-vllm"}
        for run in runs.values():
            run.log({"loss": 1.9}, step=20)
        wait_until(
            lambda: all(
                (r := hub_runs().get(f"sft-{n}")) is not None and r["last_step"] == 20 and r["eta_seconds"]
                for n in nodes
            ),
            15,
            f"node runs not on the hub: {hub_runs()}",
        )
        run_a = hub_runs()["sft-node-a"]
        assert run_a["instance"] == address["node-a"] and run_a["total_steps"] == 1000
        assert run_a["progress"] == 0.02 and run_a["status"] == "running"

        runs["node-b"].finish(timeout_s=5)
        nodes["node-b"].stop(signal.SIGKILL)
        wait_until(lambda: states()[address["node-b"]] == "Unreachable", 10, f"a killed node: {states()}")
        assert states()[address["node-a"]] == "Ready"

        def target_down() -> list[dict[str, Any]]:
            alerts = hub.get("/api/v1/alerts").json()["data"]["alerts"]
            return [a for a in alerts if a["labels"]["alertname"] == "TargetDown"]

        wait_until(lambda: target_down(), 10, "TargetDown is not pending for the killed node")
        (alert,) = target_down()
        assert alert["labels"]["instance"] == address["node-b"] and alert["state"] in ("pending", "firing")

        nodes["node-b"].start()
        wait_until(lambda: states() == ready, 20, f"a restarted node is not Ready again: {states()}")
        assert hub.stop() == 0
        assert "Traceback" not in hub.log
    finally:
        for run in runs.values():
            run.finish(timeout_s=1)
