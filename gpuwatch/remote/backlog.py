"""The store as a sender's queue: its samples after a watermark, as the sender's batches."""

from __future__ import annotations

from typing import Any, Protocol

from gpuwatch.remote.sender import Batch, Gap


class AppendedStore(Protocol):
    """What of `gpuwatch.store.Store` the senders use (`store/appended.py`)."""

    def appended_since(self, watermark: Any, max_samples: int, until: Any = None) -> Any: ...

    def newest_appended(self) -> Any: ...

    def load_watermark(self, destination: str) -> Any: ...

    def save_watermark(self, destination: str, watermark: Any, now_ms: int) -> None: ...

    def appended_lag(self, watermark: Any, now_ms: int, until: Any = None) -> Any: ...

    def load_gaps(self, destination: str) -> list[Any]: ...

    def save_gap(self, destination: str, start: Any, end: Any, now_ms: int, live: Any = None) -> None: ...


READ_AHEAD = 100_000  # samples read from the store at once by a sender that is behind


class StoreBacklog:
    """`Backlog` over the store. A destination seen for the first time starts at what is stored now,
    as Prometheus's remote write does (not with the whole history); from then on, nothing is skipped."""

    def __init__(self, store: AppendedStore, now_ms: Any) -> None:
        self._store = store
        self._now_ms = now_ms
        # What a read ahead returned past the batch handed out, by the watermark and end it continues
        # from, and what the store had after it: behind, one read takes READ_AHEAD samples and the
        # sender's batches are cut from it. A batch read alone decoded the chunk rows of every series
        # in it for one sample each (2,576 samples/s caught up after an outage; bench/README.md).
        self._ahead: dict[tuple[Any, Any], tuple[Any, int]] = {}

    def load_watermark(self, destination: str) -> Any:
        found = self._store.load_watermark(destination)
        if found is None:
            found = self._store.newest_appended()
            self._store.save_watermark(destination, found, self._now_ms())
        return found

    def save_watermark(self, destination: str, watermark: Any, now_ms: int) -> None:
        self._store.save_watermark(destination, watermark, now_ms)

    def newest(self) -> Any:
        return self._store.newest_appended()

    def load_gaps(self, destination: str) -> list[Gap]:
        return [Gap(g.start, g.end) for g in self._store.load_gaps(destination)]

    def save_gap(self, destination: str, gap: Gap, now_ms: int, live: Any = None) -> None:
        self._store.save_gap(destination, gap.start, gap.end, now_ms, live)

    def appended_since(self, watermark: Any, max_samples: int, until: Any = None) -> Batch:
        ahead = self._ahead.pop((watermark, until), None)
        if ahead is None:
            got = self._store.appended_since(watermark, max(max_samples, READ_AHEAD), until)
            after = 0
            if got.samples > max_samples:  # a backlog: say how much (a caught-up sender skips the count)
                after = int(self._store.appended_lag(got.watermark, self._now_ms(), until).samples)
        else:
            got, after = ahead
        got, rest = got.first(max_samples)
        if rest.samples:
            if len(self._ahead) >= 16:  # (a lane that moved elsewhere left its piece behind)
                self._ahead.clear()
            self._ahead[(got.watermark, until)] = (rest, after)
        series = got.series
        pending = rest.samples + after
        return Batch(
            [s.name for s in series],
            [s.labels for s in series],
            [s.timestamps_ms for s in series],
            [s.values for s in series],
            got.watermark,
            pending,
        )
