"""Encode one series' timestamps and values into compact chunk blobs, and back.

Both encoders end the same way: integers are zig-zagged, narrowed to the fewest bytes that hold the
largest one, byte-shuffled (all first bytes, then all second bytes, ...) and zlib-compressed. Runs of
equal small numbers, which is what regular timestamps and slowly moving gauges become, compress to
almost nothing that way.

- Timestamps are stored as deltas of deltas: a regular 1 s scrape is a run of zeros. Chunks whose
  timestamps are perfectly regular (every scrape on time, the common case) are stored as just their
  first timestamp and step (a width byte of 0, then two int64), and decode with one `arange`. Older
  chunks, written before that form existed, decode as before.
- Values are tried as decimals first (ALP-like): the smallest exponent e in 0..6 for which most
  values v satisfy `rint(v * 10**e) / 10**e == v` bit for bit. Those integers are stored as deltas, or
  deltas of deltas for steadily rising counters, whichever is narrower. Values that do not fit (NaN
  payloads such as Prometheus's staleness marker, +-Inf, -0.0, odd fractions) are stored verbatim as
  exceptions, so every float64 bit pattern round-trips.
- Otherwise values are XORed with their predecessor (as Gorilla does) and compressed the same way.

`decode_chunks` decodes many chunks at once: the per-chunk work is only the header parse and zlib;
unshuffling, zig-zag and the (segmented) running sums run once over all of them, so a read of
thousands of small chunks (2 h of a 15 s series is 480 samples) costs numpy calls per query, not per chunk.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence

import numpy as np

_LEVEL = 6
_MAX_EXACT = float(2**53)
_MAX_DECIMALS = 6
_EXCEPTION_SHARE = 0.1
_DECIMAL = 1
_XOR = 2
_HEADER = struct.Struct("<BBBI")  # mode, decimals, delta order, exception count
_REGULAR = struct.Struct("<Bqq")  # 0 (where other blobs have their width), first timestamp, step
_RUN_SLACK = 16  # `_unpack_many` groups equal chunks when there are more runs than this + 1/8 of them
_SMALL = 64  # packed parts up to this many bytes are decompressed once per distinct content
_POW10 = [10.0**e for e in range(_MAX_DECIMALS + 1)]


def _zigzag(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.int64, copy=False)
    return ((x << np.int64(1)) ^ (x >> np.int64(63))).view(np.uint64)


def _unzigzag(u: np.ndarray) -> np.ndarray:
    return ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(np.int64)


def _pack_unsigned(u: np.ndarray) -> bytes:
    """Narrow, byte-shuffle and compress unsigned 64-bit integers."""
    top = int(u.max()) if u.size else 0
    width = 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8
    narrow = u.astype(f"<u{width}", copy=False)
    planes = narrow.view(np.uint8).reshape(-1, width).T
    return bytes([width]) + zlib.compress(np.ascontiguousarray(planes).tobytes(), _LEVEL)


def _unpack_unsigned(blob: bytes | memoryview, n: int) -> np.ndarray:
    width = blob[0]
    planes = np.frombuffer(zlib.decompress(blob[1:]), dtype=np.uint8).reshape(width, n)
    return np.ascontiguousarray(planes.T).view(f"<u{width}").reshape(n).astype(np.uint64)


def _diff(x: np.ndarray, order: int) -> np.ndarray:
    # int64 arithmetic wraps identically in diff and cumsum, so even huge jumps invert exactly.
    with np.errstate(over="ignore"):
        for _ in range(order):
            x = np.diff(x, prepend=np.int64(0))
    return x


def _undiff(x: np.ndarray, order: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        for _ in range(order):
            x = np.cumsum(x, dtype=np.int64)
    return x


def encode_times(t_ms: np.ndarray) -> bytes:
    """Encode int64 millisecond timestamps: first and step if regular, else compressed deltas of deltas."""
    t = t_ms.astype(np.int64, copy=False)
    if t.size:
        with np.errstate(over="ignore"):
            step = t[1] - t[0] if t.size > 1 else np.int64(0)
            if t.size <= 2 or bool(np.all(np.diff(t) == step)):
                return _REGULAR.pack(0, int(t[0]), int(step))
    return _pack_unsigned(_zigzag(_diff(t, 2)))


def _regular(t0: int, step: int, n: int) -> np.ndarray:
    # int64 arithmetic wraps exactly as the encoder's diff did, so any t0/step pair round-trips.
    with np.errstate(over="ignore"):
        return np.arange(n, dtype=np.int64) * np.int64(step) + np.int64(t0)


def decode_times(blob: bytes | memoryview, n: int) -> np.ndarray:
    """Decode `n` timestamps written by `encode_times`."""
    if blob[0] == 0:
        _, t0, step = _REGULAR.unpack_from(blob)
        return _regular(t0, step, n)
    return _undiff(_unzigzag(_unpack_unsigned(blob, n)), 2)


def _decimal_fit(v: np.ndarray) -> tuple[int, np.ndarray, np.ndarray] | None:
    """Find the smallest exponent turning most of `v` into exact integers."""
    bits = v.view(np.uint64)
    with np.errstate(invalid="ignore", over="ignore"):
        for e in range(_MAX_DECIMALS + 1):
            scale = 10.0**e
            scaled = np.rint(v * scale)
            ints = np.where(np.abs(scaled) < _MAX_EXACT, scaled, 0.0).astype(np.int64)
            ok = (ints.astype(np.float64) / scale).view(np.uint64) == bits
            if ok.sum() >= (1.0 - _EXCEPTION_SHARE) * v.size:
                return e, ints, ok
    return None


def _fill_forward(x: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Replace entries where `ok` is false with the previous good one, so deltas stay small."""
    if ok.all():
        return x
    idx = np.where(ok, np.arange(x.size), 0)
    np.maximum.accumulate(idx, out=idx)
    return x[idx]


