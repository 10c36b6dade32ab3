"""Routing, grouping, group_wait/group_interval/repeat_interval, inhibition, silences, resolved
notifications, retries and restarts, through the Notifier on a real store with a FakeClock (no sleeping)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from flask.testing import FlaskClient

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import make_labels
from gpuwatch.notify.config import parse_notify
from gpuwatch.notify.delivery import DeliveryError
from gpuwatch.notify.notifier import Notifier
from gpuwatch.notify.receiverconfig import Integration
from gpuwatch.rules.evaluate import FIRING, INACTIVE, Alert
from gpuwatch.rules.load import Rule
from gpuwatch.store import Store

T0 = 1_800_000_000.0

CONFIG = """
route:
  receiver: team
  group_by: [alertname]
  group_wait: 30s
  group_interval: 5m
  repeat_interval: 4h
  routes:
    - matchers: ['severity="critical"']
      receiver: pager
      group_by: [alertname, gpu]
      continue: true
    - match_re: {alertname: 'GPU.*'}
      receiver: gpu-team
receivers:
  - name: team
    webhook_configs: [{url: "http://127.0.0.1:1/team"}]
  - name: pager
    webhook_configs: [{url: "http://127.0.0.1:1/pager"}]
  - name: gpu-team
    webhook_configs: [{url: "http://127.0.0.1:1/gpu", send_resolved: false}]
inhibit_rules:
  - source_matchers: ['alertname="GPULost"']
    target_matchers: ['alertname!="GPULost"']
    equal: [gpu]
"""


class Recorder:
    """A sender that records payloads, and fails while `down` names the receiver."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.down: set[str] = set()
        self.hang: set[str] = set()
        self.release = threading.Event()
        self.attempts = 0

    def __call__(self, integration: Integration, payload: dict[str, Any], *, now_ms: int) -> None:
        self.attempts += 1
        if payload["receiver"] in self.hang:
            self.release.wait(30)
        if payload["receiver"] in self.down:
            raise DeliveryError("connection refused")
        self.sent.append((payload["receiver"], payload))

    def to(self, receiver: str) -> list[dict[str, Any]]:
        return [p for r, p in self.sent if r == receiver]


class Harness:
    def __init__(self, tmp_path: Path, clock: FakeClock, config: str = CONFIG) -> None:
        self.tmp_path, self.clock, self.config = tmp_path, clock, config
        self.sender = Recorder()
        self.muted: dict[str, list[str]] = {}
        self.alerts: dict[tuple[tuple[str, str], ...], Alert] = {}
        self.store = Store.open(tmp_path / "data", clock=clock)
        self.notifier = self._notifier()

    def _notifier(self) -> Notifier:
        cfg = parse_notify(yaml.safe_load(self.config))
        from gpuwatch.notify.alerting import AlertingConfig

        n = Notifier(
            cfg, AlertingConfig(), self.store, self.clock, external_url="http://gw:9842", sender=self.sender
        )
        n.muted_by = lambda labels, now_ms: self.muted.get(labels.get("alertname", ""), [])
        return n

    def restart(self) -> None:
        self.store.close()
        self.store = Store.open(self.tmp_path / "data", clock=self.clock)
        self.notifier = self._notifier()

    def fire(self, **labels: str) -> None:
        key = make_labels(labels)
        now = self.clock.now_ms()
        old = self.alerts.get(key)
        if old is None or old.state == INACTIVE:
            self.alerts[key] = Alert(key, make_labels({"summary": "s"}), FIRING, now, 1.0, fired_at_ms=now)

    def resolve(self, **labels: str) -> None:
        key = make_labels(labels)
        a = self.alerts[key]
        self.alerts[key] = Alert(
            a.labels, a.annotations, INACTIVE, a.active_at_ms, a.value, a.fired_at_ms, self.clock.now_ms()
        )

    def step(self, seconds: float = 0) -> None:
        """Advance the clock, evaluate (hand the alerts over) and run the notifier once."""
        self.clock.advance(seconds)
        rule = Rule("alert", "X", "up == 0")
        self.notifier.observe([(rule, a) for a in self.alerts.values()], 15.0, self.clock.now_ms())
        self.notifier.tick()

    def run(self, seconds: float, every: float = 15) -> None:
        """Evaluate now, then every `every` seconds for `seconds`."""
        self.step()
        for _ in range(int(seconds / every)):
            self.step(every)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def h(tmp_path: Path, clock: FakeClock) -> Iterator[Harness]:
    harness = Harness(tmp_path, clock)
    yield harness
    harness.store.close()


