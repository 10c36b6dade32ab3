"""Store.select_last: each series' last sample in a window, exactly as a full `select` would give it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import STALE_NAN, Batch, Matcher, Sample, SeriesData, last_samples, make_labels
from gpuwatch.query import Engine, Vector
from gpuwatch.store import Store
from tests.storemodel import NAME, T0, Op, modelled_store, operations


def _last_of_select(store: Store, start: int, end: int) -> list[tuple[str, list[int], list[int]]]:
    return [
        (s.labels[0][1], s.timestamps_ms[-1:].tolist(), s.values[-1:].view(np.uint64).tolist())
        for s in store.select([NAME], start, end)
    ]


def _select_last(store: Store, start: int, end: int) -> list[tuple[str, list[int], list[int]]]:
    return [
        (s.labels[0][1], s.timestamps_ms.tolist(), s.values.view(np.uint64).tolist())
        for s in store.select_last([NAME], start, end)
    ]


def _agree(store: Store, marks: list[int]) -> None:
    for end in marks:
        for width in (1, 5_000, 300_000, 10**9):
            start = end - width + 1
            assert _select_last(store, start, end) == _last_of_select(store, start, end), (start, end)


@settings(max_examples=40, deadline=None)
@given(ops=operations(slots=40, retention_slots=45))
def test_select_last_equals_the_last_sample_of_select(ops: list[Op]) -> None:
    with modelled_store(step_ms=1000) as m:
        for op in ops:
            m.apply(op)
            _agree(m.store, [T0 + 10_000, T0 + 25_000, T0 + 40_000])
            m.agree([(T0, T0 + 40_000)])


def _vec(result: object) -> list[tuple[tuple[tuple[str, str], ...], str]]:
    assert isinstance(result, Vector)
    return sorted((tuple(sorted(s.labels.items())), repr(s.value)) for s in result)


class _WindowOnly:
    """The store answering select_last from whole windows (`last_samples` of `select`), not memory."""

    def __init__(self, store: Store) -> None:
        self.select = store.select

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return last_samples(self.select(matchers, start_ms, end_ms), start_ms, end_ms)


@pytest.mark.parametrize(
    "expr",
    [
        "m",
        "m offset 20s",
        "m @ 1800000015",
        "m offset -30s",
        "timestamp(m)",
        "m > 0 and m offset 10s",
        "sum(m) + on() group_left sum(count_over_time(m[1m]))",
        'm{s="b"} / on() group_left m{s="a"}',
    ],
)
def test_engine_instant_answers_agree_with_window_reads(expr: str) -> None:
    clock = FakeClock(T0 / 1000)
    with Store.open(None, clock=clock, flush_interval_s=3600) as store:
        for k in range(60):
            samples = [Sample("m", make_labels({"s": "a"}), float(k % 7))]
            if k < 40 or k % 2:
                samples.append(Sample("m", make_labels({"s": "b"}), STALE_NAN if k == 41 else float(k)))
            store.append(Batch(T0 + k * 1000, samples))
        store.append(Batch(T0 + 90_000, [Sample("m", make_labels({"s": "a"}), 42.0)]))  # in the future
        store.flush()
        for at in (T0 + 20_000, T0 + 41_500, T0 + 59_000, T0 + 400_000):
            got = _vec(Engine(store).instant(expr, at))
            assert got == _vec(Engine(_WindowOnly(store)).instant(expr, at)), (expr, at)


def test_a_stale_marker_hides_the_series_and_a_restart_reads_from_the_database(tmp_path: Path) -> None:
    clock = FakeClock(T0 / 1000)
    store = Store.open(tmp_path, clock=clock)
    try:
        store.append(
            Batch(T0, [Sample("m", make_labels({"s": "a"}), 1.0), Sample("m", make_labels({"s": "b"}), 2.0)])
        )
        store.append(Batch(T0 + 1000, [Sample("m", make_labels({"s": "a"}), STALE_NAN)]))
        store.flush()
        result = Engine(store).instant("m", T0 + 2000)
        assert _vec(result) == [((("__name__", "m"), ("s", "b")), "2.0")]
        last = store.select_last([NAME], T0 - 5000, T0 + 2000)
        assert math.isnan(last[0].values[0]) and last[0].timestamps_ms.tolist() == [T0 + 1000]
        store.close()
        store = Store.open(tmp_path, clock=clock)
        assert store._writer is not None
        assert not store._writer.latest.lookup(np.array([1, 2]))[0].any()  # values not known after a restart
        assert _vec(Engine(store).instant("m", T0 + 2000)) == [((("__name__", "m"), ("s", "b")), "2.0")]
        store.append(
            Batch(T0 - 500, [Sample("m", make_labels({"s": "b"}), 3.0)])
        )  # older than what is stored
        store.append(Batch(T0 + 3000, [Sample("m", make_labels({"s": "a"}), 4.0)]))
        store.flush()
        known = store._writer.latest.lookup(np.array([1, 2]))[0].tolist()
        assert known == [True, False]
        assert _vec(Engine(store).instant("m", T0 + 3000)) == [
            ((("__name__", "m"), ("s", "a")), "4.0"),
            ((("__name__", "m"), ("s", "b")), "2.0"),
        ]
    finally:
        store.close()
