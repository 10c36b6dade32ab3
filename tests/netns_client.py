"""Run inside a network namespace by test_access_netns.py: a client on "another host".

Usage: netns_client.py URL TOKENS_JSON. Prints one JSON object of what each client saw.
"""

from __future__ import annotations

import json
import sys
import urllib.error
from typing import Any

import requests
from prometheus_client import CollectorRegistry, Gauge, push_to_gateway
from prometheus_client.exposition import basic_auth_handler

from gpuwatch import client


def main(url: str, tokens: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    silence = {
        "matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
        "startsAt": "2020-01-01T00:00:00Z",
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "netns",
        "comment": "everything",
    }
    writes: list[tuple[str, str, dict[str, Any], str]] = [
        ("PUT", "/metrics/job/netns", {"data": "netns_up 1\n"}, "machine"),
        ("POST", "/metrics/job/netns", {"data": "netns_up 1\n"}, "machine"),
        ("DELETE", "/metrics/job/netns", {}, "machine"),
        ("POST", "/api/v1/push", {"json": {"run": "netns", "metrics": {"loss": 1}}}, "machine"),
        ("POST", "/api/v1/runs", {"json": {"run": "netns", "action": "init"}}, "machine"),
        ("POST", "/api/v1/import/prometheus", {"data": "netns_imported 1\n"}, "machine"),
        ("POST", "/api/v2/alerts", {"json": [{"labels": {"alertname": "FromNetns"}}]}, "machine"),
        ("POST", "/api/v2/silences", {"json": silence}, "admin"),
        ("DELETE", "/api/v2/silence/0d6e5ca0-0000-4000-8000-000000000000", {}, "admin"),
        ("POST", "/-/reload", {}, "admin"),
    ]
    results = []
    for method, path, kw, role in writes:
        bare = requests.request(method, url + path, timeout=10, **kw).status_code
        auth = {"Authorization": f"Bearer {tokens[role]}"}
        authed = requests.request(method, url + path, headers=auth, timeout=10, **kw).status_code
        results.append([method, path, bare, authed])
    out["writes"] = results
    viewer = {"Authorization": f"Bearer {tokens['viewer']}"}
    out["viewer_silence"] = requests.post(
        url + "/api/v2/silences", json=silence, headers=viewer, timeout=10
    ).status_code
    out["viewer_query"] = requests.get(
        url + "/api/v1/query", params={"query": "up"}, headers=viewer, timeout=10
    ).status_code
    out["anonymous_query"] = requests.get(
        url + "/api/v1/query", params={"query": "up"}, timeout=10
    ).status_code
    out["cross_site_form"] = requests.post(
        url + "/api/v2/silences",
        data={"matchers": "x"},
        headers={"Origin": "https://evil.example", "Authorization": f"Bearer {tokens['admin']}"},
        timeout=10,
    ).status_code

    # the SDK with and without a token
    run = client.init("netns-sdk", total_steps=10, url=url, token=tokens["machine"], flush_interval_s=0.05)
    for step in range(3):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    out["sdk_finished"] = run.finish(timeout_s=20)
    out["sdk_rejected"] = run.rejected
    bare_run = client.init("netns-no-token", url=url, flush_interval_s=0.05)
    bare_run.log({"loss": 1.0}, step=1)
    bare_run.finish(timeout_s=20)
    out["sdk_without_token_rejected"] = bare_run.rejected
    out["runs"] = sorted(
        r["run"] for r in requests.get(url + "/api/v1/runs", headers=viewer, timeout=10).json()["data"]
    )

    # prometheus_client's push_to_gateway, as a training job sends it
    registry = CollectorRegistry()
    Gauge("netns_job_last_success", "When the job finished.", registry=registry).set(1)

    def handler(url: str, method: str, timeout: float | None, headers: Any, data: bytes) -> Any:
        return basic_auth_handler(url, method, timeout, headers, data, "trainer", tokens["machine"])

    push_to_gateway(url.split("://", 1)[1], job="netns-batch", registry=registry, handler=handler)
    out["push_to_gateway"] = "ok"
    try:
        push_to_gateway(url.split("://", 1)[1], job="netns-batch", registry=registry)
        out["push_to_gateway_without"] = "accepted"
    except urllib.error.HTTPError as e:
        out["push_to_gateway_without"] = e.code
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
