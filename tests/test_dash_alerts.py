"""The alerts, targets and logs pages' data: firing alerts with how long and their Explore range,
groups with state and errors, the bounded transition history, a silence made from an alert's
matchers; targets by job; the runs the log search offers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, LogLine, Sample, make_labels
from gpuwatch.core.units import format_rfc3339
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.rules.state import HISTORY_LENGTH
from gpuwatch.store import alerthistory
from gpuwatch.store.alerthistory import StoredTransition
from gpuwatch.web import create_app
from gpuwatch.web.dash.targets import group_targets

GPU = {"gpu": "0", "Hostname": "n1", "UUID": "GPU-0"}
XSS = "<img src=x onerror=alert(1)>"
RULES = f"""
groups:
  - name: lab
    rules:
      - alert: Hot
        expr: DCGM_FI_DEV_GPU_TEMP > 85
        for: 30s
        labels: {{severity: critical}}
        annotations: {{summary: "GPU {{{{ $labels.gpu }}}} is hot {XSS}"}}
      - alert: Broken
        expr: '{{__name__=~"DCGM_FI_DEV_GPU_TEMP|DUP"}}'  # the same labels twice once __name__ goes
"""


def _runtime(tmp_path: Path, clock: FakeClock) -> Runtime:
    (tmp_path / "rules.yml").write_text(RULES)
    settings = load(
        None,
        {},
        {
            "data_dir": str(tmp_path / "data"),
            "demo": True,
            "rule_files": [str(tmp_path / "rules.yml")],
            "builtin_rules": False,
        },
    )
    return build_runtime(settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    rt = _runtime(tmp_path, clock)
    yield rt
    rt.close()


def _hot(runtime: Runtime, clock: FakeClock, value: float) -> None:
    samples = [Sample("DCGM_FI_DEV_GPU_TEMP", make_labels(GPU), value), Sample("DUP", make_labels(GPU), 1.0)]
    runtime.store.append(Batch(clock.now_ms(), samples))
    runtime.store.flush()
    assert runtime.jobs.run("rules")


def test_alerts_page_data_and_a_silence_from_an_alert(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    _hot(runtime, clock, 90)
    clock.advance(45)
    _hot(runtime, clock, 91)
    clock.advance(20)
    data = client.get("/api/ui/alerts").get_json()["data"]
    (alert,) = data["alerts"]
    assert alert["rule"] == "Hot" and alert["state"] == "firing"
    assert (
        alert["annotations"]["summary"] == f"GPU 0 is hot {XSS}"
    )  # stored as text; the page shows it as text
    assert alert["active_for_ms"] == 65_000 and alert["for_ms"] == 20_000  # active 65 s, firing 20 s
    assert alert["explore"] == {
        "expr": "DCGM_FI_DEV_GPU_TEMP > 85",
        "start": alert["active_at"] - 3600_000,
        "end": clock.now_ms(),
    }
    assert {m["name"] for m in alert["silence_matchers"]} == {
        "alertname",
        "gpu",
        "Hostname",
        "UUID",
        "severity",
    }
    (group,) = data["groups"]
    assert group["state"] == "err" and group["errors"][0]["rule"] == "Broken"
    assert [r["state"] for r in group["rules"]] == ["firing", "inactive"]
    assert [(h["rule"], h["from"], h["to"]) for h in data["history"]] == [
        ("Hot", "pending", "firing"),
        ("Hot", "inactive", "pending"),
    ]
    # two clicks on the page send this: the alert's matchers, a comment and a duration
    body = {
        "matchers": alert["silence_matchers"],
        "startsAt": format_rfc3339(clock.now_ms()),
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "ops",
        "comment": "swapping the fan",
    }
    r = client.post("/api/v2/silences", json=body)
    assert r.status_code == 200, r.get_data(as_text=True)
    sid = r.get_json()["silenceID"]
    data = client.get("/api/ui/alerts").get_json()["data"]
    assert data["alerts"][0]["silenced_by"] == [sid]
    assert [s["id"] for s in data["silences"]] == [sid]
    assert client.delete(f"/api/v2/silence/{sid}").status_code == 200
    assert client.get("/api/ui/alerts").get_json()["data"]["alerts"][0]["silenced_by"] == []
    clock.advance(15)
    _hot(runtime, clock, 60)
    data = client.get("/api/ui/alerts").get_json()["data"]
    assert data["alerts"] == [] and data["history"][0]["to"] == "inactive"


def test_history_is_bounded(runtime: Runtime, clock: FakeClock) -> None:
    manager = runtime.rules
    assert manager is not None
    assert manager._history.maxlen == HISTORY_LENGTH
    for i in range(6):
        _hot(runtime, clock, 90 if i % 2 == 0 else 60)  # pending, dropped, pending, ...
        clock.advance(15)
    assert len(manager.history()) == 6 and len(manager.history(limit=2)) == 2


def test_history_outlives_a_restart_and_is_capped_and_retained(tmp_path: Path, clock: FakeClock) -> None:
    t0 = clock.now_ms()
    first = _runtime(tmp_path, clock)
    try:
        _hot(first, clock, 90)
        clock.advance(45)
        _hot(first, clock, 91)
    finally:
        first.close()
    clock.advance(60)
    second = _runtime(tmp_path, clock)
    try:
        client = create_app(second).test_client()
        history = client.get("/api/ui/alerts").get_json()["data"]["history"]
        assert [(h["rule"], h["from"], h["to"], h["labels"]["gpu"]) for h in history] == [
            ("Hot", "pending", "firing", "0"),
            ("Hot", "inactive", "pending", "0"),
        ]
        assert history[1]["at"] == t0
        rows = [StoredTransition("g", "R", (("i", str(i)),), "inactive", "pending", i) for i in range(5)]
        second.store.save_alert_history_soon(rows).result()
        assert len(second.store.alert_history(100)) == 7
        cur = second.store._need_writer()._cur
        second.store._ask(lambda: alerthistory.append(cur, rows[:1], cap=3))  # the oldest go first
        assert [r.at_ms for r in second.store.alert_history(100)] == [3, 4, 0]
        second.store._ask(lambda: alerthistory.delete_before(cur, 4))  # retention
        assert [r.at_ms for r in second.store.alert_history(100)] == [4]
    finally:
        second.close()


def test_targets_grouped_by_job() -> None:
    rows = group_targets(
        [
            {"scrapePool": "vllm", "scrapeUrl": "http://b:1/metrics", "health": "down"},
            {"scrapePool": "vllm", "scrapeUrl": "http://a:1/metrics", "health": "up"},
            {"scrapePool": "node", "scrapeUrl": "http://c:1/metrics", "health": "unknown"},
        ]
    )
    assert [(j["job"], j["up"], j["down"], j["unknown"]) for j in rows] == [
        ("node", 0, 0, 1),
        ("vllm", 1, 1, 0),
    ]
    assert [t["scrapeUrl"] for t in rows[1]["targets"]] == ["http://a:1/metrics", "http://b:1/metrics"]


def test_targets_and_logs_json(runtime: Runtime, client: FlaskClient, clock: FakeClock) -> None:
    assert client.get("/api/ui/targets").get_json()["data"]["jobs"] == []
    runtime.store.append_log_lines([LogLine(clock.now_ms(), "/t.log", "run-x", "INFO", "hello")], [])
    runtime.store.flush()
    assert client.get("/api/ui/logs").get_json()["data"]["runs"] == ["run-x"]


def test_every_page_renders_and_outside_text_stays_text(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    bad = "<script>alert(1)</script>"
    assert client.post("/api/v1/runs", json={"run": bad, "action": "init", "host": bad}).status_code == 200
    _hot(runtime, clock, 90)
    for path in (
        "/training",
        "/inference",
        "/alerts",
        "/targets",
        "/logs",
        "/training/" + quote(bad, safe=""),
    ):
        r = client.get(path)
        assert r.status_code == 200, (path, r.get_data(as_text=True)[:500])
        html = r.get_data(as_text=True)
        assert bad not in html, path  # escaped in the page and in its embedded JSON
        assert XSS not in html, path
    for path in ("/training", "/alerts", "/targets", "/logs", "/inference"):
        assert "训练" in client.get(path + "?lang=zh").get_data(as_text=True), path  # the nav, translated
    assert client.get("/inference/nope").status_code == 404
    assert client.get("/training/nope").status_code == 404
