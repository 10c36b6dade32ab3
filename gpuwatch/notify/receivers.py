"""Send one notification through one integration: webhook, Slack, DingTalk, Feishu/Lark, WeCom, Apprise
(e-mail is in `email.py`). Every sender takes the webhook payload (version 4) and raises `DeliveryError`
with a one-line reason; `permanent` marks failures that retrying cannot fix (a 4xx answer)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote_plus, urlsplit

import requests

from gpuwatch import __version__
from gpuwatch.notify.alert import body_lines, title
from gpuwatch.notify.delivery import DeliveryError, option_text
from gpuwatch.notify.email import send_email
from gpuwatch.notify.receiverconfig import HttpOptions, Integration, import_apprise

USER_AGENT = f"gpuwatch/{__version__}"


log = logging.getLogger("gpuwatch.notify")


def dingtalk_sign(secret: str, timestamp_ms: int) -> str:
    """Return DingTalk's robot signature: base64(HMAC-SHA256(key=secret, msg="<timestamp>\\n<secret>"))."""
    msg = f"{timestamp_ms}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), msg, hashlib.sha256).digest()).decode()


def feishu_sign(secret: str, timestamp_s: int) -> str:
    """Return Feishu/Lark's robot signature: base64(HMAC-SHA256(key="<timestamp>\\n<secret>", msg=""))."""
    key = f"{timestamp_s}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def _short(url: str) -> str:
    """Return a URL without its query (robot tokens and keys live there)."""
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}{p.path}"


def _one_line(s: str, n: int = 200) -> str:
    s = " ".join(s.split())
    return s[:n] + ("..." if len(s) > n else "")


def post_json(
    url: str, body: Any, *, http: HttpOptions, timeout_s: float, session: requests.Session | None = None
) -> requests.Response:
    """POST `body` as JSON; raise DeliveryError for a network error or a non-2xx status."""
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    auth = None
    if http.basic_auth:
        auth = http.basic_auth
    elif http.authorization:
        headers["Authorization"] = f"{http.authorization[0]} {http.authorization[1]}"
    verify: bool | str = not http.insecure_skip_verify
    if http.ca_file and verify:
        verify = http.ca_file
    post = session.post if session is not None else requests.post
    try:
        resp = post(
            url,
            data=json.dumps(body).encode(),
            headers=headers,
            auth=auth,
            timeout=timeout_s,
            verify=verify,
            allow_redirects=False,
            proxies={"http": http.proxy_url, "https": http.proxy_url} if http.proxy_url else None,
        )
    except requests.Timeout:
        raise DeliveryError(f"no answer from {_short(url)} within {timeout_s:g}s") from None
    except requests.ConnectionError as e:
        reason = str(e.args[0]) if e.args else str(e)
        if "Connection refused" in reason:
            reason = "connection refused"
        raise DeliveryError(f"cannot connect to {_short(url)}: {_one_line(reason, 160)}") from None
    except requests.RequestException as e:
        raise DeliveryError(f"request to {_short(url)} failed: {_one_line(str(e), 160)}") from None
    if not 200 <= resp.status_code < 300:
        permanent = 400 <= resp.status_code < 500 and resp.status_code not in (408, 429)
        raise DeliveryError(
            f"HTTP {resp.status_code} from {_short(url)}: {_one_line(resp.text) or resp.reason}",
            permanent=permanent,
        )
    return resp


def _check_robot(resp: requests.Response, url: str, code_keys: tuple[str, ...]) -> None:
    """Robots answer 200 with an error code in the body: 0 is success."""
    try:
        data = resp.json()
    except ValueError:
        return
    if not isinstance(data, dict):
        return
    for key in code_keys:
        if key in data and data[key] not in (0, "0"):
            msg = data.get("errmsg") or data.get("msg") or data.get("StatusMessage") or ""
            raise DeliveryError(
                f"{_short(url)} refused the message: code {data[key]} {_one_line(str(msg))}".rstrip()
            )


def _markdown(payload: Mapping[str, Any]) -> str:
    return "\n".join(f"- {line}" for line in body_lines(payload))


