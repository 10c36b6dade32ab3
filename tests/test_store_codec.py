"""The chunk codec: many-chunk decoding equals chunk-by-chunk decoding, bit for bit, old blobs included;
zlib (2-hour chunks, and every blob written before zstd) and zstd (closed days' chunks) both."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.core.model import STALE_NAN
from gpuwatch.store import codec, decodemany
from gpuwatch.store.codec import (
    decode_times,
    decode_values,
    encode_times,
    encode_values,
)
from gpuwatch.store.decodemany import decode_chunks


def old_encode_times(t: np.ndarray) -> bytes:
    """Timestamps as every chunk written before the regular form existed."""
    return codec._pack_unsigned(codec._zigzag(codec._diff(t.astype(np.int64), 2)))


def _bits(v: np.ndarray) -> list[int]:
    return np.ascontiguousarray(v, np.float64).view(np.uint64).tolist()


values_kind = st.sampled_from(["int", "dec2", "dec6", "counter", "random", "const", "odd"])
times_kind = st.sampled_from(["regular", "jitter", "old", "single", "huge"])


@st.composite
def chunk(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, bool]:
    n = draw(st.integers(1, 700))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    tk = draw(times_kind)
    t0 = draw(st.integers(-(2**50), 2**50))
    step = draw(st.sampled_from([1, 1000, 15_000, 60_000, 2**40]))
    if tk == "jitter":
        t = t0 + np.cumsum(rng.integers(1, 3 * step + 2, n)).astype(np.int64)
    elif tk == "single":
        t = np.array([t0] * 1, np.int64)
        n = 1
    elif tk == "huge":
        t = np.int64(-(2**62)) + np.arange(n, dtype=np.int64) * np.int64(2**52)
    else:
        t = t0 + np.arange(n, dtype=np.int64) * step
    vk = draw(values_kind)
    if vk == "int":
        v = np.round(rng.normal(50, 20, n))
    elif vk == "dec2":
        v = np.round(rng.normal(300, 50, n), 2)
    elif vk == "dec6":
        v = np.round(rng.random(n), 6)
    elif vk == "counter":
        v = np.cumsum(rng.integers(0, 10**9, n)).astype(np.float64)
    elif vk == "random":
        v = rng.normal(0, 1e6, n)
    elif vk == "const":
        v = np.full(n, draw(st.sampled_from([0.0, 1.0, 81559.0, -0.0, 1e300])))
    else:
        v = np.round(rng.normal(0, 100, n), 1)
        k = draw(st.integers(0, max(0, n // 20)))
        v[rng.integers(0, n, k)] = draw(
            st.sampled_from([STALE_NAN, math.nan, math.inf, -math.inf, -0.0, 0.1 / 3])
        )
    return t, v, tk == "old"


@settings(max_examples=150, deadline=None)
@given(
    chunks=st.lists(chunk(), min_size=1, max_size=12), grouped=st.booleans(), zstd=st.integers(0, 2**12 - 1)
)
def test_decode_chunks_equals_one_by_one(
    chunks: list[tuple[np.ndarray, np.ndarray, bool]], grouped: bool, zstd: int
) -> None:
    # `zstd`: a bit a chunk, set where it is zstd-compressed (a closed day's) rather than zlib: a mix
    zs = [bool(zstd >> i & 1) for i in range(len(chunks))]
    ts = [
        old_encode_times(t) if old else encode_times(t, z) for (t, _, old), z in zip(chunks, zs, strict=True)
    ]
    vs = [encode_values(v, z) for (_, v, _), z in zip(chunks, zs, strict=True)]
    ns = np.array([t.size for t, _, _ in chunks], np.int64)
    # `grouped`: unshuffle chunks grouped by width and size (as when they alternate a lot), not in runs
    with mock.patch.object(decodemany, "_RUN_SLACK", -1 if grouped else 16):
        got_t, got_v = decode_chunks(ns, ts, vs)
    want_t = np.concatenate([decode_times(b, int(n)) for b, n in zip(ts, ns, strict=True)])
    want_v = np.concatenate([decode_values(b, int(n)) for b, n in zip(vs, ns, strict=True)])
    assert got_t.dtype == np.int64 and got_v.dtype == np.float64
    assert got_t.tolist() == want_t.tolist() == np.concatenate([t for t, _, _ in chunks]).tolist()
    assert _bits(got_v) == _bits(want_v) == _bits(np.concatenate([v for _, v, _ in chunks]))


@st.composite
def series_chunks(draw: st.DrawFn) -> list[np.ndarray]:
    """One series cut into chunks that go on from one another (as a series' 2 h chunks and its short
    last one), with now and then a gap, a new step, or one sample."""
    t = draw(st.integers(-(2**50), 2**50))
    step = draw(st.sampled_from([1, 15_000, 2**40]))
    out = []
    for n, gap, new_step in draw(
        st.lists(
            st.tuples(st.sampled_from([1, 2, 3, 480]), st.booleans(), st.booleans()), min_size=1, max_size=10
        )
    ):
        if new_step:
            step = draw(st.sampled_from([1, 1000, 15_000]))
        if gap:
            t += draw(st.integers(1, 10**6))
        out.append(t + np.arange(n, dtype=np.int64) * step)
        t = int(out[-1][-1]) + step
    return out


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(series_chunks(), min_size=1, max_size=4), old=st.booleans())
def test_decode_chunks_of_consecutive_chunks(parts: list[list[np.ndarray]], old: bool) -> None:
    chunks = [t for series in parts for t in series]
    ts = [encode_times(t) for t in chunks]
    if old:  # one chunk in the old form among regular ones
        ts[len(ts) // 2] = old_encode_times(chunks[len(ts) // 2])
    vs = [encode_values(np.full(t.size, float(i % 3))) for i, t in enumerate(chunks)]
    ns = np.array([t.size for t in chunks], np.int64)
    got_t, got_v = decode_chunks(ns, ts, vs)
    assert got_t.tolist() == np.concatenate(chunks).tolist()
    assert got_v.tolist() == [float(i % 3) for i, t in enumerate(chunks) for _ in range(t.size)]


def test_regular_timestamps_take_17_bytes_and_old_blobs_still_decode() -> None:
    t = 1_793_491_200_000 + np.arange(480, dtype=np.int64) * 15_000
    assert len(encode_times(t)) == 17
    assert decode_times(encode_times(t), 480).tolist() == t.tolist()
    old = old_encode_times(t)
    assert old[0] != 0 and decode_times(old, 480).tolist() == t.tolist()
    jitter = t.copy()
    jitter[7] += 1
    assert encode_times(jitter)[0] != 0
    assert decode_times(encode_times(jitter), 480).tolist() == jitter.tolist()


def test_decode_chunks_empty() -> None:
    t, v = decode_chunks(np.zeros(0, np.int64), [], [])
    assert t.size == 0 and v.size == 0


@settings(max_examples=150, deadline=None)
@given(c=chunk(), extra=st.integers(-(2**63), 2**63 - 1))
def test_a_row_of_columns_round_trips_bit_for_bit(c: tuple[np.ndarray, np.ndarray, bool], extra: int) -> None:
    t, v, _ = c
    ints = np.r_[t, np.int64(extra)]
    floats = np.r_[v, codec_float(extra)]
    buf = b"".join([codec.pack_int_column(ints), codec.pack_float_column(floats), b"tail"])
    got_i, pos = codec.unpack_column(buf, 0, ints.size)
    assert codec.column_end(buf, 0, ints.size) == pos
    got_f, end = codec.unpack_column(buf, pos, floats.size)
    assert codec.column_end(buf, pos, floats.size) == end
    assert got_i.dtype == np.int64 and got_i.tolist() == ints.tolist()
    assert got_f.dtype == np.float64 and _bits(got_f) == _bits(floats)
    assert buf[end:] == b"tail"


def _column_forms() -> list[tuple[str, np.ndarray]]:
    """Columns of every form `unpack_column` reads: integers of each width and delta order, decimals
    with and without units off and exceptions, float bits; none, one and two values."""
    rng = np.random.default_rng(7)
    n = 1440
    ramp = np.arange(n, dtype=np.int64)
    sums = np.cumsum(np.round(rng.random(n) * 100, 1))  # sums of decimals: units off their decimal
    odd = np.round(rng.normal(250, 30, n), 1)
    odd[[3, 500, 1439]] = [np.nan, np.inf, -0.0]  # exceptions
    forms = [
        ("int, order 0, width 1", rng.integers(0, 100, n)),
        ("int, order 1, width 2", np.cumsum(rng.integers(-20_000, 20_000, n))),
        ("int, order 2, width 1", 1_793_491_200_000 + 60_000 * ramp + (ramp % 3 == 0)),
        ("int, width 4", rng.integers(-(2**30), 2**30, n)),
        ("int, width 8", rng.integers(-(2**62), 2**62, n)),
        ("decimal", np.round(rng.random(n) * 100, 1)),
        ("decimal, units off", sums),
        ("decimal, exceptions", odd),
        ("bits", rng.standard_normal(n) * 1e6),
        ("empty", np.zeros(0)),
        ("one", np.array([12.5])),
        ("two", np.array([7, 2**62], np.int64)),
    ]
    return forms


def test_every_column_form_decodes_and_is_skipped_by_its_header_alone() -> None:
    seen = set()
    for name, x in _column_forms():
        packed = codec.pack_int_column(x) if x.dtype == np.int64 else codec.pack_float_column(x)
        kind, _, order, width = codec._COLUMN.unpack_from(packed)
        off = codec._DECIMAL_EXTRA.unpack_from(packed, 4) if kind == codec._COL_DECIMAL else (0, 0)
        seen.add((kind, order if kind == codec._COL_INT else None, width, off[0] > 0, off[1] > 0))
        buf = b"head" + packed + b"tail"
        got, end = codec.unpack_column(buf, 4, x.size)
        assert codec.column_end(buf, 4, x.size) == end == 4 + len(packed), name
        assert buf[end:] == b"tail", name
        assert got.dtype == x.dtype and _bits(got.astype(np.float64)) == _bits(x.astype(np.float64)), name
        assert got.flags.writeable, name  # an array of its own, not a view of `buf`
    # (the forms above cover what they say: each kind, width 1-8, orders 0-2, units off, exceptions)
    assert {k for k, *_ in seen} == {codec._COL_INT, codec._COL_DECIMAL, codec._COL_BITS}
    assert {w for *_, w, _, _ in seen} >= {1, 2, 4, 8}
    assert {o for _, o, *_ in seen if o is not None} == {0, 1, 2}
    assert any(bad for *_, bad, _ in seen) and any(units for *_, units in seen)


def codec_float(bits: int) -> float:
    """Any float64, NaN payloads included, from 64 bits."""
    return float(np.array([bits], np.int64).view(np.float64)[0])


def test_short_decimals_take_a_byte_or_two_a_value() -> None:
    v = np.round(np.random.default_rng(1).normal(250, 30, 1440), 1)  # watts to a tenth, a day of minutes
    assert len(codec.pack_float_column(v)) < 2 * v.size + 16 < 8 * v.size


def _packed_head(blob: bytes, is_values: bool) -> int:
    """The width byte of a blob's packed part (0: timestamps in the regular form)."""
    if not is_values:
        return blob[0]
    n_bad = codec._HEADER.unpack_from(blob)[3]
    return blob[codec._HEADER.size + 12 * n_bad]


