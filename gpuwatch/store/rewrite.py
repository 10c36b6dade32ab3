"""How the writer rewrites the chunks table: the head written as chunks, the chunks of closed windows
merged into one per series (and of closed days into one per series and day), retention's deletes and trims, and an import's rows moved to live series ids (writer.py runs them on its
thread and keeps the bookkeeping)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from operator import itemgetter
from typing import Any, NamedTuple

import duckdb
import numpy as np

from gpuwatch.store import sqlrows
from gpuwatch.store.chunking import (
    DAY_WINDOW_MS,
    WINDOW_MS,
    ChunkRow,
    dedupe_sorted,
    encode_many,
    encode_series,
    sample_seqs,
)
from gpuwatch.store.codec import decode_times, decode_values
from gpuwatch.store.decodemany import decode_chunks

MERGE_BLOCK = 1 << 18  # merging closed windows decodes and re-encodes about this many samples at a time
MERGE_BYTES = 8 << 20  # ... and reads about this many bytes of chunks from DuckDB a transaction
MERGE_SERIES = 10_000  # ... of at most this many series
# A day's 2-hour windows become its day chunk once the next day's first window is over too: until
# then the dashboards' hour reaches into it, and a read of its last hour would decode the whole day
# (bench/README.md, "Soak": 792 ms and +93 MiB for 64 series at 1 s, against 57-114 ms and none).
DAY_MERGE_AFTER_MS = WINDOW_MS
# A closed 2-hour window's chunks are merged 75 minutes after it closed, when the dashboards' hour (and
# its 5-minute lookback) no longer reaches into it, and the tier build has long looked at its chunks.
# Merged at the close, (1) the merged chunk carried its newest sample's write seq, not yet looked at,
# and started before the built hour: taken for a late sample, every series' day so far was rebuilt
# from raw at every close (soak j: 3,168 series-days, a 582 MiB peak and DuckDB out of memory at
# 04:00); and (2) each 1-hour chart read and decoded the closed window's whole chunk for the next hour.
WINDOW_MERGE_AFTER_MS = 75 * 60_000


def head_chunks(cur: duckdb.DuckDBPyConnection) -> list[ChunkRow]:
    """The head's samples as chunk rows: sorted, a repeated (series, time)'s newest write kept, less
    those a newer bulk chunk holds."""
    head = cur.execute(
        "SELECT series_id, t_ms, v_bits, seq FROM head ORDER BY series_id, t_ms, seq"
    ).fetchnumpy()
    samples = dedupe_sorted(
        np.asarray(head["series_id"]),
        np.asarray(head["t_ms"]),
        np.asarray(head["v_bits"]).view(np.float64),
        np.asarray(head["seq"]),
    )
    return encode_many(*_without_overwritten(cur, *samples))


def merge_batches(cur: duckdb.DuckDBPyConnection) -> Iterator[Merge]:
    """The batches of series to merge: in the 2-hour windows since the last merged day that closed at
    least `WINDOW_MERGE_AFTER_MS` ago, those where a series has more than one chunk, then, newest day
    first, each UTC day closed at least `DAY_MERGE_AFTER_MS` ago where a series has more than one (its
    windows become one day chunk; a late sample's chunk is merged in again); ~MERGE_BYTES of chunks a
    batch.

    A window's chunks were read whole in one statement: after an hour of 36,000 series (20 vLLM
    targets and 64 GPUs) that is ~50 MB of blobs, past DuckDB's 64 MB cap with the sort, and every
    compaction failed from then on. A batch holds about `MERGE_BYTES` of blobs and commits on its own
    (`merge_series`; a crash between batches leaves the rest for the next compaction)."""
    newest = sqlrows.scalar(cur, "SELECT coalesce(max(t_max_ms), 0) FROM chunks")
    closed = newest // WINDOW_MS * WINDOW_MS  # windows before it are over ...
    days_end = (closed - DAY_MERGE_AFTER_MS) // DAY_WINDOW_MS * DAY_WINDOW_MS  # ... and days before it
    windows_end = (newest - WINDOW_MERGE_AFTER_MS) // WINDOW_MS * WINDOW_MS  # windows merged are before it
    # Grouped by (window, series), which DuckDB can spill to disk: a distinct count of series per
    # window needed more than its 64 MB cap here at ~2 M chunks (5,600 series over 30 days), and
    # compaction then failed at every try.
    for window_ms, lo_ms, hi_ms, order in (
        (WINDOW_MS, days_end, windows_end, "ASC"),
        (DAY_WINDOW_MS, 0, days_end, "DESC"),
    ):
        windows = cur.execute(
            f"SELECT DISTINCT win FROM (SELECT t_min_ms // ? AS win FROM chunks WHERE t_min_ms >= ? "
            f"AND t_min_ms < ? GROUP BY win, series_id HAVING count(*) > 1) ORDER BY win {order}",
            [window_ms, lo_ms, hi_ms],
        ).fetchall()
        for (win,) in windows:
            lo, hi = win * window_ms, (win + 1) * window_ms
            sizes = cur.execute(
                "SELECT series_id, sum(octet_length(ts) + octet_length(vs)) AS bytes FROM chunks "
                "WHERE t_min_ms >= ? AND t_min_ms < ? GROUP BY series_id HAVING count(*) > 1 "
                "ORDER BY series_id",
                [lo, hi],
            ).fetchnumpy()
            for sids, nbytes in _batches(np.asarray(sizes["series_id"]), np.asarray(sizes["bytes"])):
                yield Merge(lo, hi, sids, nbytes)


class Merge(NamedTuple):
    """Merge series `sids`' chunks starting in [lo_ms, hi_ms), a window or a day, into one each
    (`nbytes` of chunks)."""

    lo_ms: int
    hi_ms: int
    sids: list[int]
    nbytes: int

    @property
    def is_day(self) -> bool:
        return self.hi_ms - self.lo_ms == DAY_WINDOW_MS


def merge_series(cur: duckdb.DuckDBPyConnection, lo: int, hi: int, sids: list[int]) -> None:
    """Merge series `sids`' chunks that start in [lo, hi) (a window, or a day) into one per series,
    in one transaction. A day's chunks are written once: zstd-compressed (codec.py)."""
    listed = ",".join(map(str, sids))
    found = cur.execute(
        f"SELECT series_id, seq, n, ts, vs, seqs, seq_lo FROM chunks WHERE t_min_ms >= ? AND t_min_ms < ? "
        f"AND series_id IN ({listed})",
        [lo, hi],
    ).fetchall()
    # By series and write order, sorted here: DuckDB's sort would hold the blobs in its memory.
    found.sort(key=itemgetter(0, 1))
    merged: list[ChunkRow] = []
    start, size = 0, 0
    window_ms = hi - lo
    zstd = window_ms == DAY_WINDOW_MS
    for i, row in enumerate(found):  # decode and re-encode about MERGE_BLOCK samples at a time
        size += row[2]
        if i + 1 == len(found) or (size >= MERGE_BLOCK and found[i + 1][0] != row[0]):
            merged.extend(merge_block(found[start : i + 1], window_ms, zstd))
            start, size = i + 1, 0
    cur.execute("BEGIN TRANSACTION")
    try:
        cur.execute(
            f"DELETE FROM chunks WHERE t_min_ms >= ? AND t_min_ms < ? AND series_id IN ({listed})", [lo, hi]
        )
        sqlrows.insert_chunks(cur, merged)
        cur.execute("COMMIT")
    except BaseException:
        sqlrows.rollback(cur)
        raise


