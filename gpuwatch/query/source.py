"""What the engine is given: a source of samples (the store, the rules' round cache) and its settings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpuwatch.core.model import Matcher, SeriesData


class Queryable(Protocol):
    """Where the engine reads samples from (the store satisfies it)."""

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """What `select` returns cut to each series' last sample (the store answers it from memory);
        instant selectors at one step use it."""
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
