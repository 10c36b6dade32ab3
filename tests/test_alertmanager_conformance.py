"""The same API v2 requests against the real Alertmanager (Debian's prometheus-alertmanager) and
`gpuwatch serve`: the answers agree in status, shape, states, fingerprints and error messages."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import requests

from tests.conftest import clean_env

TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def shape(value: Any) -> Any:
    """Return the JSON's keys and types, with times and ids as placeholders."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items() if k != "receivers"}
    if isinstance(value, (list, tuple)):
        return [shape(v) for v in value]
    if isinstance(value, str) and TIME.fullmatch(value):
        return "<time>"
    if isinstance(value, str) and UUID.fullmatch(value):
        return "<uuid>"
    return value


def iso(delta_s: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(seconds=delta_s)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


class Api:
    def __init__(self, base: str) -> None:
        self.base = base + "/api/v2"

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        resp = requests.request(method, self.base + path, json=body, timeout=10)
        return resp.status_code, (resp.json() if resp.content else None)

    def silence(
        self, *matchers: tuple[str, str, bool], start_s: float = 0, end_s: float = 3600, **extra: Any
    ) -> Any:
        body = {
            "matchers": [{"name": n, "value": v, "isRegex": r} for n, v, r in matchers],
            "startsAt": iso(start_s),
            "endsAt": iso(end_s),
            "createdBy": "ops",
            "comment": "maintenance",
            **extra,
        }
        return self.call("POST", "/silences", body)


def scenario(api: Api) -> dict[str, Any]:
    """Run one conversation; return what should be equal between the two servers."""
    seen: dict[str, Any] = {}
    seen["post alert"] = api.call(
        "POST",
        "/alerts",
        [{"labels": {"alertname": "DiskFull", "instance": "n1"}, "annotations": {"summary": "full"}}],
    )
    _, alerts = api.call("GET", "/alerts")
    seen["alerts"] = shape(alerts)
    seen["fingerprint"] = alerts[0]["fingerprint"]
    code, created = api.silence(("instance", "n1", False))
    sid = created["silenceID"]
    seen["create"] = (code, shape(created))
    _, alerts = api.call("GET", "/alerts")
    seen["silenced by"] = [a["status"] for a in alerts] == [
        {"inhibitedBy": [], "silencedBy": [sid], "state": "suppressed"}
    ]
    seen["silenced=false"] = api.call("GET", "/alerts?silenced=false")
    seen["active=false"] = len(api.call("GET", "/alerts?active=false")[1])
    seen["filter"] = len(api.call("GET", "/alerts?filter=instance%3D%22n2%22")[1])
    seen["list"] = shape(api.call("GET", "/silences"))
    seen["get"] = shape(api.call("GET", f"/silence/{sid}"))
    _, got = api.call("GET", f"/silence/{sid}")
    code, same = api.silence(("instance", "n1", False), end_s=7200, id=sid, startsAt=got["startsAt"])
    seen["update in place"] = (code, same["silenceID"] == sid)
    code, other = api.silence(("instance", "n2", False), id=sid)
    seen["update with other matchers"] = (code, other["silenceID"] != sid)
    seen["old one expired"] = api.call("GET", f"/silence/{sid}")[1]["status"]
    seen["expire"] = api.call("DELETE", f"/silence/{other['silenceID']}")
    seen["expired"] = api.call("GET", f"/silence/{other['silenceID']}")[1]["status"]
    seen["states"] = [s["status"]["state"] for s in api.call("GET", "/silences")[1]]
    for name, matchers, start_s, end_s in [
        ("start after end", [("job", "x", False)], 60, 0),
        ("end in the past", [("job", "x", False)], -7200, -3600),
        ("all match empty", [("job", "", False)], 0, 3600),
    ]:
        seen[name] = api.silence(*matchers, start_s=start_s, end_s=end_s)
    for name, matchers, prefix in [
        (
            "bad regex",
            [("job", "(", True)],
            "silence invalid: invalid label matcher 0: invalid regular expression",
        ),
        (
            "bad label name",
            [("a-b", "x", False)],
            'silence invalid: invalid label matcher 0: invalid label name "a-b"',
        ),
    ]:
        code, message = api.silence(*matchers)
        seen[name] = (code, message.replace("'", '"').startswith(prefix))
    seen["unknown id"] = api.silence(("job", "x", False), id="0e5e8b6c-0000-0000-0000-000000000000")
    seen["bad filter"] = api.call("GET", "/alerts?filter=nonsense")
    code, message = api.call("GET", "/alerts?receiver=(")
    seen["bad receiver"] = (code, message.startswith("failed to parse receiver param: "))
    seen["status"] = sorted(api.call("GET", "/status")[1])
    return seen


@pytest.mark.slow
def test_gpuwatch_answers_as_alertmanager_does(alertmanager: str, serve) -> None:  # type: ignore[no-untyped-def]
    env = clean_env(GPUWATCH_BUILTIN_RULES="false", GPUWATCH_DEMO_SOURCES="false", GPUWATCH_DEMO_GPUS="1")
    srv = serve("--demo", env=env)
    expected = scenario(Api(alertmanager))
    got = scenario(Api(srv.url))
    assert got == expected
    assert expected["silenced by"] and expected["silenced=false"] == (200, [])  # the scenario tests something
    assert srv.stop() == 0