def _without_overwritten(
    cur: duckdb.DuckDBPyConnection, ids: np.ndarray, t_ms: np.ndarray, values: np.ndarray, seqs: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The head samples (sorted by series and time) less those a bulk chunk written after them holds
    the same (series, time) of. A chunk carries one seq, the newest of its samples: a head row that an
    import overwrote would otherwise come back as the newer write once compacted into a chunk."""
    if not ids.size:
        return ids, t_ms, values, seqs
    # Only bulk chunks are newer than the head (at most 4,096 and an import's since the last
    # compaction), so they are read whole and matched here: `series_id IN (SELECT DISTINCT series_id
    # FROM head)` hashed 2 M ids past DuckDB's 64 MB cap, and compaction failed at every try.
    newer = cur.execute(
        "SELECT series_id, seq, n, ts, vs FROM chunks WHERE seq > ?", [int(seqs.min())]
    ).fetchall()
    if newer:
        in_head = np.isin(np.array([r[0] for r in newer], np.int64), ids).tolist()
        newer = [r for r, keep in zip(newer, in_head, strict=True) if keep]
    if not newer:
        return ids, t_ms, values, seqs
    ns = np.array([r[2] for r in newer], np.int64)
    chunk_t, _ = decode_chunks(ns, [r[3] for r in newer], [r[4] for r in newer])
    all_ids = np.concatenate([ids.astype(np.int64), np.repeat(np.array([r[0] for r in newer], np.int64), ns)])
    all_t = np.concatenate([t_ms.astype(np.int64), chunk_t])
    all_seq = np.concatenate(
        [seqs.astype(np.int64), np.repeat(np.array([r[1] for r in newer], np.int64), ns)]
    )
    order = np.lexsort((all_seq, all_t, all_ids))
    s_ids, s_t = all_ids[order], all_t[order]
    last = np.ones(order.size, bool)  # the newest write of each (series, time)
    last[:-1] = (s_ids[1:] != s_ids[:-1]) | (s_t[1:] != s_t[:-1])
    winners = order[last]
    keep = np.sort(winners[winners < ids.size])
    if keep.size == ids.size:
        return ids, t_ms, values, seqs
    return ids[keep], t_ms[keep], values[keep], seqs[keep]


def move_series(cur: duckdb.DuckDBPyConnection, moved: dict[int, int]) -> None:
    """In an import's transaction: its rows of series `moved` (its id -> a live one) to the live ids."""
    cur.register(
        "gpuwatch_moved",
        {
            "mine": np.fromiter(moved, np.int32, len(moved)),
            "live": np.fromiter(moved.values(), np.int32, len(moved)),
        },
    )
    try:
        for table in ("head", "chunks"):
            cur.execute(
                f"UPDATE {table} SET series_id = m.live FROM gpuwatch_moved m WHERE {table}.series_id = m.mine"
            )
        cur.execute("DELETE FROM series WHERE series_id IN (SELECT mine FROM gpuwatch_moved)")
    finally:
        with contextlib.suppress(duckdb.Error):
            cur.unregister("gpuwatch_moved")


def merge_block(
    found: list[tuple[Any, ...]], window_ms: int = WINDOW_MS, zstd: bool = False
) -> list[ChunkRow]:
    """Merge the chunks (series_id, seq, n, ts, vs, seqs, seq_lo) of whole series into one row per
    series and window of `window_ms` (`zstd`: compressed so, else zlib). The newest row wins a
    repeated timestamp (as reads decide it); each sample keeps its own write seq (appended.py)."""
    ns = np.array([r[2] for r in found], np.int64)
    t, v = decode_chunks(ns, [r[3] for r in found], [r[4] for r in found])
    ids = np.repeat(np.array([r[0] for r in found], np.int64), ns)
    seqs = np.repeat(np.array([r[1] for r in found], np.int64), ns)
    own = np.concatenate([sample_seqs(r[1], r[6], r[2], r[5]) for r in found])
    order = np.lexsort((seqs, t, ids))
    ids, t, v, seqs, own = ids[order], t[order], v[order], seqs[order], own[order]
    if ids.size > 1:
        keep = np.ones(ids.size, dtype=bool)
        keep[:-1] = (ids[1:] != ids[:-1]) | (t[1:] != t[:-1])
        if not keep.all():
            ids, t, v, seqs, own = ids[keep], t[keep], v[keep], seqs[keep], own[keep]
    return encode_many(ids, t, v, seqs, own, window_ms, zstd)


def _batches(sids: np.ndarray, nbytes: np.ndarray) -> Iterator[tuple[list[int], int]]:
    """Runs of `sids` whose `nbytes` add up to about MERGE_BYTES (at least one series each), with
    their bytes."""
    start, total = 0, 0
    for i, n in enumerate(nbytes.tolist()):
        if i > start and (total + n > MERGE_BYTES or i - start >= MERGE_SERIES):
            yield sids[start:i].tolist(), total
            start, total = i, 0
        total += n
    if start < sids.size:
        yield sids[start:].tolist(), total


def delete_before(
    cur: duckdb.DuckDBPyConnection, cutoff_ms: int, top_seq: int = 0
) -> tuple[int, int, list[int]]:
    """Delete samples before `cutoff_ms` (trimming chunks that straddle it) and series left without
    samples or tier points, in one transaction; return (chunk samples deleted, head rows deleted, series ids deleted).
    `top_seq`, the highest seq given out, is kept in `seq_floor`: a deleted sample may have had it, and
    a watermark may point at it (appended.py)."""
    cur.execute("BEGIN TRANSACTION")
    try:
        cur.execute("DELETE FROM seq_floor")
        cur.execute("INSERT INTO seq_floor VALUES (?)", [top_seq])
        deleted = sqlrows.scalar(
            cur, "SELECT coalesce(sum(n), 0) FROM chunks WHERE t_max_ms < ?", [cutoff_ms]
        )
        cur.execute("DELETE FROM chunks WHERE t_max_ms < ?", [cutoff_ms])
        trimmed = []
        straddling = cur.execute(
            "SELECT series_id, seq, n, ts, vs, seqs, seq_lo FROM chunks WHERE t_min_ms < ?", [cutoff_ms]
        ).fetchall()
        for sid, seq, n, ts, vs, seqs, seq_lo in straddling:
            t, v = decode_times(ts, n), decode_values(vs, n)
            keep = t >= cutoff_ms
            deleted += n - int(keep.sum())
            own = None if seqs is None else sample_seqs(seq, seq_lo, n, seqs)[keep]
            # A day's window: the part kept stays one chunk, whatever window it was written in; written
            # once, so zstd-compressed as a day's chunk.
            trimmed.extend(encode_series(sid, t[keep], v[keep], seq, own, DAY_WINDOW_MS, zstd=True))
        cur.execute("DELETE FROM chunks WHERE t_min_ms < ?", [cutoff_ms])
        sqlrows.insert_chunks(cur, trimmed)
        head_old = sqlrows.scalar(cur, "SELECT count(*) FROM head WHERE t_ms < ?", [cutoff_ms])
        cur.execute("DELETE FROM head WHERE t_ms < ?", [cutoff_ms])
        orphans = [
            r[0]
            for r in cur.execute(
                "SELECT series_id FROM series WHERE series_id NOT IN (SELECT series_id FROM chunks) "
                "AND series_id NOT IN (SELECT series_id FROM head) "
                "AND series_id NOT IN (SELECT series_id FROM tier_1m) "
                "AND series_id NOT IN (SELECT series_id FROM tier_1h)"
            ).fetchall()
        ]
        if orphans:
            cur.execute(f"DELETE FROM series WHERE series_id IN ({','.join(map(str, orphans))})")
        cur.execute("COMMIT")
    except BaseException:
        sqlrows.rollback(cur)
        raise
    return deleted, head_old, orphans
