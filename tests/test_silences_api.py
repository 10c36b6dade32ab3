"""Alertmanager's API v2 (/api/v2/silences, /silence/<id>, /alerts, /alerts/groups, /status) on a
runtime whose rule fires at once, and `gpuwatch silence add|list|expire` against it over real HTTP."""

from __future__ import annotations

import argparse
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.serving import make_server

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.cli.main import _parser, main
from gpuwatch.cli.silence import run_silence
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.units import format_rfc3339_millis as format_time
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.notify.alert import fingerprint
from tests.conftest import free_port

RULES = """
groups:
  - name: always
    interval: 30s
    rules:
      - alert: AlwaysOn
        expr: vector(1)
        labels: {severity: info}
        annotations: {summary: "always on"}
      - alert: Waiting
        expr: vector(1)
        for: 1h
"""


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    (tmp_path / "rules.yml").write_text(RULES)
    settings = load(
        None,
        {},
        {
            "data_dir": str(tmp_path / "data"),
            "demo": True,
            "builtin_rules": False,
            "rule_files": [str(tmp_path / "rules.yml")],
        },
    )
    rt = build_runtime(settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
    assert rt.jobs.run("rules")
    yield rt
    rt.close()


def silence_body(
    clock: FakeClock, *matchers: dict[str, Any], hours: float = 2, **extra: Any
) -> dict[str, Any]:
    return {
        "matchers": list(matchers) or [{"name": "alertname", "value": "AlwaysOn", "isRegex": False}],
        "startsAt": format_time(clock.now_ms()),
        "endsAt": format_time(clock.now_ms() + int(hours * 3600_000)),
        "createdBy": "ops",
        "comment": "maintenance",
        **extra,
    }


def post(client: FlaskClient, body: Any) -> tuple[int, Any]:
    resp = client.post("/api/v2/silences", json=body)
    return resp.status_code, resp.get_json()


def test_firing_alerts_in_alertmanager_shape(client: FlaskClient, clock: FakeClock) -> None:
    now = format_time(clock.now_ms())
    alerts = client.get("/api/v2/alerts").get_json()
    labels = {"alertname": "AlwaysOn", "severity": "info"}
    assert alerts == [  # the pending "Waiting" alert is not there: Prometheus sends only firing ones
        {
            "annotations": {"summary": "always on"},
            "endsAt": format_time(clock.now_ms() + 4 * 60_000),  # ValidUntil: 4 x max(30s, 1m resend delay)
            "fingerprint": fingerprint(labels),
            "receivers": [],
            "startsAt": now,
            "status": {"inhibitedBy": [], "silencedBy": [], "state": "active"},
            "updatedAt": now,
            "generatorURL": "http://localhost/api/v1/query?query=vector%281%29",
            "labels": labels,
        }
    ]
    groups = client.get("/api/v2/alerts/groups").get_json()
    assert groups == [{"labels": {}, "receiver": {"name": ""}, "alerts": alerts}]


def test_fingerprint_is_prometheus_label_signature() -> None:
    # prometheus/common model.LabelsToSignature's test vectors (FNV-1a 64 with 0xff separators)
    assert fingerprint({}) == "cbf29ce484222325"
    assert (
        fingerprint({"name": "garland, briggs", "fear": "love is not enough"})
        == f"{5799056148416392346:016x}"
    )


def test_a_silence_suppresses_the_alert_in_v2_but_not_in_prometheus_api(
    client: FlaskClient, runtime: Runtime, clock: FakeClock
) -> None:
    code, answer = post(client, silence_body(clock))
    assert code == 200
    sid = answer["silenceID"]
    (alert,) = client.get("/api/v2/alerts").get_json()
    assert alert["status"] == {"inhibitedBy": [], "silencedBy": [sid], "state": "suppressed"}
    assert client.get("/api/v2/alerts?silenced=false").get_json() == []
    assert client.get("/api/v2/alerts?active=false").get_json() == [alert]  # amtool alert query --silenced
    assert client.get("/api/v2/alerts?filter=severity%3D%22info%22").get_json() == [alert]
    assert client.get("/api/v2/alerts?filter=severity!=info").get_json() == []
    assert client.get("/api/v2/alerts?receiver=nobody").get_json() == []
    # Prometheus knows nothing of silences: /api/v1/alerts still shows the alert firing
    v1 = client.get("/api/v1/alerts").get_json()["data"]["alerts"]
    assert {(a["labels"]["alertname"], a["state"]) for a in v1} == {
        ("AlwaysOn", "firing"),
        ("Waiting", "pending"),
    }
    # the notifier's question, answered from memory
    assert runtime.silences is not None
    assert runtime.silences.muted_by({"alertname": "AlwaysOn", "severity": "info"}, clock.now_ms()) == [sid]
    # expiring lifts it at once
    assert client.delete(f"/api/v2/silence/{sid}").status_code == 200
    (alert,) = client.get("/api/v2/alerts").get_json()
    assert alert["status"]["state"] == "active" and alert["status"]["silencedBy"] == []


def test_silences_list_get_update_and_expire(client: FlaskClient, clock: FakeClock) -> None:
    _, first = post(client, silence_body(clock))
    sid = first["silenceID"]
    _, other = post(client, silence_body(clock, {"name": "gpu", "value": "[0-3]", "isRegex": True}))
    got = client.get(f"/api/v2/silence/{sid}").get_json()
    assert got == {
        "id": sid,
        "status": {"state": "active"},
        "updatedAt": format_time(clock.now_ms()),
        "comment": "maintenance",
        "createdBy": "ops",
        "endsAt": format_time(clock.now_ms() + 2 * 3600_000),
        "matchers": [{"name": "alertname", "value": "AlwaysOn", "isRegex": False, "isEqual": True}],
        "startsAt": format_time(clock.now_ms()),
    }
    clock.advance(60)
    # POST with the id of an existing silence updates it (same matchers, later end)
    code, again = post(client, {**silence_body(clock, hours=5), "id": sid, "startsAt": got["startsAt"]})
    assert (code, again) == (200, {"silenceID": sid})
    assert client.get(f"/api/v2/silence/{sid}").get_json()["endsAt"] == format_time(
        clock.now_ms() + 5 * 3600_000
    )
    listed = client.get("/api/v2/silences").get_json()
    assert [s["id"] for s in listed] == [other["silenceID"], sid]  # active ones, the next to end first
    only = client.get("/api/v2/silences", query_string={"filter": "gpu=~[0-3]"}).get_json()
    assert [s["id"] for s in only] == [other["silenceID"]]
    assert client.get("/api/v2/silences?creator=nobody").get_json() == []
    assert client.delete(f"/api/v2/silence/{sid}").status_code == 200
    assert client.get(f"/api/v2/silence/{sid}").get_json()["status"] == {"state": "expired"}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"matchers": []}, "silence invalid: at least one matcher required"),
        (
            {"matchers": [{"name": "job", "value": "(", "isRegex": True}]},
            "silence invalid: invalid label matcher 0: invalid regular expression '(': ",
        ),
        ({"endsAt": "2020-01-01T00:00:00Z"}, "Failed to create silence: start time must be before end time"),
        (
            {"startsAt": "2020-01-01T00:00:00Z", "endsAt": "2020-01-02T00:00:00Z"},
            "Failed to create silence: end time can't be in the past",
        ),
        ({"comment": None}, "comment in body is required"),
        ({"id": "0e5e8b6c-0000-0000-0000-000000000000"}, "silence not found"),
    ],
)
def test_bad_silences_get_alertmanager_style_errors(
    client: FlaskClient, clock: FakeClock, change: dict[str, Any], error: str
) -> None:
    code, answer = post(client, {**silence_body(clock), **change})
    assert code == (404 if "not found" in error else 400)
    assert isinstance(answer, str) and answer.startswith(error)
    assert client.get("/api/v2/silences").get_json() == []


