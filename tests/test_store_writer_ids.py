"""Series ids in the writer: by label-tuple identity (shared tuples, new tuples, after retention) and by
a source's table numbers."""

from __future__ import annotations

import numpy as np

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Sample, SeriesTable
from gpuwatch.store.core import Store
from gpuwatch.store.seriesids import SeriesIds

ALL = (-(2**62), 2**62)


def series(store: Store) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[int, float]]]:
    return {
        (s.name, s.labels): list(zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True))
        for s in store.select([], *ALL)
    }


def test_one_label_tuple_many_names_and_equal_tuples_from_elsewhere(clock: FakeClock) -> None:
    store = Store.open(None, clock=clock)
    try:
        gpu = (("gpu", "0"), ("host", "h"))
        store.append(Batch(1000, [Sample("a", gpu, 1.0), Sample("b", gpu, 2.0)]))
        # an equal tuple built anew, and one with its pairs out of order, are the same series
        store.append(Batch(2000, [Sample("a", (("gpu", "0"), ("host", "h")), 3.0)]))
        store.append(Batch(3000, [Sample("a", (("host", "h"), ("gpu", "0")), 4.0), Sample("b", gpu, 5.0)]))
        store.flush()
        assert series(store) == {
            ("a", gpu): [(1000, 1.0), (2000, 3.0), (3000, 4.0)],
            ("b", gpu): [(1000, 2.0), (3000, 5.0)],
        }
    finally:
        store.close()


def test_a_series_deleted_by_retention_is_created_again_for_the_same_tuple(clock: FakeClock) -> None:
    store = Store.open(None, clock=clock, retention_s=3600)
    try:
        labels = (("job", "j"),)
        store.append(Batch(1000, [Sample("gone", labels, 1.0)]))
        store.flush()
        store.apply_retention(1000 + 2 * 3600 * 1000)  # deletes the sample and the series
        assert series(store) == {}
        store.append(Batch(9_000_000, [Sample("gone", labels, 2.0)]))  # the very same tuple object
        store.flush()
        assert series(store) == {("gone", labels): [(9_000_000, 2.0)]}
    finally:
        store.close()


def test_sources_that_rebuild_labels_every_tick_hand_the_writer_one_tuple(clock: FakeClock) -> None:
    """Self-monitoring counters and rule outputs build their labels afresh each tick; interned, the
    writer meets one tuple per series (found by identity) instead of one new tuple per tick."""
    from gpuwatch.core.jobs import JobRegistry
    from gpuwatch.core.model import stable_labels
    from gpuwatch.rules.evaluate import record_samples
    from gpuwatch.rules.load import Rule

    a = stable_labels({"job": "sample", "__name__": "x", "empty": ""})
    b = stable_labels({"job": "sample"})
    assert a is b and a == (("job", "sample"),)
    rule = Rule(kind="record", name="r:sum", expr="sum(x)", labels=(("team", "ml"),))
    first = record_samples(rule, [({"gpu": "0", "__name__": "x"}, 1.0)])
    again = record_samples(rule, [({"gpu": "0"}, 2.0)])
    assert first[0].labels is again[0].labels == (("gpu", "0"), ("team", "ml"))
    jobs = JobRegistry(clock)
    jobs.add("sample", lambda: None, 1.0)
    jobs.run("sample")
    assert jobs.counters() == [("sample", 1, 0, 0.0)]


def test_interned_label_sets_are_bounded_and_a_busy_one_stays_shared() -> None:
    """A source of ever-new label values (a pod per restart) does not grow the table without end, and a
    label set met every tick keeps its one tuple however many others pass through."""
    from gpuwatch.core.model import intern_labels

    busy = intern_labels((("job", "busy"),))
    for i in range(100_000):
        intern_labels((("pod", f"pod-{i}"),))
        if i % 1000 == 0:
            assert intern_labels((("job", "busy"),)) is busy
    assert intern_labels.cache_info().currsize <= 65_536


def test_table_numbers_of_one_series_share_its_id_and_new_ids_are_dense() -> None:
    ids = SeriesIds([], next_id=10)
    known = ("k", (("a", "1"),))
    assert ids.of_table(_table([known]), np.array([0])).tolist() == [10]
    twice = ("t", (("a", "2"),))
    table = _table([twice, ("u", ()), twice, known, ("v", ())])
    assert ids.of_table(table, np.arange(5)).tolist() == [11, 12, 11, 10, 13]
    fresh = _table([("w", ()), ("x", ())])  # every key new and distinct: made in one pass
    assert ids.of_table(fresh, np.array([1, 0, 1])).tolist() == [15, 14, 15]
    assert [(e.series_id, e.name) for e in ids.new] == [
        (10, "k"),
        (11, "t"),
        (12, "u"),
        (13, "v"),
        (14, "w"),
        (15, "x"),
    ]


def _table(keys: list[tuple[str, tuple[tuple[str, str], ...]]]) -> SeriesTable:
    table = SeriesTable()
    for name, labels in keys:
        table.add(name, labels)
    return table
