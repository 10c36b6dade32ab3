"""Encode one series' timestamps and values into compact chunk blobs, and back.

Both encoders end the same way: integers are zig-zagged, narrowed to the fewest bytes that hold the
largest one, byte-shuffled (all first bytes, then all second bytes, ...) and compressed. Runs of
equal small numbers, which is what regular timestamps and slowly moving gauges become, compress to
almost nothing that way.

- Compression: zlib (level 6) for the 2-hour chunks written as samples come in (fast to write), zstd
  (level 15) with `zstd=True`, for the chunks of a closed day, written once (rewrite.py's day merge and
  retention's trim): 0.678 -> 0.651 bytes a sample on bench_bytes' data. The packed part's first byte
  is its width (1, 2, 4 or 8) for zlib, the width + 0x10 for zstd; decoders read both, so blobs written
  before zstd decode unchanged.

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

Reads decode many chunks at once (`decodemany.py`); this module decodes one at a time.
"""

from __future__ import annotations

import struct
import zlib

import cramjam
import numpy as np

_LEVEL = 6
_ZSTD_LEVEL = 15
ZSTD = 0x10  # added to the width byte of a zstd-compressed packed part (widths are 1..8)
_MAX_EXACT = float(2**53)
_MAX_DECIMALS = 6
_EXCEPTION_SHARE = 0.1
_DECIMAL = 1
_XOR = 2
_HEADER = struct.Struct("<BBBI")  # mode, decimals, delta order, exception count
_REGULAR = struct.Struct("<Bqq")  # 0 (where other blobs have their width), first timestamp, step
_I8 = struct.Struct("<q")
_SMALL = 64  # packed parts up to this many bytes are decompressed once per distinct content


def _zigzag(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.int64, copy=False)
    return ((x << np.int64(1)) ^ (x >> np.int64(63))).view(np.uint64)


def _unzigzag(u: np.ndarray) -> np.ndarray:
    return ((u >> np.uint64(1)) ^ (np.uint64(0) - (u & np.uint64(1)))).view(np.int64)


def _compress(raw: bytes, width: int, zstd: bool) -> bytes:
    """The packed part of `raw` (shuffled integers `width` bytes wide): its width byte, compressed."""
    if zstd:
        return bytes([width + ZSTD]) + bytes(cramjam.zstd.compress(raw, level=_ZSTD_LEVEL))
    return bytes([width]) + zlib.compress(raw, _LEVEL)


def inflate(head: int, body: bytes | memoryview) -> bytes | memoryview:
    """The shuffled bytes of a packed part whose width byte is `head` and compressed bytes `body`."""
    if head > ZSTD:
        return memoryview(cramjam.zstd.decompress(body))
    return zlib.decompress(body)


def _pack_unsigned(u: np.ndarray, zstd: bool = False) -> bytes:
    """Narrow, byte-shuffle and compress unsigned 64-bit integers (zlib, or `zstd`)."""
    top = int(u.max()) if u.size else 0
    width = 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8
    narrow = u.astype(f"<u{width}", copy=False)
    planes = narrow.view(np.uint8).reshape(-1, width).T
    return _compress(np.ascontiguousarray(planes).tobytes(), width, zstd)


def _unpack_unsigned(blob: bytes | memoryview, n: int) -> np.ndarray:
    head = blob[0]
    width = head - ZSTD if head > ZSTD else head
    planes = np.frombuffer(inflate(head, memoryview(blob)[1:]), dtype=np.uint8).reshape(width, n)
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


def encode_times(t_ms: np.ndarray, zstd: bool = False) -> bytes:
    """Encode int64 millisecond timestamps: first and step if regular, else compressed deltas of deltas
    (zlib, or `zstd`)."""
    t = t_ms.astype(np.int64, copy=False)
    if t.size:
        with np.errstate(over="ignore"):
            step = t[1] - t[0] if t.size > 1 else np.int64(0)
            if t.size <= 2 or bool(np.all(np.diff(t) == step)):
                return _REGULAR.pack(0, int(t[0]), int(step))
    return _pack_unsigned(_zigzag(_diff(t, 2)), zstd)


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