def _cost(d: np.ndarray) -> float:
    return float(np.log2(np.abs(d[1:].astype(np.float64)) + 1.0).sum())


def encode_values(v: np.ndarray) -> bytes:
    """Encode float64 values so that every bit pattern (NaN payloads included) round-trips."""
    v = np.ascontiguousarray(v, dtype=np.float64)
    fit = _decimal_fit(v) if v.size else (0, np.zeros(0, np.int64), np.zeros(0, bool))
    if fit is None:
        bits = v.view(np.int64)
        xored = bits ^ np.concatenate(([np.int64(0)], bits[:-1]))
        return _HEADER.pack(_XOR, 0, 0, 0) + _pack_unsigned(xored.view(np.uint64))
    decimals, ints, ok = fit
    ints = _fill_forward(ints, ok)
    d1 = _diff(ints, 1)
    d2 = _diff(d1, 1)
    order = 2 if _cost(d2) < _cost(d1) else 1
    packed = _pack_unsigned(_zigzag(d1 if order == 1 else d2))
    bad = np.flatnonzero(~ok).astype("<u4")
    extra = bad.tobytes() + v[bad].astype("<f8").tobytes()
    return _HEADER.pack(_DECIMAL, decimals, order, bad.size) + extra + packed


def decode_values(blob: bytes | memoryview, n: int) -> np.ndarray:
    """Decode `n` values written by `encode_values`."""
    mode, decimals, order, n_bad = _HEADER.unpack_from(blob)
    pos = _HEADER.size
    if mode == _XOR:
        xored = _unpack_unsigned(memoryview(blob)[pos:], n).view(np.int64)
        with np.errstate(over="ignore"):
            return np.bitwise_xor.accumulate(xored).view(np.float64)
    bad = np.frombuffer(blob, dtype="<u4", count=n_bad, offset=pos)
    pos += 4 * n_bad
    raw = np.frombuffer(blob, dtype="<f8", count=n_bad, offset=pos)
    pos += 8 * n_bad
    ints = _undiff(_unzigzag(_unpack_unsigned(memoryview(blob)[pos:], n)), order)
    values = ints.astype(np.float64) / 10.0**decimals
    values[bad] = raw
    return values


# -- many chunks at once: encoding ------------------------------------------------------------------
# Compaction encodes tens of thousands of short series at a time. These take many chunks of one length
# as the rows of a 2-D array and do each step of `encode_times` / `encode_values` once for all rows;
# only the zlib call and the header stay per chunk. The bytes are the same as chunk by chunk.


