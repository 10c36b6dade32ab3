"""Prometheus remote-write 1.0 on the wire: a protobuf `WriteRequest` in snappy's block format.

    message WriteRequest { repeated TimeSeries timeseries = 1; repeated MetricMetadata metadata = 3; }
    message TimeSeries   { repeated Label labels = 1; repeated Sample samples = 2;
                           repeated Exemplar exemplars = 3; repeated Histogram histograms = 4; }
    message Label        { string name = 1; string value = 2; }
    message Sample       { double value = 1; int64 timestamp = 2; }   // milliseconds

The protobuf is read and written here by hand (five message types, three wire types), strictly: a
truncated varint, a length past the end, a wire type a field cannot have or invalid UTF-8 is a
`WireError` naming the offset, never an exception of another kind. Unknown fields are skipped, as
protobuf readers do; exemplars and metadata are skipped; native histograms are counted so the receiver
can refuse their series. Snappy is cramjam's; its block header (the uncompressed length) is read first,
so a small body that claims to inflate past the cap is refused before anything is allocated.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import cramjam

CONTENT_TYPE = "application/x-protobuf"
HEADERS = {
    "Content-Type": CONTENT_TYPE,
    "Content-Encoding": "snappy",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
}

_DOUBLE = struct.Struct("<d")
LABEL_CACHE_SIZE = 250_000  # label runs (series) remembered between requests: a 4,000-GPU lab has 100,000
Labels = tuple[tuple[str, str], ...]
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class WireError(ValueError):
    """A body that is not a valid snappy-compressed remote-write request."""


class TimeSeries(NamedTuple):
    """One series of a request: its label pairs as sent (`__name__` among them) and its samples."""

    labels: tuple[tuple[str, str], ...]
    timestamps_ms: tuple[int, ...]
    values: tuple[float, ...]
    histograms: int = 0  # native histogram samples (not stored by gpuwatch)


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise WireError(f"truncated varint at byte {pos}")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise WireError(f"varint longer than 10 bytes at byte {pos}")


def _skip(buf: bytes, pos: int, end: int, wire: int) -> int:
    if wire == _VARINT:
        return _varint(buf, pos, end)[1]
    if wire == _I64:
        pos += 8
    elif wire == _I32:
        pos += 4
    elif wire == _LEN:
        size, pos = _varint(buf, pos, end)
        pos += size
    else:
        raise WireError(f"unsupported wire type {wire} at byte {pos}")
    if pos > end:
        raise WireError(f"field runs past the end of its message at byte {end}")
    return pos


def _length(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    size, pos = _varint(buf, pos, end)
    if pos + size > end:
        raise WireError(f"length {size} at byte {pos} runs past the end of its message")
    return pos + size, pos


def _text(buf: bytes, start: int, stop: int) -> str:
    try:
        return buf[start:stop].decode("utf-8")
    except UnicodeDecodeError:
        raise WireError(f"label text at byte {start} is not UTF-8") from None


def _label(buf: bytes, pos: int, end: int) -> tuple[str, str]:
    name = value = ""
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if field in (1, 2) and wire == _LEN:
            stop, start = _length(buf, pos, end)
            if field == 1:
                name = _text(buf, start, stop)
            else:
                value = _text(buf, start, stop)
            pos = stop
        elif field in (1, 2):
            raise WireError(f"Label field {field} with wire type {wire} at byte {pos}")
        else:
            pos = _skip(buf, pos, end, wire)
    return name, value


def label_run(buf: bytes, start: int, stop: int) -> Labels:
    """The pairs of a run of `Label` fields at [start, stop) of a `TimeSeries`; WireError where the run
    holds anything else."""
    pairs = []
    pos = start
    while pos < stop:
        key, pos = _varint(buf, pos, stop)
        if key != 1 << 3 | _LEN:
            raise WireError(f"not a Label field at byte {pos}")
        end, begin = _length(buf, pos, stop)
        pairs.append(_label(buf, begin, end))
        pos = end
    return tuple(pairs)


def _sample(buf: bytes, pos: int, end: int) -> tuple[int, float]:
    if end - pos >= 11 and buf[pos] == 0x09 and buf[pos + 9] == 0x10:  # value, then time: every sender
        raw, stop = _varint(buf, pos + 10, end)
        if stop == end:
            return (raw - (1 << 64) if raw >= 1 << 63 else raw), _DOUBLE.unpack_from(buf, pos + 1)[0]
    value, ts = 0.0, 0
    while pos < end:
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if field == 1 and wire == _I64:
            if pos + 8 > end:
                raise WireError(f"truncated double at byte {pos}")
            value = _DOUBLE.unpack_from(buf, pos)[0]
            pos += 8
        elif field == 2 and wire == _VARINT:
            raw, pos = _varint(buf, pos, end)
            ts = raw - (1 << 64) if raw >= 1 << 63 else raw  # int64, two's complement
        elif field in (1, 2):
            raise WireError(f"Sample field {field} with wire type {wire} at byte {pos}")
        else:
            pos = _skip(buf, pos, end, wire)
    return ts, value


def _labels(buf: bytes, spans: list[tuple[int, int]], cache: dict[bytes, Labels] | None) -> Labels:
    """The label pairs at `spans`; a run of labels seen before (the same series, the next batch) is
    looked up by its bytes instead of read again."""
    if cache is None or not spans:
        return tuple(_label(buf, start, stop) for start, stop in spans)
    key = buf[spans[0][0] : spans[-1][1]]
    found = cache.get(key)
    if found is None:
        found = tuple(_label(buf, start, stop) for start, stop in spans)
        if len(cache) >= LABEL_CACHE_SIZE:
            cache.clear()  # a bound; the next batches fill it again with what is current
        cache[key] = found
    return found


def _fast_series(buf: bytes, pos: int, end: int, cache: dict[bytes, Labels]) -> TimeSeries | None:
    """The common shape, read with index arithmetic: a run of labels, then samples `value, time`, each
    message shorter than 128 bytes. None where the series has another shape (`_series` reads it)."""
    p = pos
    while p + 1 < end and buf[p] == 0x0A and buf[p + 1] < 0x80:
        p += 2 + buf[p + 1]
    if p == pos or p > end:
        return None
    run = buf[pos:p]
    labels = cache.get(run)
    times: list[int] = []
    values: list[float] = []
    unpack = _DOUBLE.unpack_from
    while p < end:
        size = buf[p + 1] if p + 1 < end else 0x80
        start, stop = p + 2, p + 2 + size
        if (
            buf[p] != 0x12
            or size >= 0x80
            or size < 11
            or stop > end
            or buf[start] != 0x09
            or buf[start + 9] != 0x10
        ):
            return None
        q, raw, shift = start + 10, 0, 0
        while q < stop:
            byte = buf[q]
            raw |= (byte & 0x7F) << shift
            shift += 7
            q += 1
            if byte < 0x80:
                break
        if q != stop or buf[q - 1] >= 0x80 or shift > 70:
            return None
        times.append(raw - (1 << 64) if raw >= 1 << 63 else raw)
        values.append(unpack(buf, start + 1)[0])
        p = stop
    if labels is None:
        spans = []
        q = pos
        while q < pos + len(run):
            spans.append((q + 2, q + 2 + buf[q + 1]))
            q += 2 + buf[q + 1]
        labels = _labels(buf, spans, None)
        if len(cache) >= LABEL_CACHE_SIZE:
            cache.clear()
        cache[run] = labels
    return TimeSeries(labels, tuple(times), tuple(values))


def _series(buf: bytes, pos: int, end: int, cache: dict[bytes, Labels] | None) -> TimeSeries:
    if cache is not None:
        fast = _fast_series(buf, pos, end, cache)
        if fast is not None:
            return fast
    spans: list[tuple[int, int]] = []
    times: list[int] = []
    values: list[float] = []
    histograms = 0
    contiguous, last_stop = True, -1
    while pos < end:
        at = pos
        key, pos = _varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if field in (1, 2, 4) and wire != _LEN:
            raise WireError(f"TimeSeries field {field} with wire type {wire} at byte {pos}")
        if field == 1:
            stop, start = _length(buf, pos, end)
            contiguous = contiguous and last_stop in (-1, at)  # the cache key is the run's bytes
            spans.append((start, stop))
            last_stop = stop
            pos = stop
        elif field == 2:
            stop, start = _length(buf, pos, end)
            ts, value = _sample(buf, start, stop)
            times.append(ts)
            values.append(value)
            pos = stop
        elif field == 4:
            histograms += 1
            pos = _skip(buf, pos, end, wire)
        else:  # exemplars (3) and anything newer
            pos = _skip(buf, pos, end, wire)
    labels = _labels(buf, spans, cache if contiguous else None)
    return TimeSeries(labels, tuple(times), tuple(values), histograms)


def decode_request(body: bytes, cache: dict[bytes, Labels] | None = None) -> list[TimeSeries]:
    """The time series of an uncompressed `WriteRequest`. `cache`: label runs already read (bytes ->
    pairs), kept by the caller between requests; a sender writes the same series every few seconds."""
    out: list[TimeSeries] = []
    pos, end = 0, len(body)
    while pos < end:
        key, pos = _varint(body, pos, end)
        field, wire = key >> 3, key & 7
        if field == 1:
            if wire != _LEN:
                raise WireError(f"WriteRequest field 1 with wire type {wire} at byte {pos}")
            stop, start = _length(body, pos, end)
            out.append(_series(body, start, stop, cache))
            pos = stop
        else:  # metadata (3) and anything newer
            pos = _skip(body, pos, end, wire)
    return out


def uncompressed_length(body: bytes) -> int:
    """The length snappy's block header says `body` inflates to."""
    return _varint(body, 0, min(len(body), 10))[0]


