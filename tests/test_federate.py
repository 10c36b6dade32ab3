"""GET /federate: Prometheus's federation endpoint, checked against its rules and against Prometheus 2."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.app.runtime import Runtime
from gpuwatch.collect.fetch import HttpFetcher
from gpuwatch.collect.scrape import Target
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock, SystemClock
from gpuwatch.core.model import STALE_NAN, Batch, Sample, make_labels
from tests.conftest import Server, clean_env, run_prometheus, wait_until

DEMO_GPUS = 1


def put(runtime: Runtime, t_ms: int, *samples: tuple[str, dict[str, str], float]) -> None:
    runtime.store.append(Batch(t_ms, [Sample(n, make_labels(labels), v) for n, labels, v in samples]))


def federate(client: FlaskClient, *matches: str, **headers: str) -> tuple[int, str]:
    got = client.get("/federate", query_string=[("match[]", m) for m in matches], headers=headers)
    return got.status_code, got.get_data(as_text=True)


def test_federate_serves_the_newest_sample_of_each_series(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    now = clock.now_ms()
    put(runtime, now - 400_000, ("old_metric", {"job": "x"}, 1.0))  # outside the 5 min lookback
    put(runtime, now - 60_000, ("vllm:num_requests_running", {"job": "vllm", "instance": "gpu1:8000"}, 3.0))
    put(runtime, now - 30_000, ("vllm:num_requests_running", {"job": "vllm", "instance": "gpu1:8000"}, 4.0))
    put(runtime, now - 30_000, ("gone", {"job": "x"}, 1.0))
    put(runtime, now - 20_000, ("gone", {"job": "x"}, STALE_NAN))  # its newest sample is a marker
    put(runtime, now - 10_000, ("gpuwatch:inference_queue_length", {"job": "vllm", "engine": "vllm"}, 2.5))
    put(runtime, now - 10_000, ("esc", {"path": 'a"b\\c\nd'}, 1.5), ("bare", {}, -7.0))
    runtime.store.flush()

    status, text = federate(client, '{job=~"vllm|x"}', '{__name__=~"vllm:.*|bare|esc|old_metric"}')
    assert status == 200
    assert text.splitlines() == [
        "# TYPE bare untyped",
        f"bare -7 {now - 10_000}",
        "# TYPE esc untyped",
        f'esc{{path="a\\"b\\\\c\\nd"}} 1.5 {now - 10_000}',
        "# TYPE gpuwatch:inference_queue_length untyped",  # recording-rule outputs too
        f'gpuwatch:inference_queue_length{{engine="vllm",job="vllm"}} 2.5 {now - 10_000}',
        "# TYPE vllm:num_requests_running untyped",  # matched by both selectors: once
        f'vllm:num_requests_running{{instance="gpu1:8000",job="vllm"}} 4 {now - 30_000}',
    ]
    families = {f.name: f for f in text_string_to_metric_families(text)}  # prometheus_client reads it
    assert families["esc"].samples[0].labels == {"path": 'a"b\\c\nd'}
    assert families["bare"].samples[0].timestamp == (now - 10_000) / 1000

    assert federate(client, '{job="nothing"}') == (200, "")
    status, text = federate(client)
    assert status == 400 and text == "bad request: no match[] parameter provided\n"
    status, text = federate(client, "up{")
    assert status == 400 and text.startswith("bad request: ") and text.count("\n") == 1


def test_federate_gzip_and_the_node_name_for_local_targets(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    now = clock.now_ms()
    for i in range(50):
        put(runtime, now - 1000, ("up", {"job": "vllm", "instance": f"127.0.0.1:{8000 + i}"}, 1.0))
    put(runtime, now - 1000, ("up", {"job": "sglang", "instance": "localhost:30000"}, 1.0))
    put(runtime, now - 1000, ("up", {"job": "tgi", "instance": "[::1]:3000"}, 1.0))
    put(runtime, now - 1000, ("up", {"job": "other", "instance": "10.0.0.7:9100"}, 1.0))
    runtime.store.flush()
    got = client.get("/federate", query_string={"match[]": "up"}, headers={"Accept-Encoding": "gzip"})
    assert got.headers["Content-Encoding"] == "gzip" and got.headers["Content-Type"].startswith("text/plain")
    text = gzip.decompress(got.get_data()).decode()
    lines = {line.split("{", 1)[1].split("}")[0] for line in text.splitlines() if line.startswith("up{")}
    assert 'instance="node-1:8000",job="vllm"' in lines  # the node's name (the runtime's hostname)
    assert 'instance="node-1:30000",job="sglang"' in lines and 'instance="node-1:3000",job="tgi"' in lines
    assert 'instance="10.0.0.7:9100",job="other"' in lines
    assert len(lines) == 53
    assert "Content-Encoding" not in client.get("/federate", query_string={"match[]": "up"}).headers


@contextmanager
def prometheus(tmp_path: Path, scrape_yaml: str) -> Iterator[str]:
    """Run the real Prometheus (Debian's `prometheus`) with one scrape job; yield its URL."""
    with run_prometheus(tmp_path, "global: {scrape_interval: 1s}\nscrape_configs:\n" + scrape_yaml) as prom:
        yield prom.url


def test_prometheus_federates_gpuwatch_and_gpuwatch_federates_prometheus(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Prometheus 2 scrapes a demo gpuwatch's /federate with honor_labels: gpuwatch's GPU series and the
    vLLM series it scraped arrive with their labels; then gpuwatch scrapes that Prometheus's /federate
    and gets the same series, each with the timestamp Prometheus gave it."""
    node: Server = serve(
        "--demo",
        env=clean_env(GPUWATCH_FLUSH_INTERVAL="0.3s", GPUWATCH_HOSTNAME="node-p", GPUWATCH_DEMO_GPUS="1"),
    )
    job = (
        "  - job_name: lab\n    honor_labels: true\n    metrics_path: /federate\n"
        "    params: {'match[]': ['{__name__=~\"DCGM_FI_DEV_GPU_UTIL|vllm:num_requests_running\"}']}\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{node.port}']}}]\n"
    )
    with prometheus(tmp_path, job) as url:

        def result(expr: str) -> list[dict[str, dict[str, str]]]:
            got = requests.get(url + "/api/v1/query", params={"query": expr}, timeout=5).json()
            return list(got["data"]["result"])

        wait_until(lambda: result("vllm:num_requests_running"), 20, "Prometheus got nothing from /federate")
        (gpu,) = result("DCGM_FI_DEV_GPU_UTIL")
        assert gpu["metric"]["Hostname"] == "node-p" and gpu["metric"]["job"] == "lab"
        (vllm,) = result("vllm:num_requests_running")
        assert vllm["metric"]["job"] == "demo-vllm" and vllm["metric"]["instance"].startswith("node-p:")
        # Prometheus's /federate of what it got writes the same TYPE line and series as gpuwatch's.
        match = {"match[]": "vllm:num_requests_running"}
        theirs = requests.get(url + "/federate", params=match, timeout=5).text.splitlines()
        ours = node.get("/federate", params=match).text.splitlines()
        assert theirs[0] == ours[0] == "# TYPE vllm:num_requests_running untyped"
        assert [line.rsplit(" ", 2)[0] for line in theirs[1:]] == [
            line.rsplit(" ", 2)[0] for line in ours[1:]
        ]

        spec = TargetSpec(
            job="prom", address=url.removeprefix("http://"), scheme="http", metrics_path="/federate",
            params=(("match[]", '{job="demo-vllm"}'),), labels=make_labels({"job": "prom", "instance": "p"}),
            interval_s=1, timeout_s=5, honor_labels=True,
        )  # fmt: skip
        fetcher = HttpFetcher(SystemClock())
        target = Target(spec, fetcher, SystemClock())
        try:
            first, *stamped = target.scrape()
            assert target.health == "up", target.last_error
            got = {s.name: (b.timestamp_ms, s) for b in stamped for s in b.samples}
            t_ms, sample = got["vllm:num_requests_running"]
            assert dict(sample.labels)["job"] == "demo-vllm" and t_ms < first.timestamp_ms
            # Scraped again: a series whose sample did not change is not stored twice.
            again = {s.name: b.timestamp_ms for b in target.scrape()[1:] for s in b.samples}
            assert all(again[name] > got[name][0] for name in again)
            assert target.last_out_of_order == len(got) - len(again)
        finally:
            fetcher.close()  # Prometheus keeps the connection open