def _pack_unsigned_rows(u: np.ndarray) -> list[bytes]:
    """`_pack_unsigned` of each row of the 2-D uint64 array `u`."""
    k, n = u.shape
    out: list[bytes] = [b""] * k
    if not k:
        return out
    top = u.max(axis=1) if n else np.zeros(k, np.uint64)
    widths = np.where(top < 1 << 8, 1, np.where(top < 1 << 16, 2, np.where(top < 1 << 32, 4, 8)))
    compress = zlib.compress
    for width in np.unique(widths).tolist():
        rows = np.flatnonzero(widths == width)
        part = u if rows.size == k else u[rows]
        narrow = part.astype(f"<u{width}")
        shuffled = np.ascontiguousarray(narrow.view(np.uint8).reshape(rows.size, n, width).transpose(0, 2, 1))
        joined = shuffled.tobytes()
        size = width * n
        head = bytes([width])
        if size > _SMALL:
            for i, row in enumerate(rows.tolist()):
                out[row] = head + compress(joined[i * size : (i + 1) * size], _LEVEL)
            continue
        seen: dict[bytes, bytes] = {}  # short rows repeat (constant series): compress each content once
        for i, row in enumerate(rows.tolist()):
            raw = joined[i * size : (i + 1) * size]
            blob = seen.get(raw)
            if blob is None:
                blob = seen[raw] = head + compress(raw, _LEVEL)
            out[row] = blob
    return out


def encode_times_rows(t_ms: np.ndarray) -> list[bytes]:
    """`encode_times` of each row of a 2-D int64 array (one chunk a row, all of one length)."""
    t = np.ascontiguousarray(t_ms, dtype=np.int64)
    k, n = t.shape
    out: list[bytes] = [b""] * k
    if not k or not n:
        return [encode_times(row) for row in t]
    with np.errstate(over="ignore"):
        d = np.diff(t, axis=1)
        step = d[:, 0] if n > 1 else np.zeros(k, np.int64)
        regular = np.ones(k, bool) if n <= 2 else (d == step[:, None]).all(axis=1)
        irregular = np.flatnonzero(~regular)
        if irregular.size:
            dd = np.diff(t[irregular], axis=1, prepend=np.int64(0))
            dd = np.diff(dd, axis=1, prepend=np.int64(0))
            for row, blob in zip(irregular.tolist(), _pack_unsigned_rows(_zigzag(dd)), strict=True):
                out[row] = blob
    pack = _REGULAR.pack
    for row, t0, st in zip(
        np.flatnonzero(regular).tolist(), t[regular, 0].tolist(), step[regular].tolist(), strict=True
    ):
        out[row] = pack(0, t0, st)
    return out


def encode_values_rows(v: np.ndarray) -> list[bytes]:
    """`encode_values` of each row of a 2-D float64 array (one chunk a row, all of one length)."""
    v = np.ascontiguousarray(v, dtype=np.float64)
    k, n = v.shape
    out: list[bytes] = [b""] * k
    if not k or not n:
        return [encode_values(row) for row in v]
    bits = v.view(np.uint64)
    decimals = np.full(k, -1, np.int64)
    ints = np.zeros((k, n), np.int64)
    ok = np.zeros((k, n), bool)
    todo = np.arange(k)
    need = (1.0 - _EXCEPTION_SHARE) * n
    with np.errstate(invalid="ignore", over="ignore"):
        for e in range(_MAX_DECIMALS + 1):  # as _decimal_fit, for the rows still without an exponent
            if not todo.size:
                break
            scale = 10.0**e
            part = v[todo]
            scaled = np.rint(part * scale)
            part_ints = np.where(np.abs(scaled) < _MAX_EXACT, scaled, 0.0).astype(np.int64)
            part_ok = (part_ints.astype(np.float64) / scale).view(np.uint64) == bits[todo]
            fits = part_ok.sum(axis=1) >= need
            done = todo[fits]
            decimals[done], ints[done], ok[done] = e, part_ints[fits], part_ok[fits]
            todo = todo[~fits]
    xor_rows = np.flatnonzero(decimals < 0)
    if xor_rows.size:
        b = v[xor_rows].view(np.int64)
        xored = b.copy()
        xored[:, 1:] ^= b[:, :-1]
        head = _HEADER.pack(_XOR, 0, 0, 0)
        for row, blob in zip(xor_rows.tolist(), _pack_unsigned_rows(xored.view(np.uint64)), strict=True):
            out[row] = head + blob
    dec_rows = np.flatnonzero(decimals >= 0)
    if not dec_rows.size:
        return out
    x, good = ints[dec_rows], ok[dec_rows]
    if not good.all():  # _fill_forward, row by row
        idx = np.where(good, np.arange(n), 0)
        np.maximum.accumulate(idx, axis=1, out=idx)
        x = np.take_along_axis(x, idx, axis=1)
    with np.errstate(over="ignore"):
        d1 = np.diff(x, axis=1, prepend=np.int64(0))
        d2 = np.diff(d1, axis=1, prepend=np.int64(0))
    cost1 = np.log2(np.abs(d1[:, 1:].astype(np.float64)) + 1.0).sum(axis=1)
    cost2 = np.log2(np.abs(d2[:, 1:].astype(np.float64)) + 1.0).sum(axis=1)
    second = cost2 < cost1
    packed = _pack_unsigned_rows(_zigzag(np.where(second[:, None], d2, d1)))
    pack = _HEADER.pack
    bad_rows = np.logical_not(good).any(axis=1)
    has_bad: list[bool] = np.asarray(bad_rows).tolist()
    for i, (row, e, two, blob, odd) in enumerate(
        zip(dec_rows.tolist(), decimals[dec_rows].tolist(), second.tolist(), packed, has_bad, strict=True)
    ):
        if odd:
            bad = np.flatnonzero(~good[i]).astype("<u4")
            extra = bad.tobytes() + v[row, bad].astype("<f8").tobytes()
            out[row] = pack(_DECIMAL, e, 2 if two else 1, bad.size) + extra + blob
        else:
            out[row] = pack(_DECIMAL, e, 2 if two else 1, 0) + blob
    return out


