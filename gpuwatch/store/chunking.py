"""Cut one series' samples into encoded chunk rows, one per time window, and merge them back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpuwatch.store.codec import (
    decode_times,
    decode_values,
    encode_times,
    encode_times_rows,
    encode_values,
    encode_values_rows,
)

# Chunks never straddle a window, so merging and retention work window by window. Two hours, as in
# Prometheus: 7,200 samples of a 1 s series, big enough for the encoders to find their runs. Once a
# UTC day is over, its windows are merged into one chunk per series and day (rewrite.py): a year of a
# lab's series is then 2 M chunks rather than 25 M (the index in memory, 36 B a chunk), and the
# encoders find longer runs (bench/README.md, "Bytes"). A closed day's chunks are written once, so they
# are zstd-compressed (`zstd=True`, slower to write, smaller); the 2-hour ones zlib (codec.py).
WINDOW_MS = 2 * 3600 * 1000
DAY_WINDOW_MS = 24 * 3600 * 1000
_BLOCK = 1 << 16  # encode_many encodes at most about this many samples in one numpy pass (memory)


@dataclass(frozen=True)
class ChunkRow:
    """One encoded `chunks` row."""

    series_id: int
    t_min_ms: int
    t_max_ms: int
    n: int
    seq: int
    ts: bytes
    vs: bytes
    last_value: float | None = None  # the value at t_max_ms, where known without decoding (latest.py)
    # Each sample's own write seq (`encode_times` of them, in time order), None where all are `seq`;
    # and the lowest of them (None: `seq`). appended.py reads them: compaction and merges give a row the
    # newest of its samples' seqs, which alone cannot say which samples came after a watermark.
    seqs: bytes | None = None
    seq_lo: int | None = None


def dedupe_last(t_ms: np.ndarray, values: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort by time and keep, for each timestamp, the value with the highest `order` (last write wins)."""
    t_ms, values, _ = dedupe_last_order(t_ms, values, order)
    return t_ms, values


def dedupe_last_order(
    t_ms: np.ndarray, values: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`dedupe_last`, also returning the `order` of each sample kept."""
    if t_ms.size > 1 and not np.all(t_ms[1:] > t_ms[:-1]):
        idx = np.lexsort((order, t_ms))
        t_ms, values, order = t_ms[idx], values[idx], order[idx]
        keep = np.ones(t_ms.size, dtype=bool)
        keep[:-1] = t_ms[1:] != t_ms[:-1]
        t_ms, values, order = t_ms[keep], values[keep], order[keep]
    return t_ms, values, order


def sample_seqs(seq: int, lo: int | None, n: int, blob: bytes | None) -> np.ndarray:
    """The write seq of each of a chunk row's `n` samples (`ChunkRow.seqs`, or `seq` for all)."""
    if blob is None or lo is None:
        return np.full(n, seq, np.int64)
    return decode_times(blob, n)


def _seqs_blob(seq: int, seqs: np.ndarray, zstd: bool = False) -> tuple[bytes | None, int | None]:
    if not seqs.size or bool((seqs == seq).all()):
        return None, None
    return encode_times(seqs, zstd), int(seqs.min())


def encode_series(
    series_id: int,
    t_ms: np.ndarray,
    values: np.ndarray,
    seq: int,
    seqs: np.ndarray | None = None,
    window_ms: int = WINDOW_MS,
    zstd: bool = False,
) -> list[ChunkRow]:
    """Encode sorted, duplicate-free samples of one series into one row per window of `window_ms`;
    `seqs`: each sample's own write seq (at most `seq`), where they differ; `zstd`: compressed with
    zstd rather than zlib (a closed day's chunks)."""
    rows = []
    windows = t_ms // window_ms
    cuts = np.flatnonzero(windows[1:] != windows[:-1]) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, t_ms.size], strict=True):
        t, v = t_ms[lo:hi], values[lo:hi]
        blob, seq_lo = (None, None) if seqs is None else _seqs_blob(seq, seqs[lo:hi], zstd)
        rows.append(
            ChunkRow(
                series_id,
                int(t[0]),
                int(t[-1]),
                int(t.size),
                seq,
                encode_times(t, zstd),
                encode_values(v, zstd),
                float(v[-1]),
                blob,
                seq_lo,
            )
        )
    return rows


