"""TensorBoard's smoothing of a training curve, and a point reduction that keeps its spikes.

The smoothing runs on every raw point first and the reduction after it, so a one-step spike of the
loss moves the smoothed curve exactly as it would at full resolution and stays visible in the raw
line (each reduced bucket keeps its lowest and highest point).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

DEFAULT_WEIGHT = 0.6
MAX_POINTS = 4000  # per series and answer; more is drawn as each bucket's lowest and highest point


def ema(values: np.ndarray | list[float], weight: float = DEFAULT_WEIGHT) -> np.ndarray:
    """Return TensorBoard's debiased exponential moving average of `values`.

    `last = last * weight + (1 - weight) * v` over the finite values, divided by `1 - weight**n`
    (n: finite values so far) so that the first points are not pulled towards 0. NaN and infinite
    values pass through unchanged and do not move the average. A constant curve stays exactly as it is.
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError("smoothing weight must be at least 0 and below 1")
    v = np.asarray(values, dtype=np.float64)
    out = np.empty_like(v)
    finite = v[np.isfinite(v)]
    if finite.size and np.all(finite == finite[0]):
        return v.copy()
    last = 0.0
    n = 0
    for i, x in enumerate(v.tolist()):
        if not math.isfinite(x):
            out[i] = x
            continue
        last = last * weight + (1.0 - weight) * x
        n += 1
        out[i] = last / (1.0 - weight**n)
    return out


def reduce_indices(values: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Return the indices to keep so that at most `max_points` remain: per bucket its lowest and
    highest finite point (and the first and last of all), in order. Short series are kept whole."""
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max(1, (max_points - 2) // 2)
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    keep = {0, n - 1}
    v = np.asarray(values, dtype=np.float64)
    for a, b in itertools.pairwise(edges):
        if b <= a:
            continue
        chunk = v[a:b]
        ok = np.isfinite(chunk)
        if not ok.any():
            keep.add(int(a))
            continue
        idx = np.flatnonzero(ok)
        vals = chunk[idx]
        keep.add(int(a + idx[int(np.argmin(vals))]))
        keep.add(int(a + idx[int(np.argmax(vals))]))
    return np.array(sorted(keep), dtype=np.int64)


def smooth_and_reduce(
    values: np.ndarray, weight: float, max_points: int = MAX_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """Return (indices kept, smoothed values at them): smoothing over every point, then the reduction
    (the union of the raw curve's and the smoothed curve's extremes per bucket, so both keep their shape)."""
    smoothed = ema(values, weight)
    if len(values) <= max_points:
        return np.arange(len(values)), smoothed
    half = max(4, max_points // 2)
    idx = np.union1d(reduce_indices(values, half), reduce_indices(smoothed, half))
    return idx, smoothed[idx]
