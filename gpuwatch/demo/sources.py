"""Demo sources: the simulated engines (engines.py) served as `/metrics`, and a training run with its log.

In demo mode gpuwatch exercises its whole path over real HTTP: two `prometheus_client` registries with
the metric names, labels and buckets vLLM V1 and SGLang expose, served on 127.0.0.1 ephemeral ports and
scraped as jobs `demo-vllm` and `demo-sglang`, and a training run that pushes through the real SDK
(`gpuwatch.client`) and writes a trainer's text log, which gpuwatch tails as a `log_files` entry. One
thread does it all: it serves both ports (requests are small and answered inline) and, every `tick_s`,
moves the figures and logs a training step. The SDK has its own sender thread. Figures follow a bursty
request load that the servers handle with room to spare, except in the latency spikes of the incident
schedule (incidents.py), when the queue grows and P99 latency goes to tens of seconds.
"""

from __future__ import annotations

import contextlib
import logging
import random
import selectors
import socket
import threading
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app

from gpuwatch.collect.scrapeconfig import ScrapeConfig, StaticGroup
from gpuwatch.core.clock import Clock, SystemClock
from gpuwatch.demo.engines import SglangSim, VllmSim
from gpuwatch.demo.incidents import IncidentSchedule
from gpuwatch.demo.training import TrainingSim

log = logging.getLogger("gpuwatch.demo.sources")


class _QuietHandler(WSGIRequestHandler):
    timeout = 5  # a client that connects and says nothing must not hold the demo thread for long

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: the demo's servers are scraped every few seconds."""


def local_url(host: str, port: int) -> str:
    """Return the URL at which this machine reaches a gpuwatch listening on `host`:`port`."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class DemoSources:
    """The simulated vLLM and SGLang servers and training run, all driven by one thread."""

    def __init__(
        self,
        gpuwatch_url: str | None,
        *,
        clock: Clock | None = None,
        tick_s: float = 1.0,
        seed: int | None = None,
        training_log: Path | None = None,
        token: str | None = None,
        training_gpus: list[str] | None = None,
        incidents: IncidentSchedule | None = None,
        training_step: int = 0,
    ) -> None:
        """`token`: the machine token the training run sends (needed where loopback is not trusted).
        `incidents`: the demo's schedule (latency spikes, a stalled run); None: always healthy.
        `training_step`: the step the training run is at (a demo going on from its history)."""
        self.clock = clock or SystemClock()
        self.tick_s = tick_s
        rng = random.Random(seed)
        self.vllm = VllmSim(rng, clock=self.clock, incidents=incidents)
        self.sglang = SglangSim(rng, clock=self.clock, incidents=incidents)
        options: dict[str, Any] = {"token": token} if token else {}
        self.training = (
            # 50,000 steps: a run of some 14 hours, whose loss falls hour over hour (TrainingLossNotDecreasing)
            TrainingSim(
                gpuwatch_url,
                rng,
                self.clock,
                total_steps=50_000,
                log_path=training_log,
                gpus=training_gpus,
                report_process=False,
                incidents=incidents,
                first_step=training_step,
                **options,
            )
            if gpuwatch_url
            else None
        )
        self._servers: dict[str, WSGIServer] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    def start(self) -> None:
        """Bind both servers on 127.0.0.1 ephemeral ports and start the demo thread."""
        if self._thread is not None:
            return
        try:
            for job, registry in (("demo-vllm", self.vllm.registry), ("demo-sglang", self.sglang.registry)):
                server = make_server("127.0.0.1", 0, make_wsgi_app(registry), handler_class=_QuietHandler)
                server.timeout = 0  # handle_request() only when select said a connection is waiting
                self._servers[job] = server
            self._wake_r, self._wake_w = socket.socketpair()
        except OSError:
            self._close_sockets()
            raise
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gpuwatch-demo", daemon=True)
        self._thread.start()
        log.info("demo: simulated vLLM at %s, SGLang at %s", self.url("demo-vllm"), self.url("demo-sglang"))

    def url(self, job: str) -> str:
        """Return the `/metrics` URL of the simulated server scraped as `job`."""
        return f"http://127.0.0.1:{self._servers[job].server_port}/metrics"

    def scrape_configs(self) -> tuple[ScrapeConfig, ...]:
        """Return one scrape job per simulated server (`demo-vllm`, `demo-sglang`); call after start."""
        return tuple(
            ScrapeConfig(job_name=job, static_configs=(StaticGroup((f"127.0.0.1:{server.server_port}",)),))
            for job, server in self._servers.items()
        )

    def _loop(self) -> None:
        assert self._wake_r is not None
        with selectors.DefaultSelector() as sel:
            for server in self._servers.values():
                sel.register(server.socket, selectors.EVENT_READ, server)
            sel.register(self._wake_r, selectors.EVENT_READ, None)
            last = next_tick = self.clock.monotonic()
            while not self._stop.is_set():
                for key, _ in sel.select(max(0.0, next_tick - self.clock.monotonic())):
                    if key.data is not None:
                        key.data.handle_request()
                now = self.clock.monotonic()
                if now >= next_tick:
                    self._tick(now - last)
                    last, next_tick = now, max(next_tick + self.tick_s, now + self.tick_s / 2)

    def _tick(self, dt: float) -> None:
        try:
            self.vllm.tick(dt)
            self.sglang.tick(dt)
            if self.training is not None:
                self.training.tick()
        except Exception:  # a bug in a simulation must not take the demo's servers down
            log.exception("demo: a simulated source failed")

    def stop(self) -> None:
        """Stop the thread, close both ports and finish the training run. Safe to call twice."""
        self._stop.set()
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.training is not None:
            self.training.close()
        self._close_sockets()

    def _close_sockets(self) -> None:
        for server in self._servers.values():
            server.server_close()
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._wake_r = self._wake_w = None

    def __enter__(self) -> DemoSources:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
