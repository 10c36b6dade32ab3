"""The samples appended after a watermark (store/appended.py): every stored sample returned once,
across flushes, compaction, window merges, bulk chunks, retention, reopening and a crash."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import STALE_NAN, Batch, Sample
from gpuwatch.store import Store
from gpuwatch.store.appended import ALL, Watermark
from gpuwatch.store.chunking import WINDOW_MS
from gpuwatch.store.core import DB_FILE

Key = tuple[str, tuple[tuple[str, str], ...], int]
HOUR = 3600 * 1000


def bits(v: float) -> int:
    return int(np.float64(v).view(np.int64))


class Sender:
    """A remote-write sender's view: what it was sent, and its watermark."""

    def __init__(self) -> None:
        self.mark: Watermark | None = None
        self.got: list[tuple[Key, int]] = []

    def pull(self, store: Store, n: int) -> int:
        out = store.appended_since(self.mark, n)
        assert out.samples <= n
        for s in out.series:
            assert np.all(np.diff(s.timestamps_ms) > 0)  # ascending time, once each
            for t, v in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True):
                self.got.append(((s.name, s.labels, t), bits(v)))
        assert self.mark is None or out.watermark >= self.mark
        self.mark = out.watermark
        return out.samples

    def drain(self, store: Store, n: int) -> None:
        for _ in range(100_000):
            if self.mark is not None and self.mark >= store.newest_appended():
                assert store.appended_since(self.mark, n).samples == 0  # and nothing after caught up
                return
            self.pull(store, n)
        raise AssertionError("never caught up")


def stored(store: Store) -> dict[Key, int]:
    return {
        (s.name, s.labels, t): bits(v)
        for s in store.select([], -(2**62), 2**62)
        for t, v in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True)
    }


def check(sender: Sender, store: Store, writes: Counter[Key]) -> None:
    """Every stored sample was sent, its last value sent is the stored one, and a sample was sent
    more than once only where it was written more than once."""
    have = stored(store)
    last = dict(sender.got)
    for key, v in have.items():
        assert last.get(key) == v, key
    for key, times in Counter(k for k, _ in sender.got).items():
        assert times <= writes[key], key


def test_empty_store_and_caught_up(tmp_path: Path) -> None:
    with Store.open(tmp_path, clock=FakeClock()) as s:
        out = s.appended_since(None, 10)
        assert out.samples == 0 and out.watermark >= Watermark(0, ALL)
        s.append(Batch(1000, [Sample("m", (("gpu", "0"),), 1.0), Sample("m", (("gpu", "1"),), STALE_NAN)]))
        s.flush()
        out = s.appended_since(None, 10)
        assert [(x.name, x.labels, x.timestamps_ms.tolist()) for x in out.series] == [
            ("m", (("gpu", "0"),), [1000]),
            ("m", (("gpu", "1"),), [1000]),
        ]
        assert bits(out.series[1].values[0]) == bits(STALE_NAN)  # bit for bit
        assert out.watermark == s.newest_appended()
        assert s.appended_since(out.watermark, 10).samples == 0
        assert s.appended_lag(out.watermark, 5000).samples == 0
        lag = s.appended_lag(None, 5000)
        assert (lag.samples, lag.lag_ms) == (2, 4000)


def test_compaction_mixing_sent_and_new_samples(tmp_path: Path) -> None:
    """A sender a few samples behind when the head is compacted into one chunk per series."""
    with Store.open(tmp_path, clock=FakeClock()) as s:
        sender = Sender()
        writes: Counter[Key] = Counter()
        for k in range(10):
            s.append(Batch(k * 1000, [Sample("m", (("gpu", str(g)),), float(k)) for g in range(3)]))
            writes.update(("m", (("gpu", str(g)),), k * 1000) for g in range(3))
        s.flush()
        sender.pull(s, 14)  # part of the head
        s.compact()
        assert sender.pull(s, 5) == 5  # whole pieces from the mixed chunks, not a sample a call
        sender.drain(s, 5)
        check(sender, s, writes)
        assert len(sender.got) == 30


