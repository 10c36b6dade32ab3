"""A lab that loses nothing, end to end: a hub (`gpuwatch serve`, writes only with a machine token) and
two nodes (`gpuwatch serve --demo`, 2 GPUs each) pushing to it by remote write. The hub is stopped
(SIGTERM) for 20 s (twice the sender's `LIVE_DELAY_S`: node-a's live samples go first) and started
again on the same data directory and port; once the nodes have caught up, the hub shows both nodes
Ready with no alert firing (each node's own figures a series of its own), and, the nodes stopped,
every sample each node stored of its GPUs' utilization, power and memory used is on the hub, time and
value."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import GPUWATCH, Server, clean_env, free_port, wait_until

pytestmark = pytest.mark.slow

NODES = ("node-a", "node-b")
METRICS = "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_POWER_USAGE|DCGM_FI_DEV_FB_USED"
OUTAGE_S = 20.0
WINDOW_S = 600  # every sample of the test: it runs for under two minutes

Series = dict[tuple[str, str], dict[int, str]]  # (metric, gpu) -> time (ms) -> value


def selector(node: str) -> str:
    return f'{{__name__=~"{METRICS}",Hostname="{node}"}}[{WINDOW_S}s]'


def by_series(result: list[dict[str, Any]]) -> Series:
    return {
        (r["metric"]["__name__"], r["metric"]["gpu"]): {int(round(t * 1000)): v for t, v in r["values"]}
        for r in result
    }


def hub_series(hub: Server, node: str, at_s: float) -> Series:
    r = hub.get("/api/v1/query", params={"query": selector(node), "time": f"{at_s:.3f}"})
    r.raise_for_status()
    return by_series(r.json()["data"]["result"])


def stored_series(node: Server, at_s: float) -> Series:
    """What a stopped node stored, read from its data directory (`gpuwatch query --data-dir`)."""
    out = subprocess.run(
        [*GPUWATCH, "query", selector(node.env["GPUWATCH_HOSTNAME"]), "--time", f"{at_s:.3f}",
         "--data-dir", str(node.data_dir), "--json"],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return by_series(json.loads(out.stdout)["result"])


def newest_on_hub(hub: Server) -> dict[str, float]:
    """Each node's oldest "newest GPU utilization sample" on the hub (s): what it has sent up to."""
    r = hub.get("/api/v1/query", params={"query": "min by (Hostname) (timestamp(DCGM_FI_DEV_GPU_UTIL))"})
    r.raise_for_status()
    return {s["metric"].get("Hostname", ""): float(s["value"][1]) for s in r.json()["data"]["result"]}


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for s in made:
        if s.proc is not None and s.proc.poll() is None:
            s.stop(signal.SIGKILL)


def start_lab(tmp_path: Path, servers: list[Server]) -> tuple[Server, list[Server]]:
    """A hub that takes writes only with a token, as `install.sh --hub` makes it, and nodes that send
    with that token, as `install.sh --node` configures them."""
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    made = subprocess.run(
        [*GPUWATCH, "token", "create", "nodes", "--role", "machine", "--data-dir", str(hub_dir / "data")],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    token_file = tmp_path / "hub-token"
    token_file.write_text(made.stdout.splitlines()[-1] + "\n")
    hub_config = hub_dir / "gpuwatch.yml"
    # A hub without GPUs disables the two rules about its own GPUs, as their text says.
    hub_config.write_text(
        "evaluation_interval: 2s\nbuiltin_rules: {disable: [NVMLUnavailable, GPUMetricsAbsent]}\n"
    )
    hub_env = clean_env(
        GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOSTNAME="hub", GPUWATCH_TRUST_LOOPBACK="false"
    )
    hub = Server(["--config", str(hub_config)], hub_dir / "data", free_port(), hub_env)
    servers.append(hub.start())
    assert requests.post(f"{hub.url}/api/v1/write", data=b"", timeout=10).status_code == 401
    nodes = []
    for name in NODES:
        (tmp_path / name).mkdir()
        config = tmp_path / name / "gpuwatch.yml"
        config.write_text(
            "sample_interval: 1s\ndemo_sources: false\nremote_write:\n"
            f"  - url: {hub.url}/api/v1/write\n    name: hub\n"
            f"    authorization: {{credentials_file: {token_file}}}\n"
            "    queue_config: {batch_send_deadline: 500ms, min_backoff: 100ms, max_backoff: 1s"
            # node-a as install.sh --node writes it (new samples first, the backlog behind them at a
            # pace), node-b in order (as for a Prometheus): both must lose nothing
            + (", live_first: true, catch_up_rate: 2000}\n" if name == NODES[0] else "}\n")
        )
        env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOSTNAME=name, GPUWATCH_DEMO_GPUS="2")
        node = Server(["--demo", "--config", str(config)], tmp_path / name / "data", free_port(), env)
        servers.append(node.start())
        nodes.append(node)
    return hub, nodes