def test_other_bad_requests_are_4xx_json(client: FlaskClient) -> None:
    resp = client.post("/api/v2/silences", data="{", content_type="application/json")
    assert resp.status_code == 400 and isinstance(resp.get_json(), str)
    for path, code in [
        ("/api/v2/silence/nope", 404),
        ("/api/v2/alerts?filter=nonsense", 400),
        ("/api/v2/alerts?active=maybe", 400),
        ("/api/v2/alerts?receiver=(", 400),
        ("/api/v2/silences?filter=a=~(", 400),
    ]:
        resp = client.get(path)
        assert resp.status_code == code, path
        assert isinstance(resp.get_json(), str) and "Traceback" not in resp.get_json()
    resp = client.delete("/api/v2/silence/nope")
    assert (resp.status_code, resp.get_json()) == (404, "silence not found")


def test_status_and_receivers(client: FlaskClient, clock: FakeClock) -> None:
    status = client.get("/api/v2/status").get_json()
    assert status["cluster"] == {"status": "disabled", "peers": []}
    assert set(status["versionInfo"]) == {
        "version",
        "revision",
        "branch",
        "buildUser",
        "buildDate",
        "goVersion",
    }
    assert status["versionInfo"]["revision"].startswith("gpuwatch ")
    assert isinstance(status["config"]["original"], str)
    assert status["uptime"] == format_time(clock.now_ms())
    assert client.get("/api/v2/receivers").get_json() == []


