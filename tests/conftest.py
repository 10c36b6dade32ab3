"""Shared fixtures: a runtime on a fake clock, its Flask app and test client, free ports, a running
`gpuwatch serve` subprocess, HTTP helpers."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.web import create_app

ROOT = Path(__file__).resolve().parent.parent
GPUWATCH = [sys.executable, "-m", "gpuwatch.cli.main"]


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's: `-p no:xdist` runs without it
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: half again as many workers as cores. A third of the suite's time is spent waiting on
    the processes it starts (servers, Chromium, Prometheus, kill -9 and restart), so on 2 cores 3
    workers took the suite 1,224 -> 778 s (0.64x) and 4 workers no less (759 s) (bench/README.md, Suite)."""
    cores = os.cpu_count() or 1
    return max(2, cores + cores // 2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """Return the environment without any GPUWATCH_* the developer may have set, and with the demo's
    week of history off (seconds of every start; a test of it turns it on)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    env["GPUWATCH_DEMO_HISTORY"] = "false"
    env.update(extra)
    return env


@dataclass
class Server:
    """A `gpuwatch serve` subprocess on 127.0.0.1."""

    args: list[str]
    data_dir: Path
    port: int
    env: dict[str, str]
    proc: subprocess.Popen[str] | None = None
    log_path: Path = field(default=Path())
    _log_file: IO[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> Server:
        self.log_path = self.data_dir.parent / f"serve-{self.port}-{time.monotonic_ns()}.log"
        self._log_file = log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            [
                *GPUWATCH,
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--data-dir",
                str(self.data_dir),
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            cwd=self.data_dir.parent,
        )
        wait_until(lambda: self._healthy(), timeout_s, f"gpuwatch did not answer /-/health; log:\n{self.log}")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"gpuwatch exited with {self.proc.returncode}; log:\n{self.log}")
        try:
            return requests.get(self.url + "/-/health", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    @property
    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def get(self, path: str, **kw: object) -> requests.Response:
        return requests.get(self.url + path, timeout=10, **kw)  # type: ignore[arg-type]

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"gpuwatch did not stop on signal {sig}; log:\n{self.log}") from None
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return int(self.proc.returncode)


def wait_until(cond, timeout_s: float, message: str, interval_s: float = 0.1) -> None:  # type: ignore[no-untyped-def]
    """Poll `cond` until it is true; fail with `message` after `timeout_s` (a deadline, not a timing assertion)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(interval_s)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    """Start `gpuwatch serve ARGS...` on a free port; every server is stopped at the end."""
    servers: list[Server] = []

    def start(*args: str, data_dir: Path | None = None, env: dict[str, str] | None = None) -> Server:
        d = data_dir or tmp_path / "data"
        srv = Server(list(args), d, free_port(), env or clean_env(GPUWATCH_FLUSH_INTERVAL="0.5s"))
        servers.append(srv)
        return srv.start()

    yield start
    for srv in servers:
        if srv.proc is not None:
            srv.stop(signal.SIGKILL)


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at a fixed start; tests move it with advance()."""
    return FakeClock(1_790_000_000)


@pytest.fixture
def nvml(request: pytest.FixtureRequest, clock: FakeClock) -> FakeNvml:
    """Simulated GPUs on the fake clock; a test module sets DEMO_GPUS to change the count (default 4)."""
    return FakeNvml(gpu_count=getattr(request.module, "DEMO_GPUS", 4), clock=clock, blocking_event_wait=False)


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock, nvml: FakeNvml) -> Iterator[Runtime]:
    """A whole runtime (real DuckDB file, simulated GPUs, fake clock) whose jobs tests call directly."""
    settings = load(None, {}, {"data_dir": str(tmp_path / "data"), "demo": True})
    rt = build_runtime(settings, "node-1", clock=clock, nvml=nvml)
    yield rt
    rt.close()


@pytest.fixture
def app(runtime: Runtime) -> Flask:
    """The Flask app around `runtime` (a module's own `runtime` fixture, where it has one)."""
    return create_app(runtime)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    """A test client of `app`: requests without a socket."""
    return app.test_client()


def require_tool(name: str) -> str:
    """Return the path of a Debian tool a test runs against (promtool, amtool, prometheus-alertmanager).

    Skips the test when the tool is missing, except in CI (`.ci/run` installs the tools and sets
    REQUIRE_TEST_TOOLS=1), where a missing tool fails the test. (Not a GPUWATCH_ name:
    gpuwatch rejects unknown GPUWATCH_* variables.)
    """
    path = shutil.which(name)
    if path is None:
        if os.environ.get("REQUIRE_TEST_TOOLS") == "1":
            pytest.fail(f"{name} is not installed (apt-get install prometheus prometheus-alertmanager)")
        pytest.skip(f"{name} is not installed")
    return path