def send(
    integration: Integration,
    payload: Mapping[str, Any],
    *,
    now_ms: int,
    session: requests.Session | None = None,
) -> None:
    """Deliver `payload` through `integration`; raise DeliveryError on failure."""
    kind, timeout, http = integration.kind, integration.timeout_s, integration.http
    if kind == "webhook":
        post_json(integration.url, payload, http=http, timeout_s=timeout, session=session)
    elif kind == "slack":
        body: dict[str, Any] = {}
        for k in ("channel", "username", "icon_emoji", "icon_url"):
            if integration.option(k) is not None:
                body[k] = option_text(integration, k, payload, "")
        subject = option_text(integration, "title", payload, title(payload))
        attachment: dict[str, Any] = {
            "title": subject,
            "text": option_text(integration, "text", payload, "\n".join(body_lines(payload))),
            "fallback": option_text(integration, "fallback", payload, subject),
            "color": option_text(
                integration, "color", payload, "danger" if payload["status"] == "firing" else "good"
            ),
            "mrkdwn_in": ["fallback", "pretext", "text"],
        }
        for k in ("title_link", "pretext", "footer", "callback_id"):
            if integration.option(k) is not None:
                attachment[k] = option_text(integration, k, payload, "")
        body["attachments"] = [attachment]
        post_json(integration.url, body, http=http, timeout_s=timeout, session=session)
    elif kind == "dingtalk":
        url = integration.url
        if integration.secret:
            sep = "&" if "?" in url else "?"
            url += f"{sep}timestamp={now_ms}&sign={quote_plus(dingtalk_sign(integration.secret, now_ms))}"
        subject = option_text(integration, "title", payload, title(payload))
        message = option_text(integration, "message", payload, _markdown(payload))
        body = {"msgtype": "markdown", "markdown": {"title": subject, "text": f"#### {subject}\n\n{message}"}}
        resp = post_json(url, body, http=http, timeout_s=timeout, session=session)
        _check_robot(resp, url, ("errcode",))
    elif kind == "feishu":
        message = option_text(integration, "message", payload, "\n".join(body_lines(payload)))
        subject = option_text(integration, "title", payload, title(payload))
        body = {"msg_type": "text", "content": {"text": f"{subject}\n\n{message}"}}
        if integration.secret:
            ts = now_ms // 1000
            body = {"timestamp": str(ts), "sign": feishu_sign(integration.secret, ts), **body}
        resp = post_json(integration.url, body, http=http, timeout_s=timeout, session=session)
        _check_robot(resp, integration.url, ("code", "StatusCode"))
    elif kind == "wecom":
        subject = option_text(integration, "title", payload, title(payload))
        message = option_text(integration, "message", payload, _markdown(payload))
        body = {"msgtype": "markdown", "markdown": {"content": f"#### {subject}\n\n{message}"}}
        resp = post_json(integration.url, body, http=http, timeout_s=timeout, session=session)
        _check_robot(resp, integration.url, ("errcode",))
    elif kind == "email":
        send_email(integration, payload, now_ms=now_ms)
    elif kind == "apprise":
        _send_apprise(integration, payload)
    else:  # pragma: no cover - config validation allows only the kinds above
        raise DeliveryError(f"unknown integration kind {kind!r}", permanent=True)


def _send_apprise(integration: Integration, payload: Mapping[str, Any]) -> None:
    try:
        apprise = import_apprise()
    except ImportError:
        raise DeliveryError(
            "apprise is not installed; pip install 'gpuwatch[apprise]'", permanent=True
        ) from None
    app = apprise.Apprise()
    for url in integration.option("urls", ()):
        app.add(url)
    ok = app.notify(
        body=option_text(integration, "message", payload, "\n".join(body_lines(payload))),
        title=option_text(integration, "title", payload, title(payload)),
        notify_type=apprise.NotifyType.FAILURE
        if payload["status"] == "firing"
        else apprise.NotifyType.SUCCESS,
    )
    if not ok:
        raise DeliveryError("Apprise could not deliver to at least one URL (see the log for its reason)")
