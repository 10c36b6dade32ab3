"""What every receiver shares: the delivery error, message options rendered from templates, TLS, backoff."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Mapping
from typing import Any

from gpuwatch.notify.receiverconfig import HttpOptions, Integration
from gpuwatch.notify.templates import default_set, render
from gpuwatch.templating.template import TemplateError

log = logging.getLogger("gpuwatch.notify")

BACKOFF_FIRST_S = 5.0
BACKOFF_MAX_S = 300.0


def backoff_s(attempts: int) -> float:
    """Return how long to wait after the `attempts`-th failed attempt."""
    return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, attempts - 1)))


class DeliveryError(Exception):
    """A notification could not be delivered; the message is one line for the delivery log."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


def option_text(integration: Integration, key: str, payload: Mapping[str, Any], default: str) -> str:
    """Return a message option rendered for this notification, or `default` when it is not set.

    A template that fails at run time (a missing `define`, a bad call) still sends: the default text,
    followed by the error, so the alert is not lost and the mistake is visible where it was made.
    """
    raw = integration.option(key)
    if raw is None:
        return default
    if key not in integration.templated:
        return str(raw)

    try:
        return render(integration.templates or default_set(), raw, payload)
    except TemplateError as e:
        log.warning("notify: %s: template %s failed: %s", integration.name, key, e)
        return f"{default} (template error in {key}: {e})"


def tls_context(http: HttpOptions) -> ssl.SSLContext:
    """Return an SSL context honouring `ca_file` and `insecure_skip_verify`."""
    ctx = ssl.create_default_context(cafile=http.ca_file or None)
    if http.insecure_skip_verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx
