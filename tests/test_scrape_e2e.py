"""End to end: `gpuwatch serve --demo --scrape URL` scrapes a real prometheus_client server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tests.conftest import clean_env, free_port, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def exporter() -> Iterator[int]:
    registry = CollectorRegistry()
    Gauge("vllm:num_requests_waiting", "Waiting.", ["model_name"], registry=registry).labels("llama").set(4)
    Counter("tgi_request", "Requests.", registry=registry).inc(3)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    yield port
    server.shutdown()
    server.server_close()


def test_serve_scrapes_a_prometheus_client_endpoint(serve, exporter: int) -> None:  # type: ignore[no-untyped-def]
    # Only the one target: the demo's own simulated vLLM and SGLang servers stay off.
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.5s", GPUWATCH_DEMO_SOURCES="false")
    srv = serve("--demo", "--scrape", f"http://127.0.0.1:{exporter}/metrics", env=env)

    def query(q: str) -> list[dict]:  # type: ignore[type-arg]
        body = srv.get("/api/v1/query", params={"query": q}).json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    wait_until(lambda: query("up") != [], 30, f"no 'up' series after 30s; log:\n{srv.log}")
    (up,) = query("up")
    assert up["metric"] == {"__name__": "up", "job": "scrape", "instance": f"127.0.0.1:{exporter}"}
    assert up["value"][1] == "1"
    (waiting,) = query("vllm:num_requests_waiting")
    assert waiting["metric"]["model_name"] == "llama" and waiting["value"][1] == "4"
    assert query("tgi_request_total")[0]["value"][1] == "3"
    (target,) = srv.get("/api/v1/targets").json()["data"]["activeTargets"]
    assert target["health"] == "up" and target["scrapeUrl"] == f"http://127.0.0.1:{exporter}/metrics"
