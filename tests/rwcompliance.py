"""The harness of tests/test_remote_write_compliance.py: a remote-write receiver in this process
(destinations `main`, `slow`, `r500`, `r400`), the pages each case serves (`prometheus_client`'s or
written by hand), and one `gpuwatch serve` scraping them every second and writing to the receiver."""

from __future__ import annotations

import itertools
import random
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cramjam
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.remote.wire import WireError, decode_request
from tests.conftest import Server, clean_env, free_port, wait_until

Labels = tuple[tuple[str, str], ...]
Sample = tuple[Labels, int, float]  # labels as sent (__name__ among them), time (ms), value
STALE_BITS = struct.pack("<Q", 0x7FF0000000000002)  # Prometheus's staleness marker, a NaN
SLOW_REQUESTS = 6  # the slow destination's first requests, each answered after 1-2 s
ORDERING_SERIES = 1000  # as the suite's ordering case
DEADLINE_S = 30.0


def is_stale(value: float) -> bool:
    return struct.pack("<d", value) == STALE_BITS


# -- the receiver --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One remote-write request as the receiver answered it."""

    destination: str  # the last part of the URL's path
    headers: dict[str, str]
    samples: list[Sample]
    status: int


@dataclass
class Receiver:
    """A remote-write receiver on 127.0.0.1 that records every request (headers, decoded samples,
    its answer) and answers as each destination's case wants."""

    requests: list[Request] = field(default_factory=list)
    refused: dict[str, Request] = field(default_factory=dict)  # r500/r400: the batch refused
    errors: list[str] = field(default_factory=list)  # bodies that were not snappy + protobuf
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _rng: random.Random = field(default_factory=lambda: random.Random(7))

    def start(self) -> ThreadingHTTPServer:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a real receiver

            def do_POST(self) -> None:
                status = receiver.answer(
                    self.path, dict(self.headers), self.rfile.read(int(self.headers["Content-Length"]))
                )
                text = b"" if status < 300 else b"refused by the test\n"
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", str(len(text)))
                    self.end_headers()
                    self.wfile.write(text)
                except OSError:
                    pass  # the sender gave up (gpuwatch is stopped at the end)

            def log_message(self, format: str, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def answer(self, path: str, headers: dict[str, str], body: bytes) -> int:
        destination = path.rsplit("/", 1)[-1]
        try:
            series = decode_request(bytes(cramjam.snappy.decompress_raw(body)))
        except (cramjam.DecompressionError, WireError) as exc:
            with self._lock:
                self.errors.append(f"{destination}: {exc}")
            return 400
        samples = [(s.labels, t, v) for s in series for t, v in zip(s.timestamps_ms, s.values, strict=True)]
        status, delay = 204, 0.0
        with self._lock:  # one sender per destination: its requests come one at a time
            earlier = sum(r.destination == destination for r in self.requests)
            if destination == "slow" and earlier < SLOW_REQUESTS:
                delay = self._rng.uniform(1.0, 2.0)
            refuse = {"r500": 500, "r400": 400}.get(destination)
            if refuse and destination not in self.refused and select(samples, "now"):
                status = refuse
        if delay:
            time.sleep(delay)  # the receiver is slow (not a wait in a test)
        request = Request(destination, headers, samples, status)
        with self._lock:
            self.requests.append(request)
            if status >= 400:
                self.refused[destination] = request
        return status

    def answered(self) -> list[Request]:
        """Every request so far, in the order answered."""
        with self._lock:
            return list(self.requests)

    def taken(self, destination: str) -> list[Sample]:
        """The samples the receiver took (2xx) from one destination, in the order received."""
        with self._lock:
            return [
                s for r in self.requests if r.destination == destination and r.status < 300 for s in r.samples
            ]


def select(samples: list[Sample], name: str | None = None, **labels: str) -> list[Sample]:
    """The samples whose labels include `labels` (and `__name__` = `name`), as the suite's labelsContain."""
    want = {**labels, **({"__name__": name} if name else {})}
    return [s for s in samples if all(dict(s[0]).get(k) == v for k, v in want.items())]


# -- the pages -----------------------------------------------------------------------------------------


def registry_page(*collectors: object, after: Callable[[], None] | None = None) -> Callable[[], bytes]:
    """A page of `collectors` written by prometheus_client; `after` runs after each scrape."""
    registry = CollectorRegistry()
    for c in collectors:
        registry.register(c)  # type: ignore[arg-type]

    def page() -> bytes:
        body = generate_latest(registry)
        if after is not None:
            after()
        return body

    return page


class GoSummary:
    """A summary of the observations 1, 2 and 3 with the quantiles a Go client reports for them
    (prometheus_client's Summary has no quantiles)."""

    def collect(self) -> Iterator[Metric]:
        m = Metric("summary", "A summary.", "summary")
        for q, v in (("0.5", 2.0), ("0.9", 3.0), ("0.99", 3.0)):
            m.add_sample("summary", {"quantile": q}, v)
        m.add_sample("summary_sum", {}, 6.0)
        m.add_sample("summary_count", {}, 3.0)
        yield m


def make_pages() -> dict[str, Callable[[], bytes]]:
    """Path -> page, one per case (the suite's pages)."""
    counter = Counter("counter", "Counts its scrapes.", registry=None)
    now = Gauge("now", "The current time (ms).", registry=None)
    now.set_function(lambda: float(int(time.time()) * 1000))
    const = Gauge("gauge", "Constant.", registry=None)
    const.set_function(lambda: 42.0)
    histogram = Histogram("histogram", "Two observations.", buckets=(1.0, 2.0), registry=None)
    histogram.observe(1.0)
    histogram.observe(2.0)
    stale = Gauge("stale", "Gone after the first scrape.", registry=None)
    stale_registry = CollectorRegistry()
    stale_registry.register(stale)
    stale_scrapes = itertools.count()
    ordering = Gauge("test", "One of many.", ["i"], registry=None)
    for i in range(ORDERING_SERIES):
        ordering.labels(str(i)).set(1.0)
    gauge_page = registry_page(const)

    def stale_page() -> bytes:
        body = generate_latest(stale_registry)
        if next(stale_scrapes) == 0:
            stale_registry.unregister(stale)  # as the suite: the series is on the first page only
        return body

    def text(page: str) -> Callable[[], bytes]:
        return lambda: page.encode()

    gauge_text = "# HELP test A gauge\n# TYPE test gauge\n"
    return {
        "/counter": registry_page(counter, after=counter.inc),
        "/gauge": registry_page(now),
        "/histogram": registry_page(histogram),
        "/summary": registry_page(GoSummary()),
        "/up": gauge_page,
        "/job_label": gauge_page,
        "/instance_label": gauge_page,
        "/timestamp": gauge_page,
        "/invalid": text("\n# this is not valid prometheus\n1234notvali}{ 444\n"),
        "/sorted_labels": text(gauge_text + 'test{b="2",a="1"} 1.0\n'),
        "/repeated_labels": text(gauge_text + 'test{a="1",a="1"} 1.0\n'),
        "/empty_labels": text(gauge_text + 'test{a=""} 1.0\n'),
        "/name_label": text(gauge_text + '{label="value"} 1.0\n'),
        "/honor_labels": text(gauge_text + 'test{job="original", instance="foo"} 1.0\n'),
        "/staleness": stale_page,
        "/ordering": registry_page(ordering),
        "/retries": registry_page(now),
    }


@dataclass
class Pages:
    """An HTTP server on 127.0.0.1 answering each path with its page; counts the scrapes per path."""

    pages: dict[str, Callable[[], bytes]]
    scrapes: dict[str, int] = field(default_factory=dict)
    gone_after: int | None = None  # shut down after this many scrapes (a target that disappears)

    def start(self) -> ThreadingHTTPServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                page = owner.pages.get(path)
                if page is None:
                    self.send_error(404)
                    return
                body = page()
                owner.scrapes[path] = owner.scrapes.get(path, 0) + 1
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                if owner.gone_after is not None and sum(owner.scrapes.values()) == owner.gone_after:
                    threading.Thread(target=close).start()  # not on this thread: shutdown() waits for it

            def log_message(self, format: str, *args: object) -> None:
                pass

        def close() -> None:
            server.shutdown()
            server.server_close()  # connections refused from now on: the target is gone

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


# -- gpuwatch ------------------------------------------------------------------------------------------

JOBS = [path.lstrip("/") for path in make_pages()]
APART = ("ordering", "retries")  # jobs with destinations of their own


def config(pages: str, gone: str, receiver: str) -> str:
    lines = ["sample_interval: 1s", "demo_sources: false", "scrape_configs:"]
    for job, target in [*((j, pages) for j in JOBS), ("gone", gone)]:
        path = "/metrics" if job == "gone" else f"/{job}"
        lines += [
            f"  - job_name: {job}",
            "    scrape_interval: 1s",
            "    scrape_timeout: 1s",
            f"    metrics_path: {path}",
            f"    static_configs: [{{targets: ['{target}']}}]",
        ]
    queue = "batch_send_deadline: 250ms, min_backoff: 100ms, max_backoff: 1s"
    keep = {"slow": "ordering", "r500": "retries", "r400": "retries"}
    lines += [
        "remote_write:",
        f"  - url: {receiver}/main",
        "    name: main",
        "    headers: {X-Scope-OrgID: lab}",
        f"    write_relabel_configs: [{{source_labels: [job], regex: '{'|'.join(APART)}', action: drop}}]",
        f"    queue_config: {{{queue}}}",
    ]
    for name, job in keep.items():
        lines += [
            f"  - url: {receiver}/{name}",
            f"    name: {name}",
            f"    write_relabel_configs: [{{source_labels: [job], regex: {job}, action: keep}}]",
            f"    queue_config: {{{queue}, max_samples_per_send: 500}}",
        ]
    return "\n".join(lines) + "\n"


@dataclass
class Lab:
    gpuwatch: Server
    receiver: Receiver
    address: str  # the pages' host:port, every case's instance
    start_ms: int

    def wait(self, cond: Callable[[], object], what: str) -> None:
        """Poll `cond` until true; fail after DEADLINE_S with `what` and the end of gpuwatch's log."""
        try:
            wait_until(cond, DEADLINE_S, what, interval_s=0.2)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; gpuwatch log:\n{self.gpuwatch.log[-3000:]}") from None

    def taken(
        self, job: str, name: str | None = None, destination: str = "main", **labels: str
    ) -> list[Sample]:
        return select(self.receiver.taken(destination), name, job=job, **labels)

    def failed_scrapes(self, job: str, destination: str = "main") -> set[int]:
        """The times of `job`'s scrapes that failed (`up` 0): on a busy machine a 1 s scrape can time out."""
        return {t for _, t, v in self.taken(job, "up", destination) if v == 0.0}

    def scraped(self, job: str, name: str, destination: str = "main", **labels: str) -> list[Sample]:
        """`taken`, less the staleness markers a failed scrape writes for the series of the one before
        (as Prometheus does); a marker at any other time stays, for the case to see."""
        failed = self.failed_scrapes(job, destination)
        return [
            s for s in self.taken(job, name, destination, **labels) if not (is_stale(s[2]) and s[1] in failed)
        ]

    def metric(self, name: str, destination: str) -> float:
        """A figure of gpuwatch's own /metrics, for one destination."""
        for family in text_string_to_metric_families(self.gpuwatch.get("/metrics").text):
            for s in family.samples:
                if s.name == name and s.labels.get("remote_name") == destination:
                    return float(s.value)
        raise AssertionError(f"{name}{{remote_name={destination!r}}} is not in /metrics")


@contextmanager
def run_lab(base: Path) -> Iterator[Lab]:
    """The receiver, the pages and `gpuwatch serve` scraping them, until the block ends."""
    receiver = Receiver()
    pages = Pages(make_pages())
    gone = Pages({"/metrics": registry_page(Gauge("gone", "Soon gone.", registry=None))}, gone_after=2)
    servers = [receiver.start(), pages.start(), gone.start()]
    address = [f"127.0.0.1:{s.server_address[1]}" for s in servers]
    (base / "gpuwatch.yml").write_text(config(address[1], address[2], f"http://{address[0]}"))
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOSTNAME="lab")
    start_ms = int(time.time() * 1000)
    srv = Server(["--config", str(base / "gpuwatch.yml")], base / "data", free_port(), env)
    try:
        srv.start()
        yield Lab(srv, receiver, address[1], start_ms)
    finally:
        if srv.proc is not None:
            srv.stop(signal.SIGKILL)
        for s in servers:
            s.shutdown()
            s.server_close()