def names(payload: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(a["labels"]["alertname"], a["status"]) for a in payload["alerts"]]


def test_group_wait_then_one_notification_for_the_group(h: Harness) -> None:
    h.fire(alertname="Disk", instance="a")
    h.step()
    h.step(15)
    h.fire(alertname="Disk", instance="b")
    h.step(14)
    assert h.sender.sent == []  # group_wait (30s) has not passed since the group was made
    h.step(1)
    [p] = h.sender.to("team")
    assert p["groupKey"] == '{}:{alertname="Disk"}'
    assert sorted(a["labels"]["instance"] for a in p["alerts"]) == ["a", "b"]
    assert p["status"] == "firing" and p["groupLabels"] == {"alertname": "Disk"}


def test_routing_continue_and_child_group_by(h: Harness) -> None:
    h.fire(alertname="GPUHot", gpu="0", severity="critical")
    h.fire(alertname="Other", severity="warning")
    h.run(30)
    [pager] = h.sender.to("pager")
    assert pager["groupKey"] == '{}/{severity="critical"}:{alertname="GPUHot", gpu="0"}'
    [gpu] = h.sender.to("gpu-team")  # `continue: true` on the pager route lets the next sibling match
    assert gpu["groupKey"] == '{}/{alertname=~"GPU.*"}:{alertname="GPUHot"}'
    [team] = h.sender.to("team")  # no child matched Other: the root takes it
    assert names(team) == [("Other", "firing")]


def test_group_interval_for_new_alerts_and_repeat_interval(h: Harness) -> None:
    h.fire(alertname="Disk", instance="a")
    h.run(30)
    assert len(h.sender.to("team")) == 1
    h.fire(alertname="Disk", instance="b")
    h.run(4 * 60)
    assert len(h.sender.to("team")) == 1  # group_interval (5m) since the first flush has not passed
    h.run(60)
    assert len(h.sender.to("team")) == 2
    assert len(h.sender.to("team")[1]["alerts"]) == 2
    h.run(3 * 3600 + 50 * 60, every=60)
    assert len(h.sender.to("team")) == 2  # nothing new: quiet until repeat_interval (4h)
    h.run(15 * 60, every=60)
    assert len(h.sender.to("team")) == 3


