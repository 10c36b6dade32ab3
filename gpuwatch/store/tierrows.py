"""Tier points in the `tier_1m` and `tier_1h` tables: one row per series, resolution and period, its points
encoded as narrowed integer and decimal columns under zstd (`encode_points`).

A 1-minute row holds one UTC day of a series (1,440 points at most), a 1-hour row 30 days (720): a
90-day panel at a step of an hour reads three or four rows a series, and the index of a year of 5,600
series stays small. A row's `seq` is the store's newest write seq when it was built: a chunk written
later for its day holds a sample the row lacks (`tierbuild.py` rebuilds it). A read decodes only the
columns its query's function reads (`columns=`, query/tiered.py): a 7-day panel's `avg_over_time` the
ends, counts and sums of each row, about half the whole row's time (bench/README.md, "Tiers").
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Collection, Sequence

import cramjam
import duckdb
import numpy as np

from gpuwatch.core.tiers import COLUMNS, HOUR_MS, MINUTE_MS, TierPoints, concat, cut, partial, take
from gpuwatch.store.codec import column_end, pack_float_column, pack_int_column, unpack_column

DAY_MS = 86_400_000
PERIOD_MS = {MINUTE_MS: DAY_MS, HOUR_MS: 30 * DAY_MS}  # what one row of each resolution covers
TABLE = {MINUTE_MS: "tier_1m", HOUR_MS: "tier_1h"}
READ_BYTES = 4 << 20
_FLOATS = 6  # sum, min, max, first_v, last_v, correction
_LEVEL = 3
_COLUMNS = b"\x01"  # a row's first byte in the column form (a zstd frame, the form before, starts 0x28)


def encode_points(p: TierPoints, *, narrow: bool = True) -> bytes:
    """Encode one series' points (at least one) into a row's blob: a version byte, then columns
    (`codec.pack_*_column`: bucket ends, counts and the first and last samples' offsets into their
    bucket as narrowed integers; the six float columns as decimals where they are, else their bits;
    the staleness flags as bits), zstd-compressed as one. One decompression and a few numpy passes a
    column decode it: a 90-day panel reads thousands of rows.

    `narrow=False`: fixed-width columns (`_encode_fixed`), 1.5x the bytes and half the time to decode;
    the 1-hour rows' form, which year panels read by the thousand and which cost ~1/25 of the
    1-minute rows' bytes (bench/README.md, "Bytes" and "Tiers")."""
    if not narrow:
        return _encode_fixed(p)
    end = p.end_ms
    body = b"".join(
        [
            pack_int_column(end),
            pack_int_column(p.n),
            pack_int_column(end - p.first_t),
            pack_int_column(end - p.last_t),
            *(pack_float_column(c) for c in (p.sum, p.min, p.max, p.first_v, p.last_v, p.correction)),
            np.packbits(p.stale_after).tobytes(),
        ]
    )
    return _COLUMNS + bytes(cramjam.zstd.compress(body, _LEVEL))


# A row's columns in their order (`encode_points`), by the TierPoints column each is read for: the
# first and last samples' times are their offsets before the bucket's end.
_ROW = ("end_ms", "n", "first_t", "last_t", "sum", "min", "max", "first_v", "last_v", "correction")
_FIXED_FLOATS = ("sum", "min", "max", "first_v", "last_v", "correction")  # `_encode_fixed`'s order


@functools.lru_cache(maxsize=64)
def _plan(columns: frozenset[str] | None) -> tuple[frozenset[str], int]:
    """The columns to decode for `columns` (None: all; `end_ms` always, unknown names refused), and
    how many of a row's columns to go through for them."""
    if columns is None:
        columns = frozenset(COLUMNS)
    unknown = columns - set(COLUMNS)
    if unknown:
        raise ValueError(f"no tier point columns {sorted(unknown)}")
    want = columns | {"end_ms"}
    last = len(_ROW) if "stale_after" in want else max(_ROW.index(c) for c in want if c in _ROW) + 1
    return want, last


