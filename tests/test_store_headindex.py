"""Reads that leave the head table out (store/headindex.py) return exactly what reads with it return."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.clock import FakeClock
from gpuwatch.model import STALE_NAN, Batch, Matcher, Sample, make_labels
from gpuwatch.store import Store
from gpuwatch.store import writer as writer_module
from gpuwatch.store.headindex import HeadIndex
from gpuwatch.store.read import read_samples

NAME = Matcher("__name__", "=", "m")
T0 = 1_800_000_000_000
RANGES = [(T0, T0 + 9_000), (T0 + 10_000, T0 + 25_000), (T0 + 26_000, T0 + 40_000), (T0 - 10**9, T0 + 10**9)]


def _as_lists(found: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, tuple[list[int], list[int]]]:
    return {sid: (t.tolist(), v.view(np.uint64).tolist()) for sid, (t, v) in found.items()}


def _agree(store: Store) -> None:
    """Every read through the store equals a read that always includes the head."""
    ids = sorted(e.series_id for e in store._snapshot().by_id.values())
    for start, end in RANGES:
        got = sorted(
            (s.timestamps_ms.tolist(), s.values.view(np.uint64).tolist())
            for s in store.select([NAME], start, end)
        )
        by_ids = _as_lists(read_samples(store._cursor(), ids, start, end, store._heads()))
        truth = _as_lists(read_samples(store._cursor(), ids, start, end))
        assert by_ids == truth, (start, end)
        assert got == sorted(truth.values()), (start, end)


_value = st.one_of(st.floats(-5, 5, allow_nan=False), st.just(STALE_NAN))
_op = st.one_of(
    st.tuples(
        st.just("batch"), st.integers(0, 40), st.lists(st.tuples(st.sampled_from("ab"), _value), max_size=3)
    ),
    st.tuples(
        st.just("series"),
        st.sampled_from("abc"),
        st.lists(st.tuples(st.integers(0, 40), _value), min_size=1, max_size=12),
    ),
    st.tuples(st.just("compact")),
    st.tuples(st.just("retention"), st.integers(0, 45)),
    st.tuples(st.just("reopen")),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_op, min_size=1, max_size=12))
def test_reads_equal_reads_with_the_head(ops: list[tuple], monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[type-arg]
    monkeypatch.setattr(writer_module, "_BULK_MIN", 6)  # imports of 6+ samples become chunks directly
    clock = FakeClock(T0 / 1000)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp), clock=clock, flush_interval_s=3600, retention_s=0)
        try:
            for op in ops:
                kind = op[0]
                if kind == "batch":
                    store.append(
                        Batch(T0 + op[1] * 1000, [Sample("m", make_labels({"s": s}), v) for s, v in op[2]])
                    )
                elif kind == "series":
                    t = np.array([T0 + x * 1000 for x, _ in op[2]], np.int64)
                    v = np.array([v for _, v in op[2]], np.float64)
                    store.append_series("m", make_labels({"s": op[1]}), t, v)
                elif kind == "compact":
                    store.compact()
                elif kind == "retention":
                    store.apply_retention(T0 + op[1] * 1000)
                else:
                    store.close()
                    store = Store.open(Path(tmp), clock=clock, flush_interval_s=3600, retention_s=0)
                store.flush()
                _agree(store)
            store.close()
            store = Store.open(Path(tmp), clock=clock, read_only=True)  # the index read from the file
            _agree(store)
        finally:
            store.close()


def _store_with_head_rows() -> tuple[Store, int]:
    store = Store.open(None, clock=FakeClock(T0 / 1000), flush_interval_s=3600)
    for k in range(5):
        store.append(Batch(T0 + k * 1000, [Sample("m", make_labels({"s": "a"}), float(k))]))
    store.flush()
    return store, next(iter(store._snapshot().by_id))


def test_the_index_follows_head_writes_and_compaction() -> None:
    store, sid = _store_with_head_rows()
    with store:
        heads = store._heads()
        assert heads.clear_of(np.array([sid]), T0 + 4_000) is None
        assert heads.clear_of(np.array([sid]), T0 - 1) is not None  # ends before the head's oldest row
        assert heads.clear_of(np.array([sid + 1]), T0 + 4_000) is not None  # a series without head rows
        store.compact()
        assert heads.clear_of(np.array([sid]), T0 + 4_000) is not None
        assert read_samples(store._cursor(), [sid], T0, T0 + 4_000, heads)[sid][0].tolist() == [
            T0 + k * 1000 for k in range(5)
        ]


class _MarkedDuringTheRead(HeadIndex):
    """An index that says "clear" although the head has rows, and sees the writer mark rows right after:
    what a reader sees when a flush commits between its decision and its statement."""

    def __init__(self, mark: bool) -> None:
        super().__init__()
        self.mark = mark

    def clear_of(self, ids: np.ndarray, end_ms: int) -> int | None:
        marks = super().clear_of(ids, end_ms)
        if self.mark:
            self.add(ids, np.full(ids.size, end_ms))
        return marks


def test_a_read_racing_a_head_write_is_repeated_with_the_head() -> None:
    store, sid = _store_with_head_rows()
    with store:
        cur = store._cursor()
        # Without a mark in between, the statement leaves the head out (the saving)...
        assert read_samples(cur, [sid], T0, T0 + 4_000, _MarkedDuringTheRead(mark=False)) == {}
        # ...and with one, the read is repeated with the head and finds its rows.
        found = read_samples(cur, [sid], T0, T0 + 4_000, _MarkedDuringTheRead(mark=True))
        assert found[sid][1].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
