"""The only place that reads the time; tests pass a FakeClock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Source of wall-clock and monotonic time."""

    def now(self) -> float:
        """Return Unix time in seconds."""
        ...

    def now_ms(self) -> int:
        """Return Unix time in integer milliseconds."""
        ...

    def monotonic(self) -> float:
        """Return a monotonic time in seconds, for durations."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._t = float(start)
        self._mono = 0.0

    def now(self) -> float:
        return self._t

    def now_ms(self) -> int:
        return int(round(self._t * 1000))

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by `seconds`."""
        self._t += seconds
        self._mono += seconds