def test_a_backlog_compacted_over_many_series_comes_in_full_batches(tmp_path: Path) -> None:
    """A node's outage past a compaction: each series' chunk row starts at its own seq of the first
    tick, so the rows' lowest seqs are 1, 2, 3, ...; a batch is still `max_samples` samples, not the
    one sample between a row's lowest seq and the next's (2,000 series took ~2,000 calls a window)."""
    with Store.open(tmp_path, clock=FakeClock()) as s:
        writes: Counter[Key] = Counter()
        for k in range(20):
            s.append(Batch(k * 1000, [Sample("m", (("gpu", str(g)),), float(k)) for g in range(50)]))
            writes.update(("m", (("gpu", str(g)),), k * 1000) for g in range(50))
        s.flush()
        sender = Sender()
        sender.pull(s, 30)  # part of the first tick sent, then the outage's compaction
        s.compact()
        assert [sender.pull(s, 100) for _ in range(3)] == [100, 100, 100]
        sender.drain(s, 100)
        check(sender, s, writes)
        assert len(sender.got) == 1000


def test_bulk_chunk_bigger_than_max_samples_comes_in_pieces(tmp_path: Path) -> None:
    with Store.open(tmp_path, clock=FakeClock()) as s:
        t = np.arange(3000, dtype=np.int64) * 1000
        s.append_series("bulk", (), t, t.astype(np.float64))
        s.flush()
        sender = Sender()
        assert sender.pull(s, 1000) == 1000
        assert sender.mark is not None and sender.mark.t_ms == 999_000
        sender.drain(s, 700)
        assert sorted(k[2] for k, _ in sender.got) == t.tolist()


def test_overwrite_of_a_sent_sample_is_sent_again(tmp_path: Path) -> None:
    with Store.open(tmp_path, clock=FakeClock()) as s:
        s.append(Batch(1000, [Sample("m", (), 1.0)]))
        s.flush()
        sender = Sender()
        sender.drain(s, 10)
        s.append(Batch(1000, [Sample("m", (), 2.0)]))  # the same time again: last write wins
        s.append(Batch(500, [Sample("m", (), 0.5)]))  # and a late sample
        s.flush()
        s.compact()
        sender.drain(s, 10)
        assert sender.got == [
            (("m", (), 1000), bits(1.0)),
            (("m", (), 500), bits(0.5)),
            (("m", (), 1000), bits(2.0)),
        ]


def test_watermark_saved_survives_reopen_and_retention_of_the_newest_seqs(tmp_path: Path) -> None:
    with Store.open(tmp_path, clock=FakeClock(), retention_s=3600) as s:
        s.append(Batch(10 * HOUR, [Sample("new", (), 1.0)]))
        s.flush()
        s.append(Batch(1000, [Sample("old", (), 1.0)]))  # a late sample, the highest seq
        s.flush()
        sender = Sender()
        sender.drain(s, 10)
        assert sender.mark is not None
        s.save_watermark("prom", sender.mark, 123)
        assert s.load_watermark("prom") == sender.mark
        assert s.load_watermark("other") is None
        assert s.apply_retention(10 * HOUR) == 1  # removes the highest seq
    with Store.open(tmp_path, clock=FakeClock(), retention_s=3600) as s:
        mark = s.load_watermark("prom")
        assert mark == sender.mark
        s.append(Batch(10 * HOUR + 1000, [Sample("new", (), 2.0)]))
        s.flush()
        out = s.appended_since(mark, 10)  # numbered past the saved watermark: not invisible
        assert [(x.name, x.timestamps_ms.tolist()) for x in out.series] == [("new", [10 * HOUR + 1000])]


def test_crash_keeps_what_was_flushed_and_no_watermark_points_past_it(tmp_path: Path) -> None:
    live, copy = tmp_path / "live", tmp_path / "copy"
    s = Store.open(live, clock=FakeClock(), flush_interval_s=3600)
    try:
        sender = Sender()
        writes: Counter[Key] = Counter()
        for k in range(20):
            s.append(Batch(k * 1000, [Sample("m", (("gpu", str(g)),), float(k)) for g in range(4)]))
            writes.update(("m", (("gpu", str(g)),), k * 1000) for g in range(4))
            if k == 9:
                s.flush()
                s.compact()
        sender.pull(s, 25)
        s.save_watermark("prom", sender.mark or Watermark(0), 1)
        s.flush()
        mark_before = sender.mark
        s.append(Batch(99_000, [Sample("lost", (), 1.0)]))  # not flushed: lost in the crash
        copy.mkdir()
        for name in (DB_FILE, DB_FILE + ".wal"):  # the files as kill -9 leaves them
            if (live / name).exists():
                shutil.copy(live / name, copy / name)
    finally:
        s.close()
    with Store.open(copy, clock=FakeClock()) as c:
        assert c.load_watermark("prom") == mark_before
        assert mark_before is not None and mark_before <= c.newest_appended()
        sender.mark = c.load_watermark("prom")
        sender.drain(c, 7)
        check(sender, c, writes)
        assert sum(1 for k, _ in sender.got if k[0] == "lost") == 0
        assert len({k for k, _ in sender.got}) == 80


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 5), st.integers(-3, 30), st.booleans()),
        st.tuples(st.just("bulk"), st.integers(0, 2), st.integers(-2000, 3000), st.booleans()),
        st.tuples(st.just("flush")),
        st.tuples(st.just("compact")),
        st.tuples(st.just("reopen")),
        st.tuples(st.just("retention"), st.integers(0, 40)),
        st.tuples(st.just("pull"), st.integers(1, 60)),
    ),
    max_size=25,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS, st.integers(1, 400))
