"""Token buckets per client address: writes a second, and failed credentials a minute."""

from __future__ import annotations

import threading
from collections.abc import Callable

MAX_CLIENTS = 10_000  # buckets kept; past it the fullest (idle) ones are forgotten


class RateLimiter:
    """`allow(key)` spends one token of `key`'s bucket (capacity `burst`, refilled at `rate` a second)."""

    def __init__(self, rate: float, burst: float, monotonic: Callable[[], float]) -> None:
        self.rate = rate
        self.burst = burst
        self._monotonic = monotonic
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    def _level(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (self.burst, now))
        return min(self.burst, tokens + (now - at) * self.rate)

    def allow(self, key: str) -> bool:
        """Spend one token; False (nothing spent) when the bucket is empty. A rate of 0 allows all."""
        if self.rate <= 0:
            return True
        now = self._monotonic()
        with self._lock:
            tokens = self._level(key, now)
            if tokens < 1.0:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - 1.0, now)
            if len(self._buckets) > MAX_CLIENTS:
                self._forget(now)
            return True

    def empty(self, key: str) -> bool:
        """True while `key` has no token left (checked without spending one)."""
        if self.rate <= 0:
            return False
        with self._lock:
            return self._level(key, self._monotonic()) < 1.0

    def retry_after(self, key: str) -> int:
        """Whole seconds until `key` has a token again (at least 1)."""
        with self._lock:
            missing = 1.0 - self._level(key, self._monotonic())
        return max(1, int(missing / self.rate + 0.999)) if self.rate > 0 else 1

    def _forget(self, now: float) -> None:
        full = [k for k in self._buckets if self._level(k, now) >= self.burst]
        for k in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[k]
