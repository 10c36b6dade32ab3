"""End to end: `gpuwatch serve` as a real process on 127.0.0.1, real HTTP, a real DuckDB file."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.core.clock import SystemClock
from gpuwatch.core.model import Matcher
from gpuwatch.store import Store
from tests.conftest import GPUWATCH, clean_env, free_port, wait_until

pytestmark = pytest.mark.slow

DCGM_LABELS = {"gpu", "UUID", "modelName", "Hostname", "pci_bus_id"}


def overview_gpus(srv) -> list[dict]:  # type: ignore[no-untyped-def]
    return srv.get("/api/overview").json()["gpus_seen"]


def stored_util_timestamps(data_dir: Path) -> list[int]:
    store = Store.open(data_dir, clock=SystemClock())
    try:
        series = store.select([Matcher("__name__", "=", "DCGM_FI_DEV_GPU_UTIL")], 0, 2**62)
        assert len(series) == 8
        return sorted({int(t) for s in series for t in s.timestamps_ms})
    finally:
        store.close()


def test_demo_serves_metrics_page_and_health(serve) -> None:  # type: ignore[no-untyped-def]
    srv = serve("--demo")
    health = srv.get("/-/health").json()
    assert health["status"] == "ok" and health["demo"] is True and health["gpus"] == 8

    resp = srv.get("/metrics")
    assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(resp.text)}
    util = families["DCGM_FI_DEV_GPU_UTIL"]
    assert util.type == "gauge"
    assert sorted(s.labels["gpu"] for s in util.samples) == [str(i) for i in range(8)]
    for s in util.samples:
        assert set(s.labels) >= DCGM_LABELS and 0 <= s.value <= 100
        assert s.labels["modelName"] == "NVIDIA H100 80GB HBM3"
    for name in (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
    ):
        assert len(families[name].samples) == 8, name

    wait_until(lambda: len(overview_gpus(srv)) == 8, 20, "overview never showed 8 GPUs")
    page = srv.get("/")
    assert page.status_code == 200 and "NVIDIA H100 80GB HBM3" in page.text
    assert page.text.count("data-uuid=") == 8

    assert srv.get("/-/jobs").json()["jobs"][0]["name"] == "sample"
    assert srv.get("/-/settings").json()["demo"] is True
    missing = srv.get("/no/such/page")
    assert missing.status_code == 404 and "Traceback" not in missing.text
    assert srv.stop() == 0
    assert "Traceback" not in srv.log


def test_data_survives_restart_and_kill9(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    srv = serve("--demo", data_dir=data)
    wait_until(lambda: len(overview_gpus(srv)) == 8, 20, "no data stored")
    assert srv.stop(signal.SIGTERM) == 0
    first = stored_util_timestamps(data)
    assert first

    srv2 = serve("--demo", data_dir=data)
    wait_until(lambda: len(overview_gpus(srv2)) == 8, 20, "no data after restart")
    # The newest tick the server has flushed, as its own page reports it.
    seen_ms = max(g["last_seen_ms"] for g in overview_gpus(srv2))
    srv2.stop(signal.SIGKILL)
    after_kill = stored_util_timestamps(data)
    assert set(first) <= set(after_kill), "samples from before the restart were lost"
    assert max(after_kill) >= seen_ms, "samples already flushed before kill -9 were lost"

    srv3 = serve("--demo", data_dir=data)
    assert srv3.stop() == 0


def test_second_server_on_same_data_dir_exits_2(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "data"
    serve("--demo", data_dir=data)
    proc = subprocess.run(
        [*GPUWATCH, "serve", "--demo", "--port", str(free_port()), "--data-dir", str(data)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 2
    assert "in use by a running gpuwatch" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_port_in_use_exits_2(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    srv = serve("--demo")
    proc = subprocess.run(
        [
            *GPUWATCH,
            "serve",
            "--demo",
            "--host",
            "127.0.0.1",
            "--port",
            str(srv.port),
            "--data-dir",
            str(tmp_path / "other"),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{srv.port}" in proc.stderr and "Traceback" not in proc.stderr


def _nvml_present() -> bool:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_nvml_present(), reason="this machine has an NVIDIA driver")
def test_without_driver_starts_says_so_once_and_serves(serve) -> None:  # type: ignore[no-untyped-def]
    srv = serve()
    health = srv.get("/-/health").json()
    assert health["gpus"] == 0 and "no NVIDIA GPU found" in health["gpu_problem"]
    assert "gpuwatch_nvml_up 0" in srv.get("/metrics").text
    page = srv.get("/")
    assert page.status_code == 200 and "gpuwatch serve --demo" in page.text
    assert srv.stop() == 0
    lines = [line for line in srv.log.splitlines() if "no NVIDIA GPU found" in line]
    assert len(lines) == 1 and "gpuwatch serve --demo" in lines[0]


def test_bad_config_one_line_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "g.yml"
    cfg.write_text("sample_interval: fast\n")
    proc = subprocess.run(
        [*GPUWATCH, "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        f"gpuwatch: config error: {cfg}: sample_interval: expected a duration like 15s, got 'fast'\n"
    )
    proc = subprocess.run(
        [*GPUWATCH, "serve", "--port", "http"], capture_output=True, text=True, env=clean_env(), timeout=60
    )
    assert proc.returncode == 2 and proc.stderr.startswith("gpuwatch: config error: command line: port:")


def test_version_and_smi_demo() -> None:
    from gpuwatch import __version__

    proc = subprocess.run([*GPUWATCH, "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"gpuwatch {__version__}"
    proc = subprocess.run(
        [*GPUWATCH, "smi", "--demo"], capture_output=True, text=True, env=clean_env(), timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("NVIDIA H100 80GB HBM3") == 8


def _imported(data_dir: Path) -> int:
    store = Store.open(data_dir, clock=SystemClock())
    try:
        return len(store.select([Matcher("__name__", "=", "imported_total")], 0, 2**62))
    finally:
        store.close()


@pytest.mark.parametrize("delay_s", [0.8, 2.2])
def test_an_import_killed_midway_is_all_or_nothing(serve, tmp_path: Path, delay_s: float) -> None:  # type: ignore[no-untyped-def]
    """kill -9 at some moment of a 60,000-series import: afterwards the store holds all of it or none."""
    data = tmp_path / "data"
    n = 60_000
    body = "".join(f'imported_total{{pod="p{i}"}} {i} 1700000000000\n' for i in range(n)).encode()
    srv = serve("--demo", data_dir=data, env=clean_env(GPUWATCH_DEMO_GPUS="1", GPUWATCH_DEMO_SOURCES="false"))

    def post() -> None:
        with contextlib.suppress(requests.RequestException):
            requests.post(srv.url + "/api/v1/import/prometheus", data=body, timeout=120)

    sender = threading.Thread(target=post)
    sender.start()
    time.sleep(delay_s)  # a moment somewhere in the import: what is asserted does not depend on which
    srv.stop(signal.SIGKILL)
    sender.join(60)
    assert _imported(data) in (0, n)