def encode_values(v: np.ndarray, zstd: bool = False) -> bytes:
    """Encode float64 values so that every bit pattern (NaN payloads included) round-trips (zlib, or
    `zstd`)."""
    v = np.ascontiguousarray(v, dtype=np.float64)
    fit = _decimal_fit(v) if v.size else (0, np.zeros(0, np.int64), np.zeros(0, bool))
    if fit is None:
        bits = v.view(np.int64)
        xored = bits ^ np.concatenate(([np.int64(0)], bits[:-1]))
        return _HEADER.pack(_XOR, 0, 0, 0) + _pack_unsigned(xored.view(np.uint64), zstd)
    decimals, ints, ok = fit
    ints = _fill_forward(ints, ok)
    d1 = _diff(ints, 1)
    d2 = _diff(d1, 1)
    order = 2 if _cost(d2) < _cost(d1) else 1
    packed = _pack_unsigned(_zigzag(d1 if order == 1 else d2), zstd)
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
# only the compression and the header stay per chunk. The bytes are the same as chunk by chunk.


def _pack_unsigned_rows(u: np.ndarray, zstd: bool = False) -> list[bytes]:
    """`_pack_unsigned` of each row of the 2-D uint64 array `u`."""
    k, n = u.shape
    out: list[bytes] = [b""] * k
    if not k:
        return out
    top = u.max(axis=1) if n else np.zeros(k, np.uint64)
    widths = np.where(top < 1 << 8, 1, np.where(top < 1 << 16, 2, np.where(top < 1 << 32, 4, 8)))
    for width in np.unique(widths).tolist():
        rows = np.flatnonzero(widths == width)
        part = u if rows.size == k else u[rows]
        narrow = part.astype(f"<u{width}")
        shuffled = np.ascontiguousarray(narrow.view(np.uint8).reshape(rows.size, n, width).transpose(0, 2, 1))
        joined = shuffled.tobytes()
        size = width * n
        if size > _SMALL:
            for i, row in enumerate(rows.tolist()):
                out[row] = _compress(joined[i * size : (i + 1) * size], width, zstd)
            continue
        seen: dict[bytes, bytes] = {}  # short rows repeat (constant series): compress each content once
        for i, row in enumerate(rows.tolist()):
            raw = joined[i * size : (i + 1) * size]
            blob = seen.get(raw)
            if blob is None:
                blob = seen[raw] = _compress(raw, width, zstd)
            out[row] = blob
    return out


def encode_times_rows(t_ms: np.ndarray, zstd: bool = False) -> list[bytes]:
    """`encode_times` of each row of a 2-D int64 array (one chunk a row, all of one length)."""
    t = np.ascontiguousarray(t_ms, dtype=np.int64)
    k, n = t.shape
    out: list[bytes] = [b""] * k
    if not k or not n:
        return [encode_times(row, zstd) for row in t]
    with np.errstate(over="ignore"):
        d = np.diff(t, axis=1)
        step = d[:, 0] if n > 1 else np.zeros(k, np.int64)
        regular = np.ones(k, bool) if n <= 2 else (d == step[:, None]).all(axis=1)
        irregular = np.flatnonzero(~regular)
        if irregular.size:
            dd = np.diff(t[irregular], axis=1, prepend=np.int64(0))
            dd = np.diff(dd, axis=1, prepend=np.int64(0))
            for row, blob in zip(irregular.tolist(), _pack_unsigned_rows(_zigzag(dd), zstd), strict=True):
                out[row] = blob
    pack = _REGULAR.pack
    for row, t0, st in zip(
        np.flatnonzero(regular).tolist(), t[regular, 0].tolist(), step[regular].tolist(), strict=True
    ):
        out[row] = pack(0, t0, st)
    return out


def encode_values_rows(v: np.ndarray, zstd: bool = False) -> list[bytes]:
    """`encode_values` of each row of a 2-D float64 array (one chunk a row, all of one length)."""
    v = np.ascontiguousarray(v, dtype=np.float64)
    k, n = v.shape
    out: list[bytes] = [b""] * k
    if not k or not n:
        return [encode_values(row, zstd) for row in v]
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
        for row, blob in zip(
            xor_rows.tolist(), _pack_unsigned_rows(xored.view(np.uint64), zstd), strict=True
        ):
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
    packed = _pack_unsigned_rows(_zigzag(np.where(second[:, None], d2, d1)), zstd)
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


