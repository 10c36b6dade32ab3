"""End to end: Debian's real Prometheus scrapes a prometheus_client page and remote-writes into a
`gpuwatch serve` (`POST /api/v1/write`); what gpuwatch then answers is what Prometheus answers.

Prometheus scrapes every second and sends a batch at least every second. Both are asked the same
range-selector query (`{job="page"}[30s]` at one fixed time: raw samples with their timestamps) and
must give the same series, labels (job and instance, which Prometheus adds) and (time, value) pairs,
Prometheus's own `up` and `scrape_*` series among them. gpuwatch may lag a batch behind, so the query
time is a little in the past and the comparison is retried until a deadline; gpuwatch must never have
a sample Prometheus does not. When the page stops, Prometheus writes staleness markers: gpuwatch's
instant query must stop returning the page's series as Prometheus's does (without the markers it would
answer for another 5 minutes). A recording rule's output (`job:rate5m:sum`, colons in the name) must
arrive too. Prometheus's own counters of failed and dropped samples must stay at 0. And Debian's vmagent
writes into gpuwatch the same way.

Skips without `prometheus`, except in CI (REQUIRE_TEST_TOOLS=1), where it fails.
"""

from __future__ import annotations

import math
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import (
    ROOT,
    Prometheus,
    Server,
    clean_env,
    free_port,
    require_tool,
    run_prometheus,
    wait_until,
)

pytestmark = pytest.mark.slow

Labels = tuple[tuple[str, str], ...]
Samples = dict[Labels, list[tuple[int, str]]]

RULES = """\
groups:
  - name: page
    interval: 1s
    rules:
      - record: job:rate5m:sum
        expr: sum by (job) (rate(page_requests_total[5m]))
"""


@dataclass
class Page:
    """A prometheus_client page on 127.0.0.1 whose figures change every 100 ms until stopped."""

    port: int
    stop: Callable[[], None]  # idempotent

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextmanager
def start_page() -> Iterator[Page]:
    registry = CollectorRegistry()
    requests_total = Counter("page_requests", "Requests served.", registry=registry)
    temperature = Gauge("page_temperature_celsius", "Temperature.", ["sensor"], registry=registry)
    latency = Histogram("page_latency_seconds", "Latency.", buckets=(0.1, 0.5, 1.0), registry=registry)
    size = Summary("page_response_bytes", "Response size.", registry=registry)
    done = threading.Event()

    def tick() -> None:
        i = 0
        while not done.wait(0.1):
            i += 1
            requests_total.inc(0.1)  # 0.1 + 0.1 + ...: values with all 17 digits, not round ones
            temperature.labels("inlet").set(20 + math.sin(i / 7) / 3)
            temperature.labels("outlet").set(35 + i / 3)
            latency.observe((i % 13) / 10)
            size.observe(1000 / (i % 7 + 1))

    requests_total.inc(0.1)
    temperature.labels("inlet").set(20.0)
    temperature.labels("outlet").set(35.0)
    port = free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if stopped:
            return
        stopped = True
        done.set()
        thread.join(5)
        server.shutdown()
        server.server_close()

    try:
        yield Page(port, stop)
    finally:
        stop()


@contextmanager
def start_gpuwatch(tmp_path: Path) -> Iterator[Server]:
    # Simulated GPUs; the demo's own simulated inference servers stay off. Loopback needs no token.
    # PYTHONPATH: the receiver under test is this checkout's, whichever gpuwatch the venv has installed.
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_DEMO_SOURCES="false", PYTHONPATH=str(ROOT))
    srv = Server(["--demo"], tmp_path / "data", free_port(), env)
    try:
        yield srv.start()
    finally:
        if srv.proc is not None:
            srv.stop(signal.SIGKILL)


@contextmanager
def start_prometheus(
    tmp_path: Path, page: Page, gpuwatch: Server, rules: str | None = None
) -> Iterator[Prometheus]:
    rule_files = ""
    if rules is not None:
        (tmp_path / "rules.yml").write_text(rules)
        rule_files = f"rule_files: [{tmp_path / 'rules.yml'}]\n"
    config = (
        "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
        + rule_files
        + f"scrape_configs: [{{job_name: page, static_configs: [{{targets: ['{page.target}']}}]}}]\n"
        + f"remote_write: [{{url: '{gpuwatch.url}/api/v1/write', queue_config: {{batch_send_deadline: 1s}},"
        + " metadata_config: {send_interval: 1s}}]\n"  # requests with metadata only, too
    )
    with run_prometheus(tmp_path, config, timeout_s=20) as prom:
        yield prom


def query(base: str, expr: str, at: float | None = None) -> dict[str, Any]:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    resp = requests.get(base + "/api/v1/query", params=params, timeout=10)
    body = resp.json()
    assert resp.status_code == 200 and body["status"] == "success", f"{base} {expr!r}: {resp.text[:2000]}"
    return dict(body["data"])


