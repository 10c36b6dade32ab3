"""What the web layer needs from the process: the runtime's parts, as a Protocol the app's Runtime meets.

Routes reach it through `runtime()`; `create_app(runtime)` puts it in `app.extensions["gpuwatch"]`.
Parts a process may lack (rules, silences, a notifier, ...) are None, never missing attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from flask import current_app

from gpuwatch.collect.push import PushGroups
from gpuwatch.core.clock import Clock
from gpuwatch.core.credentials import AccessFile
from gpuwatch.core.jobs import JobRegistry
from gpuwatch.core.model import LabelLimits, Labels, MetricInfo, SeriesLimits
from gpuwatch.notify.config import NotifyConfig
from gpuwatch.notify.notifier import Notifier
from gpuwatch.notify.received import ReceivedAlerts
from gpuwatch.notify.silences import Silences
from gpuwatch.query.backend import QueryBackend
from gpuwatch.query.source import EngineSettings, Queryable
from gpuwatch.rules.manager import RuleManager
from gpuwatch.web.access import AccessSettings

if TYPE_CHECKING:  # the type only: importing the store would load DuckDB into every route module
    from gpuwatch.store import Store


class WebSettings(EngineSettings, AccessSettings, Protocol):
    """The settings pages and APIs read: the query engine's, the access checks', and these."""

    @property
    def sample_interval(self) -> float: ...
    @property
    def flush_interval(self) -> float: ...
    @property
    def notify(self) -> NotifyConfig: ...
    @property
    def label_limits(self) -> LabelLimits: ...
    @property
    def series_limits(self) -> SeriesLimits: ...
    @property
    def proc_root(self) -> Path: ...  # the host's /proc (the serving GPUs' listeners)
    @property
    def energy_price_per_kwh(self) -> float: ...
    @property
    def energy_currency(self) -> str: ...
    @property
    def usage_idle_below(self) -> float: ...
    @property
    def query_max_concurrency(self) -> int: ...
    @property
    def query_max_queued(self) -> int: ...
    def public(self) -> dict[str, Any]: ...


class WebRuntime(Protocol):
    """The process as routes see it."""

    @property
    def settings(self) -> WebSettings: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def hostname(self) -> str: ...
    @property
    def store(self) -> Store: ...
    @property
    def queryable(self) -> Queryable:
        """What PromQL reads: the store, with gpuwatch's own recent figures merged in from memory."""
        ...

    @property
    def backend(self) -> QueryBackend:
        """What answers PromQL, series and labels for pages and APIs: the remote store where
        `storage.remote` is set, else gpuwatch's engine over `queryable`."""
        ...

    @property
    def jobs(self) -> JobRegistry: ...
    @property
    def metadata(self) -> dict[str, MetricInfo]: ...
    @property
    def pushes(self) -> PushGroups: ...
    @property
    def rules(self) -> RuleManager | None: ...
    @property
    def silences(self) -> Silences | None: ...
    @property
    def received(self) -> ReceivedAlerts | None: ...
    @property
    def notifier(self) -> Notifier | None: ...
    @property
    def access(self) -> AccessFile | None: ...
    def status(self) -> dict[str, Any]: ...
    def exposition(self) -> str: ...
    def targets(self) -> list[dict[str, Any]]: ...
    def dropped_targets(self) -> list[dict[str, Any]]: ...
    def remote_write_states(self) -> list[dict[str, Any]]: ...
    def metric_metadata(self) -> dict[str, list[dict[str, str]]]: ...
    def federation_filter(self) -> Callable[[str, Labels], bool] | None: ...


def runtime() -> WebRuntime:
    """Return the runtime of the app handling the current request."""
    return cast(WebRuntime, current_app.extensions["gpuwatch"])
