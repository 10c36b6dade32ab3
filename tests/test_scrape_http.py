"""Scrapes over real HTTP on 127.0.0.1: the real prometheus_client, and a server misbehaving on purpose."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from gpuwatch.collect.fetch import HttpFetcher
from gpuwatch.collect.scrapeconfig import parse_scrape_configs
from gpuwatch.collect.scrapepool import ScrapePool
from gpuwatch.core.clock import FakeClock, SystemClock
from gpuwatch.core.model import Batch, Labels
from tests.conftest import free_port, wait_until


@dataclass
class Route:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    hang: threading.Event | None = None  # wait for this before answering
    drip_s: float = 0.0  # send the body a byte at a time, this far apart


class Site:
    """A tiny HTTP server answering each path as its Route says, recording request headers."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                site.seen.append((self.path, dict(self.headers)))
                route = site.routes.get(self.path, Route(404, b"not found"))
                if route.hang is not None and not route.drip_s:
                    route.hang.wait(30)
                self.send_response(route.status)
                for k, v in route.headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(route.body)))
                self.end_headers()
                try:
                    if route.drip_s:
                        for i in range(len(route.body)):
                            self.wfile.write(route.body[i : i + 1])
                            self.wfile.flush()
                            if route.hang is not None and route.hang.wait(route.drip_s):
                                return
                    else:
                        self.wfile.write(route.body)
                except OSError:
                    pass  # the scraper gave up

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        for route in self.routes.values():
            if route.hang is not None:
                route.hang.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site() -> Iterator[Site]:
    s = Site()
    yield s
    s.close()


def by_key(batches: list[Batch]) -> dict[tuple[str, Labels], float]:
    return {(s.name, s.labels): s.value for b in batches for s in b.samples}


def make_pool(jobs: list[dict[str, object]], clock: object, **kw: object) -> tuple[ScrapePool, list[Batch]]:
    batches: list[Batch] = []
    lock = threading.Lock()

    def sink(b: Batch) -> None:
        with lock:
            batches.append(b)

    pool = ScrapePool(parse_scrape_configs(jobs), default_interval_s=15.0, sink=sink, clock=clock, **kw)  # type: ignore[arg-type]
    return pool, batches


def job(address: str, path: str = "/metrics", **extra: object) -> dict[str, object]:
    return {"job_name": "j", "metrics_path": path, "static_configs": [{"targets": [address]}], **extra}


def test_real_prometheus_client_vllm_page_arrives_exactly() -> None:
    registry = CollectorRegistry()
    prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", ["model_name", "engine"], registry=registry)
    running = Gauge("vllm:num_requests_running", "Running.", ["model_name", "engine"], registry=registry)
    ttft = Histogram(
        "vllm:time_to_first_token_seconds",
        "TTFT.",
        ["model_name", "engine"],
        buckets=(0.1, 1.0),
        registry=registry,
    )
    prompt.labels("llama", "0").inc(5119912)
    running.labels("llama", "0").set(3)
    ttft.labels("llama", "0").observe(0.5)
    port = free_port()
    server, _thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        pool, batches = make_pool([job(f"127.0.0.1:{port}")], FakeClock())
        pool.scrape_all()
    finally:
        server.shutdown()
        server.server_close()
    got = by_key(batches)
    t = {"job": "j", "instance": f"127.0.0.1:{port}", "model_name": "llama", "engine": "0"}
    key = tuple(sorted(t.items()))
    assert got[("vllm:prompt_tokens_total", key)] == 5119912
    assert ("vllm:prompt_tokens_created", key) in got
    assert got[("vllm:num_requests_running", key)] == 3
    le = tuple(sorted({**t, "le": "1.0"}.items()))
    assert got[("vllm:time_to_first_token_seconds_bucket", le)] == 1
    assert got[("vllm:time_to_first_token_seconds_sum", key)] == 0.5
    assert got[("up", (("instance", f"127.0.0.1:{port}"), ("job", "j")))] == 1
    assert pool.states()[0]["invalidLines"] == 0


def test_request_headers_gzip_and_auth(site: Site, tmp_path: Path) -> None:
    site.routes["/metrics?format=prometheus"] = Route(
        body=gzip.compress(b"tgi_request_count 7\n"),
        headers={"Content-Encoding": "gzip", "Content-Type": "text/plain; version=0.0.4"},
    )
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    pool, batches = make_pool(
        [
            job(
                site.address,
                params={"format": ["prometheus"]},
                authorization={"credentials_file": str(token)},
            )
        ],
        FakeClock(),
    )
    pool.scrape_all()
    assert by_key(batches)[("tgi_request_count", (("instance", site.address), ("job", "j")))] == 7
    _path, headers = site.seen[-1]
    # Not application/openmetrics-text at all: prometheus_client would answer OpenMetrics whatever its q.
    assert headers["Accept"] == "text/plain;version=0.0.4;q=1,*/*;q=0.1"
    assert "gzip" in headers["Accept-Encoding"]
    assert headers["Authorization"] == "Bearer s3cret"
    assert float(headers["X-Prometheus-Scrape-Timeout-Seconds"]) == 10
    site.routes["/metrics"] = Route(body=b"a 1\n")
    pool, _ = make_pool([job(site.address, basic_auth={"username": "u", "password": "p"})], FakeClock())
    pool.scrape_all()
    assert site.seen[-1][1]["Authorization"] == "Basic dTpw"


