"""An import's own transaction (store/staged.py): the writer keeps flushing other samples while it is
written, a refused or failed import leaves nothing of itself, and a label set a live write makes
meanwhile ends up one series. Real DuckDB files; the writer is paused inside an import by its
`after_import_slice` hook and events, never by sleeping."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest

from gpuwatch.collect.importer import prepare
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import SeriesLimitExceeded, StoreError
from gpuwatch.core.model import Batch, Matcher, Sample, SeriesColumns, SeriesLimits, make_labels
from gpuwatch.store import Store, sqlrows

NOW_MS = 1_700_000_000_000
T_IMPORT = NOW_MS - 3_600_000  # the imported samples' time: an hour before the live ones
SERIES = 50
SLICE = 10  # series a slice: the import below is written in 5 slices
WAIT_S = 30  # a safety net for a broken writer, not a timing


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW_MS / 1000)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    s = Store.open(tmp_path / "d", clock=clock, flush_interval_s=2.0)
    assert s._writer is not None
    s._writer.import_slice_series = SLICE
    yield s
    s.close()


def imported(n: int = SERIES, name: str = "imp", long: int = 0) -> SeriesColumns:
    """`n` one-sample series `name{i=...}`, and `long` of 2,000 samples (bulk chunks)."""
    lines = [f'{name}{{i="{i}"}} {i} {T_IMPORT}' for i in range(n)]
    lines += [f'{name}_long{{i="{i}"}} {k} {T_IMPORT + k * 1000}' for i in range(long) for k in range(2000)]
    prepared = prepare("\n".join(lines) + "\n", now_ms=NOW_MS)
    assert not prepared.errors
    return prepared.columns


def stored_series(store: Store, name: str) -> int:
    """The rows of `name` in the series table, read by a cursor of the test's own."""
    cur = store._con.cursor()
    try:
        row = cur.execute("SELECT count(*) FROM series WHERE name = ?", [name]).fetchone()
        return int(row[0]) if row else 0
    finally:
        cur.close()


def live(store: Store, clock: FakeClock, name: str = "live", **labels: str) -> None:
    """Append one live sample and let the flush interval pass, so the writer flushes at its next turn."""
    store.append(Batch(clock.now_ms(), [Sample(name, make_labels(labels), 1.0)]))
    clock.advance(5)


class Pause:
    """Holds the writer inside an import after chosen write slices until the test lets it go on."""

    def __init__(self, store: Store, *at: int) -> None:
        self._at = at
        self._slices = 0
        self.reached = {k: threading.Event() for k in at}
        self.go = {k: threading.Event() for k in at}
        assert store._writer is not None
        store._writer.after_import_slice = self._hook

    def _hook(self) -> None:
        self._slices += 1
        if self._slices in self._at:
            self.reached[self._slices].set()
            assert self.go[self._slices].wait(WAIT_S)

    def at(self, k: int) -> None:
        assert self.reached[k].wait(WAIT_S)

    def release(self, k: int) -> None:
        self.go[k].set()


def in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


def test_other_samples_are_written_while_a_big_import_is_and_the_import_commits_whole(
    store: Store, clock: FakeClock
) -> None:
    pause = Pause(store, 2, 3)
    t, errors = in_thread(lambda: store.write_columns(imported(long=2)))
    pause.at(2)  # two slices are in the import's transaction, three to come
    live(store, clock)
    pause.release(2)
    pause.at(3)  # the writer has taken its turn between slices 2 and 3: the live sample is stored
    found = store.select([Matcher("__name__", "=", "live")], 0, 2**62)
    assert [s.values.tolist() for s in found] == [[1.0]]
    assert stored_series(store, "live") == 1
    assert stored_series(store, "imp") == 0 and stored_series(store, "imp_long") == 0  # not committed
    assert store.select([Matcher("__name__", "=~", "imp.*")], 0, 2**62) == []
    pause.release(3)
    t.join(WAIT_S)
    assert not errors
    assert stored_series(store, "imp") == SERIES and stored_series(store, "imp_long") == 2
    found = store.select([Matcher("__name__", "=", "imp")], 0, 2**62)
    assert sorted(float(s.values[0]) for s in found) == [float(i) for i in range(SERIES)]
    long = store.select([Matcher("__name__", "=", "imp_long")], 0, 2**62)
    assert [s.values.size for s in long] == [2000, 2000]
    assert store.select_last([Matcher("__name__", "=", "imp")], 0, 2**62)[0].timestamps_ms[0] == T_IMPORT
    store.compact()  # the head (live and imported rows) into chunks, as written
    assert len(store.select([Matcher("__name__", "=", "imp")], 0, 2**62)) == SERIES


