"""A lab on a store in a real browser: two demo nodes write into Debian's VictoriaMetrics 1.79 (or
Prometheus 2.42) as docs/examples/node-to-victoriametrics.yml says, and a gpuwatch face on it
(docs/examples/face-on-victoriametrics.yml, face-on-prometheus.yml) shows both in Debian's Chromium:
every page loads with the nodes' data and no console error; a built-in alert fires from the nodes' data
in the store and reaches the webhook; a silence made in the face's alerts page mutes the same alert of
the other node. (The face's `for` state across a restart: test_face_e2e.py.)"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import requests

from tests.browser import chart_points, wait_panels
from tests.conftest import Server, clean_env, free_port, run_prometheus, run_victoriametrics, wait_until
from tests.test_face_e2e import HOSTS, SHORT_WAIT, example
from tests.webhook_server import Hook, hook_server

pytestmark = pytest.mark.slow

LIVE = "from=now-5m&to=now&refresh=off"
ROW_REMAP = 'DCGM_FI_DEV_ROW_REMAP_PENDING{gpu="0",UUID="GPU-1"} 1\n'


class Lab:
    """The store, two demo nodes writing to it, a face on it, and the face's webhook."""

    def __init__(self, store: str, hook: Hook, face: Server, nodes: dict[str, Server]) -> None:
        self.store, self.hook, self.face, self.nodes = store, hook, face, nodes

    def query(self, expr: str) -> list[dict[str, Any]]:
        got = self.face.get("/api/v1/query", params={"query": expr}).json()
        assert got["status"] == "success", got
        return list(got["data"]["result"])

    def notified(self, alertname: str) -> set[str]:
        """The Hostname of every firing `alertname` the webhook was sent."""
        return {
            a["labels"].get("Hostname", "")
            for body in self.hook.bodies()
            if isinstance(body, dict)
            for a in body.get("alerts", [])
            if a["labels"].get("alertname") == alertname and a["status"] == "firing"
        }