def instant(base: str, expr: str) -> dict[Labels, str]:
    data = query(base, expr)
    assert data["resultType"] == "vector", data
    return {tuple(sorted(r["metric"].items())): r["value"][1] for r in data["result"]}


def _same_float(text: str) -> str:
    """The value as the float it stands for (Go and Python may spell one float differently)."""
    value = float(text)
    return "NaN" if math.isnan(value) else repr(value)


def raw_samples(base: str, expr: str, at: float) -> Samples:
    """The raw samples a range selector selects at `at`: {labels: [(ms, value)]}."""
    data = query(base, expr, at)
    assert data["resultType"] == "matrix", data
    return {
        tuple(sorted(r["metric"].items())): [(round(float(t) * 1000), _same_float(v)) for t, v in r["values"]]
        for r in data["result"]
    }


def diff(prom: Samples, gw: Samples) -> list[str]:
    """What differs between Prometheus's and gpuwatch's samples (empty when they agree)."""
    out = [f"only in Prometheus: {dict(k)}" for k in prom.keys() - gw.keys()]
    out += [f"only in gpuwatch: {dict(k)}" for k in gw.keys() - prom.keys()]
    for key in prom.keys() & gw.keys():
        if prom[key] != gw[key]:
            p, g = set(prom[key]), set(gw[key])
            out.append(f"{dict(key)}: Prometheus only {sorted(p - g)[:5]}, gpuwatch only {sorted(g - p)[:5]}")
    return out


def assert_same_samples(
    prom: Prometheus, gw: Server, expr: str, min_samples: int, timeout_s: float
) -> Samples:
    """Wait until Prometheus has `min_samples` of each series of `expr` and gpuwatch answers exactly the
    same range-selector query at a fixed time 2 s in the past; return the samples."""
    seen: dict[str, Any] = {}

    def enough() -> bool:
        got = raw_samples(prom.url, expr, time.time() - 2.0)
        return bool(got) and all(len(v) >= min_samples for v in got.values())

    wait_until(
        enough, timeout_s, f"Prometheus has not {min_samples} samples of {expr}; its log:\n{prom.log}", 0.25
    )

    def agree() -> bool:
        at = time.time() - 2.0  # gpuwatch may be a batch (1 s) behind
        p, g = raw_samples(prom.url, expr, at), raw_samples(gw.url, expr, at)
        seen.update(prom=p, gw=g)
        # gpuwatch never has what Prometheus has not, on any try
        for key, samples in g.items():
            assert key in p, f"gpuwatch has a series Prometheus has not: {dict(key)}"
            extra = set(samples) - set(p[key])
            assert not extra, f"{dict(key)}: gpuwatch has samples Prometheus has not: {sorted(extra)[:5]}"
        return p == g

    try:
        wait_until(agree, timeout_s, "", 0.25)
    except AssertionError as exc:
        if str(exc):
            raise
        problems = diff(seen["prom"], seen["gw"])
        raise AssertionError(
            f"gpuwatch differs from Prometheus for {expr}:\n" + "\n".join(problems)
        ) from None
    samples: Samples = seen["gw"]
    for key, values in samples.items():
        assert len(values) >= min_samples, f"{dict(key)}: only {len(values)} samples"
    return samples


def assert_nothing_failed(prom: Prometheus) -> None:
    """Prometheus sent samples and metadata, and counted none that gpuwatch refused or never took."""
    text = requests.get(prom.url + "/metrics", timeout=10).text
    counts = {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name
        in (
            "prometheus_remote_storage_samples_failed_total",
            "prometheus_remote_storage_samples_dropped_total",
            "prometheus_remote_storage_samples_total",
            "prometheus_remote_storage_metadata_failed_total",
            "prometheus_remote_storage_metadata_total",
        )
    }
    assert counts.get("prometheus_remote_storage_samples_total", 0) > 0, counts
    assert counts.get("prometheus_remote_storage_samples_failed_total", 0) == 0, f"{counts}; log:\n{prom.log}"
    assert counts.get("prometheus_remote_storage_samples_dropped_total", 0) == 0, (
        f"{counts}; log:\n{prom.log}"
    )
    assert counts.get("prometheus_remote_storage_metadata_total", 0) > 0, counts
    assert counts.get("prometheus_remote_storage_metadata_failed_total", 0) == 0, (
        f"{counts}; log:\n{prom.log}"
    )


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Any]:
    """`start(rules=None)` -> (page, gpuwatch, prometheus), all stopped at the end, also on failure."""
    require_tool("prometheus")  # before starting anything
    with ExitStack() as stack:

        def start(rules: str | None = None) -> tuple[Page, Server, Prometheus]:
            page = stack.enter_context(start_page())
            gw = stack.enter_context(start_gpuwatch(tmp_path))
            prom = stack.enter_context(start_prometheus(tmp_path, page, gw, rules))
            return page, gw, prom

        yield start