def test_a_failed_import_leaves_nothing_and_other_samples_are_stored(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = store._writer
    assert writer is not None
    real = sqlrows.insert_columns
    inserts = {"import": 0}

    def failing(cur: duckdb.DuckDBPyConnection, table: str, columns: dict, computed: str = "") -> None:
        if cur is writer._import_cur:
            inserts["import"] += 1
            if inserts["import"] == 5:  # in the third slice
                raise duckdb.IOException("Could not write file: No space left on device")
        real(cur, table, columns, computed)

    monkeypatch.setattr(sqlrows, "insert_columns", failing)
    pause = Pause(store, 1)
    t, errors = in_thread(lambda: store.write_columns(imported()))
    pause.at(1)
    live(store, clock)
    pause.release(1)
    t.join(WAIT_S)
    assert len(errors) == 1 and isinstance(errors[0], StoreError), errors
    assert "No space left" in str(errors[0])
    assert stored_series(store, "imp") == 0
    assert store.select([Matcher("__name__", "=", "imp")], 0, 2**62) == []
    assert store.stats()["write_errors"] == 1 and store.stats()["head_samples"] == 1
    live(store, clock)
    store.flush()
    assert store.select([Matcher("__name__", "=", "live")], 0, 2**62)[0].values.tolist() == [1.0, 1.0]
    monkeypatch.setattr(sqlrows, "insert_columns", real)
    store.write_columns(imported())  # the same again: its series are new, not half known
    assert stored_series(store, "imp") == SERIES
    assert len(store.select([Matcher("__name__", "=", "imp")], 0, 2**62)) == SERIES


def test_an_import_over_the_series_limit_writes_nothing_and_other_samples_flow(
    store: Store, clock: FakeClock
) -> None:
    live(store, clock)
    with pytest.raises(SeriesLimitExceeded, match="max_new_series_per_request"):
        store.write_columns(imported(), SeriesLimits(per_request=SERIES - 1, per_minute=0))
    assert stored_series(store, "imp") == 0
    store.flush()
    assert stored_series(store, "live") == 1
    store.write_columns(imported(), SeriesLimits(per_request=SERIES, per_minute=0))
    assert stored_series(store, "imp") == SERIES


def test_a_label_set_a_live_write_makes_during_an_import_is_one_series(
    store: Store, clock: FakeClock
) -> None:
    pause = Pause(store, 1)
    t, errors = in_thread(lambda: store.write_columns(imported()))
    pause.at(1)  # series 0-9 are in the import's transaction, 10-49 counted as new, not yet written
    store.append(
        Batch(
            clock.now_ms(),
            [Sample("imp", make_labels({"i": "3"}), 103.0), Sample("imp", make_labels({"i": "25"}), 125.0)],
        )
    )
    clock.advance(5)
    pause.release(1)
    t.join(WAIT_S)
    assert not errors
    assert stored_series(store, "imp") == SERIES
    for i in ("3", "25"):
        found = store.select([Matcher("__name__", "=", "imp"), Matcher("i", "=", i)], 0, 2**62)
        assert len(found) == 1
        assert found[0].timestamps_ms.tolist() == [T_IMPORT, NOW_MS]
        assert found[0].values.tolist() == [float(i), 100.0 + float(i)]
    assert len(store.series([Matcher("__name__", "=", "imp")], 0, 2**62)) == SERIES
    ids = store._con.cursor().execute("SELECT DISTINCT series_id FROM head").fetchall()
    assert {r[0] for r in ids} <= set(store._catalog.snapshot().by_id)  # no row under a dropped id
    store.append(Batch(clock.now_ms() + 1000, [Sample("imp", make_labels({"i": "3"}), 7.0)]))
    store.flush()
    assert stored_series(store, "imp") == SERIES


def test_a_live_sample_at_an_imported_time_written_meanwhile_stays_the_newest(
    store: Store, clock: FakeClock
) -> None:
    pause = Pause(store, 1)
    t, errors = in_thread(lambda: store.write_columns(imported()))
    pause.at(1)
    store.append(Batch(T_IMPORT, [Sample("imp", make_labels({"i": "30"}), -1.0)]))  # written later
    clock.advance(5)
    pause.release(1)
    t.join(WAIT_S)
    assert not errors
    one = [Matcher("__name__", "=", "imp"), Matcher("i", "=", "30")]
    assert store.select(one, 0, 2**62)[0].values.tolist() == [-1.0]
    assert store.select_last(one, 0, 2**62)[0].values.tolist() == [-1.0]
    store.compact()
    assert store.select(one, 0, 2**62)[0].values.tolist() == [-1.0]


@pytest.mark.parametrize("job", ["compact", "retention"])
def test_compaction_and_retention_asked_for_during_an_import_wait_for_it(
    store: Store, clock: FakeClock, job: str
) -> None:
    pause = Pause(store, 1)
    t, errors = in_thread(lambda: store.write_columns(imported()))
    pause.at(1)
    if job == "compact":
        c, c_errors = in_thread(store.compact)
    else:  # 30 days of retention from 40 days after the import: every imported sample is older
        c, c_errors = in_thread(lambda: store.apply_retention(T_IMPORT + 40 * 86_400_000))
    pause.release(1)
    t.join(WAIT_S)
    c.join(WAIT_S)
    assert not errors and not c_errors
    if job == "compact":
        assert store.stats()["head_samples"] == 0 and stored_series(store, "imp") == SERIES
    else:  # the import committed, then retention deleted its samples, once its days were in the tiers
        imp = [Matcher("__name__", "=", "imp")]
        assert store.select(imp, 0, 2**62) == []
        day = 86_400_000
        assert len(store.select_tiers(imp, 3_600_000, 0, (T_IMPORT // day + 2) * day)) == SERIES


def test_imports_one_after_another_and_an_empty_one(store: Store) -> None:
    store.write_columns(SeriesColumns([], [], np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0)))
    store.write_columns(imported(name="a"))
    store.write_columns(imported(name="a"))  # known series: nothing new
    store.write_columns(imported(name="b"))
    assert stored_series(store, "a") == SERIES and stored_series(store, "b") == SERIES


def test_an_import_sent_while_another_is_written_waits_its_turn_and_both_commit(store: Store) -> None:
    pause = Pause(store, 1)
    first, errors = in_thread(lambda: store.write_columns(imported(name="a")))
    pause.at(1)
    second, more_errors = in_thread(lambda: store.write_columns(imported(name="b")))
    pause.release(1)
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert not errors and not more_errors
    assert stored_series(store, "a") == SERIES and stored_series(store, "b") == SERIES
    ids = store._con.cursor().execute("SELECT count(DISTINCT series_id) FROM series").fetchone()
    assert ids == (2 * SERIES,)
