"""Send a notification as an e-mail through SMTP (stdlib smtplib), as Alertmanager's email_configs do:
STARTTLS required unless `require_tls: false`, implicit TLS on port 465, LOGIN/PLAIN auth when a user
name is set."""

from __future__ import annotations

import smtplib
import ssl
from collections.abc import Mapping
from datetime import datetime, timezone
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from typing import Any

from gpuwatch.notify.alert import text, title
from gpuwatch.notify.delivery import DeliveryError, option_text, tls_context
from gpuwatch.notify.receiverconfig import Integration


def build_message(integration: Integration, payload: Mapping[str, Any], now_ms: int) -> EmailMessage:
    """Return the e-mail for a notification."""

    msg = EmailMessage()
    msg["Subject"] = option_text(integration, "header:Subject", payload, title(payload))
    msg["From"] = integration.option("from")
    msg["To"] = integration.option("to")
    msg["Date"] = format_datetime(datetime.fromtimestamp(now_ms / 1000, tz=timezone.utc))
    msg["Message-Id"] = make_msgid(domain="gpuwatch")
    for key in integration.templated:
        name = key.removeprefix("header:")
        if key.startswith("header:") and name != "Subject":
            msg[name] = option_text(integration, key, payload, "")
    plain = text(payload) + "\n\n" + str(payload.get("externalURL", "")) + "\n"
    if integration.option("html") is None:
        msg.set_content(option_text(integration, "text", payload, plain))
        return msg
    # As Alertmanager: the text part only when `text` is set, then the HTML part.
    if integration.option("text") is not None:
        msg.set_content(option_text(integration, "text", payload, plain))
        msg.add_alternative(option_text(integration, "html", payload, ""), subtype="html")
    else:
        msg.set_content(option_text(integration, "html", payload, ""), subtype="html")
    return msg


def send_email(integration: Integration, payload: Mapping[str, Any], *, now_ms: int) -> None:
    """Deliver the notification by SMTP; raise DeliveryError with a one-line reason."""
    host, _, port_text = str(integration.option("smarthost")).rpartition(":")
    port = int(port_text)
    msg = build_message(integration, payload, now_ms)
    hello = integration.option("hello") or "localhost"
    ctx = tls_context(integration.http)
    where = f"{host}:{port}"
    try:
        smtp: smtplib.SMTP
        if port == 465:
            smtp = smtplib.SMTP_SSL(
                host, port, local_hostname=hello, timeout=integration.timeout_s, context=ctx
            )
        else:
            smtp = smtplib.SMTP(host, port, local_hostname=hello, timeout=integration.timeout_s)
        with smtp:
            smtp.ehlo()
            if port != 465 and integration.option("require_tls", True):
                if not smtp.has_extn("starttls"):
                    raise DeliveryError(
                        f"SMTP server {where} does not offer STARTTLS; set require_tls: false to send without TLS",
                        permanent=True,
                    )
                smtp.starttls(context=ctx)
                smtp.ehlo()
            user = integration.option("auth_username")
            if user:
                smtp.login(user, integration.option("auth_password") or "")
            to = [a.strip() for a in str(integration.option("to")).split(",") if a.strip()]
            smtp.send_message(msg, to_addrs=to)
    except DeliveryError:
        raise
    except smtplib.SMTPAuthenticationError as e:
        raise DeliveryError(
            f"SMTP server {where} refused the login: {e.smtp_code} {_decode(e.smtp_error)}", permanent=True
        ) from None
    except smtplib.SMTPResponseException as e:
        raise DeliveryError(f"SMTP server {where} answered {e.smtp_code} {_decode(e.smtp_error)}") from None
    except smtplib.SMTPRecipientsRefused as e:
        raise DeliveryError(f"SMTP server {where} refused the recipients {', '.join(e.recipients)}") from None
    except (TimeoutError, smtplib.SMTPException, ssl.SSLError, OSError) as e:
        reason = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise DeliveryError(f"cannot send mail through {where}: {reason}") from None


def _decode(err: bytes | str) -> str:
    s = err.decode(errors="replace") if isinstance(err, bytes) else str(err)
    return " ".join(s.split())
