"""`gpuwatch notify test RECEIVER`: send one test notification through each integration of a receiver."""

from __future__ import annotations

from gpuwatch.core.clock import Clock
from gpuwatch.core.model import make_labels
from gpuwatch.notify.alert import NotifyAlert, webhook_payload
from gpuwatch.notify.config import NotifyConfig
from gpuwatch.notify.delivery import DeliveryError
from gpuwatch.notify.dispatcher import format_label_set
from gpuwatch.notify.receivers import send


class UnknownReceiver(LookupError):
    """The receiver is not defined in the configuration."""


def send_test(config: NotifyConfig, receiver: str, clock: Clock, *, hostname: str, external_url: str) -> str:
    """Send a test notification; return a one-line success message or raise DeliveryError / UnknownReceiver."""
    r = config.receiver(receiver)
    if r is None:
        names = ", ".join(x.name for x in config.receivers) or "(none)"
        raise UnknownReceiver(f"unknown receiver {receiver!r}; receivers in the configuration: {names}")
    if not r.integrations:
        raise DeliveryError(f"receiver {receiver!r} has no *_configs, so there is nothing to send to")
    now_ms = clock.now_ms()
    labels = make_labels({"alertname": "GpuwatchTestNotification", "severity": "none", "instance": hostname})
    alert = NotifyAlert(
        labels,
        make_labels({"summary": f"Test notification from gpuwatch on {hostname}; no action is needed."}),
        now_ms,
        now_ms + 300_000,
        external_url,
    )
    glabels = {"alertname": "GpuwatchTestNotification"}
    for integration in r.integrations:
        payload = webhook_payload(
            receiver=r.name,
            group_key=f"{{}}:{format_label_set(glabels.items())}",
            group_labels=glabels,
            alerts=[alert],
            now_ms=now_ms,
            external_url=external_url,
        )
        try:
            send(integration, payload, now_ms=now_ms)
        except DeliveryError as e:
            raise DeliveryError(f"receiver {receiver!r}: {integration.name}: {e}") from None
    names = ", ".join(i.name for i in r.integrations)
    return f"sent a test notification to receiver {receiver!r} ({names})"