def test_alerts_posted_by_other_senders_are_listed_silenced_and_time_out(
    client: FlaskClient, runtime: Runtime, clock: FakeClock
) -> None:
    zero = "0001-01-01T00:00:00.000Z"  # what amtool sends for a time it was not given
    disk = {
        "labels": {"alertname": "DiskFull", "instance": "n1", "empty": ""},
        "annotations": {"summary": "full"},
    }
    resp = client.post("/api/v2/alerts", json=[{**disk, "startsAt": zero, "endsAt": zero}])
    assert resp.status_code == 200
    started = format_time(clock.now_ms())
    got = {a["labels"]["alertname"]: a for a in client.get("/api/v2/alerts").get_json()}
    assert set(got) == {"AlwaysOn", "DiskFull"}
    assert got["DiskFull"]["labels"] == {"alertname": "DiskFull", "instance": "n1"}  # empty values dropped
    assert got["DiskFull"]["startsAt"] == started
    assert got["DiskFull"]["endsAt"] == format_time(clock.now_ms() + 5 * 60_000)  # resolve_timeout
    _, answer = post(client, silence_body(clock, {"name": "instance", "value": "n1", "isRegex": False}))
    assert client.get("/api/v2/alerts?silenced=false").get_json()[0]["labels"]["alertname"] == "AlwaysOn"
    clock.advance(240)
    client.post("/api/v2/alerts", json=[disk])  # sent again: still the first start, a later end
    (again,) = [a for a in client.get("/api/v2/alerts").get_json() if a["labels"]["alertname"] == "DiskFull"]
    assert again["startsAt"] == started and again["status"]["silencedBy"] == [answer["silenceID"]]
    clock.advance(301)  # not sent for longer than resolve_timeout: resolved
    runtime.jobs.run("rules")
    assert [a["labels"]["alertname"] for a in client.get("/api/v2/alerts").get_json()] == ["AlwaysOn"]


def test_bad_posted_alerts_are_named_and_the_good_ones_kept(client: FlaskClient) -> None:
    resp = client.post(
        "/api/v2/alerts",
        json=[
            {"labels": {}},
            {"labels": {"a-b": "x"}},
            {"labels": {"alertname": "Good"}},
            {"labels": {"x": "1"}, "startsAt": "2026-01-02T00:00:00Z", "endsAt": "2026-01-01T00:00:00Z"},
            "nonsense",
        ],
    )
    assert resp.status_code == 400
    assert resp.get_json() == (
        'alert 0: at least one label pair required; alert 1: invalid label set: invalid name "a-b"; '
        "alert 3: start time must be before end time; alert 4: an alert must be a JSON object"
    )
    assert "Good" in {a["labels"]["alertname"] for a in client.get("/api/v2/alerts").get_json()}
    resp = client.post("/api/v2/alerts", data="{", content_type="application/json")
    assert resp.status_code == 400 and "JSON array" in resp.get_json()


# -- the command line over real HTTP ------------------------------------------------------------------


@pytest.fixture
def url(app: Flask) -> Iterator[str]:
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    thread.join()


def cli(clock: FakeClock, *argv: str) -> tuple[int, str, str]:
    args: argparse.Namespace = _parser().parse_args(["silence", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = run_silence(args, {"USER": "tester"}, out=out, err=err, clock=clock)
    return code, out.getvalue(), err.getvalue()


def test_cli_adds_lists_and_expires(url: str, clock: FakeClock, runtime: Runtime) -> None:
    code, out, err = cli(clock, "add", "AlwaysOn", "severity=~info|warning", "-c", "disk swap", "--url", url)
    assert (code, err) == (0, "")
    sid = out.strip()
    assert runtime.silences is not None and runtime.silences.get(sid).created_by == "tester"
    code, out, _ = cli(clock, "list", "--url", url)
    assert code == 0
    head, row = out.splitlines()
    assert head.split() == ["ID", "MATCHERS", "STATE", "STARTS", "ENDS", "CREATED", "BY", "COMMENT"]
    assert row.startswith(sid) and 'alertname="AlwaysOn" severity=~"info|warning"' in row
    assert "active" in row and "tester" in row and row.endswith("disk swap")
    assert (
        "2026-09-21 14:13:20 UTC  2026-09-21 15:13:20 UTC" in row
    )  # ends an hour after the clock's start (default duration 1h)
    assert cli(clock, "list", "--expired", "--url", url)[1] == "(no expired silences)\n"
    code, out, _ = cli(clock, "add", "gpu=1", "-c", "x", "-a", "ops", "--duration", "2h", "--url", url)
    assert code == 0 and runtime.silences.get(out.strip()).ends_at_ms == clock.now_ms() + 2 * 3600_000
    assert cli(clock, "expire", sid, "--url", url) == (0, f"expired {sid}\n", "")
    clock.advance(1)
    assert cli(clock, "list", "--expired", "-q", "--url", url)[1] == f"{sid}\n"


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["add", "a=~(", "-c", "x"], 1, "gpuwatch: invalid regular expression '('"),
        (
            ["add", "a=1", "-c", "x", "--end", "2020-01-01T00:00:00Z"],
            2,
            "gpuwatch: the silence must end after it starts",
        ),
        (
            ["add", "a=1", "-c", "x", "--start", "2020-01-01T00:00:00Z", "--end", "2020-01-01T01:00:00Z"],
            1,
            "gpuwatch: Failed to create silence: end time can't be in the past",
        ),
        (["add", "a=1", "-c", "x", "--duration", "soon"], 2, "gpuwatch: cannot parse 'soon' as a duration"),
        (
            ["add", "a=", "-c", "x"],
            1,
            "gpuwatch: silence invalid: at least one matcher must not match the empty string",
        ),
        (["expire", "no-such-id"], 1, "gpuwatch: silence not found"),
    ],
)
def test_cli_errors_are_one_line(
    url: str, clock: FakeClock, argv: list[str], code: int, message: str
) -> None:
    got, out, err = cli(clock, *argv, "--url", url)
    assert (got, out) == (code, "")
    assert err.startswith(message) and err.count("\n") == 1