# -- many chunks at once: decoding -----------------------------------------------------------------------------


def _starts(ns: np.ndarray) -> np.ndarray:
    """Offsets of each chunk's first element in the concatenation."""
    out = np.zeros(ns.size, np.int64)
    np.cumsum(ns[:-1], out=out[1:])
    return out


class _Blobs:
    """Many blobs joined into one buffer, with each blob's offset and length."""

    def __init__(self, blobs: Sequence[bytes | bytearray | memoryview]) -> None:
        self.joined = b"".join(blobs)
        self.buf = np.frombuffer(self.joined, np.uint8)
        self.lens = np.fromiter(map(len, blobs), np.int64, len(blobs))
        self.off = _starts(self.lens)
        self.end = self.off + self.lens

    def field(self, at: np.ndarray, dtype: str) -> np.ndarray:
        """The little-endian `dtype` numbers stored at byte offsets `at` (not necessarily aligned)."""
        size = np.dtype(dtype).itemsize
        return self.buf[at[:, None] + np.arange(size)].view(dtype).reshape(at.size)


def _planes_to_ints(planes: np.ndarray, w: int, cnt: int, n: int) -> np.ndarray:
    """Unshuffle `cnt` blobs of `n` integers `w` bytes wide (as packed one after the other) into rows."""
    if w == 1:
        return planes.reshape(cnt, n)
    p = planes.reshape(cnt, w, n)
    if w == 2:
        return p[:, 0, :].astype(np.uint16) | (p[:, 1, :].astype(np.uint16) << np.uint16(8))
    rows = np.empty((cnt, n, w), np.uint8)
    for j in range(w):  # plane by plane: twice as fast as one transposing copy
        rows[:, :, j] = p[:, j, :]
    return rows.view(f"<u{w}").reshape(cnt, n)


def _inflate_all(mv: memoryview, begins: list[int], ends: list[int]) -> list[bytes]:
    """zlib-decompress each `mv[begin:end]`; small ones (constant chunks, which repeat) only once each."""
    seen: dict[memoryview, bytes] = {}
    out = []
    for a, e in zip(begins, ends, strict=True):
        part = mv[a:e]
        if e - a > _SMALL:
            out.append(zlib.decompress(part))
            continue
        raw = seen.get(part)
        if raw is None:
            raw = seen[part] = zlib.decompress(part)
        out.append(raw)
    return out


