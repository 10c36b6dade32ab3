"""`gpuwatch serve` sending notifications over real HTTP: a webhook receiver that is down and then comes
up gets each notification once, in order; a real Alertmanager (Debian's prometheus-alertmanager) gets
the alerts forwarded as Prometheus sends them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from gpuwatch.notify.alert import fingerprint
from tests.conftest import free_port, wait_until
from tests.webhook_server import Hook

pytestmark = pytest.mark.slow

RULES = """
groups:
  - name: e2e
    interval: 1s
    rules:
      - alert: E2EFlag
        expr: e2e_flag == 1
        labels: {severity: page}
        annotations: {summary: "the flag is up"}
"""


def write_config(tmp_path: Path, **blocks: Any) -> Path:
    (tmp_path / "rules.yml").write_text(RULES)
    conf = tmp_path / "gpuwatch.yml"
    conf.write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "builtin_rules": False, **blocks}))
    return conf


def flag(url: str, value: int) -> None:
    r = requests.put(f"{url}/metrics/job/e2e", data=f"e2e_flag {value}\n", timeout=10)
    assert r.status_code == 200, r.text


def test_webhook_down_then_up_gets_each_notification_once_in_order_across_a_restart(
    serve, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    port = free_port()
    conf = write_config(
        tmp_path,
        notify={
            "route": {
                "receiver": "hook",
                "group_wait": "0s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{"name": "hook", "webhook_configs": [{"url": f"http://127.0.0.1:{port}/alerts"}]}],
        },
    )
    srv = serve("--config", str(conf))

    def notes() -> dict[str, Any]:
        return srv.get("/api/v1/notifications").json()["data"]  # type: ignore[no-any-return]

    flag(srv.url, 1)
    wait_until(lambda: any(q["lastError"] for q in notes()["queue"]), 30, f"no failed attempt:\n{srv.log}")
    assert srv.stop() == 0
    srv = serve("--config", str(conf))  # same data directory: the queue and what was notified survive
    assert [q["status"] for q in notes()["queue"]] == ["firing"]
    flag(srv.url, 0)
    wait_until(
        lambda: len(notes()["queue"]) == 2, 30, f"the resolved notification was not queued:\n{srv.log}"
    )
    hook = Hook(port)
    try:
        wait_until(
            lambda: len(hook.requests) >= 2, 60, f"not delivered after the receiver came up:\n{srv.log}"
        )
        wait_until(lambda: not notes()["queue"], 10, "the queue did not empty")
        bodies = hook.bodies()
        assert [b["status"] for b in bodies] == ["firing", "resolved"]
        assert all(b["version"] == "4" and b["receiver"] == "hook" for b in bodies)
        assert bodies[0]["alerts"][0]["labels"] == {"alertname": "E2EFlag", "job": "e2e", "severity": "page"}
        assert bodies[1]["alerts"][0]["status"] == "resolved"
        log = notes()["deliveries"]
        assert [(d["status"], d["result"]) for d in log] == [("resolved", "success"), ("firing", "success")]
        assert log[1]["attempts"] >= 2
        counted = 'gpuwatch_notifications_total{receiver="hook",result="success"} 2'
        wait_until(lambda: counted in srv.get("/metrics").text, 10, "deliveries not counted on /metrics")
        assert len(hook.requests) == 2  # once each
    finally:
        hook.close()
    assert srv.stop() == 0


def test_alerts_are_forwarded_to_a_real_alertmanager(serve, tmp_path: Path, alertmanager: str) -> None:  # type: ignore[no-untyped-def]
    target = alertmanager.removeprefix("http://")
    conf = write_config(tmp_path, alerting={"alertmanagers": [{"static_configs": [{"targets": [target]}]}]})
    srv = serve("--config", str(conf))

    def am_alerts() -> list[dict[str, Any]]:
        got = requests.get(alertmanager + "/api/v2/alerts", timeout=5).json()
        return [a for a in got if a["labels"].get("alertname") == "E2EFlag"]

    flag(srv.url, 1)
    wait_until(lambda: bool(am_alerts()), 30, f"the alert did not reach Alertmanager:\n{srv.log}")
    [a] = am_alerts()
    assert a["labels"] == {"alertname": "E2EFlag", "job": "e2e", "severity": "page"}
    assert a["annotations"] == {"summary": "the flag is up"}
    assert a["fingerprint"] == fingerprint(a["labels"])  # the same fingerprint as Alertmanager's own
    assert a["status"]["state"] == "active" and a["endsAt"] > a["startsAt"]
    assert "/api/v1/query?query=e2e_flag%20%3D%3D%201" in a["generatorURL"]
    flag(srv.url, 0)
    wait_until(lambda: not am_alerts(), 30, f"Alertmanager did not see the alert resolve:\n{srv.log}")
    am = srv.get("/api/v1/notifications").json()["data"]["alertmanagers"]
    assert am[0]["url"] == f"{alertmanager}/api/v2/alerts" and am[0]["lastError"] == ""
    assert srv.stop() == 0