@dataclass
class Prometheus:
    """A running Debian `prometheus` (see `run_prometheus`)."""

    url: str
    log_path: Path

    @property
    def log(self) -> str:
        return self.log_path.read_text()


@contextmanager
def run_prometheus(tmp_path: Path, config: str, *flags: str, timeout_s: float = 30.0) -> Iterator[Prometheus]:
    """Run the real Prometheus with `config` (prometheus.yml's text) and extra `flags` until the block
    ends; skipped (failed in CI) where it is not installed."""
    binary = require_tool("prometheus")
    conf = tmp_path / "prometheus.yml"
    conf.write_text(config)
    port = free_port()
    prom = Prometheus(f"http://127.0.0.1:{port}", tmp_path / "prometheus.log")
    with prom.log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={conf}",
                f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )

        def ready() -> bool:
            assert proc.poll() is None, f"Prometheus exited with {proc.returncode}:\n{prom.log}"
            try:
                return requests.get(prom.url + "/-/ready", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        try:
            wait_until(
                ready, timeout_s, f"Prometheus was not ready in {timeout_s:.0f}s; its log:\n{prom.log}"
            )
            yield prom
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextmanager
def run_victoriametrics(tmp_path: Path) -> Iterator[str]:
    """Run Debian's VictoriaMetrics on a free port until the block ends, with no latency offset (its
    default hides the newest 30 s from queries) and data of any age kept; yield its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            require_tool("victoria-metrics"),
            "-search.latencyOffset=0s",
            "-retentionPeriod=100y",
            f"-storageDataPath={tmp_path / 'vm'}",
            f"-httpListenAddr=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"VictoriaMetrics exited with {proc.returncode}"
        try:
            return requests.get(f"{url}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    try:
        wait_until(up, 30, "VictoriaMetrics did not start")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    """Start the real Alertmanager (Debian's prometheus-alertmanager) on a free port; yield its URL."""
    with start_alertmanager(tmp_path, "route: {receiver: default}\nreceivers: [{name: default}]\n") as url:
        yield url


@contextmanager
def start_alertmanager(tmp_path: Path, config: str) -> Iterator[str]:
    """Run the real Alertmanager with `config` (alertmanager.yml text) on a free port; yield its URL."""
    binary = require_tool("prometheus-alertmanager")
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(config)
    log_path = tmp_path / "alertmanager.log"
    port = free_port()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={conf}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            assert proc.poll() is None, f"Alertmanager exited:\n{log_path.read_text()}"
            try:
                return requests.get(url + "/-/ready", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        try:
            try:
                wait_until(ready, 30, "Alertmanager did not start in 30s")
            except AssertionError as e:
                raise AssertionError(f"{e}; its log:\n{log_path.read_text()}") from None
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- real-browser tests (tests/browser.py) ---------------------------------------------------------------


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """ONE `gpuwatch serve --demo` (own data dir, free port) for every browser test of the session,
    answering once its overview has GPUs."""
    from tests.browser import require_chromium

    require_chromium()
    base = tmp_path_factory.mktemp("demo-server")
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.5s", GPUWATCH_HOST_INTERVAL="1s")
    srv = Server(["--demo"], base / "data", free_port(), env)
    srv.start()

    def has(expr: str) -> bool:
        return bool(srv.get("/api/v1/query", params={"query": expr}).json()["data"]["result"])

    try:
        # Charts of rates need two samples of each source: host figures, GPUs and the demo's scrapes.
        for expr in ("rate(node_disk_reads_completed_total[1m])", "DCGM_FI_DEV_GPU_UTIL", "up"):
            wait_until(lambda e=expr: has(e), 30, f"the demo has no data for {expr}")
        yield srv
    finally:
        srv.stop(signal.SIGKILL)


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    """Debian's Chromium, headless, for the whole session."""
    from tests.browser import CHROMIUM_ARGS, require_chromium

    path = require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser) -> Iterator[object]:  # type: ignore[no-untyped-def]
    """A fresh browser context and page (1280x800) whose console is kept as `page.console`
    (tests.browser.Console: `.errors`)."""
    from tests.browser import VIEWPORT, watch_console

    context = browser.new_context(viewport=VIEWPORT)
    pg = context.new_page()
    pg.console = watch_console(pg)
    yield pg
    context.close()