# -- columns of one row, for a caller that compresses them together (tierrows.py) -------------------
# A column is a 4-byte header (kind, decimals, delta order, width) and its integers narrowed to
# `width` bytes and byte-shuffled, uncompressed: the caller compresses a row's columns as one. Floats
# are stored as decimals where most are within a few units in the last place of one (sums of
# decimals are: the units off are a column of their own, mostly zeros; an exception list, as in
# `encode_values`, keeps the others bit for bit), else as their bits. A column's size follows from its
# header (and a decimal column's exception count): `column_end` steps over one a reader does not need.

_COLUMN = struct.Struct("<BBBB")
_COL_INT, _COL_DECIMAL, _COL_BITS = 0, 1, 2
_DECIMAL_EXTRA = struct.Struct("<IB")  # exceptions, width of the units-off column (0: all on)
_MAX_ULPS = 1 << 10  # a decimal column's value may be this many units in the last place off


def _shuffle(u: np.ndarray) -> tuple[int, bytes]:
    top = int(u.max()) if u.size else 0
    width = 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4 if top < 1 << 32 else 8
    planes = u.astype(f"<u{width}", copy=False).view(np.uint8).reshape(-1, width).T
    return width, np.ascontiguousarray(planes).tobytes()


def _unshuffled(buf: bytes, pos: int, n: int, width: int) -> np.ndarray:
    """The `n` unsigned integers of `width` bytes at `pos` (byte planes), as that width: a view of
    `buf` for one byte, else a copy put together plane by plane (cheaper than a transposed copy of
    the planes at widths 2 and 4, where numpy copies a byte at a time)."""
    if width == 1:
        return np.frombuffer(buf, np.uint8, count=n, offset=pos)
    planes = np.frombuffer(buf, np.uint8, count=width * n, offset=pos).reshape(width, n)
    out = np.empty((n, width), np.uint8)
    if width == 8:
        np.copyto(out.T, planes)
    else:
        for k in range(width):
            out[:, k] = planes[k]
    return out.view(f"<u{width}").reshape(n)


def _unzigzag_narrow(u: np.ndarray) -> np.ndarray:
    """`_unzigzag` in the integers' own width (a zig-zagged value below 2**(8w) is a signed w-byte
    one), as signed integers of that width: two temporaries of w bytes a value, not four of 8."""
    sign = u & 1
    np.negative(sign, out=sign)
    half = u >> 1
    np.bitwise_xor(half, sign, out=half)
    return half.view(f"<i{u.dtype.itemsize}")


def _pack_deltas(d: np.ndarray, order: int) -> tuple[int, bytes]:
    """Differences of order `order`: the first `order` (large: the column's start) as int64, the
    rest narrowed and shuffled; (width, bytes)."""
    width, body = _shuffle(_zigzag(d[order:]))
    return width, d[:order].astype("<i8").tobytes() + body


def _unpack_deltas(buf: bytes, pos: int, n: int, width: int, order: int) -> tuple[np.ndarray, int]:
    lead = min(order, n)
    x = np.empty(n, np.int64)
    for i in range(lead):  # (scalars: cheaper than an array of one or two)
        x[i] = _I8.unpack_from(buf, pos)[0]
        pos += 8
    x[lead:] = _unzigzag_narrow(_unshuffled(buf, pos, n - lead, width))  # (widened, sign and all)
    for _ in range(order):  # in place; int64 sums wrap as the differences did, arrays do not warn
        np.add.accumulate(x, out=x)
    return x, pos + width * (n - lead)


def _deltas_size(n: int, width: int, order: int) -> int:
    lead = min(order, n)
    return 8 * lead + width * (n - lead)


def _narrowest(x: np.ndarray) -> tuple[int, np.ndarray]:
    """The delta order (0-2) whose differences of `x` are smallest, and those differences."""
    best = (0, x)
    cost = _cost(np.r_[np.int64(0), x])
    for order in (1, 2):
        d = _diff(x, order)
        c = _cost(np.r_[np.int64(0), d])
        if c < cost:
            best, cost = (order, d), c
    return best


def pack_int_column(x: np.ndarray) -> bytes:
    """One int64 column (module note above)."""
    order, d = _narrowest(x.astype(np.int64, copy=False))
    width, body = _pack_deltas(d, order)
    return _COLUMN.pack(_COL_INT, 0, order, width) + body


