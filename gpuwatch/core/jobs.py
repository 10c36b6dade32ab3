"""Scheduled jobs that never crash the scheduler and record how they went."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gpuwatch.core.clock import Clock

log = logging.getLogger("gpuwatch.jobs")


@dataclass
class JobState:
    """What /-/jobs shows for one job."""

    name: str
    interval_s: float
    runs: int = 0
    failures: int = 0
    last_run_ms: int | None = None
    last_duration_s: float | None = None
    last_error: str | None = None


class JobRegistry:
    """Run named jobs, one at a time each, recording run count, duration and last error."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._jobs: dict[str, tuple[Callable[[], object], JobState]] = {}
        self._locks: dict[str, threading.Lock] = {}

    def add(self, name: str, fn: Callable[[], object], interval_s: float) -> None:
        """Register `fn` under `name`; the scheduler calls `run(name)`."""
        self._jobs[name] = (fn, JobState(name=name, interval_s=interval_s))
        self._locks[name] = threading.Lock()

    def names(self) -> list[str]:
        return list(self._jobs)

    def interval(self, name: str) -> float:
        return self._jobs[name][1].interval_s

    def run(self, name: str) -> bool:
        """Run job `name` now unless it is already running; return True if it succeeded."""
        fn, state = self._jobs[name]
        lock = self._locks[name]
        if not lock.acquire(blocking=False):
            return False
        try:
            start = self._clock.monotonic()
            state.last_run_ms = self._clock.now_ms()
            try:
                fn()
            except Exception as e:  # the job wrapper is the one place that catches everything
                state.failures += 1
                state.last_error = f"{type(e).__name__}: {e}"
                log.warning(
                    "job %s failed: %s", name, state.last_error, exc_info=log.isEnabledFor(logging.DEBUG)
                )
                return False
            else:
                state.last_error = None
                return True
            finally:
                state.runs += 1
                state.last_duration_s = self._clock.monotonic() - start
        finally:
            lock.release()

    def counters(self) -> list[tuple[str, int, int, float | None]]:
        """Return (name, runs, failures, last duration in seconds) of every job, for /metrics."""
        return [(s.name, s.runs, s.failures, s.last_duration_s) for _, s in self._jobs.values()]

    def states(self) -> list[dict[str, Any]]:
        """Return every job's state as plain dicts."""
        return [asdict(state) for _, state in self._jobs.values()]
