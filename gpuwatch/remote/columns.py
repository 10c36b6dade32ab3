"""A remote-write request read straight into columns, for the shape every sender writes.

Prometheus, vmagent, Alloy and gpuwatch write each `TimeSeries` as its run of labels followed by one
sample, `value` (fixed64) then `timestamp` (varint): 18 bytes for every millisecond time from 1971 to
2109. Such a request is read here with one step per series in Python (its length, and its run of
labels looked up by its bytes among the runs seen before, each checked once) and every sample's value
and time at once with numpy. Any other shape (several samples in a series, a time of another length,
exemplars, histograms, a run that is not only labels, a series over 16 KiB) gives None, and the
receiver reads the whole request with `wire.decode_request` instead: both give the same columns
(tests/test_remote_columns.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from gpuwatch.remote.wire import LABEL_CACHE_SIZE, WireError, label_run

SAMPLE_BYTES = 18  # 0x12, 16, 0x09, 8 bytes of value, 0x10, 6 bytes of time
_TAIL = np.arange(SAMPLE_BYTES)


class Run(NamedTuple):
    """A run of labels as the receiver stores it: name, sorted labels, and why it is refused (or None)."""

    name: str
    labels: tuple[tuple[str, str], ...]
    problem: str | None


class RunMemory:
    """Label runs seen before: their bytes -> an index into `runs` (bounded; emptied when full). Their
    label pairs are shared: a lab's series have most in common (job, model, host, GPU UUID)."""

    def __init__(self, check: Callable[[tuple[tuple[str, str], ...]], Run]) -> None:
        self.index: dict[bytes, int] = {}
        self.runs: list[Run] = []
        self._pairs: dict[tuple[str, str], tuple[str, str]] = {}
        self._check = check

    def forget(self) -> None:
        self.index.clear()
        self.runs.clear()
        self._pairs.clear()

    def learn(self, buf: bytes, start: int, stop: int) -> int | None:
        """Read the run at [start, stop); None when it is not only labels."""
        try:
            pairs = label_run(buf, start, stop)
        except WireError:
            return None
        shared = self._pairs.setdefault
        pairs = tuple(shared(pair, pair) for pair in pairs)
        self.runs.append(self._check(pairs))
        self.index[buf[start:stop]] = len(self.runs) - 1
        return len(self.runs) - 1


class Read(NamedTuple):
    """Per series of the request as sent: its run's index, time (ms) and value."""

    runs: np.ndarray  # int64
    t_ms: np.ndarray  # int64
    values: np.ndarray  # float64


def read_columns(buf: bytes, memory: RunMemory) -> Read | None:
    """The request's series and samples, or None where it has another shape (module docstring)."""
    if len(memory.runs) >= LABEL_CACHE_SIZE:
        memory.forget()
    ids: list[int] = []
    tails: list[int] = []
    get, learn = memory.index.get, memory.learn
    pos, end = 0, len(buf)
    try:
        while pos < end:
            if buf[pos] != 0x0A:
                return None
            b1 = buf[pos + 1]
            if b1 < 0x80:
                size, pos = b1, pos + 2
            else:
                b2 = buf[pos + 2]
                if b2 >= 0x80:
                    return None
                size, pos = (b1 & 0x7F) | b2 << 7, pos + 3
            stop = pos + size
            if size < SAMPLE_BYTES or stop > end:
                return None
            tail = stop - SAMPLE_BYTES
            k = get(buf[pos:tail])
            if k is None:
                k = learn(buf, pos, tail)
                if k is None:
                    return None
            ids.append(k)
            tails.append(tail)
            pos = stop
    except IndexError:  # a length cut off at the end
        return None
    if not ids:
        return Read(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64))
    raw = np.frombuffer(buf, np.uint8)
    sample = raw[np.array(tails, np.int64)[:, None] + _TAIL]
    shape_ok = (
        (sample[:, 0] == 0x12)
        & (sample[:, 1] == 0x10)
        & (sample[:, 2] == 0x09)
        & (sample[:, 11] == 0x10)
        & (sample[:, 12:17] >= 0x80).all(axis=1)
        & (sample[:, 17] < 0x80)
    )
    if not shape_ok.all():
        return None
    values = np.ascontiguousarray(sample[:, 3:11]).view("<f8").ravel().astype(np.float64)
    digits = (sample[:, 12:18] & 0x7F).astype(np.int64)
    t_ms = (digits << (7 * np.arange(6, dtype=np.int64))).sum(axis=1)
    return Read(np.array(ids, np.int64), t_ms, values)
