"""The real `prometheus_client` push functions and a JSON push against a real `gpuwatch serve --demo`."""

from __future__ import annotations

import pytest
import requests
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import delete_from_gateway, push_to_gateway, pushadd_to_gateway

from tests.conftest import wait_until

pytestmark = pytest.mark.slow


def latest(server, query: str) -> list[dict]:  # type: ignore[no-untyped-def]
    resp = server.get("/api/v1/query", params={"query": query})
    assert resp.status_code == 200, resp.text
    return resp.json()["data"]["result"]


def test_push_to_gateway_unchanged(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve("--demo")
    gateway = f"127.0.0.1:{server.port}"
    reg = CollectorRegistry()
    loss = Gauge("training_loss", "loss", registry=reg)
    steps = Counter("training_steps", "steps", registry=reg)
    loss.set(2.5)
    steps.inc(10)
    push_to_gateway(gateway, job="nightly-sft", registry=reg, grouping_key={"instance": "node 7"})
    wait_until(
        lambda: latest(server, 'training_loss{job="nightly-sft",instance="node 7"}'),
        30,
        "the push did not arrive",
    )
    loss.set(1.5)
    pushadd_to_gateway(gateway, job="nightly-sft", registry=reg, grouping_key={"instance": "node 7"})
    wait_until(
        lambda: [r["value"][1] for r in latest(server, 'training_loss{job="nightly-sft"}')] == ["1.5"],
        30,
        "the second push did not arrive",
    )
    assert latest(server, 'training_steps_total{job="nightly-sft"}')[0]["value"][1] == "10"
    assert latest(server, 'push_time_seconds{job="nightly-sft"}')
    delete_from_gateway(gateway, job="nightly-sft", grouping_key={"instance": "node 7"})
    # The staleness marker ends the series at once, not after the 5-minute lookback.
    wait_until(
        lambda: not latest(server, 'training_loss{job="nightly-sft"}'), 30, "the delete did not arrive"
    )


def test_json_push_and_bad_body(serve) -> None:  # type: ignore[no-untyped-def]
    server = serve("--demo")
    resp = requests.post(
        server.url + "/api/v1/push",
        json=[{"run": "go-trainer", "step": 5, "metrics": {"loss": 0.5}}],
        timeout=10,
    )
    assert resp.status_code == 200, resp.text
    wait_until(lambda: latest(server, 'training_loss{run="go-trainer"}'), 30, "the JSON push did not arrive")
    bad = requests.post(server.url + "/api/v1/push", data=b"{nope", timeout=10)
    assert bad.status_code == 400 and bad.json()["errorType"] == "bad_data"