def decompress(body: bytes, max_bytes: int) -> bytes:
    """Inflate a snappy block; WireError when it is not one or would exceed `max_bytes`."""
    size = uncompressed_length(body)
    if size > max_bytes:
        raise WireError(f"the body inflates to {size} bytes, more than {max_bytes}")
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise WireError(f"not a snappy block: {exc}") from None


def compress(body: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(body))


# -- writing (the sender's side, and the tests') ---------------------------------------------------


def _put_varint(out: bytearray, n: int) -> None:
    n &= (1 << 64) - 1
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _put_len(out: bytearray, field: int, payload: bytes) -> None:
    _put_varint(out, field << 3 | _LEN)
    _put_varint(out, len(payload))
    out += payload


def encode_labels(labels: Iterable[tuple[str, str]]) -> bytes:
    """The `labels` fields of a `TimeSeries` message, in the order given."""
    out = bytearray()
    for name, text in labels:
        label = bytearray()
        _put_len(label, 1, name.encode())
        _put_len(label, 2, text.encode())
        _put_len(out, 1, bytes(label))
    return bytes(out)


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    _put_varint(out, n)
    return bytes(out)


def encode_samples(timestamps_ms: Sequence[int], values: Sequence[float]) -> bytes:
    """The `samples` fields of a `TimeSeries` message. A sample is at most 20 bytes (a one-byte
    length), and the series of one scrape share their timestamp: its varint is made once."""
    out = bytearray()
    pack = _DOUBLE.pack
    stamps: dict[int, bytes] = {}
    for ts, value in zip(timestamps_ms, values, strict=True):
        tail = stamps.get(ts)
        if tail is None:
            tail = stamps[ts] = b"\x10" + _varint_bytes(ts)  # field 2, varint
        body = b"\x09" + pack(value) + tail  # field 1, wire type 1 (fixed64)
        out += b"\x12" + bytes((len(body),)) + body  # TimeSeries field 2, length-delimited
    return bytes(out)


def encode_series(
    labels: Iterable[tuple[str, str]], timestamps_ms: Sequence[int], values: Sequence[float]
) -> bytes:
    """One `TimeSeries` message, labels and samples in the order given."""
    return encode_labels(labels) + encode_samples(timestamps_ms, values)


def encode_request(series: Iterable[bytes]) -> bytes:
    """A `WriteRequest` of already encoded `TimeSeries` messages (uncompressed)."""
    out = bytearray()
    for message in series:
        _put_len(out, 1, message)
    return bytes(out)
