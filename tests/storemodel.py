"""One model of store writes for the property tests: what a store takes (live batches, imports, flushes,
compactions, retention, reopening), applied to a real Store and to a plain dict of what it must then hold.

A test draws `operations(...)`, applies each to a `modelled_store(...)`, and after each checks what it
is about: `agree` (reads equal the model), and its own part (a cache's budget, the head index, ...).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from hypothesis import strategies as st

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import STALE_NAN, Batch, Matcher, Sample, SeriesData, make_labels
from gpuwatch.core.tiers import MINUTE_MS
from gpuwatch.store import Store
from gpuwatch.store import writer as writer_module
from gpuwatch.store.chunking import WINDOW_MS

T0 = 1_800_000_000_000  # a window boundary: slot 0 starts a window
assert T0 % WINDOW_MS == 0
NAME = Matcher("__name__", "=", "m")
Op = tuple[Any, ...]
Read = list[tuple[str, list[int], list[int]]]  # (label s, timestamps, value bits) per series, by s
VALUES = st.one_of(st.floats(-5, 5, allow_nan=False), st.just(STALE_NAN))


def operations(
    *,
    slots: int = 30,
    retention_slots: int = 20,
    max_size: int = 14,
    extra: Sequence[st.SearchStrategy[Op]] = (),
) -> st.SearchStrategy[list[Op]]:
    """Lists of operations on series `m{s=...}`, each a tuple (a failing example prints as it reads):

    - `("batch", k, [(s, v), ...])`: one live batch at slot k, of series a and b; k may lie before or
      after what the store holds already (late samples, future timestamps);
    - `("series", s, [(k, v), ...])`: one import of series a, b or c (a long one becomes chunks directly,
      skipping the head; slots may repeat: the later value wins);
    - `("flush",)`: a flush (every operation is followed by one: this one has nothing queued);
    - `("compact",)`: the head into chunks (and closed windows merged);
    - `("retention", k)`: drop every sample before slot k, and series left empty;
    - `("reopen",)`: close the store and open it again.

    `extra` adds kinds the test applies itself (a read, say).
    """
    kinds: list[st.SearchStrategy[Op]] = [
        st.tuples(
            st.just("batch"),
            st.integers(0, slots),
            st.lists(st.tuples(st.sampled_from("ab"), VALUES), max_size=3),
        ),
        st.tuples(
            st.just("series"),
            st.sampled_from("abc"),
            st.lists(st.tuples(st.integers(0, slots), VALUES), min_size=1, max_size=12),
        ),
        st.tuples(st.just("flush")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("retention"), st.integers(0, retention_slots)),
        st.tuples(st.just("reopen")),
        *extra,
    ]
    return st.lists(st.one_of(kinds), min_size=1, max_size=max_size)


def bits(v: float) -> int:
    return int(np.float64(v).view(np.uint64))


def _as_read(found: Sequence[SeriesData]) -> Read:
    return sorted(
        (dict(sd.labels)["s"], sd.timestamps_ms.tolist(), sd.values.view(np.uint64).tolist()) for sd in found
    )


def read(store: Store, start: int, end: int, matchers: Sequence[Matcher] = (NAME,)) -> Read:
    """What `store.select` returns, as a Read."""
    return _as_read(store.select(list(matchers), start, end))


class ModelledStore:
    """A Store in `directory` (None: in memory, not to be reopened) and `points`, what it must hold:
    {label s: {t_ms: value}}."""

    def __init__(self, directory: Path | None, *, step_ms: int, **open_kw: Any) -> None:
        self.directory = directory
        self.step_ms = step_ms
        self.clock = FakeClock(T0 / 1000)
        self.open_kw = {"flush_interval_s": 3600, "retention_s": 0, **open_kw}
        self.store = Store.open(directory, clock=self.clock, **self.open_kw)
        self.points: dict[str, dict[int, float]] = {}

    def t(self, slot: int) -> int:
        return T0 + slot * self.step_ms

    def apply(self, op: Op, *, flush: bool = True) -> None:
        """Apply `op` to the store and the model, then flush: a batch and an import of the same point
        never meet in one flush, where either may win. (`flush=False`: the test flushes, and writes no
        such pair before it.)"""
        kind = op[0]
        if kind == "batch":
            t = self.t(op[1])
            self.store.append(Batch(t, [Sample("m", make_labels({"s": s}), v) for s, v in op[2]]))
            for s, v in op[2]:
                self.points.setdefault(s, {})[t] = v
        elif kind == "series":
            t = np.array([self.t(k) for k, _ in op[2]], np.int64)
            v = np.array([v for _, v in op[2]], np.float64)
            self.store.append_series("m", make_labels({"s": op[1]}), t, v)
            for ti, vi in zip(t.tolist(), v.tolist(), strict=True):
                self.points.setdefault(op[1], {})[ti] = vi
        elif kind == "flush":
            self.store.flush()  # after the previous operation's flush: nothing queued
        elif kind == "compact":
            self.store.compact()
        elif kind == "retention":
            self.store.apply_retention(self.t(op[1]))  # retention_s=0: the cutoff is the time given,
            cutoff = self.t(op[1]) // MINUTE_MS * MINUTE_MS  # down to the minute (tiers.py's buckets)
            for pts in self.points.values():
                for t in [t for t in pts if t < cutoff]:
                    del pts[t]
        elif kind == "reopen":
            self.store.close()
            self.store = Store.open(self.directory, clock=self.clock, **self.open_kw)
        else:
            raise ValueError(f"not a store operation: {op!r}")
        if flush:
            self.store.flush()

    def reopen_read_only(self) -> None:
        self.store.close()
        self.store = Store.open(self.directory, clock=self.clock, **{**self.open_kw, "read_only": True})

    def expected(self, start: int, end: int) -> Read:
        out = []
        for s, pts in sorted(self.points.items()):
            ts = sorted(t for t in pts if start <= t <= end)
            if ts:
                out.append((s, ts, [bits(pts[t]) for t in ts]))
        return out

    def read(self, start: int, end: int, matchers: Sequence[Matcher] = (NAME,)) -> Read:
        return read(self.store, start, end, matchers)

    def read_last(self, start: int, end: int) -> Read:
        return _as_read(self.store.select_last([NAME], start, end))

    def agree(self, ranges: Sequence[tuple[int, int]]) -> None:
        """`select` returns the model's points in each range, and `select_last` each series' last."""
        for start, end in ranges:
            want = self.expected(start, end)
            assert self.read(start, end) == want, (start, end)
            assert self.read_last(start, end) == [(s, t[-1:], v[-1:]) for s, t, v in want], (start, end)


@contextmanager
def modelled_store(*, step_ms: int, bulk_min: int = 6, **open_kw: Any) -> Iterator[ModelledStore]:
    """A ModelledStore in a fresh directory (one per Hypothesis example); imports of `bulk_min` or more
    samples become chunks directly, as big ones do."""
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(writer_module, "_BULK_MIN", bulk_min):
        m = ModelledStore(Path(tmp), step_ms=step_ms, **open_kw)
        try:
            yield m
        finally:
            m.store.close()