def _decimal_ulps(v: np.ndarray) -> tuple[int, np.ndarray, np.ndarray, np.ndarray] | None:
    """As `_decimal_fit`, but a value may lie a few units in the last place off its decimal (a sum
    of decimals, as the tiers' are): the smallest exponent for which most values do, the integers,
    the units off (`bits(v) - bits(int / 10**e)`) and which values fit."""
    bits = v.view(np.int64)
    with np.errstate(invalid="ignore", over="ignore"):
        for e in range(_MAX_DECIMALS + 1):
            scale = 10.0**e
            scaled = np.rint(v * scale)
            ints = np.where(np.abs(scaled) < _MAX_EXACT, scaled, 0.0).astype(np.int64)
            off = bits - (ints.astype(np.float64) / scale).view(np.int64)
            ok = (np.abs(off) <= _MAX_ULPS) & np.isfinite(v) & (np.abs(scaled) < _MAX_EXACT)
            if ok.sum() >= (1.0 - _EXCEPTION_SHARE) * v.size:
                return e, ints, np.where(ok, off, 0), ok
    return None


def pack_float_column(v: np.ndarray) -> bytes:
    """One float64 column, every bit pattern kept (module note above)."""
    v = np.ascontiguousarray(v, dtype=np.float64)
    fit = _decimal_ulps(v) if v.size else None
    if fit is None:
        width, body = _shuffle(v.view(np.uint64))
        return _COLUMN.pack(_COL_BITS, 0, 0, width) + body
    decimals, ints, off, ok = fit
    order, d = _narrowest(_fill_forward(ints, ok))
    width, body = _pack_deltas(d, order)
    bad = np.flatnonzero(~ok).astype("<u4")
    off_width, off_body = _shuffle(_zigzag(off)) if off.any() else (0, b"")
    extra = _DECIMAL_EXTRA.pack(bad.size, off_width) + bad.tobytes() + v[bad].astype("<f8").tobytes()
    return _COLUMN.pack(_COL_DECIMAL, decimals, order, width) + extra + off_body + body


def unpack_column(buf: bytes, pos: int, n: int) -> tuple[np.ndarray, int]:
    """The `n` values of the column at `pos` of `buf` (int64 or float64, as packed; arrays of their
    own), and the position after it."""
    kind, decimals, order, width = _COLUMN.unpack_from(buf, pos)
    pos += _COLUMN.size
    if kind == _COL_BITS:
        bits = _unshuffled(buf, pos, n, width)
        return (bits if width == 8 else bits.astype(np.uint64)).view(np.float64), pos + width * n
    if kind == _COL_INT:
        return _unpack_deltas(buf, pos, n, width, order)
    n_bad, off_width = _DECIMAL_EXTRA.unpack_from(buf, pos)
    pos += _DECIMAL_EXTRA.size
    bad_at = pos
    pos += 12 * n_bad
    off_at = pos
    pos += off_width * n
    ints, end = _unpack_deltas(buf, pos, n, width, order)
    values = ints / 10.0**decimals if decimals else ints.astype(np.float64)  # (int to float, then divided)
    if off_width:
        bits = values.view(np.int64)
        np.add(bits, _unzigzag_narrow(_unshuffled(buf, off_at, n, off_width)), out=bits)
    if n_bad:
        bad = np.frombuffer(buf, "<u4", count=n_bad, offset=bad_at)
        values[bad] = np.frombuffer(buf, "<f8", count=n_bad, offset=bad_at + 4 * n_bad)
    return values, end


def column_end(buf: bytes, pos: int, n: int) -> int:
    """The position after the column of `n` values at `pos` of `buf`, from its header alone: skips a
    column without decoding it."""
    kind, _, order, width = _COLUMN.unpack_from(buf, pos)
    pos += _COLUMN.size
    if kind == _COL_BITS:
        return pos + width * n
    if kind == _COL_DECIMAL:
        n_bad, off_width = _DECIMAL_EXTRA.unpack_from(buf, pos)
        pos += _DECIMAL_EXTRA.size + 12 * n_bad + off_width * n
    return pos + _deltas_size(n, width, order)