def _decode_ints(
    blobs: _Blobs, pick: np.ndarray, at: np.ndarray, ns: np.ndarray, orders: np.ndarray | None
) -> np.ndarray:
    """Decode the packed integers of blobs `pick` (packed part from byte `at` of each) into one int64
    array, in order: zig-zag and `orders` rounds of running sums per chunk, or (`orders` None) a running
    XOR of the raw integers."""
    k = pick.size
    widths = blobs.buf[at].astype(np.int64)
    # Consecutive chunks of one width and size (all the full 2 h chunks of a series) decode as the rows
    # of one 2-D array; when widths and sizes alternate too much for that, equal ones are grouped.
    key = widths << np.int64(40) | ns
    change = np.flatnonzero(key[1:] != key[:-1]) + 1
    grouped = change.size > _RUN_SLACK + k // 8
    order = np.argsort(key, kind="stable") if grouped else np.arange(k)
    if grouped:
        change = np.flatnonzero(np.diff(key[order])) + 1
    mv = memoryview(blobs.joined)
    a_s, e_s = (at[order] + 1).tolist(), blobs.end[pick][order].tolist()
    raw = np.frombuffer(b"".join(_inflate_all(mv, a_s, e_s)), np.uint8)
    starts = _starts(ns)
    out = np.empty(int(ns.sum()), np.int64)
    uniform = bool(k) and bool((ns == ns[0]).all())
    pos = 0
    with np.errstate(over="ignore"):  # int64 sums wrap exactly as the encoder's differences did
        for lo, hi in zip([0, *change.tolist()], [*change.tolist(), k], strict=True):
            rows = order[lo:hi]
            first = int(rows[0])
            w, n, cnt = int(widths[first]), int(ns[first]), hi - lo
            seg = raw[pos : pos + cnt * w * n]
            pos += cnt * w * n
            if grouped:
                dest = np.empty((cnt, n), np.int64)
            else:
                dest = out[int(starts[first]) : int(starts[first]) + cnt * n].reshape(cnt, n)
            planes = seg.reshape(cnt, w, n)
            if n == 1 or ((orders is None or (orders[rows] < 2).all()) and not planes[:, :, 1:].any()):
                # Every integer after each chunk's first is zero (a constant series, or one sample):
                # each row is its first integer, decoded as below (a running sum or XOR of it and zeros).
                dest[:] = _first_ints(planes, w, orders is None)[:, None]
            else:
                _decode_rows(
                    _planes_to_ints(seg, w, cnt, n), w, dest, None if orders is None else orders[rows]
                )
            if grouped and uniform:
                out.reshape(k, n)[rows] = dest  # every chunk holds n integers: chunk i is row i
            elif grouped:
                for row, at_out in enumerate(starts[rows].tolist()):  # block copies beat a fancy index
                    out[at_out : at_out + n] = dest[row]
    return out


def _first_ints(planes: np.ndarray, w: int, is_xor: bool) -> np.ndarray:
    """The decoded first integer of each chunk in `planes` (chunks, bytes, integers) as int64."""
    u0 = _planes_to_ints(np.ascontiguousarray(planes[:, :, :1]).reshape(-1), w, planes.shape[0], 1)[:, 0]
    if is_xor:
        return u0.astype(np.uint64).view(np.int64)
    one = u0.dtype.type(1)
    return ((u0 >> one) ^ (u0.dtype.type(0) - (u0 & one))).view(f"<i{w}").astype(np.int64)


def _decode_rows(u: np.ndarray, w: int, dest: np.ndarray, orders: np.ndarray | None) -> None:
    """Decode unshuffled integers `u` (one chunk a row) into `dest`: zig-zag and `orders` running sums
    per row, or (`orders` None) a running XOR."""
    if orders is None:
        np.bitwise_xor.accumulate(u.astype(np.uint64), axis=1, out=dest.view(np.uint64))
        return
    one = u.dtype.type(1)
    z = ((u >> one) ^ (u.dtype.type(0) - (u & one))).view(f"<i{w}")
    np.cumsum(z, axis=1, dtype=np.int64, out=dest)  # sign-extends to int64 first
    twice = orders >= 2
    if twice.all():
        np.cumsum(dest, axis=1, out=dest)
    elif twice.any():
        dest[twice] = np.cumsum(dest[twice], axis=1)