def test_cli_without_a_server_says_so(clock: FakeClock) -> None:
    port = free_port()
    code, _, err = cli(clock, "list", "--url", f"http://127.0.0.1:{port}")
    assert code == 2 and err == f"gpuwatch: cannot reach http://127.0.0.1:{port}: ConnectionError\n"


def test_cli_defaults_to_the_configured_port(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    config = tmp_path / "gpuwatch.yml"
    config.write_text(f"port: {port}\n")
    assert main(["silence", "list", "--config", str(config)]) == 2
    assert capsys.readouterr().err == f"gpuwatch: cannot reach http://127.0.0.1:{port}: ConnectionError\n"


def test_posted_alerts_over_the_label_limits_are_refused(client: FlaskClient) -> None:
    huge = {"labels": {"alertname": "Big", "blob": "x" * 20_000_000}, "annotations": {}}
    many = {"labels": {"alertname": "Many", **{f"l{i}": "v" for i in range(80)}}}
    long_note = {"labels": {"alertname": "Note"}, "annotations": {"summary": "y" * 5000}}
    ok = {"labels": {"alertname": "Fine"}}
    r = client.post("/api/v2/alerts", json=[huge, many, long_note, ok])
    assert r.status_code == 400
    text = r.get_json()
    assert "alert 0: labels: value of label 'blob' is longer than 4096 characters" in text
    assert "alert 1: labels: more than 64 labels" in text
    assert "alert 2: annotations: value of label 'summary' is longer than 4096 characters" in text
    names = [a["labels"]["alertname"] for a in client.get("/api/v2/alerts").get_json()]
    assert "Fine" in names and not {"Big", "Many", "Note"} & set(names)


def test_a_lone_surrogate_in_a_posted_alert_or_silence_is_not_a_500(
    client: FlaskClient, clock: FakeClock, runtime: Runtime
) -> None:
    # Both answered 500 (UnicodeEncodeError), found by tests/test_fuzz_e2e.py. Alertmanager's JSON
    # decoder would have read "\udcff" as U+FFFD; the alert is taken, a silence holding one refused.
    alert = b'[{"labels": {"alertname": "Posted", "note": "\\udcff"}}]'
    r = client.post("/api/v2/alerts", data=alert, content_type="application/json")
    assert r.status_code == 200, r.get_data(as_text=True)
    assert any(a["labels"]["alertname"] == "Posted" for a in client.get("/api/v2/alerts").get_json())
    body = silence_body(clock, {"name": "note", "value": "\udcff", "isRegex": True})
    status, answer = post(client, body)
    assert status == 400 and "UTF-8" in str(answer), answer
    # Nor can the store hold one: a silence's texts are refused as not UTF-8 (was a 500 and a
    # store write error counted, which fired GpuwatchStoreWriteErrors).
    for body in (
        silence_body(clock, {"name": "note", "value": "x\udcff", "isRegex": False}),
        silence_body(clock, comment="\udcff"),
        silence_body(clock, createdBy="\udcff"),
    ):
        status, answer = post(client, body)
        assert status == 400 and "UTF-8" in str(answer), answer
    assert runtime.store.counters()["write_errors"] == 0
