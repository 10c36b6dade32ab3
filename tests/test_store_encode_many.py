"""Encoding many chunks at once (compaction): the same bytes as chunk by chunk, and they decode exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.store.chunking import (
    WINDOW_MS,
    ChunkRow,
    dedupe_last,
    dedupe_sorted,
    encode_many,
    encode_series,
)
from gpuwatch.store.codec import (
    encode_times,
    encode_times_rows,
    encode_values,
    encode_values_rows,
)
from gpuwatch.store.decodemany import decode_chunks
from tests.test_store_codec import _bits, chunk


@settings(max_examples=100, deadline=None)
@given(base=chunk(), k=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_rows_encode_as_one_by_one(base: tuple[np.ndarray, np.ndarray, bool], k: int, seed: int) -> None:
    t, v, _ = base
    rng = np.random.default_rng(seed)
    # k chunks of one length: the drawn one, shifted copies, and copies with some values shuffled
    ts = np.stack([t + i * 7 for i in range(k)])
    vs = np.stack([v if i % 2 == 0 else rng.permutation(v) for i in range(k)])
    t_rows, v_rows = encode_times_rows(ts), encode_values_rows(vs)
    assert t_rows == [encode_times(row) for row in ts]
    assert v_rows == [encode_values(row) for row in vs]
    got_t, got_v = decode_chunks(np.full(k, t.size), t_rows, v_rows)
    assert got_t.tolist() == ts.reshape(-1).tolist()
    assert _bits(got_v) == _bits(vs.reshape(-1))


@st.composite
def head(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Head rows of a few series as compaction reads them: sorted by (series, time, seq), with
    duplicate timestamps (a later write wins), series of different lengths, some across a window."""
    parts = draw(st.lists(chunk(), min_size=1, max_size=8))
    ids, ts, vs, seqs = [], [], [], []
    seq = 0
    for sid, (t, v, _) in enumerate(parts):
        if draw(st.booleans()):  # move it to straddle a window boundary
            t = t - t[0] + WINDOW_MS * 1000 - t.size // 2 * 1000
            t = t[: min(t.size, 300)]
            v = v[: t.size]
        dup = draw(st.integers(0, 3))
        t = np.concatenate([t, t[:dup]])
        with np.errstate(invalid="ignore"):  # a signalling NaN (the staleness marker) + 1
            v = np.concatenate([v, v[:dup][::-1] + 1])
        s = np.arange(seq, seq + t.size)
        seq += t.size
        ids.append(np.full(t.size, 3 * sid + 1))
        ts.append(t)
        vs.append(v)
        seqs.append(s)
    ids_a, t_a, v_a, s_a = (np.concatenate(x) for x in (ids, ts, vs, seqs))
    order = np.lexsort((s_a, t_a, ids_a))
    return ids_a[order], t_a[order], v_a[order], s_a[order]


@settings(max_examples=100, deadline=None)
@given(rows=head())
def test_encode_many_equals_encode_series(
    rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> None:
    ids, t, v, seqs = rows
    got = encode_many(*dedupe_sorted(ids, t, v, seqs))
    want = []
    for sid in np.unique(ids).tolist():
        pick = ids == sid
        tt, vv = dedupe_last(t[pick], v[pick], seqs[pick])
        want.extend(encode_series(sid, tt, vv, int(seqs[pick].max())))
    assert [_row(r) for r in got] == [_row(r) for r in want]
    # and what was written decodes to each series' samples, the last write of a timestamp winning
    got_t, got_v = decode_chunks(np.array([r.n for r in got]), [r.ts for r in got], [r.vs for r in got])
    want_t = np.concatenate(
        [dedupe_last(t[ids == s], v[ids == s], seqs[ids == s])[0] for s in np.unique(ids)]
    )
    want_v = np.concatenate(
        [dedupe_last(t[ids == s], v[ids == s], seqs[ids == s])[1] for s in np.unique(ids)]
    )
    assert got_t.tolist() == want_t.tolist()
    assert _bits(got_v) == _bits(want_v)


def _row(r: ChunkRow) -> tuple[object, ...]:
    last = None if r.last_value is None else _bits(np.array([r.last_value]))  # NaN != NaN
    return (r.series_id, r.t_min_ms, r.t_max_ms, r.n, r.seq, r.ts, r.vs, last)


def test_encode_many_of_nothing() -> None:
    empty = np.zeros(0, np.int64)
    assert encode_many(empty, empty, np.zeros(0), empty) == []


def test_encode_many_in_several_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gpuwatch.store.chunking._BLOCK", 100)  # 40 samples a series: 2 series a pass
    rng = np.random.default_rng(5)
    ids = np.repeat(np.arange(9), 40)
    t = np.tile(1_700_000_000_000 + 15_000 * np.arange(40), 9)
    v = np.round(rng.normal(0, 100, ids.size), 1)
    got = encode_many(ids, t, v, np.arange(ids.size))
    want = [r for s in range(9) for r in encode_series(s, t[ids == s], v[ids == s], 40 * s + 39)]
    assert [_row(r) for r in got] == [_row(r) for r in want]