def test_prometheus_remote_writes_what_it_scraped(stack) -> None:  # type: ignore[no-untyped-def]
    page, gw, prom = stack()
    wait_until(
        lambda: instant(gw.url, 'up{job="page"}') != {},
        25,
        f"gpuwatch got no up{{job=page}}; its log:\n{gw.log}\nPrometheus's log:\n{prom.log}",
        0.25,
    )
    samples = assert_same_samples(prom, gw, '{job="page"}[30s]', min_samples=7, timeout_s=20)
    names = {dict(key)["__name__"] for key in samples}
    assert {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "page_requests_total",
        "page_temperature_celsius",
        "page_latency_seconds_bucket",
        "page_latency_seconds_count",
        "page_response_bytes_sum",
    } <= names, names
    inlet = dict(next(key for key in samples if dict(key).get("sensor") == "inlet"))
    assert inlet == {
        "__name__": "page_temperature_celsius",
        "instance": page.target,
        "job": "page",
        "sensor": "inlet",
    }
    assert {dict(key)["le"] for key in samples if dict(key)["__name__"] == "page_latency_seconds_bucket"} == {
        "0.1",
        "0.5",
        "1.0",
        "+Inf",
    }

    # The page goes away: Prometheus's next scrape fails and it writes staleness markers.
    gauge = 'page_temperature_celsius{job="page"}'
    assert len(instant(gw.url, gauge)) == 2
    page.stop()
    wait_until(lambda: instant(prom.url, gauge) == {}, 10, "Prometheus still answers for the stopped page")
    try:
        wait_until(lambda: instant(gw.url, gauge) == {}, 10, "", 0.25)
    except AssertionError:
        raise AssertionError(
            f"gpuwatch still answers (no staleness markers?): {instant(gw.url, gauge)}"
        ) from None
    assert instant(gw.url, 'up{job="page"}') == {
        (("__name__", "up"), ("instance", page.target), ("job", "page")): "0"
    }
    assert_same_samples(prom, gw, f"{gauge}[30s]", min_samples=7, timeout_s=10)
    assert_nothing_failed(prom)


def test_a_recording_rule_with_colons_arrives(stack) -> None:  # type: ignore[no-untyped-def]
    _, gw, prom = stack(rules=RULES)
    samples = assert_same_samples(prom, gw, "job:rate5m:sum[30s]", min_samples=5, timeout_s=25)
    assert list(samples) == [(("__name__", "job:rate5m:sum"), ("job", "page"))]
    # The counter only grows, and rate() divides by the whole 5 minutes: the rule's values grow.
    values = [float(v) for _, v in next(iter(samples.values()))]
    assert 0 < values[0] < values[-1], values
    assert_nothing_failed(prom)


def test_vmagent_remote_writes_into_gpuwatch(tmp_path: Path) -> None:
    """Debian's vmagent (VictoriaMetrics 1.79) scrapes the page every second and remote-writes it into
    gpuwatch: the page's series arrive with vmagent's job and instance labels, and `up` is 1."""
    vmagent = require_tool("vmagent")
    with start_page() as page, start_gpuwatch(tmp_path) as gw:
        config = tmp_path / "vmagent.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\n"
            f"scrape_configs: [{{job_name: page, static_configs: [{{targets: ['{page.target}']}}]}}]\n"
        )
        log = tmp_path / "vmagent.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [
                    vmagent,
                    f"-promscrape.config={config}",
                    f"-remoteWrite.url={gw.url}/api/v1/write",
                    f"-remoteWrite.tmpDataPath={tmp_path / 'vmagent-data'}",
                    "-remoteWrite.flushInterval=500ms",
                    f"-httpListenAddr=127.0.0.1:{free_port()}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            gauge = 'page_temperature_celsius{job="page"}'
            wait_until(
                lambda: len(instant(gw.url, gauge)) == 2,
                30,
                f"nothing from vmagent; its log:\n{log.read_text()[-3000:]}\ngpuwatch's log:\n{gw.log}",
                0.25,
            )
            got = instant(gw.url, gauge)
            assert {dict(k)["sensor"] for k in got} == {"inlet", "outlet"}
            assert all(dict(k)["instance"] == page.target for k in got)
            assert instant(gw.url, 'up{job="page"}') == {
                (("__name__", "up"), ("instance", page.target), ("job", "page")): "1"
            }

            def counted() -> list[tuple[int, str]]:
                (values,) = raw_samples(gw.url, 'page_requests_total{job="page"}[30s]', time.time()).values()
                return values

            wait_until(lambda: len(counted()) >= 3, 20, "vmagent's samples stopped coming", 0.25)
            values = counted()
            assert [t for t, _ in values] == sorted({t for t, _ in values})  # one a scrape, in time order
            assert [float(v) for _, v in values] == sorted(float(v) for _, v in values)  # a counter
        finally:
            proc.terminate()
            proc.wait(10)
