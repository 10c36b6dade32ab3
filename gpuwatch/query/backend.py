"""What answers PromQL for the pages, the API and the rules: a `QueryBackend`, and the local one
(gpuwatch's own engine over the store). The remote one, a Prometheus HTTP API, is `remote.py`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from gpuwatch.core.model import Matcher, SeriesData
from gpuwatch.query.engine import Engine
from gpuwatch.query.source import EngineSettings, Queryable
from gpuwatch.query.values import Matrix, Result, success_body

MatchSets = Sequence[Sequence[Matcher]]


class QueryBackend(Protocol):
    """Instant and range queries, series, label names and values, and raw samples; the same result
    types and errors (`gpuwatch.query.errors`) wherever they are answered."""

    @property
    def name(self) -> str:
        """Where queries are answered, for messages: `local`, or the remote's URL."""
        ...

    def instant(
        self, expr: str, time_ms: int, *, timeout_s: float | None = None, lookback_ms: int | None = None
    ) -> Result: ...

    def range(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        *,
        timeout_s: float | None = None,
        lookback_ms: int | None = None,
    ) -> Matrix: ...

    def instant_body(
        self, expr: str, time_ms: int, *, timeout_s: float | None = None, lookback_ms: int | None = None
    ) -> bytes:
        """`instant`'s success answer as /api/v1/query sends it, `{"status":"success","data":...}`
        (a remote store's own bytes where they need no reading)."""
        ...

    def range_body(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        *,
        timeout_s: float | None = None,
        lookback_ms: int | None = None,
    ) -> bytes:
        """`range`'s success answer as /api/v1/query_range sends it (a remote store's own bytes where
        they need no reading)."""
        ...

    def series(self, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        """The label sets of series any of `match_sets` selects, without duplicates, sorted."""
        ...

    def label_names(self, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[str]:
        """Label names of the series any of `match_sets` selects (no sets: every series), sorted."""
        ...

    def label_values(self, name: str, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[str]:
        """Values of label `name` on the series any of `match_sets` selects (no sets: all), sorted."""
        ...

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """The raw samples in [start_ms, end_ms] of the series `matchers` select (the pages' tables)."""
        ...


class Catalog(Protocol):
    """The series a store holds, by label (the store satisfies it)."""

    def series(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[dict[str, str]]: ...

    def label_names(
        self, matchers: Sequence[Matcher] = (), start_ms: int | None = None, end_ms: int | None = None
    ) -> list[str]: ...

    def label_values(
        self,
        label: str,
        matchers: Sequence[Matcher] = (),
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> list[str]: ...


class LocalBackend:
    """gpuwatch's engine over `source` (the store, with gpuwatch's own recent figures), and `catalog`'s
    series and labels: the answers of a gpuwatch without `storage.remote`."""

    name = "local"

    def __init__(
        self,
        source: Queryable,
        catalog: Catalog,
        settings: EngineSettings,
        monotonic: Callable[[], float],
    ) -> None:
        self.source = source
        self.catalog = catalog
        self.settings = settings
        self.monotonic = monotonic

    def _engine(self, timeout_s: float | None, lookback_ms: int | None) -> Engine:
        return Engine.configured(
            self.source, self.settings, self.monotonic, timeout_s=timeout_s, lookback_ms=lookback_ms
        )

    def instant(
        self, expr: str, time_ms: int, *, timeout_s: float | None = None, lookback_ms: int | None = None
    ) -> Result:
        """Evaluate `expr` at `time_ms`."""
        return self._engine(timeout_s, lookback_ms).instant(expr, time_ms)

    def range(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        *,
        timeout_s: float | None = None,
        lookback_ms: int | None = None,
    ) -> Matrix:
        """Evaluate `expr` from `start_ms` to `end_ms` every `step_ms`."""
        return self._engine(timeout_s, lookback_ms).range(expr, start_ms, end_ms, step_ms)

    def instant_body(
        self, expr: str, time_ms: int, *, timeout_s: float | None = None, lookback_ms: int | None = None
    ) -> bytes:
        """`instant`'s success answer as /api/v1/query sends it."""
        return success_body(self.instant(expr, time_ms, timeout_s=timeout_s, lookback_ms=lookback_ms))

    def range_body(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        *,
        timeout_s: float | None = None,
        lookback_ms: int | None = None,
    ) -> bytes:
        """`range`'s success answer as /api/v1/query_range sends it."""
        return success_body(
            self.range(expr, start_ms, end_ms, step_ms, timeout_s=timeout_s, lookback_ms=lookback_ms)
        )

    def series(self, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        """The label sets of series any of `match_sets` selects, without duplicates, sorted."""
        seen: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        for matchers in match_sets:
            for labels in self.catalog.series(matchers, start_ms, end_ms):
                seen.setdefault(tuple(sorted(labels.items())), dict(labels))
        return [seen[k] for k in sorted(seen)]

    def label_names(self, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[str]:
        """Label names of the series any of `match_sets` selects (no sets: every series), sorted."""
        names: set[str] = set()
        for matchers in match_sets or [[]]:
            names.update(self.catalog.label_names(matchers, start_ms, end_ms))
        return sorted(names)

    def label_values(self, name: str, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[str]:
        """Values of label `name` on the series any of `match_sets` selects (no sets: all), sorted."""
        values: set[str] = set()
        for matchers in match_sets or [[]]:
            values.update(self.catalog.label_values(name, matchers, start_ms, end_ms))
        return sorted(values)

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """The raw samples in [start_ms, end_ms] of the series `matchers` select."""
        return self.source.select(matchers, start_ms, end_ms)