@pytest.mark.parametrize(
    ("route", "error"),
    [
        (Route(500, b"boom"), "server returned HTTP status 500 Internal Server Error"),
        (
            Route(302, b"", {"Location": "/elsewhere"}),
            "server returned HTTP status 302 Found (redirects are not followed)",
        ),
    ],
    ids=["500", "redirect"],
)
def test_failing_answers_make_the_target_down(site: Site, route: Route, error: str) -> None:
    site.routes["/metrics"] = route
    site.routes["/elsewhere"] = Route(body=b"a 1\n")
    pool, batches = make_pool([job(site.address)], FakeClock())
    pool.scrape_all()
    got = by_key(batches)
    assert got[("up", (("instance", site.address), ("job", "j")))] == 0
    (state,) = pool.states()
    assert state["health"] == "down" and state["lastError"] == error
    assert [p for p, _ in site.seen] == ["/metrics"], "the redirect is not followed"


def test_huge_and_gzip_bomb_bodies_are_capped(site: Site) -> None:
    site.routes["/big"] = Route(body=b"x 1\n" * 300_000)
    site.routes["/bomb"] = Route(body=gzip.compress(b"#" * 5_000_000), headers={"Content-Encoding": "gzip"})
    fetcher = HttpFetcher(FakeClock(), max_body_bytes=1_000_000)
    pool, batches = make_pool(
        [job(site.address, "/big"), {**job(site.address, "/bomb"), "job_name": "k"}],
        FakeClock(),
        fetch=fetcher,
    )
    pool.scrape_all()
    for state in pool.states():
        assert state["health"] == "down"
        assert state["lastError"] == "body larger than 1000000 bytes; scrape abandoned"
    assert not [s for b in batches for s in b.samples if s.name == "x"]


def test_connection_refused_is_down() -> None:
    pool, _batches = make_pool([job(f"127.0.0.1:{free_port()}")], FakeClock())
    pool.scrape_all()
    assert pool.states()[0]["health"] == "down"
    assert pool.states()[0]["lastError"] == "connection refused"


def test_a_hanging_target_does_not_delay_another(site: Site) -> None:
    hang = threading.Event()
    site.routes["/slow"] = Route(body=b"slow 1\n", hang=hang)
    site.routes["/fast"] = Route(body=b"fast 1\n")
    pool, _batches = make_pool(
        [
            {
                **job(site.address, "/slow"),
                "job_name": "slow",
                "scrape_interval": "30s",
                "scrape_timeout": "20s",
            },
            {
                **job(site.address, "/fast"),
                "job_name": "fast",
                "scrape_interval": "50ms",
                "scrape_timeout": "40ms",
            },
        ],
        SystemClock(),
    )
    slow, fast = sorted(pool.targets(), key=lambda t: t.spec.job != "slow")
    pool.start()
    try:
        wait_until(lambda: fast.scrapes >= 5, 20, "the fast target was not scraped 5 times")
        assert slow.scrapes == 0 and slow.lock.locked(), "the slow target is still in its first scrape"
        assert fast.health == "up"
    finally:
        hang.set()
        pool.stop()


def test_a_timeout_makes_the_target_down(site: Site) -> None:
    hang = threading.Event()
    site.routes["/metrics"] = Route(body=b"a 1\n", hang=hang)
    pool, _ = make_pool([job(site.address, scrape_interval="1s", scrape_timeout="200ms")], SystemClock())
    try:
        pool.scrape_all()
    finally:
        hang.set()
    (state,) = pool.states()
    assert state["health"] == "down" and state["lastError"].startswith("timed out after 0.2s")


def test_openmetrics_answer_is_parsed_as_such(site: Site) -> None:
    site.routes["/metrics"] = Route(
        body=b'# TYPE a counter\na_total 3 # {trace_id="x"} 1\n# EOF\n',
        headers={"Content-Type": "application/openmetrics-text; version=1.0.0"},
    )
    pool, batches = make_pool([job(site.address)], FakeClock())
    pool.scrape_all()
    assert by_key(batches)[("a_total", (("instance", site.address), ("job", "j")))] == 3
    assert pool.states()[0]["invalidLines"] == 0


def test_proxies_from_the_environment_are_not_used(site: Site, monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, dead)
    site.routes["/metrics"] = Route(body=b"a 1\n")
    pool, batches = make_pool([job(site.address)], FakeClock())
    pool.scrape_all()
    assert by_key(batches)[("a", (("instance", site.address), ("job", "j")))] == 1


def test_a_trickling_body_is_cut_at_the_timeout(site: Site) -> None:
    stop = threading.Event()
    site.routes["/metrics"] = Route(body=b"a 1\n" * 1000, hang=stop, drip_s=0.02)
    pool, _batches = make_pool(
        [job(site.address, scrape_interval="1s", scrape_timeout="300ms")], SystemClock()
    )
    try:
        pool.scrape_all()
    finally:
        stop.set()
    (state,) = pool.states()
    assert state["health"] == "down" and state["lastError"].startswith("timed out after 0.3s"), state
    assert state["lastScrapeDuration"] < 5, "cut near the timeout, not after the whole body (80 s)"


def test_missing_ca_file_is_a_scrape_error(site: Site, tmp_path: Path) -> None:
    pool, _ = make_pool(
        [job(site.address, scheme="https", tls_config={"ca_file": str(tmp_path / "missing.pem")})],
        FakeClock(),
    )
    pool.scrape_all()
    (state,) = pool.states()
    assert state["health"] == "down" and state["lastError"]
