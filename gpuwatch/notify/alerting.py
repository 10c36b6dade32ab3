"""prometheus.yml's `alerting:` block: the Alertmanagers gpuwatch forwards every alert to (`forward.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwatch.notify.receiverconfig import DEFAULT_TIMEOUT_S, HttpOptions, http_options
from gpuwatch.notify.yamlread import check_keys, duration, fail, listing, mapping, text, yaml_value


@dataclass(frozen=True)
class AlertmanagerTarget:
    """One Alertmanager that gets every firing and resolved alert, as Prometheus sends them."""

    url: str  # .../api/v2/alerts
    timeout_s: float = DEFAULT_TIMEOUT_S
    http: HttpOptions = HttpOptions()


@dataclass(frozen=True)
class AlertingConfig:
    """prometheus.yml's `alerting:` block."""

    alertmanagers: tuple[AlertmanagerTarget, ...] = ()

    def public(self) -> dict[str, Any]:
        return {"alertmanagers": [t.url for t in self.alertmanagers]}


def parse_alerting(raw: object) -> AlertingConfig:
    """Validate prometheus.yml's `alerting:` block (`alertmanagers` with `static_configs`)."""
    if isinstance(raw, str):
        raw = yaml_value("alerting", raw)
    data = mapping("alerting", raw)
    check_keys("alerting", data, ("alertmanagers", "alert_relabel_configs"))
    if data.get("alert_relabel_configs"):
        raise fail("alerting.alert_relabel_configs", "not supported by gpuwatch yet; remove it")
    out: list[AlertmanagerTarget] = []
    for i, am in enumerate(listing("alerting.alertmanagers", data.get("alertmanagers"))):
        path = f"alerting.alertmanagers[{i}]"
        d = mapping(path, am)
        for key in d:
            if key.endswith("_sd_configs"):
                raise fail(
                    f"{path}.{key}", "not supported by gpuwatch (list the Alertmanagers in static_configs)"
                )
        check_keys(
            path,
            d,
            (
                "static_configs",
                "scheme",
                "path_prefix",
                "timeout",
                "api_version",
                "basic_auth",
                "authorization",
                "bearer_token",
                "tls_config",
                "follow_redirects",
                "enable_http2",
                "relabel_configs",
            ),
        )
        if d.get("relabel_configs"):
            raise fail(f"{path}.relabel_configs", "not supported by gpuwatch yet; remove it")
        if str(d.get("api_version", "v2")) != "v2":
            raise fail(
                f"{path}.api_version", f"only v2 is supported (as in Prometheus 3), got {d['api_version']!r}"
            )
        scheme = text(f"{path}.scheme", d.get("scheme", "http")).lower()
        if scheme not in ("http", "https"):
            raise fail(f"{path}.scheme", f"expected http or https, got {scheme!r}")
        prefix = text(f"{path}.path_prefix", d.get("path_prefix", "/"))
        timeout = duration(f"{path}.timeout", d["timeout"]) if "timeout" in d else DEFAULT_TIMEOUT_S
        http = http_options(
            path, {k: d[k] for k in ("basic_auth", "authorization", "bearer_token", "tls_config") if k in d}
        )
        for j, group in enumerate(listing(f"{path}.static_configs", d.get("static_configs"))):
            g = mapping(f"{path}.static_configs[{j}]", group)
            check_keys(f"{path}.static_configs[{j}]", g, ("targets", "labels"))
            for k, t in enumerate(listing(f"{path}.static_configs[{j}].targets", g.get("targets"))):
                where = f"{path}.static_configs[{j}].targets[{k}]"
                host = text(where, t).strip()
                if not host or "/" in host or " " in host:
                    raise fail(
                        where,
                        f"expected host:port (scheme and path go in scheme and path_prefix), got {host!r}",
                    )
                base = f"{scheme}://{host}/{prefix.strip('/')}".rstrip("/")
                out.append(AlertmanagerTarget(base + "/api/v2/alerts", timeout, http))
    return AlertingConfig(tuple(out))
