"""The concrete scrape targets a scrape config yields: where to fetch, how, and the target labels
(after target relabelling), as `TargetSpec`s."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from gpuwatch.collect.relabel import relabel
from gpuwatch.collect.scrapeconfig import Auth, Relabel, ScrapeConfig, StaticGroup, Tls
from gpuwatch.core.model import (
    DEFAULT_LABEL_LIMITS,
    DEFAULT_SERIES_LIMITS,
    LabelLimits,
    Labels,
    SeriesLimits,
    make_labels,
)
from gpuwatch.core.units import format_duration


@dataclass(frozen=True)
class TargetSpec:
    """One concrete target: where to fetch, how, and which labels its samples get."""

    job: str
    address: str
    scheme: str
    metrics_path: str
    params: tuple[tuple[str, str], ...]
    labels: Labels  # the target labels: job, instance and static/file_sd labels
    interval_s: float
    timeout_s: float
    honor_labels: bool = False
    honor_timestamps: bool = True
    sample_limit: int = 0
    label_limits: LabelLimits = DEFAULT_LABEL_LIMITS
    series_limits: SeriesLimits = DEFAULT_SERIES_LIMITS  # new series per scrape and per minute
    relabel: tuple[Relabel, ...] = ()
    auth: Auth | None = None
    tls: Tls = Tls()
    discovered: Labels = ()  # the labels before target relabelling, for /api/v1/targets

    @property
    def is_federation(self) -> bool:
        """Whether this target is another server's `/federate` (what it stored, not its own page)."""
        return self.metrics_path.rstrip("/").endswith("/federate")

    @property
    def url(self) -> str:
        query = f"?{urlencode(self.params)}" if self.params else ""
        return f"{self.scheme}://{self.address}{self.metrics_path}{query}"


def target_specs(
    config: ScrapeConfig,
    groups: tuple[StaticGroup, ...],
    default_interval_s: float,
    dropped: list[dict[str, str]] | None = None,
    label_limits: LabelLimits = DEFAULT_LABEL_LIMITS,
    series_limits: SeriesLimits = DEFAULT_SERIES_LIMITS,
) -> list[TargetSpec]:
    """Expand a job's target groups into specs, applying `relabel_configs` as Prometheus does.

    Before relabelling a target has `__address__`, `__scheme__`, `__metrics_path__`,
    `__scrape_interval__`, `__scrape_timeout__`, `__param_<name>`, `job` and its group's labels (which
    win). Afterwards `instance` defaults to `__address__` and labels starting with `__` are removed.
    Targets that relabelling drops (or leaves without a usable address or scheme) go to `dropped`.
    """
    interval, timeout = config.interval_s(default_interval_s), config.timeout_s(default_interval_s)
    base = {
        "__scheme__": config.scheme,
        "__metrics_path__": config.metrics_path,
        "__scrape_interval__": format_duration(interval),
        "__scrape_timeout__": format_duration(timeout),
        "job": config.job_name,
    }
    for name, value in config.params:
        base.setdefault(f"__param_{name}", value)
    out = []
    for group in groups:
        for address in group.targets:
            labels = {"__address__": address, **base, **dict(group.labels)}
            discovered = dict(labels)
            if config.relabel_configs:
                result = relabel(labels, config.relabel_configs)
                address = (result or {}).get("__address__", "")
                scheme = (result or {}).get("__scheme__", "")
                if result is None or not address or "/" in address or scheme not in ("http", "https"):
                    if dropped is not None:
                        dropped.append(discovered)
                    continue
            params = dict(config.params)
            params.update({k[len("__param_") :]: v for k, v in labels.items() if k.startswith("__param_")})
            labels.setdefault("instance", labels["__address__"])
            out.append(
                TargetSpec(
                    job=config.job_name,
                    address=labels["__address__"],
                    scheme=labels["__scheme__"],
                    metrics_path=labels.get("__metrics_path__") or "/metrics",
                    params=tuple(params.items()),
                    labels=make_labels({k: v for k, v in labels.items() if not k.startswith("__")}),
                    interval_s=interval,
                    timeout_s=timeout,
                    honor_labels=config.honor_labels,
                    honor_timestamps=config.honor_timestamps,
                    sample_limit=config.sample_limit,
                    label_limits=label_limits,
                    series_limits=series_limits,
                    relabel=config.metric_relabel_configs,
                    auth=config.auth,
                    tls=config.tls,
                    discovered=tuple(sorted(discovered.items())),
                )
            )
    return out
