"""Silences, inhibition and routing wired together in one runtime: a silence made through Alertmanager's
API v2 keeps its alert out of notifications, and API v2 shows the notifier's inhibition and routing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.units import format_rfc3339_millis as format_time
from gpuwatch.demo.nvml import FakeNvml
from tests.conftest import free_port

RULES = """
groups:
  - name: wiring
    interval: 15s
    rules:
      - alert: Quiet
        expr: vector(1)
      - alert: Loud
        expr: vector(1)
      - alert: Pushed
        expr: training_loss > 0
      - alert: Source
        expr: vector(1)
      - alert: Target
        expr: vector(1)
"""


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    (tmp_path / "rules.yml").write_text(RULES)
    notify = {
        "route": {"receiver": "team", "group_by": ["alertname"], "group_wait": "0s"},
        "receivers": [{"name": "team", "webhook_configs": [{"url": f"http://127.0.0.1:{free_port()}/hook"}]}],
        "inhibit_rules": [
            {"source_matchers": ['alertname="Source"'], "target_matchers": ['alertname="Target"']}
        ],
    }
    conf = tmp_path / "gpuwatch.yml"
    conf.write_text(yaml.safe_dump({"notify": notify}))
    settings = load(
        conf,
        {},
        {
            "data_dir": str(tmp_path / "data"),
            "demo": True,
            "builtin_rules": False,
            "rule_files": [str(tmp_path / "rules.yml")],
        },
    )
    rt = build_runtime(settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
    yield rt
    rt.close()


def queued_alertnames(runtime: Runtime) -> set[str]:
    names: set[str] = set()
    for item in runtime.store.queued_notifications():
        for alert in json.loads(item.payload)["alerts"]:
            names.add(alert["labels"]["alertname"])
    return names


def test_a_silence_from_api_v2_keeps_its_alert_out_of_notifications(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    silence = {
        "matchers": [{"name": "alertname", "value": "Quiet", "isRegex": False}],
        "startsAt": format_time(clock.now_ms()),
        "endsAt": format_time(clock.now_ms() + 3600_000),
        "createdBy": "ops",
        "comment": "known",
    }
    assert client.post("/api/v2/silences", json=silence).status_code == 200
    assert runtime.notifier is not None
    for _ in range(2):
        assert runtime.jobs.run("rules")
        runtime.notifier.tick()
        clock.advance(15)
    names = queued_alertnames(runtime)
    assert "Loud" in names and "Source" in names
    assert "Quiet" not in names  # silenced
    assert "Target" not in names  # inhibited by Source


def test_api_v2_shows_inhibition_and_routing_from_the_notifier(runtime: Runtime, client: FlaskClient) -> None:
    assert runtime.jobs.run("rules")
    alerts = {a["labels"]["alertname"]: a for a in client.get("/api/v2/alerts").get_json()}
    source, target = alerts["Source"], alerts["Target"]
    assert target["status"]["state"] == "suppressed"
    assert target["status"]["inhibitedBy"] == [source["fingerprint"]]
    assert source["status"] == {"state": "active", "silencedBy": [], "inhibitedBy": []}
    assert source["receivers"] == [{"name": "team"}]
    assert [r["name"] for r in client.get("/api/v2/receivers").get_json()] == ["team"]
    status = client.get("/api/v2/status").get_json()
    assert "team" in status["config"]["original"]


def test_alerts_posted_by_another_prometheus_are_notified_then_resolve_by_timeout(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    posted = [
        {"labels": {"alertname": "DiskFull", "instance": "n1"}, "annotations": {"summary": "disk full"}}
    ]
    assert client.post("/api/v2/alerts", json=posted).status_code == 200
    assert runtime.notifier is not None
    runtime.notifier.tick()
    [first] = [json.loads(i.payload) for i in runtime.store.queued_notifications()]
    assert first["status"] == "firing"
    assert [a["labels"] for a in first["alerts"]] == [{"alertname": "DiskFull", "instance": "n1"}]
    assert first["alerts"][0]["annotations"] == {"summary": "disk full"}
    # Not sent again: Alertmanager's resolve_timeout (5m) resolves it, and the group says so.
    clock.advance(6 * 60)
    runtime.notifier.tick()
    payloads = [json.loads(i.payload) for i in runtime.store.queued_notifications()]
    assert [p["status"] for p in payloads] == ["firing", "resolved"]


def test_a_posted_alert_with_a_lone_surrogate_is_routed_and_queued(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    # With a route, its fingerprint in the dispatcher answered 500 (UnicodeEncodeError); read as
    # Alertmanager's Go decoder reads it, U+FFFD, it is routed and queued like any other.
    posted = [{"labels": {"alertname": "Disk\udcff", "instance": "n1"}}]
    assert client.post("/api/v2/alerts", json=posted).status_code == 200
    assert runtime.notifier is not None
    runtime.notifier.tick()
    runtime.store.flush()
    assert queued_alertnames(runtime) == {"Disk\ufffd"}
    assert runtime.store.counters()["write_errors"] == 0


def test_a_rule_alert_with_a_lone_surrogate_label_is_queued(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    # A pushed series' label ("\udcff" in its JSON) carried into a rule's alert: its fingerprint
    # failed the rules job at every round, and the queue's group key could not be stored.
    body = '{"run": "r", "step": 1, "metrics": {"loss": 0.5}, "labels": {"note": "\\udcff"}}'
    assert client.post("/api/v1/push", data=body, content_type="application/json").status_code == 200
    runtime.store.flush()
    assert runtime.jobs.run("rules")
    assert runtime.notifier is not None
    runtime.notifier.tick()
    runtime.store.flush()
    assert "Pushed" in queued_alertnames(runtime)
    notes = {
        alert["labels"].get("note")
        for item in runtime.store.queued_notifications()
        for alert in json.loads(item.payload)["alerts"]
    }
    assert "\ufffd" in notes
    assert runtime.store.counters()["write_errors"] == 0
