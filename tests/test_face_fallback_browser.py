"""A face whose VictoriaMetrics goes away, in Debian's Chromium: a demo gpuwatch whose `storage.remote` is
Debian's VictoriaMetrics 1.79 draws its pages from the store; the store killed, the API answers 200 from
the face's own last minutes with the warning, the page shows it in one banner line with its charts still
drawn, and the rules skip their round with the error; the store started again on the same port and
data, the warning and the banner go."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.browser import chart_points, wait_panels
from tests.conftest import Server, clean_env, free_port, require_tool, wait_until

pytestmark = pytest.mark.slow

LIVE = "from=now-1h&to=now&refresh=1s"


class Store:
    """Debian's VictoriaMetrics on one port and data directory, stopped and started again at will."""

    def __init__(self, data: Path) -> None:
        self.data, self.port = data, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                require_tool("victoria-metrics"),
                "-search.latencyOffset=0s",
                "-retentionPeriod=100y",
                f"-storageDataPath={self.data}",
                f"-httpListenAddr=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )

        def up() -> bool:
            try:
                return requests.get(f"{self.url}/health", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_until(up, 30, "VictoriaMetrics did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[Store, Server]]:
    store = Store(tmp_path / "vm")
    store.start()
    config = tmp_path / "face.yml"
    config.write_text(
        "storage:\n  remote:\n"
        f"    query_url: {store.url}\n    write_url: {store.url}/api/v1/write\n    local_buffer: 10m\n"
    )
    env = clean_env(GPUWATCH_HOSTNAME="face", GPUWATCH_DEMO_GPUS="2", GPUWATCH_EVALUATION_INTERVAL="1s",
                    GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOST_INTERVAL="1s")  # fmt: skip
    face = Server(["--demo", "--config", str(config)], tmp_path / "data", free_port(), env)
    try:
        face.start()
        yield store, face
    finally:
        if face.proc is not None and face.proc.poll() is None:
            face.stop(signal.SIGKILL)
        store.kill()


def query(face: Server, expr: str) -> dict[str, Any]:
    return dict(face.get("/api/v1/query", params={"query": expr}).json())


def test_a_face_whose_store_is_down_says_so_in_one_line_and_draws_its_last_minutes(
    lab: tuple[Store, Server], page: Any
) -> None:
    store, face = lab
    wait_until(lambda: len(query(face, "DCGM_FI_DEV_GPU_UTIL")["data"]["result"]) == 2, 60,
               f"the face's GPUs never reached the store; log:\n{face.log}")  # fmt: skip
    assert "warnings" not in query(face, "DCGM_FI_DEV_GPU_UTIL")

    store.kill()
    got = query(face, "DCGM_FI_DEV_GPU_UTIL")
    assert got["status"] == "success" and len(got["data"]["result"]) == 2  # the face's own, from its store
    # a new connection is refused; one the face kept open from before may be reset on its first use,
    # or end in the middle of an answer the store was writing as it was killed
    reasons = (
        "cannot connect: Connection refused",
        "connection dropped before the answer: Connection reset by peer",
        "connection dropped during the answer: Response ended prematurely",
    )
    lines = [
        f"remote query backend {store.url} unreachable: {why}; answered from the local buffer (last 10 minutes)"
        for why in reasons
    ]
    assert len(got["warnings"]) == 1 and got["warnings"][0] in lines, got["warnings"]

    page.goto(f"{face.url}/?{LIVE}")
    states = wait_panels(page, 30_000)
    for chart in ("util", "memory", "power"):
        assert states[chart] == "data" and chart_points(page, chart) > 0, (chart, states)
    banner = page.locator("#gw-remote")
    assert banner.is_visible() and banner.inner_text() in lines
    assert page.locator(".gw-remote").count() == 1  # one line for the page, none per panel
    assert banner.bounding_box()["height"] < 40  # type: ignore[index]

    def skipped() -> bool:
        rules = face.get("/api/v1/rules").json()["data"]["groups"]
        return all("round skipped" in r.get("lastError", "") for g in rules for r in g["rules"])

    wait_until(skipped, 30, "the rules did not skip their round")

    store.start()  # the same port and data: the warning goes once the face asks again
    wait_until(lambda: "warnings" not in query(face, "DCGM_FI_DEV_GPU_UTIL"), 30, "the warning stayed")
    page.wait_for_function("() => document.getElementById('gw-remote').hidden", timeout=30_000)
    assert page.console.errors == []