@settings(max_examples=150, deadline=None)
@given(c=chunk())
def test_zstd_and_zlib_round_trip_bit_for_bit(c: tuple[np.ndarray, np.ndarray, bool]) -> None:
    t, v, _ = c
    for zstd in (False, True):
        tb, vb = encode_times(t, zstd), encode_values(v, zstd)
        assert decode_times(tb, t.size).tolist() == t.tolist()
        assert _bits(decode_values(vb, v.size)) == _bits(v)
        got_t, got_v = decode_chunks(np.array([t.size]), [tb], [vb])
        assert got_t.tolist() == t.tolist() and _bits(got_v) == _bits(v)
        head = _packed_head(vb, True)
        assert head in ((17, 18, 20, 24) if zstd else (1, 2, 4, 8))  # width + 0x10 marks zstd
        assert _packed_head(tb, False) in ((0, 17, 18, 20, 24) if zstd else (0, 1, 2, 4, 8))


def a_day(seed: int, step_ms: int = 15_000) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """A day of samples as a node exporter gives them: timestamps with gaps and jitter, and a gauge
    to a tenth, a temperature, a counter, a staleness marker and NaN among them."""
    rng = np.random.default_rng(seed)
    t = 1_793_491_200_000 + np.arange(0, 86_400_000, step_ms, dtype=np.int64)
    keep = rng.random(t.size) > 0.02
    keep[2000:2300] = False  # a 75-minute hole
    t = t[keep] + rng.integers(0, 3, keep.sum()) * (rng.random(keep.sum()) < 0.01)
    n = t.size
    power = np.round(250 + np.cumsum(rng.normal(0, 2, n)), 1)
    power[n // 3] = STALE_NAN
    power[rng.integers(0, n, 3)] = math.nan
    return t, {
        "power": power,
        "temp": np.round(60 + np.cumsum(rng.normal(0, 0.1, n))),
        "energy": np.cumsum(rng.integers(0, 40_000, n)).astype(np.float64) / 1000,
        "util": np.round(rng.random(n) * 100),
        "const": np.full(n, 1.0),
    }


def test_a_day_of_real_looking_samples_round_trips_with_both() -> None:
    sizes = {False: 0, True: 0}
    for seed in range(3):
        t, series = a_day(seed)
        assert encode_times(t)[0] != 0  # gaps and jitter: the packed form
        for zstd in sizes:
            tb = encode_times(t, zstd)
            assert decode_times(tb, t.size).tolist() == t.tolist()
            ts, vs = [tb], []
            for v in series.values():
                vb = encode_values(v, zstd)
                assert _bits(decode_values(vb, v.size)) == _bits(v)
                vs.append(vb)
            ts += [tb] * (len(vs) - 1)
            got_t, got_v = decode_chunks(np.full(len(vs), t.size), ts, vs)
            assert got_t.tolist() == np.tile(t, len(vs)).tolist()
            assert _bits(got_v) == _bits(np.concatenate(list(series.values())))
            sizes[zstd] += len(tb) + sum(map(len, vs))
    assert sizes[True] < sizes[False]  # what zstd is for


def test_rows_encoders_write_the_same_zstd_blobs_as_one_by_one() -> None:
    rng = np.random.default_rng(5)
    t = np.cumsum(rng.integers(14_000, 16_000, (6, 300)), axis=1)
    v = np.round(rng.normal(0, 50, (6, 300)), 2)
    v[2, 7] = STALE_NAN
    v[4] = rng.normal(0, 1, 300)  # not decimal: XOR
    v[5] = 3.0  # constant: short rows, compressed once
    assert codec.encode_times_rows(t, True) == [encode_times(row, True) for row in t]
    assert codec.encode_values_rows(v, True) == [encode_values(row, True) for row in v]
    assert (
        codec.encode_values_rows(v) == [encode_values(row) for row in v] != codec.encode_values_rows(v, True)
    )


# Written by the codec before zstd existed (zlib, level 6): irregular timestamps, decimals with a NaN
# and an exception, and XOR-ed values. Every store from then holds such blobs; they must still decode.
OLD_TIMES = bytes.fromhex(
    "08789c6338cfc0c0c0c6cdc67061fe050628b8100565b0f3b3c3c4ce9f67c0001a1a9862cece9862cccc9862c402009cd106e7"
)
OLD_DECIMALS = bytes.fromhex(
    "010202020000000300000006000000000000000000f87f111111111111a13f02789c73e065304c3104220604909767c00000463a0218"
)
OLD_XOR = bytes.fromhex(
    "0200000000000008789c13ec9d63299852da2728c8f05870668785a0ae4d9fe0d7278f174e337f61eff86f3f00bfc20dc3"
)


def test_old_zlib_blobs_still_decode() -> None:
    t = 1_793_491_200_000 + np.arange(20, dtype=np.int64) * 15_000
    t[5] += 3
    t[9] += 1000
    v = np.round(40 + np.arange(20) * 0.25, 2)
    v[3], v[6] = math.nan, 0.1 / 3
    x = np.array([0.1 / 3, 1e300, -0.0, 7.0 / 9])
    assert decode_times(OLD_TIMES, 20).tolist() == t.tolist()
    assert _bits(decode_values(OLD_DECIMALS, 20)) == _bits(v)
    assert _bits(decode_values(OLD_XOR, 4)) == _bits(x)
    # Old zlib blobs and zstd ones (a store whose newer days were merged since) decoded together
    t4 = t[:4] + 1
    t4[2] += 1
    ts = [OLD_TIMES, encode_times(t, True), encode_times(t4, True), OLD_TIMES]
    vs = [OLD_DECIMALS, encode_values(v, True), OLD_XOR, encode_values(v, True)]
    assert all(_packed_head(b, False) > codec.ZSTD for b in ts[1:3])
    got_t, got_v = decode_chunks(np.array([20, 20, 4, 20]), ts, vs)
    assert got_t.tolist() == np.r_[t, t, t4, t].tolist()
    assert _bits(got_v) == _bits(np.r_[v, v, x, v])
