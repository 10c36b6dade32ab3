"""The training, inference, alerts, targets and logs pages in a real browser (Debian's Chromium)
against the session's one `gpuwatch serve --demo`: no console errors, charts that hold data, a
silence made from an alert in two clicks, and outside text (run names, annotations, log lines)
that stays text."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from gpuwatch.web.dash.panel import fill
from tests.browser import chart_points, wait_panels
from tests.conftest import wait_until

pytestmark = pytest.mark.slow
LIVE = "from=now-5m&to=now&refresh=off"
RUN = "demo-llama-7b-sft"
XSS = '<img src=x onerror="window.__xss=1">'


def _api(srv: Any, path: str, **params: str) -> Any:
    return srv.get(path, params=params).json()


def _settled(page: Any, selector: str, timeout_ms: int = 20_000) -> None:
    """Wait until the element named by `selector` has left loading (it has a data-state)."""
    page.wait_for_function(
        "(s) => { const e = document.querySelector(s); return !!e && !!e.dataset.state && e.dataset.state !== 'loading'; }",
        arg=selector,
        timeout=timeout_ms,
    )


def test_training_pages(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{demo_server.url}/training?{LIVE}")
    row = page.locator(f"#runs-body tr[data-run='{RUN}']")
    row.wait_for()
    assert row.get_attribute("data-state") == "running"
    assert "%" in row.locator("td").nth(3).inner_text()
    row.locator("a.run-link").click()
    page.wait_for_url(f"**/training/{RUN}**")
    for chart in ("loss", "lr", "grad", "throughput"):
        _settled(page, f"#panel-{chart}")
    assert chart_points(page, "loss") > 0 and chart_points(page, "throughput") > 0
    loss = page.evaluate(
        "() => document.querySelector('#panel-loss .js-plotly-plot').data.map(t => t.opacity || 1)"
    )
    assert min(loss) < 0.5 <= max(loss)  # the raw line faint under the smoothed one
    states = wait_panels(page)  # the run's GPUs (its host's, as the demo names no GPUs)
    assert states["gpu_util"] == "data" and chart_points(page, "gpu_util") > 0
    assert page.locator("#logs-body tr").count() > 0
    page.select_option("#xaxis", "step")  # the x axis by step: same points, a linear axis
    page.wait_for_url("**x=step**")
    assert (
        page.evaluate("() => document.querySelector('#panel-loss .js-plotly-plot').layout.xaxis.type")
        == "linear"
    )
    assert chart_points(page, "loss") > 0
    # the smoothing slider sets the URL and redraws from the server
    page.evaluate(
        "() => { const s = document.getElementById('smoothing'); s.value = '0.9'; s.dispatchEvent(new Event('change')); }"
    )
    page.wait_for_url("**smoothing=0.9**")
    assert page.console.errors == []


def test_a_busy_server_leaves_the_run_page_drawing_not_an_error(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    # The run page's twin takes a query turn (web/admission.py): answered 503 `unavailable` twice, the
    # page asks again a second later (here with auto-refresh off) and draws, never an error panel.
    asked = []

    def busy_twice(route) -> None:  # type: ignore[no-untyped-def]
        asked.append(route.request.url)
        if len(asked) <= 2:
            route.fulfill(status=503, headers={"Retry-After": "1"}, content_type="application/json",
                          body='{"status":"error","errorType":"unavailable","error":"too many concurrent queries (test)"}')  # fmt: skip
        else:
            route.continue_()

    page.route(f"**/api/ui/training/{RUN}?*", busy_twice)
    page.goto(f"{demo_server.url}/training/{RUN}?{LIVE}")
    _settled(page, "#panel-loss")
    assert page.get_attribute("#panel-loss", "data-state") == "data" and len(asked) >= 3
    assert chart_points(page, "loss") > 0
    assert [e for e in page.console.errors if "503" not in e] == []


def test_inference_pages(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    wait_until(
        lambda: any(
            s["job"] == "demo-vllm" for s in _api(demo_server, "/api/ui/inference")["data"]["services"]
        ),
        30,
        "the demo's vLLM never showed up as a service",
    )
    page.goto(f"{demo_server.url}/inference?{LIVE}")
    page.locator("#services-body tr[data-job='demo-vllm']").wait_for()
    assert page.locator("#services-body tr[data-job='demo-sglang']").count() == 1
    # Those charts draw rates of counters that exist once the simulated vLLM has finished requests and
    # been scraped twice; on a loaded machine that can come after the service itself shows up.
    charts = ("requests", "tokens", "queue", "kv_cache", "up")
    twin = _api(demo_server, "/api/ui/inference/demo-vllm")
    queries = {p["id"]: fill(p["query"], twin["variables"]) for p in twin["panels"] if p["id"] in charts}

    def charted(query: str) -> bool:
        end = time.time()
        answer = _api(
            demo_server, "/api/v1/query_range", query=query, start=str(end - 300), end=str(end), step="5"
        )
        return bool(answer["data"]["result"])

    for pid, query in queries.items():
        wait_until(lambda q=query: charted(q), 45, f"the demo's vLLM has no data for its {pid} chart")
    page.goto(f"{demo_server.url}/inference/demo-vllm?{LIVE}")
    states = wait_panels(page, 20_000)
    for pid in charts:
        assert states[pid] == "data", (pid, states)
        assert chart_points(page, pid) > 0, pid
    assert page.locator("#tile-kv_cache").get_attribute("data-state") in ("ok", "warn", "crit")
    assert page.locator("#tile-ttft_p99 .value").inner_text() != ""
    _settled(page, "#panel-latency_heatmap")
    # The demo's vLLM listens in gpuwatch's own process, whose pid its simulated inference GPUs report:
    # the lookup (port -> listening pid -> NVML's process table) finds them without configuration.
    wait_until(
        lambda: _api(demo_server, "/api/ui/inference/demo-vllm")["data"]["serving"]["state"] == "found",
        30,
        "the demo's serving GPUs were not found",
    )
    page.goto(f"{demo_server.url}/inference/demo-vllm?{LIVE}")
    states = wait_panels(page, 20_000)
    serving = page.locator("#serving")
    assert serving.get_attribute("data-state") == "found"
    assert "/1 " in serving.inner_text() and "/6 " in serving.inner_text(), serving.inner_text()
    for pid in ("gpu_util", "gpu_memory", "gpu_power"):
        assert states[pid] == "data", (pid, states)
        assert chart_points(page, pid) > 0, pid
    assert page.console.errors == []


def test_targets_and_logs_pages(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{demo_server.url}/targets?{LIVE}")
    page.locator("section.gw-job[data-job='demo-vllm'] tr.target").wait_for()
    assert page.locator("section.gw-job").count() >= 2
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('td.samples')).some(td => /\\d/.test(td.textContent))"
    )
    page.goto(f"{demo_server.url}/logs?from=now-15m&to=now&refresh=off&run={RUN}")
    page.locator("#log-body tr.log-line").first.wait_for()
    assert page.locator("#log-run").input_value() == RUN
    assert page.console.errors == []


def test_a_silence_from_an_alert_in_two_clicks(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    # The demo is healthy between incidents: an alert posted as another Prometheus would post it.
    alert = {
        "labels": {"alertname": "NodeDiskAlmostFull", "instance": "node-9"},
        "annotations": {"summary": "97 %"},
    }
    assert requests.post(f"{demo_server.url}/api/v2/alerts", json=[alert], timeout=5).ok
    wait_until(
        lambda: _api(demo_server, "/api/ui/alerts")["data"]["alerts"], 10, "the posted alert is not shown"
    )
    page.goto(f"{demo_server.url}/alerts?{LIVE}")
    row = page.locator("tr.alert-row").first
    row.wait_for()
    name = row.get_attribute("data-alertname")
    row.locator("button.silence-btn").click()  # one
    page.locator("#silence-create").click()  # two
    page.locator("#silences-body tr[data-state='active']").first.wait_for()

    def made() -> list[dict[str, Any]]:
        return [
            s
            for s in requests.get(f"{demo_server.url}/api/v2/silences", timeout=5).json()
            if s["status"]["state"] == "active"
            and {"name": "alertname", "value": name, "isRegex": False, "isEqual": True} in s["matchers"]
        ]

    (silence,) = made()
    assert silence["comment"] and silence["createdBy"]
    page.locator(f"#silences-body tr[data-silence='{silence['id']}'] button.expire-btn").click()
    wait_until(lambda: not made(), 10, "expiring from the page did not expire the silence")
    assert page.console.errors == []


def test_outside_text_stays_text(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    url = demo_server.url
    assert requests.post(f"{url}/api/v1/runs", json={"run": XSS, "action": "init", "host": XSS}, timeout=5).ok
    assert requests.post(
        f"{url}/api/v1/push", json={"run": XSS, "step": 1, "metrics": {"loss": 1.0}}, timeout=5
    ).ok
    alert = {"labels": {"alertname": "XssProbe", "note": XSS}, "annotations": {"summary": XSS}}
    assert requests.post(f"{url}/api/v2/alerts", json=[alert], timeout=5).ok
    (log_file,) = [p for p in Path(demo_server.data_dir).rglob("*.log") if "serve-" not in p.name][:1]
    with log_file.open("a") as f:
        f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')},000 - ERROR - trainer - CUDA out of memory {XSS}\n")
    wait_until(
        lambda: _api(demo_server, "/api/v1/logs", q="window.__xss")["data"], 10, "the line was not tailed"
    )
    checks = [
        (f"/training?{LIVE}", "#runs-body"),
        (f"/training/{quote(XSS, safe='')}?{LIVE}", "#run-name"),
        (f"/alerts?{LIVE}", "#alerts-body"),
        ("/logs?from=now-15m&to=now&refresh=off&q=__xss", "#log-body"),
    ]
    for path, where in checks:
        page.goto(url + path)
        page.wait_for_function(
            "(s) => document.querySelector(s) && document.querySelector(s).textContent.includes('window.__xss')",
            arg=where,
            timeout=15_000,
        )
        assert page.evaluate("() => window.__xss") is None, path
        assert page.locator("img[src=x]").count() == 0, path
    assert page.console.errors == []