def test_random_writes_are_all_sent_once(tmp_path_factory: object, ops: list[tuple], n: int) -> None:
    data = tmp_path_factory.mktemp("store")  # type: ignore[attr-defined]
    clock = FakeClock()
    step = WINDOW_MS // 8  # samples a few windows apart: compaction leaves several, merges close ones
    s = Store.open(data, clock=clock, retention_s=10 * step / 1000, flush_interval_s=3600)
    sender = Sender()
    writes: Counter[Key] = Counter()
    tick = 0
    try:
        for op in ops:
            kind = op[0]
            if kind == "append":
                _, series, back, stale = op
                t = max(0, tick - back) * step
                tick += 1
                samples = [
                    Sample("m", (("i", str(i)),), STALE_NAN if stale else float(tick))
                    for i in range(series + 1)
                ]
                s.append(Batch(t, samples))
                writes.update(("m", (("i", str(i)),), t) for i in range(series + 1))
            elif kind == "bulk":
                _, sid, start, stale = op
                t = (np.arange(1100, dtype=np.int64) + max(0, start)) * (step // 500)
                v = np.full(t.size, STALE_NAN if stale else float(start))
                s.append_series("bulk", (("b", str(sid)),), t, v)
                writes.update(("bulk", (("b", str(sid)),), x) for x in t.tolist())
            elif kind == "flush":
                s.flush()
            elif kind == "compact":
                s.compact()
            elif kind == "reopen":
                s.close()
                s = Store.open(data, clock=clock, retention_s=10 * step / 1000, flush_interval_s=3600)
            elif kind == "retention":
                s.apply_retention(op[1] * step)
            elif kind == "pull":
                s.flush()
                sender.pull(s, op[1])
        s.flush()
        sender.drain(s, n)
        check(sender, s, writes)
        assert s.appended_lag(sender.mark, 0).samples == 0
    finally:
        s.close()


def test_a_gap_is_read_up_to_its_end_and_kept_with_the_live_watermark_across_reopen(tmp_path: Path) -> None:
    """live_first: the live lane moves past what is stored (one transaction with the gap), the gap is
    read up to its end only, and both survive a reopen."""
    with Store.open(tmp_path, clock=FakeClock()) as s:
        for k in range(5):
            s.append(Batch(k * 1000, [Sample("m", (), float(k))]))
            s.flush()
        first = s.appended_since(None, 2)
        end = s.newest_appended()
        s.save_gap("hub", first.watermark, end, 1, live=end)
        assert s.appended_lag(first.watermark, 0, until=end).samples == 3
        s.append(Batch(9000, [Sample("m", (), 9.0)]))
        s.flush()
    with Store.open(tmp_path, clock=FakeClock()) as s:
        (gap,) = s.load_gaps("hub")
        assert (gap.start, gap.end, s.load_watermark("hub")) == (first.watermark, end, end)
        live = s.appended_since(s.load_watermark("hub"), 10)
        assert [x.timestamps_ms.tolist() for x in live.series] == [[9000]]
        behind = s.appended_since(gap.start, 10, until=gap.end)
        assert [x.timestamps_ms.tolist() for x in behind.series] == [[2000, 3000, 4000]]
        assert behind.watermark == gap.end
        s.save_gap("hub", behind.watermark, gap.end, 2)  # sent: the gap goes
        assert s.load_gaps("hub") == []
