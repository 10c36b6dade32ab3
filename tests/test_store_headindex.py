"""Reads that leave the head table out (store/headindex.py) return exactly what reads with it return."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Sample, make_labels
from gpuwatch.store import Store
from gpuwatch.store.headindex import HeadIndex
from gpuwatch.store.read import read_samples
from tests.storemodel import T0, ModelledStore, Op, modelled_store, operations

RANGES = [(T0, T0 + 9_000), (T0 + 10_000, T0 + 25_000), (T0 + 26_000, T0 + 40_000), (T0 - 10**9, T0 + 10**9)]


def _as_lists(found: dict[int, tuple[np.ndarray, np.ndarray]]) -> dict[int, tuple[list[int], list[int]]]:
    return {sid: (t.tolist(), v.view(np.uint64).tolist()) for sid, (t, v) in found.items()}


def _agree(m: ModelledStore) -> None:
    """Every read through the store equals a read that always includes the head, and the model."""
    store = m.store
    ids = sorted(e.series_id for e in store._snapshot().by_id.values())
    for start, end in RANGES:
        by_ids = _as_lists(read_samples(store._cursor(), ids, start, end, store._heads()))
        truth = _as_lists(read_samples(store._cursor(), ids, start, end))
        assert by_ids == truth, (start, end)
        assert sorted(r[1:] for r in m.read(start, end)) == sorted(truth.values()), (start, end)
    m.agree(RANGES)


@settings(max_examples=20, deadline=None)
@given(ops=operations(slots=40, retention_slots=45, max_size=12))
def test_reads_equal_reads_with_the_head(ops: list[Op]) -> None:
    with modelled_store(step_ms=1000) as m:
        for op in ops:
            m.apply(op)
            _agree(m)
        m.reopen_read_only()  # the index read from the file
        _agree(m)


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