def decode_points(blob: bytes | memoryview, n: int, columns: Collection[str] | None = None) -> TierPoints:
    """Decode the `n` points of a row written by `encode_points` (or by the release before it); with
    `columns` (names of TierPoints' columns), only those and `end_ms`, the others None: a column not
    asked for is stepped over by its header (`codec.column_end`), and none after the last asked for
    is looked at."""
    want, last = _plan(None if columns is None else frozenset(columns))
    if bytes(blob[:1]) != _COLUMNS:  # a zstd frame: fixed-width columns
        return _decode_fixed(blob, n, want)
    body = bytes(cramjam.zstd.decompress(memoryview(blob)[1:]))
    got: dict[str, np.ndarray | None] = dict.fromkeys(COLUMNS)
    pos = 0
    for name in _ROW[:last]:
        if name in want:
            got[name], pos = unpack_column(body, pos, n)
        else:
            pos = column_end(body, pos, n)
    end = got["end_ms"]
    assert end is not None
    for name in ("first_t", "last_t"):  # (offsets before the bucket's end, in place)
        off = got[name]
        if off is not None:
            np.subtract(end, off, out=off)
    if "stale_after" in want:
        got["stale_after"] = np.unpackbits(np.frombuffer(body, np.uint8, offset=pos), count=n).view(bool)
    return partial(got.values())


def _encode_fixed(p: TierPoints) -> bytes:
    """Bucket-end deltas as int64, counts and the first and last samples' offsets as int32, the six
    float columns byte-shuffled, the staleness flags as bits; zstd-compressed as one (no version
    byte: a zstd frame starts 0x28)."""
    end = p.end_ms
    floats = np.stack([p.sum, p.min, p.max, p.first_v, p.last_v, p.correction]).astype("<f8")
    shuffled = np.ascontiguousarray(floats.reshape(-1).view(np.uint8).reshape(-1, 8).T)
    body = b"".join(
        [
            np.diff(end, prepend=np.int64(0)).astype("<i8").tobytes(),
            p.n.astype("<i4").tobytes(),
            (end - p.first_t).astype("<i4").tobytes(),
            (end - p.last_t).astype("<i4").tobytes(),
            shuffled.tobytes(),
            np.packbits(p.stale_after).tobytes(),
        ]
    )
    return bytes(cramjam.zstd.compress(body, _LEVEL))


def _decode_fixed(blob: bytes | memoryview, n: int, want: frozenset[str]) -> TierPoints:
    """Rows of `_encode_fixed` (1-hour rows, and every row written before the columns were narrowed):
    the columns in `want`, the others None."""
    body = np.frombuffer(bytes(cramjam.zstd.decompress(blob)), np.uint8)
    end = np.cumsum(body[: 8 * n].view("<i8"))
    ints = body[8 * n : 20 * n].view("<i4").astype(np.int64)  # counts, first and last offsets
    pos = 20 * n
    planes = body[pos : pos + 8 * _FLOATS * n].reshape(8, _FLOATS * n)  # byte planes of the six columns
    if want.issuperset(_FIXED_FLOATS):
        floats: list[np.ndarray | None] = list(planes.T.copy().view("<f8").reshape(_FLOATS, n))
    else:
        floats = [
            planes[:, i * n : (i + 1) * n].T.copy().view("<f8").reshape(n) if name in want else None
            for i, name in enumerate(_FIXED_FLOATS)
        ]
    pos += 8 * _FLOATS * n
    return partial(
        [
            end,
            ints[:n] if "n" in want else None,
            *floats[:3],  # sum, min, max
            end - ints[n : 2 * n] if "first_t" in want else None,
            floats[3],
            end - ints[2 * n :] if "last_t" in want else None,
            floats[4],
            floats[5],
            np.unpackbits(body[pos:], count=n).view(bool) if "stale_after" in want else None,
        ]
    )


