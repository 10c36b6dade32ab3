"""Payload shapes and every sender against real local servers: webhook (Alertmanager v4), Slack, DingTalk,
Feishu and WeCom robots (signatures checked against vectors computed with openssl), e-mail through a
local SMTP server (aiosmtpd), Apprise; and `gpuwatch notify test`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from gpuwatch.core.model import make_labels
from gpuwatch.notify.alert import NotifyAlert, fingerprint, text, title, webhook_payload
from gpuwatch.notify.config import parse_notify
from gpuwatch.notify.delivery import DeliveryError
from gpuwatch.notify.receiverconfig import Integration
from gpuwatch.notify.receivers import dingtalk_sign, feishu_sign, send
from tests.conftest import GPUWATCH, clean_env, free_port
from tests.webhook_server import Hook, hook_server

NOW = 1_800_000_000_000


def alert(name: str, ends_ms: int, **labels: str) -> NotifyAlert:
    return NotifyAlert(
        make_labels({"alertname": name, **labels}),
        make_labels({"summary": f"{name} on {labels.get('gpu', '?')}", "runbook": "r"}),
        NOW - 60_000,
        ends_ms,
        "http://gw:9842/graph?g0.expr=up&g0.tab=1",
    )


def payload(max_alerts: int = 0) -> dict[str, Any]:
    alerts = [
        alert("GPUHot", NOW + 240_000, gpu="0", severity="critical"),
        alert("GPUHot", NOW - 1000, gpu="1", severity="critical"),
    ]
    return webhook_payload(
        receiver="team",
        group_key='{}:{alertname="GPUHot"}',
        group_labels={"alertname": "GPUHot"},
        alerts=alerts,
        now_ms=NOW,
        external_url="http://gw:9842",
        max_alerts=max_alerts,
    )


@pytest.fixture
def hook() -> Iterator[Hook]:
    with hook_server() as h:
        yield h


def integration(hook: Hook, kind: str, **kw: Any) -> Integration:
    cfg = parse_notify(
        {
            "route": {"receiver": "r"},
            "receivers": [{"name": "r", f"{kind}_configs": [{"url": hook.url + "/p?access_token=t", **kw}]}],
        }
    )
    return cfg.receivers[0].integrations[0]


def test_webhook_payload_is_alertmanagers_version_4() -> None:
    p = payload()
    assert list(p) == [
        "receiver", "status", "alerts", "groupLabels", "commonLabels", "commonAnnotations",
        "externalURL", "version", "groupKey", "truncatedAlerts",
    ]  # fmt: skip
    assert p["version"] == "4" and p["status"] == "firing" and p["truncatedAlerts"] == 0
    assert p["commonLabels"] == {"alertname": "GPUHot", "severity": "critical"}
    assert p["commonAnnotations"] == {"runbook": "r"}
    firing, resolved = p["alerts"]
    assert list(firing) == [
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    ]
    assert firing["status"] == "firing" and firing["endsAt"] == "0001-01-01T00:00:00Z"
    assert firing["startsAt"] == "2027-01-15T07:59:00Z"
    assert resolved["status"] == "resolved" and resolved["endsAt"] == "2027-01-15T07:59:59Z"
    assert firing["fingerprint"] == fingerprint({"alertname": "GPUHot", "gpu": "0", "severity": "critical"})
    assert payload(max_alerts=1)["truncatedAlerts"] == 1 and len(payload(max_alerts=1)["alerts"]) == 1
    assert title(p) == "[FIRING:1] GPUHot (critical)"
    assert "[resolved] GPUHot: GPUHot on 1 (gpu=1, severity=critical)" in text(p)


def test_fingerprint_matches_alertmanagers() -> None:
    # Values from Go: model.LabelSet{...}.Fingerprint().String()
    assert fingerprint({}) == "cbf29ce484222325"
    assert len(fingerprint({"alertname": "X"})) == 16


def test_signatures_match_known_vectors() -> None:
    # printf '1700000000000\nSEC000000000000000000000' | openssl dgst -sha256 -hmac SEC000000000000000000000 -binary | base64
    assert (
        dingtalk_sign("SEC000000000000000000000", 1700000000000)
        == "1zJ/w34EOSVAYr7cu7Vo8LnebmK2/GrCgegtr8mQrqM="
    )
    # printf '' | openssl dgst -sha256 -hmac "$(printf '1700000000\nfeishu-secret')" -binary | base64
    assert feishu_sign("feishu-secret", 1700000000) == "OrBzY1Y01Gq+HgJsl+7OfWcMVwc7YocohQm5iiZwjhU="


def test_webhook_posts_the_payload_and_reports_errors_in_one_line(hook: Hook) -> None:
    w = integration(hook, "webhook")
    send(w, payload(), now_ms=NOW)
    _path, headers, body = hook.requests[0]
    assert body == payload() and headers["Content-Type"] == "application/json"
    hook.status = 503
    with pytest.raises(DeliveryError, match=r"^HTTP 503 from http://127.0.0.1:\d+/p: ") as e:
        send(w, payload(), now_ms=NOW)
    assert not e.value.permanent and "access_token" not in str(e.value)
    hook.status = 400
    with pytest.raises(DeliveryError) as e:
        send(w, payload(), now_ms=NOW)
    assert e.value.permanent
    down = Integration("webhook", "webhook[0]", True, f"http://127.0.0.1:{free_port()}/x")
    with pytest.raises(
        DeliveryError, match=r"^cannot connect to http://127.0.0.1:\d+/x: connection refused$"
    ):
        send(down, payload(), now_ms=NOW)


def test_dingtalk_signs_the_url_and_checks_errcode(hook: Hook) -> None:
    d = integration(hook, "dingtalk", secret="SEC000000000000000000000")
    send(d, payload(), now_ms=1700000000000)
    path, _, body = hook.requests[0]
    q = parse_qs(urlsplit(path).query)
    assert q["access_token"] == ["t"] and q["timestamp"] == ["1700000000000"]
    assert q["sign"] == ["1zJ/w34EOSVAYr7cu7Vo8LnebmK2/GrCgegtr8mQrqM="]
    assert body["msgtype"] == "markdown" and body["markdown"]["title"] == "[FIRING:1] GPUHot (critical)"
    hook.answer = {"errcode": 310000, "errmsg": "sign not match"}
    with pytest.raises(DeliveryError, match="refused the message: code 310000 sign not match"):
        send(d, payload(), now_ms=NOW)


def test_feishu_signs_the_body_and_wecom_uses_the_key(hook: Hook) -> None:
    f = integration(hook, "feishu", secret="feishu-secret")
    send(f, payload(), now_ms=1700000000123)
    body = hook.requests[0][2]
    assert (
        body["timestamp"] == "1700000000" and body["sign"] == "OrBzY1Y01Gq+HgJsl+7OfWcMVwc7YocohQm5iiZwjhU="
    )
    assert body["msg_type"] == "text" and body["content"]["text"].startswith("[FIRING:1] GPUHot")
    hook.answer = {
        "code": 19021,
        "msg": "sign match fail or timestamp is not within one hour from current time",
    }
    with pytest.raises(DeliveryError, match="code 19021"):
        send(f, payload(), now_ms=NOW)
    cfg = parse_notify(
        {"route": {"receiver": "r"}, "receivers": [{"name": "r", "wecom_configs": [{"key": "K-1"}]}]}
    )
    assert cfg.receivers[0].integrations[0].url == "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=K-1"


def test_slack_incoming_webhook(hook: Hook) -> None:
    cfg = parse_notify(
        {
            "global": {"slack_api_url": hook.url + "/services/T/B/X"},
            "route": {"receiver": "r"},
            "receivers": [
                {
                    "name": "r",
                    "slack_configs": [
                        {"channel": "#gpu", "text": "{{ range .Alerts }}{{ .Annotations.summary }};{{ end }}"}
                    ],
                }
            ],
        }
    )
    assert cfg.ignored == ()
    send(cfg.receivers[0].integrations[0], payload(), now_ms=NOW)
    path, _, body = hook.requests[0]
    assert path == "/services/T/B/X" and body["channel"] == "#gpu"
    assert (
        body["attachments"][0]["title"] == "[FIRING:1] GPUHot (critical)"
        and body["attachments"][0]["color"] == "danger"
    )
    # `text` is a template, rendered with the notification's data as Alertmanager does.
    assert body["attachments"][0]["text"] == "GPUHot on 0;GPUHot on 1;"


def test_apprise_url(hook: Hook) -> None:
    pytest.importorskip("apprise")
    cfg = parse_notify(
        {
            "route": {"receiver": "r"},
            "receivers": [{"name": "r", "apprise_configs": [{"url": f"json://127.0.0.1:{hook.port}/a"}]}],
        }
    )
    send(cfg.receivers[0].integrations[0], payload(), now_ms=NOW)
    body = hook.requests[0][2]
    assert body["title"] == "[FIRING:1] GPUHot (critical)" and "GPUHot on 0" in body["message"]


class Smtp:
    def __init__(self) -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.handlers import Message

        self.messages: list[Any] = []
        outer = self

        class Keep(Message):  # type: ignore[misc]
            def handle_message(self, message: Any) -> None:
                outer.messages.append(message)

        self.port = free_port()
        self.controller = Controller(Keep(), hostname="127.0.0.1", port=self.port)


@pytest.fixture
def smtp() -> Iterator[Smtp]:
    pytest.importorskip("aiosmtpd")
    s = Smtp()
    s.controller.start()
    yield s
    s.controller.stop()


def email(smtp: Smtp, **kw: Any) -> Integration:
    cfg = parse_notify(
        {
            "global": {"smtp_from": "gpuwatch@lab", "smtp_smarthost": f"127.0.0.1:{smtp.port}"},
            "route": {"receiver": "r"},
            "receivers": [{"name": "r", "email_configs": [{"to": "ops@lab, oncall@lab", **kw}]}],
        }
    )
    return cfg.receivers[0].integrations[0]


def test_email_through_a_local_smtp_server(smtp: Smtp) -> None:
    send(email(smtp, require_tls=False), payload(), now_ms=NOW)
    [msg] = smtp.messages
    assert msg["Subject"] == "[FIRING:1] GPUHot (critical)"
    assert msg["From"] == "gpuwatch@lab" and msg["X-RcptTo"] == "ops@lab, oncall@lab"
    assert "[firing] GPUHot: GPUHot on 0" in msg.get_payload()


def test_email_requires_starttls_by_default(smtp: Smtp) -> None:
    with pytest.raises(DeliveryError, match=r"does not offer STARTTLS; set require_tls: false"):
        send(email(smtp), payload(), now_ms=NOW)
    assert smtp.messages == []


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUWATCH, *args], capture_output=True, text=True, env=clean_env(), cwd=cwd, timeout=60
    )


def test_notify_test_command(tmp_path: Path, hook: Hook) -> None:
    conf = tmp_path / "gpuwatch.yml"
    down = f"http://127.0.0.1:{free_port()}/x"
    conf.write_text(
        yaml.safe_dump(
            {
                "notify": {
                    "route": {"receiver": "ok"},
                    "receivers": [
                        {"name": "ok", "webhook_configs": [{"url": hook.url + "/hook"}]},
                        {"name": "down", "webhook_configs": [{"url": down}]},
                    ],
                }
            }
        )
    )
    ok = run_cli("notify", "test", "--config", str(conf), "ok", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "gpuwatch: sent a test notification to receiver 'ok' (webhook[0])\n"
    [body] = hook.bodies()
    assert body["alerts"][0]["labels"]["alertname"] == "GpuwatchTestNotification"
    bad = run_cli("notify", "test", "--config", str(conf), "down", cwd=tmp_path)
    assert bad.returncode == 1
    assert (
        bad.stderr == f"gpuwatch: receiver 'down': webhook[0]: cannot connect to {down}: connection refused\n"
    )
    unknown = run_cli("notify", "test", "--config", str(conf), "nope", cwd=tmp_path)
    assert unknown.returncode == 2
    assert unknown.stderr == "gpuwatch: unknown receiver 'nope'; receivers in the configuration: ok, down\n"


def test_apprise_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwatch.core.errors import ConfigError

    monkeypatch.setitem(sys.modules, "apprise", None)
    with pytest.raises(ConfigError) as e:
        parse_notify(
            {
                "route": {"receiver": "r"},
                "receivers": [{"name": "r", "apprise_configs": [{"url": "tgram://1/2"}]}],
            }
        )
    assert str(e.value) == (
        "config error: notify.receivers[0].apprise_configs[0]: apprise is not installed; "
        "install it with pip install 'gpuwatch[apprise]'"
    )


def test_email_with_starttls_and_login(tmp_path: Path) -> None:
    pytest.importorskip("aiosmtpd")
    import shutil
    import ssl

    from aiosmtpd.controller import Controller
    from aiosmtpd.handlers import Message
    from aiosmtpd.smtp import AuthResult, LoginPassword

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    got: list[Any] = []
    logins: list[tuple[bytes, bytes]] = []

    class Keep(Message):  # type: ignore[misc]
        def handle_message(self, message: Any) -> None:
            got.append(message)

    def check(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        assert isinstance(data, LoginPassword)
        logins.append((data.login, data.password))
        return AuthResult(success=data.password == b"secret")

    port = free_port()
    server = Controller(
        Keep(), hostname="127.0.0.1", port=port, tls_context=ctx, require_starttls=True,
        authenticator=check, auth_required=True,
    )  # fmt: skip
    server.start()
    try:
        cfg = parse_notify(
            {
                "route": {"receiver": "r"},
                "receivers": [
                    {
                        "name": "r",
                        "email_configs": [
                            {"to": "ops@lab", "from": "gw@lab", "smarthost": f"127.0.0.1:{port}",
                             "auth_username": "gw", "auth_password": "secret", "tls_config": {"ca_file": str(cert)}}
                        ],
                    }
                ],
            }
        )  # fmt: skip
        send(cfg.receivers[0].integrations[0], payload(), now_ms=NOW)
        assert logins == [(b"gw", b"secret")] and got[0]["Subject"] == "[FIRING:1] GPUHot (critical)"
    finally:
        server.stop()