def decode_times_many(blobs: Sequence[bytes | bytearray | memoryview], ns: np.ndarray) -> np.ndarray:
    """Decode the timestamps of many chunks (`ns[i]` in `blobs[i]`), concatenated."""
    ns = np.asarray(ns, dtype=np.int64)
    if not len(blobs):
        return np.zeros(0, np.int64)
    b = _Blobs(blobs)
    regular = b.buf[b.off] == 0
    out = np.empty(int(ns.sum()), np.int64)
    if regular.any():
        idx = np.flatnonzero(regular)
        first, step = b.field(b.off[idx] + 1, "<i8"), b.field(b.off[idx] + 9, "<i8")
        n_reg = ns[idx]
        change = np.flatnonzero((n_reg[1:] != n_reg[:-1]) | (step[1:] != step[:-1])) + 1
        with np.errstate(over="ignore"):  # wraps exactly as the encoder's difference did
            last = first + step * (n_reg - 1)
            # Chunks that go on where the one before ended, at its step, are one progression: first +
            # step * arange over all of them (a series' chunks; its last, often of one sample, whose
            # stored step is 0, takes the step before it).
            step_on = step[np.maximum.accumulate(np.where(n_reg > 1, np.arange(idx.size), 0))]
            joins = (
                np.flatnonzero((step_on[1:] != step_on[:-1]) | (first[1:] != last[:-1] + step_on[:-1])) + 1
            )
            if joins.size < change.size and joins.size <= _RUN_SLACK + idx.size // 8:
                d = np.empty(int(n_reg.sum()), np.int64)
                s = _starts(n_reg)
                begins = [0, *s[joins].tolist()]
                ends = [*begins[1:], d.size]
                for lo, at, end in zip([0, *joins.tolist()], begins, ends, strict=True):
                    np.add(np.arange(end - at, dtype=np.int64) * step_on[lo], first[lo], out=d[at:end])
            elif change.size <= _RUN_SLACK + idx.size // 8:
                # Runs of chunks with one size and step (a series' full chunks): first + step * arange.
                d = np.empty(int(n_reg.sum()), np.int64)
                s = _starts(n_reg)
                for lo, hi in zip([0, *change.tolist()], [*change.tolist(), idx.size], strict=True):
                    n = int(n_reg[lo])
                    rows = d[int(s[lo]) : int(s[lo]) + (hi - lo) * n].reshape(hi - lo, n)
                    np.add(first[lo:hi, None], np.arange(n, dtype=np.int64) * step[lo], out=rows)
            else:
                # Steps everywhere, and at each chunk's start the jump from where the previous one ended.
                d = np.repeat(step, n_reg)
                s = _starts(n_reg)
                d[0] = first[0]
                d[s[1:]] = first[1:] - last[:-1]
                np.cumsum(d, out=d)
        if regular.all():
            return d
        out[np.repeat(regular, ns)] = d
    idx = np.flatnonzero(~regular)
    n_irr = ns[idx]
    t = _decode_ints(b, idx, b.off[idx], n_irr, np.full(idx.size, 2))
    out[np.repeat(~regular, ns)] = t
    return out


def decode_values_many(blobs: Sequence[bytes | bytearray | memoryview], ns: np.ndarray) -> np.ndarray:
    """Decode the values of many chunks (`ns[i]` in `blobs[i]`), concatenated; bit-exact as `decode_values`."""
    ns = np.asarray(ns, dtype=np.int64)
    if not len(blobs):
        return np.zeros(0, np.float64)
    b = _Blobs(blobs)
    modes, decimals, orders = (b.buf[b.off + i].astype(np.int64) for i in range(3))
    n_bad = b.field(b.off + 3, "<u4").astype(np.int64)
    at = b.off + _HEADER.size + 12 * n_bad  # the packed integers follow the exceptions
    out = np.empty(int(ns.sum()), np.float64)
    xor = modes == _XOR
    for is_xor in (False, True):
        pick = xor if is_xor else ~xor
        if not pick.any():
            continue
        idx = np.flatnonzero(pick)
        n_sel = ns[idx]
        ints = _decode_ints(b, idx, at[idx], n_sel, None if is_xor else orders[idx])
        if is_xor:
            vals = ints.view(np.float64)
        else:
            dec = decimals[idx]
            if (dec == 0).all():
                vals = ints.astype(np.float64)  # x / 1.0 == x: skip the division
            elif (dec == dec[0]).all():
                vals = np.divide(ints, _POW10[int(dec[0])], dtype=np.float64)
            else:
                vals = np.divide(ints, np.repeat(np.array(_POW10)[dec], n_sel), dtype=np.float64)
        if pick.all():
            out = vals
        else:
            out[np.repeat(pick, ns)] = vals
    if n_bad.any():
        starts = _starts(ns)
        for i in np.flatnonzero(n_bad).tolist():
            pos, count = int(b.off[i]) + _HEADER.size, int(n_bad[i])
            bad = np.frombuffer(b.joined, dtype="<u4", count=count, offset=pos).astype(np.int64)
            out[starts[i] + bad] = np.frombuffer(b.joined, dtype="<f8", count=count, offset=pos + 4 * count)
    return out


def decode_chunks(
    ns: np.ndarray,
    ts: Sequence[bytes | bytearray | memoryview],
    vs: Sequence[bytes | bytearray | memoryview],
) -> tuple[np.ndarray, np.ndarray]:
    """Decode many chunks (`ns[i]` samples in `ts[i]`, `vs[i]`): concatenated timestamps and values."""
    return decode_times_many(ts, ns), decode_values_many(vs, ns)