def test_resolved_notification_and_send_resolved_false(h: Harness) -> None:
    h.fire(alertname="GPUHot", gpu="1")
    h.run(30)
    assert [len(h.sender.to(r)) for r in ("team", "gpu-team")] == [0, 1]
    h.fire(alertname="Disk", instance="a")
    h.run(30)
    h.resolve(alertname="Disk", instance="a")
    h.run(5 * 60)
    resolved = h.sender.to("team")[-1]
    assert resolved["status"] == "resolved" and names(resolved) == [("Disk", "resolved")]
    assert resolved["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
    h.resolve(alertname="GPUHot", gpu="1")
    h.run(10 * 60)
    assert len(h.sender.to("gpu-team")) == 1  # send_resolved: false


def test_inhibition_gpu_lost_silences_that_gpus_other_alerts(h: Harness) -> None:
    h.fire(alertname="GPULost", gpu="3")
    h.fire(alertname="Disk", gpu="3")
    h.fire(alertname="Disk", gpu="4")
    h.run(30)
    sent = [a["labels"] for p in h.sender.to("team") for a in p["alerts"]]
    assert {"alertname": "Disk", "gpu": "4"} in sent
    assert {"alertname": "Disk", "gpu": "3"} not in sent
    lost = [
        a["fingerprint"]
        for _, p in h.sender.sent
        for a in p["alerts"]
        if a["labels"]["alertname"] == "GPULost"
    ]
    assert len(lost) == 1  # (to gpu-team)
    assert h.notifier.inhibited_by({"alertname": "Disk", "gpu": "3"}, h.clock.now_ms()) == lost
    assert h.notifier.inhibited_by({"alertname": "Disk", "gpu": "4"}, h.clock.now_ms()) == []
    assert h.notifier.inhibited_by({"alertname": "GPULost", "gpu": "3"}, h.clock.now_ms()) == []


def test_silenced_alerts_are_not_notified_until_the_silence_ends(h: Harness) -> None:
    h.muted["Disk"] = ["silence-1"]
    h.fire(alertname="Disk", instance="a")
    h.run(10 * 60)
    assert h.sender.to("team") == []
    h.muted.clear()
    h.run(5 * 60)
    [p] = h.sender.to("team")
    assert names(p) == [("Disk", "firing")]


def test_receiver_down_retries_with_backoff_in_order_without_blocking_others(h: Harness) -> None:
    h.sender.down.add("team")
    h.fire(alertname="Disk", instance="a")
    h.fire(alertname="GPUHot", gpu="0", severity="critical")
    h.run(30)
    assert len(h.sender.to("pager")) == 1 and h.sender.to("team") == []
    h.resolve(alertname="Disk", instance="a")
    h.run(5 * 60)
    queued = h.store.queued_notifications()
    assert [(q.receiver, q.status) for q in queued] == [("team", "firing"), ("team", "resolved")]
    attempts = h.sender.attempts
    h.run(60)
    assert h.sender.attempts - attempts <= 2  # backoff: not an attempt every tick
    h.sender.down.clear()
    h.run(5 * 60)
    assert [p["status"] for p in h.sender.to("team")] == ["firing", "resolved"]
    assert h.store.queued_notifications() == []
    log = h.notifier.status(receiver="team")["deliveries"]
    assert [(d["status"], d["result"]) for d in log] == [("resolved", "success"), ("firing", "success")]
    assert log[1]["attempts"] > 1
    metrics = {
        (dict(s.labels)["receiver"], dict(s.labels)["result"]): s.value
        for s in h.notifier.samples()
        if s.name == "gpuwatch_notifications_total"
    }
    assert metrics[("team", "success")] == 2 and metrics[("team", "failure")] >= 2


def test_gives_up_after_hours_and_logs_the_failure(h: Harness) -> None:
    h.sender.down.add("team")
    h.fire(alertname="Disk", instance="a")
    h.run(30)
    h.run(11 * 3600, every=300)
    assert h.notifier.status(receiver="team")["deliveries"] == []  # still retrying after 11 hours
    h.run(3600, every=300)
    [d] = h.notifier.status(receiver="team")["deliveries"]
    assert d["result"] == "failed" and d["error"] == "connection refused" and d["attempts"] > 100
    # (the repeat notifications queued every repeat_interval meanwhile wait their turn)
    assert [q.status for q in h.store.queued_notifications()] == ["firing", "firing"]


def test_restart_resumes_the_queue_and_does_not_notify_again(h: Harness) -> None:
    h.fire(alertname="Disk", instance="a")
    h.fire(alertname="Net", instance="b")
    h.sender.down.add("team")
    h.run(30)
    assert len(h.store.queued_notifications()) == 2
    h.restart()
    h.sender.down.clear()
    h.run(60)
    assert sorted(names(p)[0][0] for p in h.sender.to("team")) == ["Disk", "Net"]
    h.restart()
    h.run(30 * 60)
    assert len(h.sender.to("team")) == 2  # firing alerts already notified are not notified again
    h.resolve(alertname="Disk", instance="a")
    h.run(6 * 60)
    assert names(h.sender.to("team")[-1]) == [("Disk", "resolved")]


def test_rule_manager_hands_alerts_to_the_notifier(tmp_path: Path, clock: FakeClock) -> None:
    from gpuwatch.query import Engine
    from gpuwatch.rules.load import load_groups
    from gpuwatch.rules.manager import RuleManager

    h = Harness(tmp_path, clock)
    try:
        rules = "groups: [{name: g, rules: [{alert: Always, expr: vector(1), labels: {severity: page}}]}]"
        manager = RuleManager(h.store, Engine(h.store).instant, clock, load_groups(rules, "t.yml"))
        manager.add_listener(h.notifier.observe)
        for _ in range(3):
            manager.evaluate_all()
            h.notifier.tick()
            clock.advance(15)
        [p] = h.sender.to("team")
        assert names(p) == [("Always", "firing")]
        assert p["alerts"][0]["generatorURL"] == "http://gw:9842/api/v1/query?query=vector%281%29"
    finally:
        h.store.close()


def test_notifications_api(client: FlaskClient) -> None:
    empty = client.get("/api/v1/notifications").get_json()
    assert empty["status"] == "success" and empty["data"]["deliveries"] == [] and empty["data"]["queue"] == []
    bad = client.get("/api/v1/notifications?limit=lots")
    assert bad.status_code == 400 and bad.get_json()["error"] == "limit: expected 1 to 5000, got 'lots'"


def test_notifications_api_shows_the_log(h: Harness) -> None:
    from gpuwatch.app.runtime import Runtime
    from gpuwatch.core.jobs import JobRegistry
    from gpuwatch.web import create_app

    h.fire(alertname="Disk", instance="a")
    h.run(30)
    rt = Runtime(
        settings=None,
        clock=h.clock,
        store=h.store,
        hostname="n",
        gpu=None,
        gpu_problem=None,
        jobs=JobRegistry(h.clock),
    )  # type: ignore[arg-type]
    rt.notifier = h.notifier
    data = create_app(rt).test_client().get("/api/v1/notifications?receiver=team").get_json()["data"]
    [d] = data["deliveries"]
    assert (d["receiver"], d["integration"], d["status"], d["alerts"], d["result"]) == (
        "team",
        "webhook[0]",
        "firing",
        1,
        "success",
    )
    assert d["groupKey"] == '{}:{alertname="Disk"}'


def test_forwarding_to_alertmanager_as_prometheus_sends(tmp_path: Path, clock: FakeClock) -> None:
    from gpuwatch.core.units import format_rfc3339 as format_time
    from gpuwatch.notify.alerting import parse_alerting
    from tests.conftest import free_port
    from tests.webhook_server import Hook

    port = free_port()
    alerting = parse_alerting({"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]})
    store = Store.open(tmp_path / "data", clock=clock)
    am = None
    try:
        n = Notifier(parse_notify({}), alerting, store, clock, external_url="http://gw:9842")
        rule = Rule("alert", "Hot", "temp > 85")
        key = make_labels({"alertname": "Hot", "gpu": "0"})
        fired = clock.now_ms()
        firing = Alert(key, (), FIRING, fired - 60_000, 90.0, fired_at_ms=fired)

        def evaluate(a: Alert, seconds: float = 15) -> None:
            clock.advance(seconds)
            n.observe([(rule, a)], 15.0, clock.now_ms())
            n.tick()

        evaluate(firing, 0)  # Alertmanager is down: kept and retried
        assert n.status()["alertmanagers"][0]["pending"] == 1
        assert "connection refused" in n.status()["alertmanagers"][0]["lastError"]
        am = Hook(port)
        evaluate(firing, 15)
        [batch] = am.bodies()
        assert batch == [
            {
                "labels": {"alertname": "Hot", "gpu": "0"},
                "annotations": {},
                "startsAt": format_time(fired),
                "endsAt": format_time(fired + 240_000),  # four times the 1m resend delay
                "generatorURL": "http://gw:9842/api/v1/query?query=temp%20%3E%2085",
            }
        ]
        for _ in range(3):
            evaluate(firing, 15)
        assert (
            len(am.requests) == 1
        )  # re-sent only once more than a minute has passed (Prometheus's resend delay)
        evaluate(firing, 15)
        assert len(am.requests) == 2 and am.bodies()[1][0]["endsAt"] == format_time(clock.now_ms() + 240_000)
        resolved_at = clock.now_ms() + 15_000
        evaluate(Alert(key, (), INACTIVE, firing.active_at_ms, 80.0, fired, resolved_at), 15)
        assert am.bodies()[2][0]["endsAt"] == format_time(resolved_at)  # resolved: sent at once
    finally:
        if am is not None:
            am.close()
        store.close()


def test_a_hanging_receiver_holds_up_neither_evaluation_nor_other_receivers(h: Harness) -> None:
    from tests.conftest import wait_until

    h.sender.hang.add("team")
    h.fire(alertname="Disk", instance="a")  # -> team
    h.fire(alertname="GPUHot", gpu="0", severity="critical")  # -> pager and gpu-team
    rule = Rule("alert", "X", "up == 0")
    h.notifier.start()
    try:
        h.notifier.observe([(rule, a) for a in h.alerts.values()], 15.0, h.clock.now_ms())
        h.clock.advance(30)
        h.notifier.observe([(rule, a) for a in h.alerts.values()], 15.0, h.clock.now_ms())  # returns at once
        wait_until(
            lambda: len(h.sender.to("pager")) == 1 and len(h.sender.to("gpu-team")) == 1, 20, "not sent"
        )
        assert h.sender.to("team") == []  # still hanging
        h.sender.release.set()
        wait_until(lambda: len(h.sender.to("team")) == 1, 20, "team not sent after it answered")
    finally:
        h.sender.release.set()
        h.notifier.stop()