@pytest.fixture(scope="module", params=["victoriametrics", "prometheus"])
def lab(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    kind = request.param
    tmp = tmp_path_factory.mktemp(f"face-on-{kind}")
    servers: list[Server] = []
    with ExitStack() as stack:
        if kind == "victoriametrics":
            url = stack.enter_context(run_victoriametrics(tmp))
        else:
            flags = ("--web.enable-remote-write-receiver",)
            url = stack.enter_context(run_prometheus(tmp, "global: {scrape_interval: 1m}\n", *flags)).url
        hook = stack.enter_context(hook_server())
        address = url.removeprefix("http://")
        try:
            nodes = {}
            for name in ("node-a", "node-b"):
                config = example(
                    "node-to-victoriametrics.yml", tmp / name, {"victoria-metrics:8428": address}
                )
                env = clean_env(GPUWATCH_HOSTNAME=name, GPUWATCH_DEMO_GPUS="2", GPUWATCH_FLUSH_INTERVAL="0.2s",
                                GPUWATCH_HOST_INTERVAL="1s")  # fmt: skip
                nodes[name] = Server(
                    ["--demo", "--config", str(config)], tmp / name / "data", free_port(), env
                )
                servers.append(nodes[name].start())
            config = example(
                f"face-on-{kind}.yml",
                tmp / "face",
                {HOSTS[kind]: address, "alert-receiver:9099": hook.url.removeprefix("http://"), **SHORT_WAIT},
            )
            env = clean_env(GPUWATCH_HOSTNAME="face", GPUWATCH_EVALUATION_INTERVAL="1s")
            face = Server(["--config", str(config)], tmp / "face" / "data", free_port(), env)
            servers.append(face.start())
            lab = Lab(url, hook, face, nodes)
            # what the pages draw: both nodes' GPUs, host rates, the demo's servers and the face's own
            # recorded series (from the rules it evaluates on VictoriaMetrics)
            for expr, n in (
                ("DCGM_FI_DEV_GPU_UTIL", 4),
                ("sum by (Hostname) (rate(node_disk_reads_completed_total[1m]))", 2),
                ('sum by (Hostname) (rate(vllm:request_success_total{job="demo-vllm"}[1m]))', 2),
                ('gpuwatch:inference_requests:rate1m{job="demo-vllm"}', 2),
            ):
                wait_until(
                    lambda e=expr, k=n: len(lab.query(e)) >= k,
                    90,
                    f"no data for {expr}; face log:\n{face.log}",
                )
            yield lab
        finally:
            for s in servers:
                if s.proc is not None and s.proc.poll() is None:
                    s.stop(signal.SIGKILL)


def test_every_page_of_the_face_loads_with_the_nodes_data(lab: Lab, page) -> None:  # type: ignore[no-untyped-def]
    face = lab.face.url
    page.goto(f"{face}/?{LIVE}")
    states = wait_panels(page, 30_000)
    assert states.pop("idle_held") in ("data", "nodata")  # no GPU idle-but-held for 10 minutes yet
    assert set(states.values()) == {"data"}, states
    for chart in ("util", "memory", "power", "net", "disk"):
        assert chart_points(page, chart) > 0, chart
    assert page.locator("#panel-gpus .gw-stat").inner_text() == "4"
    assert page.locator("a.gw-tile[data-state='Ready']").count() == 2

    page.goto(f"{face}/gpus/node-b/1?{LIVE}")
    states = wait_panels(page, 30_000)
    for chart in ("util", "memory", "power", "temp"):
        assert states.get(chart) == "data", (chart, states)

    page.goto(f"{face}/explore?expr=DCGM_FI_DEV_GPU_UTIL&{LIVE}")
    page.wait_for_function("() => document.getElementById('panel-explore').dataset.state === 'data'")
    assert "4 series" in page.locator("#info").inner_text()
    page.locator("#expr").fill("")
    page.locator("#expr").type("DCGM_FI_DEV_GP")  # completion from VictoriaMetrics' label values
    page.wait_for_selector("#complete li[data-value='DCGM_FI_DEV_GPU_UTIL']")

    page.goto(f"{face}/inference?{LIVE}")
    page.locator("#services-body tr[data-job='demo-vllm']").first.wait_for()
    page.goto(f"{face}/inference/demo-vllm?{LIVE}")
    states = wait_panels(page, 30_000)
    assert states["requests"] == "data" and chart_points(page, "requests") > 0, states

    for path in ("/timeline", "/alerts", "/training", "/logs", "/targets"):
        page.goto(f"{face}{path}?{LIVE}")
        page.wait_for_load_state("networkidle")
        if path == "/timeline":
            wait_panels(page, 30_000)
    assert page.console.errors == []


def test_an_alert_from_the_store_notifies_and_a_silence_from_the_page_mutes_it(lab: Lab, page) -> None:  # type: ignore[no-untyped-def]
    pushed = requests.put(f"{lab.nodes['node-a'].url}/metrics/job/dcgm", data=ROW_REMAP, timeout=10)
    assert pushed.status_code in (200, 202, 204), pushed.text
    wait_until(lambda: "node-a" in lab.notified("GPURowRemapPending"), 60,
               f"GPURowRemapPending did not reach the webhook; face log:\n{lab.face.log[-3000:]}")  # fmt: skip

    # the silence, from the face's alerts page: only its alertname kept of the alert's labels
    page.goto(f"{lab.face.url}/alerts?{LIVE}")
    row = page.locator("tr.alert-row[data-alertname='GPURowRemapPending']").first
    row.wait_for()
    row.locator("button.silence-btn").click()
    for chip in page.locator("#silence-matchers label.gw-chip").all():
        if not chip.inner_text().strip().startswith('alertname="'):
            chip.locator("input").uncheck()
    page.locator("#silence-create").click()
    page.locator("#silences-body tr[data-state='active']").first.wait_for()
    (silence,) = [
        s
        for s in requests.get(f"{lab.face.url}/api/v2/silences", timeout=5).json()
        if s["status"]["state"] == "active"
    ]
    assert silence["matchers"] == [
        {"name": "alertname", "value": "GPURowRemapPending", "isRegex": False, "isEqual": True}
    ]

    # the same alert from the other node, after the silence: muted
    pushed = requests.put(f"{lab.nodes['node-b'].url}/metrics/job/dcgm", data=ROW_REMAP, timeout=10)
    assert pushed.status_code in (200, 202, 204), pushed.text

    def muted() -> bool:
        got = lab.face.get("/api/v2/alerts", params={"filter": 'alertname="GPURowRemapPending"'}).json()
        return any(
            a["labels"].get("Hostname") == "node-b" and a["status"]["silencedBy"] == [silence["id"]]
            for a in got
        )

    wait_until(muted, 60, f"node-b's GPURowRemapPending is not muted; face log:\n{lab.face.log[-3000:]}")
    # An alert posted after it, to the same route: once the webhook has it, node-b's (firing earlier, with
    # the same group_wait) would have come before it, had it not been muted.
    after = {"labels": {"alertname": "AfterTheSilence", "Hostname": "node-b"}, "annotations": {}}
    assert requests.post(f"{lab.face.url}/api/v2/alerts", json=[after], timeout=5).ok
    wait_until(
        lambda: bool(lab.notified("AfterTheSilence")), 60, "the alert posted after the silence was not sent"
    )
    assert lab.notified("GPURowRemapPending") == {"node-a"}
    assert page.console.errors == []
