"""Stores the harness loads test data into: gpuwatch's real DuckDB store, or a small numpy one."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher, SeriesData, last_samples, make_labels
from gpuwatch.query.nativehist import NativeHistogram

Key = tuple[tuple[str, str], ...]


class Histograms:
    """Native histogram samples beside a float store: the store keeps NaN at their timestamps
    (so presence and lookback are real), this map supplies the histograms to `select`."""

    def __init__(self) -> None:
        self.by_series: dict[Key, dict[int, NativeHistogram]] = {}

    def put(self, key: Key, t_ms: int, value: float | NativeHistogram) -> float:
        """Record `value` at `t_ms`; return the float to store."""
        if isinstance(value, NativeHistogram):
            self.by_series.setdefault(key, {})[t_ms] = value
            return math.nan
        self.by_series.get(key, {}).pop(t_ms, None)  # a later float sample replaces a histogram
        return value

    def attach(self, data: list[SeriesData]) -> list[SeriesData]:
        if not self.by_series:
            return data
        out = []
        for sd in data:
            hs = self.by_series.get(tuple(sorted(sd.label_dict().items())))
            if hs:
                lo, hi = int(sd.timestamps_ms[0]), int(sd.timestamps_ms[-1])
                hs = {t: h for t, h in hs.items() if lo <= t <= hi}
                if hs:
                    sd = dataclasses.replace(sd, histograms=hs)
            out.append(sd)
        return out


class TestStore(Protocol):
    def append(self, labels: dict[str, str], t_ms: int, value: float | NativeHistogram) -> None: ...
    def prepare(self) -> None: ...
    def clear(self) -> None: ...
    def close(self) -> None: ...
    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...
    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...


def _matches(labels: dict[str, str], m: Matcher) -> bool:
    value = labels.get(m.name, "")
    if m.op == "=":
        return value == m.value
    if m.op == "!=":
        return value != m.value
    hit = re.fullmatch(f"(?s:{m.value})", value) is not None
    return hit if m.op == "=~" else not hit


class ArrayStore:
    """A tiny in-memory store over numpy arrays (for comparing with the real store)."""

    def __init__(self) -> None:
        self._pending: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
        self._series: list[tuple[dict[str, str], np.ndarray, np.ndarray]] = []
        self._hists = Histograms()

    def append(self, labels: dict[str, str], t_ms: int, value: float | NativeHistogram) -> None:
        key = tuple(sorted(labels.items()))
        self._pending.setdefault(key, []).append((t_ms, self._hists.put(key, t_ms, value)))

    def prepare(self) -> None:
        if not self._pending:
            return
        merged: dict[tuple[tuple[str, str], ...], dict[int, float]] = {}
        for labels, t, v in self._series:
            merged[tuple(sorted(labels.items()))] = dict(zip(t.tolist(), v.tolist(), strict=True))
        for key, samples in self._pending.items():
            merged.setdefault(key, {}).update(samples)
        self._pending = {}
        self._series = []
        for key, samples in merged.items():
            ts = sorted(samples)
            self._series.append(
                (
                    dict(key),
                    np.array(ts, dtype=np.int64),
                    np.array([samples[t] for t in ts], dtype=np.float64),
                )
            )

    def clear(self) -> None:
        self._pending = {}
        self._series = []
        self._hists = Histograms()

    def close(self) -> None:
        self.clear()

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return last_samples(self.select(matchers, start_ms, end_ms), start_ms, end_ms)

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        out = []
        for labels, t, v in self._series:
            if all(_matches(labels, m) for m in matchers):
                lo, hi = np.searchsorted(t, start_ms, "left"), np.searchsorted(t, end_ms, "right")
                if hi > lo:
                    out.append(
                        SeriesData(labels.get("__name__", ""), make_labels(labels), t[lo:hi], v[lo:hi])
                    )
        return self._hists.attach(out)


class RealStore:
    """gpuwatch's DuckDB store, in memory; `clear` opens a fresh one."""

    def __init__(self) -> None:
        from gpuwatch.store import Store

        self._open = lambda: Store.open(None, clock=FakeClock(), flush_interval_s=3600.0)
        self._store = self._open()
        self._pending: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
        self._hists = Histograms()

    def append(self, labels: dict[str, str], t_ms: int, value: float | NativeHistogram) -> None:
        key = tuple(sorted(labels.items()))
        self._pending.setdefault(key, []).append((t_ms, self._hists.put(key, t_ms, value)))

    def prepare(self) -> None:
        if not self._pending:
            return
        for key, samples in self._pending.items():
            labels = dict(key)
            samples.sort(key=lambda s: s[0])
            t = np.array([s[0] for s in samples], dtype=np.int64)
            v = np.array([s[1] for s in samples], dtype=np.float64)
            self._store.append_series(labels.get("__name__", ""), make_labels(labels), t, v)
        self._pending = {}
        self._store.flush()

    def clear(self) -> None:
        self._store.close()
        self._store = self._open()
        self._pending = {}
        self._hists = Histograms()

    def close(self) -> None:
        self._store.close()

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return self._hists.attach(self._store.select(matchers, start_ms, end_ms))

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return self._hists.attach(self._store.select_last(matchers, start_ms, end_ms))


def make_store(backend: str) -> TestStore:
    """Return the store named by `backend` ("store" or "array")."""
    return RealStore() if backend == "store" else ArrayStore()