def dedupe_sorted(
    ids: np.ndarray, t_ms: np.ndarray, values: np.ndarray, seqs: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Samples of many series sorted by (series, time, seq): keep the last of each (series, time)."""
    if ids.size < 2:
        return ids, t_ms, values, seqs
    keep = np.ones(ids.size, dtype=bool)
    keep[:-1] = (ids[1:] != ids[:-1]) | (t_ms[1:] != t_ms[:-1])
    if keep.all():
        return ids, t_ms, values, seqs
    return ids[keep], t_ms[keep], values[keep], seqs[keep]


def encode_many(
    ids: np.ndarray,
    t_ms: np.ndarray,
    values: np.ndarray,
    seqs: np.ndarray,
    own_seqs: np.ndarray | None = None,
    window_ms: int = WINDOW_MS,
    zstd: bool = False,
) -> list[ChunkRow]:
    """`encode_series` of many series at once, the same rows (windows of `window_ms`, `zstd` or zlib):
    samples sorted by (series, time) without duplicate timestamps; each series' rows get the highest of
    its samples' `seqs`, and keep each sample's own write seq (`own_seqs`, default `seqs`) where they
    differ from the row's.

    Chunks of one length are encoded together as the rows of one array (codec.encode_*_rows), so the
    cost is numpy calls per distinct length plus a compression call per chunk, not Python work per
    series.
    """
    n = ids.size
    if not n:
        return []
    ids = ids.astype(np.int64, copy=False)
    t_ms = t_ms.astype(np.int64, copy=False)
    new_series = ids[1:] != ids[:-1]
    series_starts = np.r_[0, np.flatnonzero(new_series) + 1]
    series_seq = np.maximum.reduceat(seqs.astype(np.int64, copy=False), series_starts)
    windows = t_ms // window_ms
    starts = np.r_[0, np.flatnonzero(new_series | (windows[1:] != windows[:-1])) + 1]
    lens = np.diff(np.r_[starts, n])
    seg_seq = series_seq[np.searchsorted(series_starts, starts, side="right") - 1]
    own = (seqs if own_seqs is None else own_seqs).astype(np.int64, copy=False)
    out: list[ChunkRow | None] = [None] * starts.size
    for length in np.unique(lens).tolist():
        segs_all = np.flatnonzero(lens == length)
        step = max(1, _BLOCK // length)
        for lo in range(0, segs_all.size, step):
            segs = segs_all[lo : lo + step]
            idx = starts[segs][:, None] + np.arange(length)
            t, v, own_block = t_ms[idx], values[idx], own[idx]
            row_seq = seg_seq[segs]
            differ = np.flatnonzero((own_block != row_seq[:, None]).any(axis=1))
            seq_blobs: list[bytes | None] = [None] * segs.size
            seq_los: list[int | None] = [None] * segs.size
            if differ.size:
                lows = own_block[differ].min(axis=1).tolist()
                for k, blob, low in zip(
                    differ.tolist(), encode_times_rows(own_block[differ], zstd), lows, strict=True
                ):
                    seq_blobs[k], seq_los[k] = blob, low
            rows = zip(
                segs.tolist(),
                ids[starts[segs]].tolist(),
                t[:, 0].tolist(),
                t[:, -1].tolist(),
                row_seq.tolist(),
                encode_times_rows(t, zstd),
                encode_values_rows(v, zstd),
                v[:, -1].tolist(),
                seq_blobs,
                seq_los,
                strict=True,
            )
            for seg, sid, t_min, t_max, seq, tb, vb, last, sb, sl in rows:
                out[seg] = ChunkRow(sid, t_min, t_max, length, seq, tb, vb, last, sb, sl)
    return out  # type: ignore[return-value]  # every segment was filled


def decode_row(n: int, ts: bytes, vs: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Decode one chunk's timestamps and values."""
    return decode_times(ts, n), decode_values(vs, n)


def merge_rows(rows: Sequence[tuple[int, int, bytes, bytes]]) -> tuple[np.ndarray, np.ndarray]:
    """Merge chunks given as (seq, n, ts, vs) into one sorted, duplicate-free series."""
    ts, vs, order = [], [], []
    for seq, n, t_blob, v_blob in rows:
        t, v = decode_row(n, t_blob, v_blob)
        ts.append(t)
        vs.append(v)
        order.append(np.full(n, seq, dtype=np.int64))
    return dedupe_last(np.concatenate(ts), np.concatenate(vs), np.concatenate(order))
