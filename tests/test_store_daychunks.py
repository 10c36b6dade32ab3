"""Day chunks: once a UTC day is over its 2-hour chunks become one chunk per series and day, with
every sample, each sample's write seq and every answer kept; late samples are merged in again,
retention by age cuts a day chunk, and a store of 2-hour chunks is merged in the background
(store/rewrite.py, store/writer.py). A closed day's chunks are zstd-compressed, the 2-hour ones zlib
(store/codec.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Matcher, Sample, stable_labels
from gpuwatch.core.tiers import HOUR_MS, MINUTE_MS
from gpuwatch.query import Engine
from gpuwatch.store import Store, codec, sqlrows
from gpuwatch.store.chunkindex import ChunkIndex
from gpuwatch.store.chunking import WINDOW_MS, encode_many
from gpuwatch.store.staged import labels_json
from tests.test_store_tiers import DAYS, NOW, T0, UTIL, RawOnly, fill, rows

DAY = 86_400_000
ALL = (0, 2**62)
UTIL_LABELS = stable_labels({"gpu": "0"})
ZLIB, ZSTD = {1, 2, 4, 8}, {17, 18, 20, 24}  # the width bytes of packed parts (width + 0x10: zstd)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW / 1000)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    s = Store.open(tmp_path / "data", clock=clock)
    yield s
    s.close()


def chunks_per_day(store: Store) -> dict[tuple[int, int], int]:
    """{(series id, day): chunks starting in it}, of the days before the newest sample's (closed)."""
    found = (
        store._cursor()
        .execute(
            f"SELECT series_id, t_min_ms // {DAY} AS d, count(*) FROM chunks "
            f"WHERE d < (SELECT max(t_max_ms) // {DAY} FROM chunks) GROUP BY ALL"
        )
        .fetchall()
    )
    return {(int(s), int(d)): int(n) for s, d, n in found}


def samples(store: Store, matchers: list[Matcher] = UTIL) -> list[tuple[object, list[int], list[int]]]:
    return [
        (s.labels, s.timestamps_ms.tolist(), s.values.view(np.int64).tolist())
        for s in store.select(matchers, *ALL)
    ]


def packed_heads(store: Store, lo_ms: int = 0, hi_ms: int = 2**62) -> dict[str, set[int]]:
    """The width bytes of the packed parts of chunks starting in [lo_ms, hi_ms) (timestamps in the
    regular form, which have none, left out), of closed days' chunks and of the newest day's."""
    found = (
        store._cursor()
        .execute(
            f"SELECT t_min_ms // {DAY} = (SELECT max(t_max_ms) // {DAY} FROM chunks), ts, vs, seqs "
            "FROM chunks WHERE t_min_ms >= ? AND t_min_ms < ?",
            [lo_ms, hi_ms],
        )
        .fetchall()
    )
    out: dict[str, set[int]] = {"closed": set(), "today": set()}
    for today, ts, vs, seqs in found:
        heads = out["today" if today else "closed"]
        n_bad = codec._HEADER.unpack_from(vs)[3]
        heads.add(vs[codec._HEADER.size + 12 * n_bad])
        heads.update(b[0] for b in (ts, seqs) if b is not None and b[0] != 0)
    return out


def test_a_closed_day_ends_in_one_chunk_a_series_with_every_sample(store: Store) -> None:
    fill(store)  # 6 days of 15 s samples in 2-hour chunks, then compacted
    got = chunks_per_day(store)
    assert set(got.values()) == {1}  # every closed day: one chunk each
    assert len(got) == 6 * (DAYS - 1)  # 3 GPUs x 2 series x 5 days (the 6th holds the newest sample)
    engine = Engine(store)
    for q in ("max_over_time(util[1h])", "rate(energy[5m])", "count_over_time(util[1d])"):
        want = rows(Engine(RawOnly(store)).range(q, T0 + HOUR_MS, T0 + DAYS * DAY, HOUR_MS))
        assert rows(engine.range(q, T0 + HOUR_MS, T0 + DAYS * DAY, HOUR_MS)) == want


