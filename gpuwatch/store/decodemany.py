"""Decode many chunks at once (`decode_chunks`: reads, the chunk cache and rewrites fetch chunks by the
thousand), bit for bit as `codec.py`'s `decode_times` and `decode_values` decode them one by one.

The per-chunk work is only the header parse and decompression (zlib, or zstd for closed days' chunks:
codec.py); unshuffling, zig-zag and the (segmented) running sums run once over all of them, so a read
of thousands of small chunks (2 h of a 15 s series is 480 samples) costs numpy calls per query, not
per chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuwatch.store.codec import _HEADER, _MAX_DECIMALS, _SMALL, _XOR, ZSTD, inflate

_RUN_SLACK = 16  # `_unpack_many` groups equal chunks when there are more runs than this + 1/8 of them
_POW10 = [10.0**e for e in range(_MAX_DECIMALS + 1)]


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


def _inflate_all(
    mv: memoryview, heads: list[int], begins: list[int], ends: list[int]
) -> list[bytes | memoryview]:
    """Decompress each `mv[begin:end]` (zlib, or zstd: its width byte `head` says); small ones
    (constant chunks, which repeat) only once each."""
    seen: dict[memoryview, bytes | memoryview] = {}
    out = []
    for head, a, e in zip(heads, begins, ends, strict=True):
        part = mv[a:e]
        if e - a > _SMALL:
            out.append(inflate(head, part))
            continue
        raw = seen.get(part)
        if raw is None:
            raw = seen[part] = inflate(head, part)
        out.append(raw)
    return out


def _decode_ints(
    blobs: _Blobs, pick: np.ndarray, at: np.ndarray, ns: np.ndarray, orders: np.ndarray | None
) -> np.ndarray:
    """Decode the packed integers of blobs `pick` (packed part from byte `at` of each) into one int64
    array, in order: zig-zag and `orders` rounds of running sums per chunk, or (`orders` None) a running
    XOR of the raw integers."""
    k = pick.size
    heads = blobs.buf[at].astype(np.int64)
    widths = np.where(heads > ZSTD, heads - ZSTD, heads)
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
    raw = np.frombuffer(b"".join(_inflate_all(mv, heads[order].tolist(), a_s, e_s)), np.uint8)
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
