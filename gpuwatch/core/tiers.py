"""Tier points: one series' samples summed up per bucket of a fixed length (1 minute, 1 hour), keeping
what makes the answers of the range functions built on them exact.

A bucket of resolution `res` ending at `end` (a multiple of `res`) holds the samples with
`end - res < t <= end`, as PromQL's range windows are left-open: a window `(e - r, e]` whose end and
range are whole multiples of `res` is the union of whole buckets.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
RESOLUTIONS_MS = (MINUTE_MS, HOUR_MS)


class TierPoints(NamedTuple):
    """One series' tier points at one resolution, one row per bucket that holds a sample, ascending.

    Staleness markers are not samples (range functions drop them): they are not counted, and only
    `stale_after` records that one came after the bucket's last sample (an instant selector then has no
    value after it)."""

    end_ms: np.ndarray  # int64, multiples of the resolution
    n: np.ndarray  # int64: samples in the bucket (NaN values included)
    sum: np.ndarray  # float64
    min: np.ndarray  # float64
    max: np.ndarray  # float64
    first_t: np.ndarray  # int64: the bucket's first sample
    first_v: np.ndarray  # float64
    last_t: np.ndarray  # int64: the bucket's last sample
    last_v: np.ndarray  # float64
    increase: np.ndarray  # float64: the counter increase between the bucket's samples, resets removed
    stale_after: np.ndarray  # bool

    @property
    def size(self) -> int:
        return int(self.end_ms.size)


def empty() -> TierPoints:
    i, f = np.zeros(0, np.int64), np.zeros(0, np.float64)
    return TierPoints(i, i, f, f, f, i, f, i, f, f, np.zeros(0, bool))