def test_a_day_stays_in_2_hour_chunks_until_the_next_day_s_first_window_is_over(store: Store) -> None:
    """Until 02:00 the dashboards' hour reaches into yesterday: it reads yesterday's last 2-hour chunk,
    not its whole day (a day chunk of a 1-s series is 86,400 samples decoded for an hour's 3,600)."""
    engine = Engine(store)

    def write(lo: int, hi: int) -> None:
        t = np.arange(lo, hi, 15_000, dtype=np.int64)
        store.append_series("util", UTIL_LABELS, t, (t // 15_000 % 97).astype(np.float64))
        store.flush()
        store.compact()

    write(T0, T0 + DAY + 30 * 60_000)  # a day and the next 30 minutes
    assert chunks_per_day(store) == {(1, T0 // DAY): 12}  # its twelve 2-hour windows, one chunk each
    q = "max_over_time(util[5m])"
    hour = (T0 + DAY - 30 * 60_000, T0 + DAY + 29 * 60_000, 60_000)  # before the next write
    want = rows(Engine(RawOnly(store)).range(q, *hour))
    assert rows(engine.range(q, *hour)) == want and want
    write(T0 + DAY + 30 * 60_000, T0 + DAY + 2 * HOUR_MS + 60_000)  # the next day's first window over
    assert chunks_per_day(store) == {(1, T0 // DAY): 1}
    assert rows(engine.range(q, *hour)) == want


def test_closed_days_are_zstd_and_read_back_every_sample(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    both = [Matcher("__name__", "=~", "util|energy")]
    with Store.open(tmp_path / "merged", clock=clock) as s:
        fill(s)  # gaps, NaN, a staleness marker, counter resets
        assert set(chunks_per_day(s).values()) == {1}
        got, heads = samples(s, both), packed_heads(s)
    monkeypatch.setattr("gpuwatch.store.rewrite.merge_batches", lambda cur: iter(()))  # merges nothing
    with Store.open(tmp_path / "raw", clock=clock) as s:
        fill(s)  # the same samples, left in the 2-hour chunks they were written in
        assert set(chunks_per_day(s).values()) == {12}
        want, raw_heads = samples(s, both), packed_heads(s)
    assert len(want) == 6 and sum(len(t) for _, t, _ in want) > 6 * 30_000
    assert got == want  # bit for bit, NaN payloads included
    assert heads == {"closed": ZSTD & heads["closed"], "today": ZLIB & heads["today"]}
    assert heads["closed"] and heads["today"]
    assert (raw_heads["closed"] | raw_heads["today"]) <= ZLIB


def test_every_sample_keeps_its_write_seq_through_the_day_merge(store: Store) -> None:
    fill(store)
    stored = sum(len(t) for _, t, _ in samples(store))
    assert stored > 3 * 30_000
    assert store.appended_since(None, 10**7).samples == 2 * stored  # util and energy: all of them


def test_a_late_sample_into_a_closed_day_is_merged_in_and_sent(store: Store) -> None:
    fill(store)
    store.build_tiers()
    mark = store.newest_appended()
    late = T0 + DAY + 3 * HOUR_MS + 1
    store.append(Batch(late, [Sample("util", (("gpu", "0"),), 42.0)]))
    store.flush()
    store.compact()
    assert set(chunks_per_day(store).values()) == {1}  # day 1 merged again
    (s0, *_) = store.select(UTIL, late, late)
    assert s0.timestamps_ms.tolist() == [late] and s0.values.tolist() == [42.0]
    out = store.appended_since(mark, 100)  # the sender gets the late sample and nothing else
    assert [(a.timestamps_ms.tolist(), a.values.tolist()) for a in out.series] == [([late], [42.0])]
    store.build_tiers()
    q = "count_over_time(util[1d])"
    want = rows(Engine(RawOnly(store)).range(q, T0 + DAY, T0 + 3 * DAY, HOUR_MS))
    assert rows(Engine(store).range(q, T0 + DAY, T0 + 3 * DAY, HOUR_MS)) == want


def test_retention_cuts_a_day_chunk_at_its_minute(tmp_path: Path, clock: FakeClock) -> None:
    with Store.open(tmp_path / "d", clock=clock, retention_s=(DAYS - 2) * 86400 + 3 * 3600) as s:
        fill(s)
        before = samples(s)
        now = clock.now_ms()
        cutoff = (now - ((DAYS - 2) * DAY + 3 * HOUR_MS)) // MINUTE_MS * MINUTE_MS  # 21:00 of day 2
        assert cutoff % DAY != 0
        deleted = s.apply_retention(now)
        after = samples(s)
        assert deleted == 2 * sum(sum(1 for t in ts if t < cutoff) for _, ts, _ in before)
        for (lab, ts, vs), (lab2, ts2, vs2) in zip(before, after, strict=True):
            keep = [i for i, t in enumerate(ts) if t >= cutoff]
            assert lab == lab2 and ts2 == [ts[i] for i in keep] and vs2 == [vs[i] for i in keep]
        assert set(chunks_per_day(s).values()) == {1}  # the cut day is still one chunk
        cut = packed_heads(s, cutoff, cutoff // DAY * DAY + DAY)  # the cut day chunks, written again
        assert cut["closed"] and cut["closed"] <= ZSTD


def test_a_store_of_2_hour_chunks_is_merged_in_the_background(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    Store.open(tmp_path / "d", clock=clock).close()
    # What the release before day chunks left: a 2-hour chunk a series and window, closed days too.
    t = T0 + 7 + np.arange(0, DAYS * DAY, 15_000, dtype=np.int64)
    ids = np.repeat(np.arange(1, 4, dtype=np.int64), t.size)
    tt = np.tile(t, 3)
    vv = np.round(np.sin(tt / 1e7) * 50 + 50, 1)
    old = encode_many(ids, tt, vv, np.arange(1, tt.size + 1, dtype=np.int64), None, WINDOW_MS)
    con = duckdb.connect(str(tmp_path / "d" / "gpuwatch.duckdb"))
    for k, text in enumerate(labels_json([(("gpu", str(g)),) for g in range(3)]), 1):
        con.execute("INSERT INTO series VALUES (?, 'util', ?)", [k, text])
    sqlrows.insert_chunks(con.cursor(), old)
    con.close()
    monkeypatch.setattr("gpuwatch.store.writer.DAY_MERGE_BYTES", 1)  # a batch (a day here) a step
    with Store.open(tmp_path / "d", clock=clock) as s:
        assert s.stats()["chunks"] == 3 * 12 * DAYS
        got = samples(s)
        writer = s._writer
        assert writer is not None and writer.is_merging_days
        steps = 0
        while writer.is_merging_days:
            s._ask(writer.merge_days)
            steps += 1
        # A closed day a step; the newest sample's day stays in 2-hour chunks until it is over.
        assert steps == DAYS - 1 and s.stats()["chunks"] == 3 * (DAYS - 1) + 3 * 12
        assert samples(s) == got
        heads = packed_heads(s)  # the days merged are zstd, the newest day's 2-hour chunks still zlib
        assert heads["closed"] and heads["closed"] <= ZSTD and heads["today"] and heads["today"] <= ZLIB
        assert [(v.timestamps_ms.tolist(), v.values.tolist()) for v in s.select(UTIL, *ALL)] == [
            (t.tolist(), vv[k * t.size : (k + 1) * t.size].tolist()) for k in range(3)
        ]
        seqs = s.appended_since(None, 10**7)
        assert seqs.samples == tt.size  # every sample kept its own write seq


def test_a_year_of_a_lab_is_a_small_index() -> None:
    # 5,600 series x 365 closed days: a chunk a series and day (and today's 2-hour windows).
    series, days = 5_600, 365
    per_series = days + 12
    sid = np.repeat(np.arange(series, dtype=np.int64), per_series)
    k = np.tile(np.arange(per_series, dtype=np.int64), series)
    t_min = np.where(k < days, k * DAY, days * DAY + (k - days) * WINDOW_MS)
    index = ChunkIndex(
        {"series_id": sid, "t_min_ms": t_min, "t_max_ms": t_min + 1, "n": k, "seq": k, "h": k}, 1
    )
    assert index.size == series * per_series == 2_111_200
    assert index.nbytes < 80 * 2**20  # 2-hour chunks: 24.6 M entries, 845 MiB
