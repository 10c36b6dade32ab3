"""A full data disk is seen and survived: `/-/health` says degraded (503) and the GpuwatchStoreWriteErrors
alert fires (and `/api/v1/query` answers gpuwatch's own figures) while writes fail, samples wait in memory and are written when space returns, and a stop
while full is one line and exit 1.

The data directory is a small tmpfs the test mounts (as root; skipped where mounting is not allowed)
and fills with a file until the kernel says no space is left.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import Server, clean_env, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(disk: Path) -> Path:
    """Fill `disk` up with one file; return it (delete it to give the space back)."""
    filler = disk / "filler"
    with filler.open("wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 20))
            f.flush()
    return filler


def _health(server: Server) -> tuple[int, dict]:
    r = requests.get(server.url + "/-/health", timeout=5)
    return r.status_code, r.json()


def _samples(server: Server) -> int:
    r = server.get("/api/v1/query", params={"query": 'count_over_time(DCGM_FI_DEV_GPU_UTIL{gpu="0"}[1h])'})
    result = r.json()["data"]["result"]
    return int(result[0]["value"][1]) if result else 0


def _alert_state(server: Server, name: str) -> str | None:
    alerts = server.get("/api/v1/alerts").json()["data"]["alerts"]
    return next((a["state"] for a in alerts if a["labels"]["alertname"] == name), None)


def test_a_full_disk_degrades_health_alerts_recovers_and_a_stop_while_full_exits_1(
    serve: Callable[..., Server], small_disk: Path
) -> None:
    env = clean_env(
        GPUWATCH_FLUSH_INTERVAL="0.5s",
        GPUWATCH_DEMO_GPUS="2",
        GPUWATCH_DEMO_SOURCES="false",
        GPUWATCH_EVALUATION_INTERVAL="1s",
    )
    server = serve("--demo", data_dir=small_disk / "data", env=env)
    wait_until(lambda: _samples(server) >= 2, 30, "no samples stored")
    filler = _fill(small_disk)
    wait_until(lambda: _health(server)[0] == 503, 60, f"health stayed ok on a full disk; log:\n{server.log}")
    _, body = _health(server)
    assert body["status"] == "degraded" and "store writes fail" in body["problem"], body
    # The alert reads the write errors the live process counted, not what it could not store.
    wait_until(
        lambda: _alert_state(server, "GpuwatchStoreWriteErrors") == "firing",
        60,
        f"GpuwatchStoreWriteErrors did not fire on a full disk; log:\n{server.log}",
    )
    assert _health(server)[0] == 503, "the alert fired only once the disk had space again"
    # PromQL and the dashboard read the same figure from memory: what was stored before says 0.
    r = server.get("/api/v1/query", params={"query": "gpuwatch_store_write_errors_total"})
    assert float(r.json()["data"]["result"][0]["value"][1]) > 0, r.text
    during = _samples(server)
    filler.unlink()
    wait_until(lambda: _health(server)[0] == 200, 60, f"health did not recover; log:\n{server.log}")
    wait_until(lambda: _samples(server) > during + 2, 30, "samples taken while full were not written")
    _fill(small_disk)  # full again, then stopped: one line, exit 1
    wait_until(lambda: _health(server)[0] == 503, 60, f"health stayed ok on a full disk; log:\n{server.log}")
    assert server.stop() == 1
    log = server.log
    assert "Traceback" not in log and "internal error" not in log, log
    assert "samples could not be written before exit" in log, log
