"""What the engine is given: a source of samples (the store, the rules' round cache) and its settings."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

from gpuwatch.core.model import Matcher, SeriesData
from gpuwatch.core.tiers import TierSeries


class Queryable(Protocol):
    """Where the engine reads samples from (the store satisfies it)."""

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """What `select` returns cut to each series' last sample (the store answers it from memory);
        instant selectors at one step use it."""
        ...


@runtime_checkable
class TierSource(Protocol):
    """A source that also has tier points (core.tiers): the store. The engine reads them where they
    answer a query exactly as the samples would (tierpick.py)."""

    def select_tiers(
        self,
        matchers: Sequence[Matcher],
        res_ms: int,
        start_ms: int,
        end_ms: int,
        columns: Collection[str] | None = None,
    ) -> list[TierSeries] | None:
        """The matching series' points of the buckets ending in (start_ms, end_ms], multiples of
        `res_ms`; None where this source cannot answer from tier points (the engine reads samples).
        `columns`: the names of the point columns the caller reads (`end_ms` always); the others may
        be None, and are not decoded. None: all."""
        ...


class EngineSettings(Protocol):
    """The settings a query engine is built from (`config.Settings` has them)."""

    @property
    def lookback(self) -> float: ...
    @property
    def query_timeout(self) -> float: ...
    @property
    def query_max_samples(self) -> int: ...
    @property
    def query_max_length(self) -> int: ...
    @property
    def query_max_depth(self) -> int: ...
