"""gpuwatch as the face of a lab on a real store, end to end, from the configs users copy
(docs/examples/): a demo node writes into Debian's VictoriaMetrics 1.79 (or Prometheus 2.42) as
node-to-victoriametrics.yml says, and a face started from face-on-victoriametrics.yml (or
face-on-prometheus.yml), the address replaced and nothing else, answers queries from the store, fires a
built-in alert from the node's data there and notifies the webhook, writes ALERTS back, and keeps a
pending alert's `for` state across a restart on an empty data directory."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import ROOT, Server, clean_env, free_port, run_prometheus, run_victoriametrics, wait_until
from tests.webhook_server import hook_server

pytestmark = pytest.mark.slow

EXAMPLES = ROOT / "docs" / "examples"
HOSTS = {"victoriametrics": "victoria-metrics:8428", "prometheus": "prometheus:9090"}
NODE_HOT = """groups:
  - name: face
    rules:
      - alert: NodeHot
        expr: DCGM_FI_DEV_GPU_UTIL{Hostname="node-a", gpu="0"} >= 0
        for: 1h
"""


@pytest.fixture(params=["victoriametrics", "prometheus"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(kind, URL) of a running VictoriaMetrics or Prometheus (with its remote-write receiver)."""
    with ExitStack() as stack:
        if request.param == "victoriametrics":
            url = stack.enter_context(run_victoriametrics(tmp_path))
        else:
            flags = ("--web.enable-remote-write-receiver",)
            url = stack.enter_context(run_prometheus(tmp_path, "global: {scrape_interval: 1m}\n", *flags)).url
        yield request.param, url


# The examples' 10 s group_wait, shortened: each notification the tests wait for would wait it out.
SHORT_WAIT = {"group_wait: 10s": "group_wait: 1s"}


def example(name: str, dest: Path, replace: dict[str, str], extra: str = "") -> Path:
    """docs/examples/`name` with each key of `replace` replaced (hosts, as a lab would), at `dest`."""
    text = (EXAMPLES / name).read_text()
    for old, new in replace.items():
        assert old in text, (name, old)
        text = text.replace(old, new)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / name
    path.write_text(text + extra)
    return path


def remote_query(url: str, expr: str) -> list[dict[str, Any]]:
    r = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    return list(r.json()["data"]["result"])


def alerts(server: Server, name: str) -> list[dict[str, Any]]:
    found = server.get("/api/v1/alerts").json()["data"]["alerts"]
    return [a for a in found if a["labels"]["alertname"] == name]


def test_the_examples_run_a_lab_on_the_store_and_a_face_keeps_its_for_state(
    tmp_path: Path, store: tuple[str, str]
) -> None:
    kind, url = store
    address = url.removeprefix("http://")
    servers: list[Server] = []
    with hook_server() as hook:
        try:
            node_config = example(
                "node-to-victoriametrics.yml", tmp_path / "node", {"victoria-metrics:8428": address}
            )
            node_env = clean_env(
                GPUWATCH_HOSTNAME="node-a", GPUWATCH_DEMO_GPUS="2", GPUWATCH_FLUSH_INTERVAL="0.2s"
            )
            node = Server(
                ["--demo", "--config", str(node_config)], tmp_path / "node" / "data", free_port(), node_env
            )
            servers.append(node.start())
            (tmp_path / "face" / "rules").mkdir(parents=True)
            (tmp_path / "face" / "rules" / "face.yml").write_text(NODE_HOT)
            face_config = example(
                f"face-on-{kind}.yml",
                tmp_path / "face",
                {HOSTS[kind]: address, "alert-receiver:9099": hook.url.removeprefix("http://"), **SHORT_WAIT},
                extra="rule_files: [rules/*.yml]\n",
            )
            face_env = clean_env(GPUWATCH_HOSTNAME="face", GPUWATCH_EVALUATION_INTERVAL="1s")
            face = Server(["--config", str(face_config)], tmp_path / "face" / "data-1", free_port(), face_env)
            servers.append(face.start())

            # the node's samples, as the store holds them (with the node's external label), through the face
            def from_the_store() -> bool:
                got = face.get(
                    "/api/v1/query", params={"query": 'DCGM_FI_DEV_GPU_UTIL{Hostname="node-a"}'}
                ).json()
                return any(s["metric"].get("cluster") == "lab" for s in got["data"]["result"])

            wait_until(
                from_the_store, 40, f"the face shows none of the node's samples; face log:\n{face.log}"
            )

            def cluster() -> dict[str, Any]:
                ui = face.get("/api/ui/cluster")
                assert ui.status_code == 200, ui.text
                return dict(ui.json()["data"])

            # the cluster page's GPU table and node tiles: the node's, from the store; none for the face
            wait_until(lambda: len(cluster()["gpus_seen"]) == 2, 30, f"no GPU table; face log:\n{face.log}")
            page = cluster()
            assert {(g["hostname"], g["gpu"]) for g in page["gpus_seen"]} == {
                ("node-a", "0"),
                ("node-a", "1"),
            }
            assert [(t["name"], t["state"], t["gpus"]) for t in page["tiles"]] == [("node-a", "Ready", 2)]

            pushed = requests.put(
                f"{node.url}/metrics/job/dcgm",
                data='DCGM_FI_DEV_ROW_REMAP_PENDING{gpu="0",UUID="GPU-1"} 1\n',
                timeout=10,
            )
            assert pushed.status_code in (200, 202, 204), pushed.text

            def notified() -> bool:
                return any(
                    a["labels"].get("alertname") == "GPURowRemapPending" and a["status"] == "firing"
                    for body in hook.bodies()
                    if isinstance(body, dict)
                    for a in body.get("alerts", [])
                )

            wait_until(
                notified, 60, f"GPURowRemapPending did not reach the webhook; face log:\n{face.log[-3000:]}"
            )
            # what the face's rules wrote went back to the store by remote write
            wait_until(
                lambda: bool(remote_query(url, 'ALERTS{alertname="GPURowRemapPending", role="face"}')),
                30,
                "the face's ALERTS did not reach the store",
            )

            wait_until(lambda: bool(alerts(face, "NodeHot")), 30, "NodeHot is not pending on the face")
            (before,) = alerts(face, "NodeHot")
            assert before["state"] == "pending"
            wait_until(
                lambda: bool(remote_query(url, 'ALERTS_FOR_STATE{alertname="NodeHot"}')),
                30,
                "the face's ALERTS_FOR_STATE did not reach the store",
            )
            assert face.stop(signal.SIGTERM) == 0
            # the same face on an empty data directory: only the store remembers when NodeHot began
            again = Server(
                ["--config", str(face_config)], tmp_path / "face" / "data-2", free_port(), face_env
            )
            servers.append(again.start())
            wait_until(lambda: bool(alerts(again, "NodeHot")), 30, f"NodeHot is not back; log:\n{again.log}")
            (after,) = alerts(again, "NodeHot")
            assert (after["state"], after["activeAt"]) == ("pending", before["activeAt"]), again.log[-3000:]
        finally:
            for s in servers:
                if s.proc is not None and s.proc.poll() is None:
                    s.stop(signal.SIGKILL)