def read_points(
    cur: duckdb.DuckDBPyConnection,
    ids: Sequence[int],
    res_ms: int,
    start_ms: int,
    end_ms: int,
    columns: Collection[str] | None = None,
) -> dict[int, TierPoints]:
    """{series id: its points of buckets ending in (start_ms, end_ms]} from the rows; series without
    any left out. `columns`: only those are decoded (`decode_points`), the others None."""
    if not ids or end_ms <= start_ms:
        return {}
    # A statement's blobs stay in DuckDB's memory (64 MB, shared) until fetched: about READ_BYTES of
    # them at a time (a 7-day read of 1-minute rows is ~160 KB a series).
    period = PERIOD_MS[res_ms]
    row_bytes = 16 * period // res_ms
    per_series = ((end_ms - start_ms) // period + 2) * row_bytes
    step = max(1, READ_BYTES // per_series)
    wanted = sorted(set(ids))
    out = {}
    for i in range(0, len(wanted), step):
        listed = ",".join(map(str, wanted[i : i + step]))
        rows = cur.execute(
            f"SELECT series_id, t_min_ms, n, data FROM {TABLE[res_ms]} WHERE series_id IN ({listed}) "
            "AND t_max_ms > ? AND t_min_ms <= ? ORDER BY series_id, t_min_ms",
            [start_ms, end_ms],
        ).fetchall()
        # A series' rows joined right after they are decoded, while their arrays are in the CPU's
        # cache: joined after all the statement's rows, a 7-day rate panel of 850 series spent 277 ms
        # (of 1.6 s) joining.
        for sid, found in itertools.groupby(rows, key=lambda row: row[0]):
            points = cut(
                concat([decode_points(data, n, columns) for _, _, n, data in found]), start_ms, end_ms
            )
            if points.size:
                out[sid] = points
    return out


def replace_span(
    cur: duckdb.DuckDBPyConnection,
    res_ms: int,
    lo_ms: int,
    hi_ms: int,
    ids: Sequence[int],
    built: dict[int, TierPoints],
    seq: int,
) -> None:
    """Make series `ids`' points of buckets ending in (lo_ms, hi_ms] those of `built` (none for a
    series not in it), keeping their other points of the same rows. (lo_ms, hi_ms] lies within one
    period. Run inside the caller's transaction.

    A 1-minute row whose day is not over (today's, rewritten at each hour's build) is written
    fixed-width, and narrowed once the span reaches the day's end: narrowing took 12-17 ms a series
    against 0.2-1.5 ms (60 and 1,320 points), every hour for every series, for ~1.25x the bytes of
    one day's rows (bench/README.md, "Tiers")."""
    if not ids:
        return
    period = PERIOD_MS[res_ms]
    p_lo = (hi_ms - 1) // period * period
    listed = ",".join(map(str, sorted(set(ids))))
    table = TABLE[res_ms]
    where = f"series_id IN ({listed}) AND t_min_ms > ? AND t_min_ms <= ?"
    params = [p_lo, p_lo + period]
    kept: dict[int, list[TierPoints]] = {}
    if (hi_ms - lo_ms) < period:  # part of a row: keep the rest of it
        for sid, n, data in cur.execute(
            f"SELECT series_id, n, data FROM {table} WHERE {where}", params
        ).fetchall():
            p = decode_points(data, n)
            outside = (p.end_ms <= lo_ms) | (p.end_ms > hi_ms)
            if outside.any():
                kept.setdefault(sid, []).append(take(p, outside))
    cur.execute(f"DELETE FROM {table} WHERE {where}", params)
    rows: list[tuple[int, TierPoints]] = []
    for sid in sorted(set(kept) | set(built)):
        parts = kept.get(sid, [])
        if sid in built and built[sid].size:
            parts = [*parts, built[sid]]
        if not parts:
            continue
        points = concat(parts)
        order = np.argsort(points.end_ms, kind="stable")
        rows.append((sid, take(points, order)))
    insert_rows(cur, res_ms, rows, seq, narrow=res_ms != HOUR_MS and hi_ms == p_lo + period)


def insert_rows(
    cur: duckdb.DuckDBPyConnection,
    res_ms: int,
    rows: list[tuple[int, TierPoints]],
    seq: int,
    *,
    narrow: bool,
) -> None:
    if not rows:
        return
    cur.register(
        "gpuwatch_tier_rows",
        {
            "series_id": np.fromiter((sid for sid, _ in rows), np.int32, len(rows)),
            "t_min_ms": np.fromiter((int(p.end_ms[0]) for _, p in rows), np.int64, len(rows)),
            "t_max_ms": np.fromiter((int(p.end_ms[-1]) for _, p in rows), np.int64, len(rows)),
            "n": np.fromiter((p.size for _, p in rows), np.int32, len(rows)),
            "seq": np.full(len(rows), seq, np.int64),
            "data": np.array([encode_points(p, narrow=narrow) for _, p in rows], dtype=object),
        },
    )
    try:
        cur.execute(f"INSERT INTO {TABLE[res_ms]} SELECT * FROM gpuwatch_tier_rows")
    finally:
        with contextlib.suppress(duckdb.Error):
            cur.unregister("gpuwatch_tier_rows")


def delete_before(cur: duckdb.DuckDBPyConnection, cutoffs: dict[int, int]) -> None:
    """Delete the rows of each resolution whose every bucket ends before its cutoff."""
    for res_ms, cutoff_ms in cutoffs.items():
        cur.execute(f"DELETE FROM {TABLE[res_ms]} WHERE t_max_ms < ?", [cutoff_ms])
