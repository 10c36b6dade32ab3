"""A `QueryBackend` for a face (`storage.remote`) that keeps answering while its remote store cannot be
reached: from the local store, its last `local_buffer` only, with a warning that says so.

The local store holds what this gpuwatch collected itself (its NVML figures, scrapes, pushes, what its
rules recorded): the queue of its remote write. While the remote is down the pages draw that, cut to
the buffer so that no chart passes a few minutes of one machine off as the store's days. Only an
unreachable remote (`RemoteUnavailable`: no connection, a 5xx, an answer that is not the API's) falls
back; a query the remote refuses or times out on is the query's own error, answered as before.

Once the remote fails it is not asked again for `retry_s` (a page's panels, asked together, do not
each wait for it), then one query probes it while the others still take the buffer. The rules never
read the buffer (`instant_remote`): vmalert's users expect a round the store cannot answer to be
skipped with an error, not evaluated on a part of the data.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from gpuwatch.core.clock import Clock
from gpuwatch.core.model import Matcher, SeriesData
from gpuwatch.query import notices
from gpuwatch.query.backend import Catalog, LocalBackend, MatchSets, QueryBackend
from gpuwatch.query.errors import RemoteUnavailable
from gpuwatch.query.source import EngineSettings, Queryable
from gpuwatch.query.values import Matrix, Result, success_body

T = TypeVar("T")

RETRY_S = 10.0  # how long an unreachable remote is not asked again


def buffer_text(seconds: float) -> str:
    """`15 minutes`, `1 hour`, `90 seconds`: the buffer as the warning says it."""
    for size, unit in ((3600, "hour"), (60, "minute"), (1, "second")):
        if seconds >= size and seconds % size == 0:
            n = int(seconds // size)
            return f"{n} {unit}" + ("s" if n != 1 else "")
    return f"{seconds:g} seconds"


class BufferedSource:
    """A `Queryable`: what `source` holds from `floor_ms()` on (no tier points: the buffer is short)."""

    def __init__(self, source: Queryable, floor_ms: Callable[[], int]) -> None:
        self.source = source
        self.floor_ms = floor_ms

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        start_ms = max(start_ms, self.floor_ms())
        return self.source.select(matchers, start_ms, end_ms) if start_ms <= end_ms else []

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        start_ms = max(start_ms, self.floor_ms())
        return self.source.select_last(matchers, start_ms, end_ms) if start_ms <= end_ms else []


class FallbackBackend:
    """Answer by `remote`; while it cannot be reached, by `source` and `catalog` within the last
    `buffer_s` (0: never, the remote's error is the answer), noting the warning."""

    def __init__(
        self,
        remote: QueryBackend,
        source: Queryable,
        catalog: Catalog,
        settings: EngineSettings,
        clock: Clock,
        *,
        buffer_s: float,
        retry_s: float = RETRY_S,
    ) -> None:
        self.remote = remote
        self.name = remote.name
        self.clock = clock
        self.buffer_ms = int(round(buffer_s * 1000))
        self.retry_s = retry_s
        self.local = LocalBackend(BufferedSource(source, self.floor_ms), catalog, settings, clock.monotonic)
        self._lock = threading.Lock()
        self._down_until: float | None = None  # monotonic time before which the remote is not asked
        self._reason = ""  # the remote's last error, one line
        self._probing = False

    # -- the remote's state ---------------------------------------------------------------------------
    def floor_ms(self) -> int:
        """The oldest time the buffer answers for: now less `buffer_s`."""
        return self.clock.now_ms() - self.buffer_ms

    @property
    def warning(self) -> str:
        """What answers from the buffer say, one line."""
        return f"{self._reason}; answered from the local buffer (last {buffer_text(self.buffer_ms / 1000)})"

    def unreachable(self) -> str | None:
        """The remote's error while it is remembered unreachable, else None."""
        with self._lock:
            if self._down_until is None or self.clock.monotonic() >= self._down_until:
                return None
            return self._reason

    def _may_ask(self) -> bool:
        """Whether this query asks the remote: yes while it answers; once it failed, one query (the
        probe) after `retry_s`, the others take the buffer meanwhile."""
        with self._lock:
            if self._down_until is None:
                return True
            if self._probing or self.clock.monotonic() < self._down_until:
                return False
            self._probing = True
            return True

    def _answered(self, error: RemoteUnavailable | None) -> None:
        with self._lock:
            self._probing = False
            if error is None:
                self._down_until = None
            else:
                self._down_until = self.clock.monotonic() + self.retry_s
                self._reason = str(error)

    def _answer(self, ask: Callable[[QueryBackend], T], local: Callable[[], T]) -> T:
        if self.buffer_ms <= 0:
            return ask(self.remote)
        if self._may_ask():
            try:
                out = ask(self.remote)
            except RemoteUnavailable as exc:
                self._answered(exc)
            except Exception:
                self._answered(None)  # it answered, with the query's own error
                notices.answered_by_remote()
                raise
            else:
                self._answered(None)
                notices.answered_by_remote()
                return out
        with self._lock:
            warning = self.warning
        out = local()
        notices.answered_from_buffer(warning)
        return out

    # -- the rules -----------------------------------------------------------------------------------
    def instant_remote(self, expr: str, time_ms: int) -> Result:
        """Evaluate `expr` at `time_ms` on the remote alone (the rules); while it is remembered
        unreachable, raise its error at once, without asking."""
        reason = self.unreachable()
        if reason is not None:
            raise RemoteUnavailable(reason)
        try:
            out = self.remote.instant(expr, time_ms)
        except RemoteUnavailable as exc:
            self._answered(exc)
            raise
        self._answered(None)
        return out

    # -- QueryBackend ---------------------------------------------------------------------------------
    def instant(
        self, expr: str, time_ms: int, *, timeout_s: float | None = None, lookback_ms: int | None = None
    ) -> Result:
        """Evaluate `expr` at `time_ms`."""
        return self._answer(
            lambda b: b.instant(expr, time_ms, timeout_s=timeout_s, lookback_ms=lookback_ms),
            lambda: self.local.instant(expr, time_ms, timeout_s=timeout_s, lookback_ms=lookback_ms),
        )

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
        """Evaluate `expr` from `start_ms` to `end_ms` every `step_ms` (from the buffer: its steps
        from the buffer's start on)."""
        return self._answer(
            lambda b: b.range(expr, start_ms, end_ms, step_ms, timeout_s=timeout_s, lookback_ms=lookback_ms),
            lambda: self._buffer_range(expr, start_ms, end_ms, step_ms, timeout_s, lookback_ms),
        )

    def instant_body(
        self, expr: str, time_ms: int, *, timeout_s: float | None = None, lookback_ms: int | None = None
    ) -> bytes:
        """`instant`'s success answer as /api/v1/query sends it (the remote's own bytes where they
        pass, `RemoteBackend.instant_body`)."""
        return self._answer(
            lambda b: b.instant_body(expr, time_ms, timeout_s=timeout_s, lookback_ms=lookback_ms),
            lambda: self.local.instant_body(expr, time_ms, timeout_s=timeout_s, lookback_ms=lookback_ms),
        )

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
        """`range`'s success answer as /api/v1/query_range sends it (the remote's own bytes where they
        pass, `RemoteBackend.range_body`)."""
        return self._answer(
            lambda b: b.range_body(
                expr, start_ms, end_ms, step_ms, timeout_s=timeout_s, lookback_ms=lookback_ms
            ),
            lambda: success_body(self._buffer_range(expr, start_ms, end_ms, step_ms, timeout_s, lookback_ms)),
        )

    def _buffer_range(
        self,
        expr: str,
        start_ms: int,
        end_ms: int,
        step_ms: int,
        timeout_s: float | None,
        lookback_ms: int | None,
    ) -> Matrix:
        start, floor = start_ms, self.floor_ms()
        if step_ms > 0 and start < floor:
            start += -(-(floor - start) // step_ms) * step_ms  # the query's own steps
        if step_ms > 0 and start > end_ms:
            return Matrix([])
        return self.local.range(expr, start, end_ms, step_ms, timeout_s=timeout_s, lookback_ms=lookback_ms)

    def _span(self, start_ms: int, end_ms: int) -> tuple[int, int] | None:
        start_ms = max(start_ms, self.floor_ms())
        return (start_ms, end_ms) if start_ms <= end_ms else None

    def series(self, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[dict[str, str]]:
        """The label sets of series any of `match_sets` selects, without duplicates, sorted."""
        span = self._span(start_ms, end_ms)
        return self._answer(
            lambda b: b.series(match_sets, start_ms, end_ms),
            lambda: self.local.series(match_sets, *span) if span else [],
        )

    def label_names(self, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[str]:
        """Label names of the series any of `match_sets` selects (no sets: every series), sorted."""
        span = self._span(start_ms, end_ms)
        return self._answer(
            lambda b: b.label_names(match_sets, start_ms, end_ms),
            lambda: self.local.label_names(match_sets, *span) if span else [],
        )

    def label_values(self, name: str, match_sets: MatchSets, start_ms: int, end_ms: int) -> list[str]:
        """Values of label `name` on the series any of `match_sets` selects (no sets: all), sorted."""
        span = self._span(start_ms, end_ms)
        return self._answer(
            lambda b: b.label_values(name, match_sets, start_ms, end_ms),
            lambda: self.local.label_values(name, match_sets, *span) if span else [],
        )

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """The raw samples in [start_ms, end_ms] of the series `matchers` select."""
        return self._answer(
            lambda b: b.select(matchers, start_ms, end_ms),
            lambda: self.local.select(matchers, start_ms, end_ms),  # the source cuts to the buffer
        )
