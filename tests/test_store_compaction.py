"""Compaction: the head written as chunks, closed windows merged (a batch of series at a time), and
both within DuckDB's memory cap while readers read (store/rewrite.py, store/readgate.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import StoreError
from gpuwatch.core.model import Batch, Matcher, Sample, make_labels
from gpuwatch.store import Store
from gpuwatch.store.chunking import ChunkRow
from tests.test_store import ALL, NAME, bits, fill


@pytest.fixture
def store() -> Iterator[Store]:
    s = Store.open(None, clock=FakeClock())
    yield s
    s.close()


@pytest.mark.parametrize("merge_block", [1 << 20, 100])  # 100: windows merged a few series at a time
def test_compaction_keeps_data_identical_and_merges_windows(
    store: Store, merge_block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpuwatch.store.rewrite.MERGE_BLOCK", merge_block)
    hour = 3600 * 1000
    names = ["a", "b"]
    for k in range(6):  # six compactions spread over 5 h: several chunks per 2 h window, then merged
        fill(store, names, gpus=3, ticks=60, t0=k * hour, step=1000)
        before = store.select([], *ALL)
        store.compact()
        after = store.select([], *ALL)
        assert [(s.name, s.labels, s.timestamps_ms.tolist(), bits(s.values)) for s in before] == [
            (s.name, s.labels, s.timestamps_ms.tolist(), bits(s.values)) for s in after
        ]
    st_ = store.stats()
    assert st_["head_samples"] == 0 and st_["samples"] == 6 * 60 * 6
    # window 0-2 h is merged into one chunk per series; 2-4 h closed under 75 minutes ago (the newest
    # sample is at 5:00:59: rewrite.WINDOW_MERGE_AFTER_MS) and keeps its two, as 4-6 h, still open
    assert st_["chunks"] == 6 * (1 + 2 + 2)


def test_a_closed_window_merges_in_batches_and_a_failed_batch_leaves_the_rest_for_later(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A closed window's chunks were merged in one statement and one transaction: after an hour of
    # 36,000 series that passed DuckDB's 64 MB, and every compaction failed from then on (the soak).
    # Now a batch of series at a time (here one series each), and the head moves into chunks first.
    from gpuwatch.store import rewrite

    monkeypatch.setattr(rewrite, "MERGE_BYTES", 1)
    hour = 3600 * 1000
    for k in range(2):  # two chunks per series in the window 0-2 h
        fill(store, ["a"], gpus=4, ticks=60, t0=k * hour, step=1000)
        store.compact()
    before = store.select([], *ALL)
    calls: list[int] = []
    merge_block = rewrite.merge_block

    def failing_second(
        found: list[tuple[int, int, int, bytes, bytes]], window_ms: int, zstd: bool = False
    ) -> list[ChunkRow]:
        calls.append(found[0][0])
        if len(calls) == 2:
            raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")
        return merge_block(found, window_ms, zstd)

    monkeypatch.setattr(rewrite, "merge_block", failing_second)
    # the window 0-2 h closed 75 minutes ago (rewrite.WINDOW_MERGE_AFTER_MS)
    fill(store, ["a"], gpus=4, ticks=1, t0=2 * hour + 75 * 60_000, step=1000)
    with pytest.raises(StoreError, match="Out of Memory"):
        store.compact()
    assert store.stats()["head_samples"] == 0  # the head was written as chunks all the same
    assert store.stats()["chunks"] == 1 + 2 + 2 + 2 + 4  # one series merged, three left, the new window
    monkeypatch.setattr(rewrite, "merge_block", merge_block)
    store.compact()  # the next compaction merges the rest
    assert store.stats()["chunks"] == 4 + 4
    after = [s for s in store.select([], *ALL)]
    assert [(s.labels, s.timestamps_ms.tolist()[:120], bits(s.values)[:120]) for s in after] == [
        (s.labels, s.timestamps_ms.tolist(), bits(s.values)) for s in before
    ]


def test_a_merge_that_fails_at_close_loses_nothing_and_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpuwatch.store import rewrite

    hour = 3600 * 1000
    store = Store.open(tmp_path, clock=FakeClock(10_000), flush_interval_s=3600)
    for k in range(2):
        fill(store, ["a"], gpus=2, ticks=60, t0=k * hour, step=1000)
        store.compact()

    def failing(
        found: list[tuple[int, int, int, bytes, bytes]], window_ms: int, zstd: bool = False
    ) -> list[ChunkRow]:
        raise duckdb.OutOfMemoryException("Out of Memory Error: could not allocate block")

    monkeypatch.setattr(rewrite, "merge_block", failing)
    fill(store, ["a"], gpus=2, ticks=1, t0=2 * hour, step=1000)
    store.close()  # was "the last 0 samples could not be written before exit", and exit 1
    monkeypatch.undo()
    with Store.open(tmp_path, clock=FakeClock(10_000)) as again:
        assert again.stats()["samples"] == 2 * 121


def test_many_readers_during_a_compaction_all_answer_within_duckdbs_memory_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 web workers reading 700 series each while the writer compacts a head of 243,000 rows, under a
    # 24 MB cap (the real one is 64 MB with ~1 M head rows): reads and the compaction used to fail with
    # "Out of Memory" (bench/README.md, "Soak"); now read statements take turns and wait for the
    # compaction. (At 16 MB a read right after the compaction failed now and then, on a loaded VM.)
    from gpuwatch.store import core

    monkeypatch.setattr(core, "MEMORY_LIMIT_MB", 24)
    names = [f"m{i}" for i in range(38)]
    labels = [make_labels({"Hostname": f"n{g // 8}", "gpu": str(g)}) for g in range(64)]
    ticks = 100
    store = Store.open(tmp_path, clock=FakeClock(1_800_000), flush_interval_s=3600, compact_rows=10**9)
    for k in range(ticks):
        store.append(Batch(k * 1000, [Sample(n, lab, float(k)) for n in names for lab in labels]))
    store.flush()
    compacted = threading.Event()
    errors: list[BaseException] = []
    reads_after = [0] * 8
    started = threading.Barrier(9)

    def reader(k: int) -> None:
        started.wait()
        while reads_after[k] < 2:
            try:
                got = store.select([Matcher(NAME, "=~", "m1.*")], 0, ticks * 1000)
                assert len(got) == 11 * 64 and all(x.timestamps_ms.size == ticks for x in got)
            except BaseException as exc:  # noqa: BLE001 - reported to the main thread below
                errors.append(exc)
                return
            if compacted.is_set():
                reads_after[k] += 1

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    started.wait()
    store.compact()
    compacted.set()
    for th in threads:
        th.join()
    assert errors == []
    assert store.stats()["write_errors"] == 0 and store.stats()["chunks"] == 38 * 64
    store.close()


def test_compaction_of_a_store_with_many_chunks_stays_within_duckdbs_memory_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 504,000 chunks (1,400 series x 360 closed days) under a 16 MB cap. Finding the windows to merge
    # with a distinct count per window needed more than the cap (at the real 64 MB: ~2 M chunks, a month of
    # 5,600 series of 2-hour chunks) and compaction failed at every try; the windows that do need merging
    # still merge.
    from gpuwatch.store import core
    from gpuwatch.store.chunking import DAY_WINDOW_MS, WINDOW_MS

    monkeypatch.setattr(core, "MEMORY_LIMIT_MB", 16)
    w0 = 1_793_491_200_000 // DAY_WINDOW_MS * DAY_WINDOW_MS + 4 * WINDOW_MS  # today, 08:00
    clock = FakeClock(w0 / 1000 + 3 * 7200)
    Store.open(tmp_path, clock=clock).close()
    con = duckdb.connect(str(tmp_path / core.DB_FILE))
    con.execute(
        "INSERT INTO chunks (series_id, t_min_ms, t_max_ms, n, seq, ts, vs, h) "
        "SELECT (1000 + i // 360)::INTEGER, ? + (i % 360) * ?, ? + (i % 360) * ? + 1000, 1, i, "
        "'\\x00'::BLOB, '\\x00'::BLOB, 0 FROM range(504000) t(i)",
        [w0 - 361 * DAY_WINDOW_MS, DAY_WINDOW_MS, w0 - 361 * DAY_WINDOW_MS, DAY_WINDOW_MS],
    )
    con.close()
    with Store.open(tmp_path, clock=clock, flush_interval_s=3600) as store:
        labels = make_labels({"gpu": "0"})
        t = np.arange(w0, w0 + 2 * WINDOW_MS, 60_000, dtype=np.int64)
        for part in (t[::2], t[1::2]):  # compacted twice: two chunks in each of two windows, then one
            store.append_series("temp", labels, part, part / 1e3)
            store.compact()
        (sd,) = store.select([Matcher("__name__", "=", "temp")], w0, w0 + 2 * WINDOW_MS)
        assert sd.timestamps_ms.tolist() == t.tolist() and sd.values.tolist() == (t / 1e3).tolist()
        assert store.stats()["chunks"] == 504_000 + 1 + 2  # the others', temp's closed window and open one


def test_a_compaction_lets_go_of_the_heads_rows(tmp_path: Path) -> None:
    # DuckDB keeps deleted rows (in its memory, spilling past its cap) and the WAL that wrote them
    # until a checkpoint, which its 256 MB threshold brought only every ~30 minutes on a 64-GPU node:
    # a kill then left up to ~25 minutes of WAL to replay at the next open. Compaction checkpoints.
    store = Store.open(str(tmp_path), clock=FakeClock())
    try:
        fill(store, ["a"], gpus=500, ticks=600)
        held = store.duckdb_memory_bytes()
        assert held is not None and held > 4 << 20  # 300,000 rows in the head
        store.compact()
        after = store.duckdb_memory_bytes()
        assert after is not None and after < held / 2
        assert sum(f.stat().st_size for f in tmp_path.glob("*.wal")) == 0
    finally:
        store.close()
