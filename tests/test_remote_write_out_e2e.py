"""Remote write out, end to end: a node (`gpuwatch serve --demo`) writes to a hub (another gpuwatch) and
to a real Prometheus (`--web.enable-remote-write-receiver`). The hub is stopped for a while, the node is
killed with -9 during the outage and started again, and afterwards every sample the node stored is on
the hub, with its timestamp and value."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import GPUWATCH, Server, clean_env, free_port, require_tool, run_prometheus, wait_until

pytestmark = pytest.mark.slow

SERIES = 'DCGM_FI_DEV_POWER_USAGE{Hostname="node-a",gpu="0"}'


def samples(url: str, selector: str, at_s: float, window_s: int = 600) -> dict[int, str]:
    """The raw samples of one series over the last `window_s` before `at_s`: time (ms) -> value."""
    r = requests.get(
        f"{url}/api/v1/query", params={"query": f"{selector}[{window_s}s]", "time": f"{at_s:.3f}"}, timeout=10
    )
    r.raise_for_status()
    result = r.json()["data"]["result"]
    assert len(result) <= 1, result
    return {int(round(t * 1000)): v for t, v in (result[0]["values"] if result else [])}


def node_config(tmp_path: Path, *urls: str) -> Path:
    lines = ["sample_interval: 1s", "demo_sources: false", "remote_write:"]
    for i, url in enumerate(urls):
        lines += [
            f"  - url: {url}",
            f"    name: dest{i}",
            "    queue_config: {batch_send_deadline: 500ms, min_backoff: 100ms, max_backoff: 1s}",
        ]
    path = tmp_path / "node.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for s in made:
        if s.proc is not None and s.proc.poll() is None:
            s.stop(signal.SIGKILL)


def test_a_node_loses_nothing_through_a_hub_outage_and_its_own_kill_9(
    tmp_path: Path, servers: list[Server]
) -> None:
    hub = Server(
        [],
        tmp_path / "hub" / "data",
        free_port(),
        clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOSTNAME="hub"),
    )
    (tmp_path / "hub").mkdir()
    servers.append(hub.start())
    config = node_config(tmp_path, f"{hub.url}/api/v1/write")
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOSTNAME="node-a", GPUWATCH_DEMO_GPUS="2")
    node = Server(["--demo", "--config", str(config)], tmp_path / "node" / "data", free_port(), env)
    (tmp_path / "node").mkdir()
    servers.append(node.start())
    wait_until(
        lambda: len(samples(hub.url, SERIES, time.time())) >= 3,
        30,
        f"no samples reached the hub; node log:\n{node.log}",
    )

    hub.stop(signal.SIGTERM)  # the outage: the node keeps sampling and storing
    down_at = time.time()

    def stored_since(t0: float, n: int) -> Any:
        return lambda: sum(t > t0 * 1000 for t in samples(node.url, SERIES, time.time())) >= n

    wait_until(stored_since(down_at, 3), 20, "the node stored nothing during the outage")
    node.stop(signal.SIGKILL)  # and the node dies during it
    node.start()
    wait_until(stored_since(time.time(), 2), 20, "the node stored nothing after its restart")
    hub.start()

    def caught_up() -> bool:
        now = time.time()
        mine = samples(node.url, SERIES, now - 2)
        theirs = samples(hub.url, SERIES, now - 2)
        return bool(mine) and all(t in theirs for t in mine)

    wait_until(caught_up, 60, f"the hub did not catch up; node log:\n{node.log}")
    assert node.stop(signal.SIGTERM) == 0
    at = time.time()
    node_data = _query_stopped(node, SERIES, at)  # the node is stopped: read its store
    hub_data = samples(hub.url, SERIES, at)
    missing = sorted(t for t in node_data if t not in hub_data)
    assert missing == [], (
        f"{len(missing)} of {len(node_data)} node samples missing on the hub, first {missing[:5]}"
    )
    assert all(hub_data[t] == v for t, v in node_data.items())
    assert len(node_data) >= 8
    status = requests.get(f"{hub.url}/-/health", timeout=5)
    assert status.status_code == 200


def _query_stopped(node: Server, selector: str, at_s: float) -> dict[int, str]:
    """Raw samples from a stopped node's data directory (`gpuwatch query --data-dir`)."""
    out = subprocess.run(
        [
            *GPUWATCH,
            "query",
            f"{selector}[600s]",
            "--time",
            f"{at_s:.3f}",
            "--data-dir",
            str(node.data_dir),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert out.returncode == 0, out.stderr
    data: Any = json.loads(out.stdout)
    result = data["result"]
    return {int(round(t * 1000)): v for t, v in (result[0]["values"] if result else [])}


def test_a_node_writes_into_a_real_prometheus(tmp_path: Path, servers: list[Server]) -> None:
    """Samples and label sets arrive as stored, and with `gpuwatch rules export` loaded, Prometheus fires
    a built-in alert from what the node wrote."""
    rules = tmp_path / "gpuwatch-rules.yml"
    export = subprocess.run(
        [*GPUWATCH, "rules", "export", "-o", str(rules)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert export.returncode == 0, export.stderr
    config = "global: {scrape_interval: 1m, evaluation_interval: 1s}\nrule_files: [gpuwatch-rules.yml]\n"
    with run_prometheus(tmp_path, config, "--web.enable-remote-write-receiver") as p:
        prom = p.url
        config = node_config(tmp_path, f"{prom}/api/v1/write")
        env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOSTNAME="node-a", GPUWATCH_DEMO_GPUS="2")
        node = Server(["--demo", "--config", str(config)], tmp_path / "node" / "data", free_port(), env)
        (tmp_path / "node").mkdir()
        servers.append(node.start())

        def arrived() -> bool:
            try:
                return len(samples(prom, SERIES, time.time())) >= 5
            except requests.RequestException:
                return False

        wait_until(arrived, 40, f"nothing reached Prometheus; node log:\n{node.log}")
        at = time.time()
        theirs = samples(prom, SERIES, at)
        mine = samples(node.url, SERIES, at)
        assert set(theirs) <= set(mine)  # Prometheus has nothing the node did not store
        assert len(theirs) >= 5 and all(theirs[t] == mine[t] for t in theirs)
        labels = requests.get(f"{prom}/api/v1/series", params={"match[]": SERIES}, timeout=10).json()["data"]
        mine_labels = node.get("/api/v1/series", params={"match[]": SERIES}).json()["data"]
        assert labels == mine_labels
        metrics = node.get("/metrics").text
        assert 'prometheus_remote_storage_samples_total{remote_name="dest0"' in metrics

        pushed = requests.post(
            f"{node.url}/api/v1/push",
            json={"run": "llama-7b", "step": 10, "metrics": {"loss": "NaN"}},
            timeout=10,
        )
        assert pushed.status_code in (200, 204), pushed.text

        def fired() -> list[dict[str, Any]]:
            alerts = requests.get(f"{prom}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
            return [
                a for a in alerts if a["labels"]["alertname"] == "TrainingLossNaN" and a["state"] == "firing"
            ]

        wait_until(lambda: bool(fired()), 40, f"TrainingLossNaN did not fire in Prometheus; log:\n{p.log}")
        assert fired()[0]["labels"]["run"] == "llama-7b"


def test_a_node_writes_into_a_real_victoriametrics(tmp_path: Path, servers: list[Server]) -> None:
    """VictoriaMetrics 1.79 as the receiver: read back through its export API (no 30 s latency offset,
    no deduplication), sample for sample against the node's own store."""
    vm_bin = require_tool("victoria-metrics")
    port = free_port()
    proc = subprocess.Popen(
        [
            vm_bin,
            f"-storageDataPath={tmp_path / 'vm'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-search.latencyOffset=1s",  # 30 s by default: the newest samples hidden from queries
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        vm = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{vm}/health"), 20, "VictoriaMetrics did not start")
        config = node_config(tmp_path, f"{vm}/api/v1/write")
        env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOSTNAME="node-a", GPUWATCH_DEMO_GPUS="2")
        node = Server(["--demo", "--config", str(config)], tmp_path / "node" / "data", free_port(), env)
        (tmp_path / "node").mkdir()
        servers.append(node.start())

        def exported() -> list[dict[str, Any]]:
            requests.get(f"{vm}/internal/force_flush", timeout=10)
            r = requests.get(f"{vm}/api/v1/export", params={"match[]": SERIES}, timeout=10)
            return [json.loads(line) for line in r.text.splitlines() if line.strip()]

        wait_until(
            lambda: sum(len(s["values"]) for s in exported()) >= 5, 40, f"nothing in VM; log:\n{node.log}"
        )
        (series,) = exported()
        theirs = dict(zip(series["timestamps"], series["values"], strict=True))
        mine = samples(node.url, SERIES, time.time())
        assert set(theirs) <= set(mine) and len(theirs) >= 5
        assert all(float(mine[t]) == v for t, v in theirs.items())
        mine_labels = node.get("/api/v1/series", params={"match[]": SERIES}).json()["data"]
        assert [series["metric"]] == mine_labels
        _builtin_alert_fires_in_vmalert(tmp_path, vm, node)
    finally:
        proc.terminate()
        proc.wait(10)


def _builtin_alert_fires_in_vmalert(tmp_path: Path, vm: str, node: Server) -> None:
    """`gpuwatch rules export` loaded into vmalert over VictoriaMetrics: a built-in alert fires from
    what the node wrote, and vmalert posts it back to gpuwatch as to an Alertmanager."""
    rules = tmp_path / "gpuwatch-rules.yml"
    export = subprocess.run(
        [*GPUWATCH, "rules", "export", "-o", str(rules)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert export.returncode == 0, export.stderr
    pushed = requests.put(
        f"{node.url}/metrics/job/dcgm",
        data='DCGM_FI_DEV_ROW_REMAP_PENDING{gpu="0",UUID="GPU-1"} 1\n',
        timeout=10,
    )
    assert pushed.status_code in (200, 202, 204), pushed.text
    port = free_port()
    log = tmp_path / "vmalert.log"
    with log.open("w") as out:
        vmalert = subprocess.Popen(
            [
                require_tool("vmalert"),
                f"-rule={rules}",
                f"-datasource.url={vm}",
                f"-remoteWrite.url={vm}",  # recording rules' results and ALERTS, as gpuwatch stores them
                f"-notifier.url={node.url}",
                "-evaluationInterval=1s",
                f"-httpListenAddr=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:

        def firing() -> bool:
            assert vmalert.poll() is None, log.read_text()
            try:
                alerts = requests.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=5).json()["data"][
                    "alerts"
                ]
            except requests.RequestException:
                return False
            return any(a["name"] == "GPURowRemapPending" and a["state"] == "firing" for a in alerts or [])

        wait_until(
            firing, 60, f"GPURowRemapPending did not fire in vmalert; its log:\n{log.read_text()[-3000:]}"
        )

        def posted() -> bool:
            got = node.get("/api/v2/alerts", params={"filter": 'alertname="GPURowRemapPending"'}).json()
            return bool(got)

        wait_until(posted, 30, "vmalert's alert did not reach gpuwatch")
    finally:
        vmalert.terminate()
        vmalert.wait(10)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
