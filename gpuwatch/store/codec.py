"""Encode one series' timestamps and values into compact chunk blobs, and back.

Both encoders end the same way: integers are zig-zagged, narrowed to the fewest bytes that hold the
largest one, byte-shuffled (all first bytes, then all second bytes, ...) and zlib-compressed. Runs of
equal small numbers, which is what regular timestamps and slowly moving gauges become, compress to
almost nothing that way.

- Timestamps are stored as deltas of deltas: a regular 1 s scrape is a run of zeros.
- Values are tried as decimals first (ALP-like): the smallest exponent e in 0..6 for which most
  values v satisfy `rint(v * 10**e) / 10**e == v` bit for bit. Those integers are stored as deltas, or
  deltas of deltas for steadily rising counters, whichever is narrower. Values that do not fit (NaN
  payloads such as Prometheus's staleness marker, +-Inf, -0.0, odd fractions) are stored verbatim as
  exceptions, so every float64 bit pattern round-trips.
- Otherwise values are XORed with their predecessor (as Gorilla does) and compressed the same way.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

_LEVEL = 6
_MAX_EXACT = float(2**53)
_MAX_DECIMALS = 6
_EXCEPTION_SHARE = 0.1
_DECIMAL = 1
_XOR = 2
_HEADER = struct.Struct("<BBBI")  # mode, decimals, delta order, exception count


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
    """Encode int64 millisecond timestamps as compressed deltas of deltas."""
    return _pack_unsigned(_zigzag(_diff(t_ms.astype(np.int64, copy=False), 2)))


def decode_times(blob: bytes | memoryview, n: int) -> np.ndarray:
    """Decode `n` timestamps written by `encode_times`."""
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