def test_a_hub_restarted_after_20_s_misses_no_node_sample(tmp_path: Path, servers: list[Server]) -> None:
    hub, nodes = start_lab(tmp_path, servers)
    logs = lambda: "".join(f"\n{s.env['GPUWATCH_HOSTNAME']} log:\n{s.log[-3000:]}" for s in servers)  # noqa: E731
    wait_until(lambda: set(newest_on_hub(hub)) >= set(NODES), 30, f"no node reached the hub{logs()}")

    hub.stop(signal.SIGTERM)
    down_at, down_mono = time.time(), time.monotonic()
    wait_until(lambda: time.monotonic() - down_mono >= OUTAGE_S, OUTAGE_S + 10, "the clock stopped")
    for node in nodes:  # the nodes kept sampling, and know they are behind
        (state,) = node.get("/api/ui/targets").json()["data"]["remote_write"]
        assert state["health"] == "down" and state["samplesPending"] > 0, state
        assert state["highestSentTimestamp"] < down_at, state
    hub.start()
    up_at = time.time()

    wait_until(
        lambda: all(newest_on_hub(hub).get(n, 0) >= up_at for n in NODES),
        60,
        f"the nodes did not catch up within 60 s{logs()}",
    )
    wait_until(
        lambda: all(
            not n.get("/api/ui/targets").json()["data"]["remote_write"][0]["gapSamplesPending"] for n in nodes
        ),
        60,
        f"node-a's backlog behind its live samples was not sent within 60 s{logs()}",
    )
    caught_up_s = time.time() - up_at
    assert "live samples go first" in nodes[0].log and "live samples go first" not in nodes[1].log

    # The hub's view: both nodes Ready, and no alert firing after a rule round that saw the catch-up.
    def evaluated_since(t_s: float) -> bool:
        groups = hub.get("/api/v1/rules").json()["data"]["groups"]
        last = [
            datetime.fromisoformat(g["lastEvaluation"].replace("Z", "+00:00")).timestamp()
            for g in groups
            if g["name"] in ("gpuwatch-gpu", "gpuwatch-health")  # every 2 s; the GPU and node alerts
        ]
        return len(last) == 2 and min(last) > t_s

    seen = time.time()
    wait_until(lambda: evaluated_since(seen), 20, "the hub's rules were not evaluated")
    tiles = {t["name"]: t for t in hub.get("/api/ui/cluster").json()["data"]["tiles"]}
    assert [(tiles[n]["state"], tiles[n]["gpus"]) for n in NODES] == [("Ready", 2)] * 2, tiles
    firing = [a for a in hub.get("/api/v1/alerts").json()["data"]["alerts"] if a["state"] == "firing"]
    assert firing == [], firing
    # Each gpuwatch's own figures are a series of their own (they carry no host label as stored).
    own = hub.get("/api/v1/query", params={"query": "gpuwatch_gpus"}).json()["data"]["result"]
    assert {r["metric"].get("Hostname", "(hub)"): r["value"][1] for r in own} == {
        "(hub)": "0",
        "node-a": "2",
        "node-b": "2",
    }

    with ThreadPoolExecutor() as both:  # the nodes stopped, and their stores read, side by side
        assert list(both.map(lambda n: n.stop(signal.SIGTERM), nodes)) == [0, 0]
        at = time.time()
        stored = list(both.map(lambda n: stored_series(n, at), nodes))
    for node, mine in zip(nodes, stored, strict=True):
        name = node.env["GPUWATCH_HOSTNAME"]
        theirs = hub_series(hub, name, at)
        assert len(mine) == 6, sorted(mine)  # 3 metrics x 2 GPUs
        for key, samples in mine.items():
            during = [t for t in samples if down_at * 1000 < t < up_at * 1000]
            assert len(during) >= OUTAGE_S - 5, f"{name} {key}: {len(during)} samples during the outage"
            got = theirs.get(key, {})
            missing = sorted(set(samples) - set(got))
            tail = (
                " (all after the hub's newest: unsent at SIGTERM)" if got and missing[:1] > [max(got)] else ""
            )
            assert missing == [], (
                f"{name} {key}: {len(missing)} of {len(samples)} samples missing on the hub{tail}, "
                f"first {missing[:5]}; caught up {caught_up_s:.1f} s after the restart"
            )
            assert got == samples, f"{name} {key}: the hub has other values or samples"
