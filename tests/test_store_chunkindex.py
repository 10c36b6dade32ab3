"""The chunk index: where each chunk is, which keys it still holds, and what it costs per chunk."""

from __future__ import annotations

import numpy as np

from gpuwatch.store.chunkindex import ChunkIndex


def _index(chunks: list[tuple[int, int, int, int, int, int]]) -> ChunkIndex:
    """`chunks`: (series id, seq, samples, first timestamp, last timestamp, hash), in any order."""
    cols = list(zip(*chunks, strict=True)) if chunks else [[]] * 6
    names = ("series_id", "seq", "n", "t_min_ms", "t_max_ms", "h")
    dtypes = (np.int64, np.int64, np.int32, np.int64, np.int64, np.uint64)
    return ChunkIndex({k: np.array(c, dt) for k, c, dt in zip(names, cols, dtypes, strict=True)}, 1)


CHUNKS = [
    (7, 3, 120, 2000, 2999, 71),
    (2, 1, 120, 0, 999, 21),
    (7, 1, 120, 0, 999, 72),
    (2, 2, 60, 1000, 1500, 22),
    (7, 2, 120, 1000, 1999, 73),
    (7, 4, 10, 1000, 1100, 74),  # a second chunk of series 7 from 1000: a late write, found after the first
]


def test_positions_series_and_keys_follow_series_then_time_then_write_order() -> None:
    index = _index(CHUNKS)
    assert index.size == 6
    assert index.sids(np.arange(6)).tolist() == [2, 2, 7, 7, 7, 7]
    assert index.rows_of_series(7) == (2, 6)
    assert index.rows_of_series(3) == (2, 2) and index.rows_of_series(99) == (0, 0)
    assert index.keys(np.array([0, 3, 4])) == [(2, 0, 120, 21), (7, 1000, 120, 73), (7, 1000, 10, 74)]
    assert index.rows_of(np.array([2, 7]), 1200, 2100).tolist() == [1, 3, 5]


def test_holds_finds_every_stored_key_and_no_other() -> None:
    index = _index(CHUNKS)
    stored = index.keys(np.arange(index.size))
    assert index.holds(stored).all()
    gone = [
        (7, 1000, 10, 75),  # rewritten: same place and size, other content
        (7, 1000, 11, 74),  # other size
        (7, 1500, 120, 73),  # other first timestamp
        (3, 0, 120, 21),  # a series with no chunks, below the highest
        (99, 0, 120, 21),  # a series past the highest
    ]
    assert not index.holds(gone).any()
    mixed = [gone[0], stored[4], gone[4], stored[0]]
    assert index.holds(mixed).tolist() == [False, True, False, True]
    assert not _index([]).holds([(0, 0, 1, 1)]).any()


def test_a_chunk_costs_36_bytes_and_a_series_8() -> None:
    rng = np.random.default_rng(1)
    series, per_series = 5_000, 40
    sid = np.repeat(np.arange(series), per_series)
    t = np.tile(np.arange(per_series) * 7_200_000, series)
    chunks = list(
        zip(sid, t, [120] * sid.size, t, t + 7_199_000, rng.integers(0, 2**62, sid.size), strict=True)
    )
    index = _index([(s, q, n, a, b, h) for s, q, n, a, b, h in chunks])
    held = sum(a.nbytes for a in vars(index).values() if isinstance(a, np.ndarray))
    assert held <= 36 * sid.size + 8 * (series + 1)
    assert index.holds(index.keys(np.arange(0, index.size, 97))).all()
