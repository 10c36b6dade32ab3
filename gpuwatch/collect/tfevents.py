"""TensorBoard event files (`events.out.tfevents.*`): split the records, check them, decode the events.

A file is a sequence of TFRecords: a little-endian uint64 length, the masked CRC-32C of those 8 bytes,
the data, and the masked CRC-32C of the data. Each record's data is an `Event` protobuf (wall time,
step, and a `Summary` of tagged values). The framing is read here with `struct`; the CRC-32C comes from
`google-crc32c` and the protobuf from tensorboardX's generated `event_pb2` with `protobuf` (the optional
extra `gpuwatch[tensorboard]`; `load_codec` says in one line when they are missing).

`split_records` works on bytes that start at a record boundary and stops before a record that is not
all there yet (a writer mid-write): the caller keeps the offset and reads from it again later. A record
whose data fails its checksum is skipped and counted; a header that fails its checksum (so its length
cannot be trusted) is skipped by looking for the next offset whose header checks out.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gpuwatch.core.errors import ConfigError

HEADER_BYTES = 12  # uint64 length + uint32 masked CRC of the length
FOOTER_BYTES = 4  # uint32 masked CRC of the data
MAX_RECORD_BYTES = 256 * 1024 * 1024  # a longer length is a corrupt header, whatever its checksum says
MISSING = (
    "reading TensorBoard event files needs tensorboardX and google-crc32c: "
    "pip install 'gpuwatch[tensorboard]'"
)

_LENGTH = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_KNOWN_PLUGINS = {"histograms": "histogram", "images": "image", "audio": "audio", "text": "text"}
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_STRING, _DT_INT64, _DT_HALF = 1, 2, 3, 7, 9, 19


class TensorBoardUnavailable(ConfigError):
    """tensorboardX, protobuf or google-crc32c is not installed."""


def masked_crc(crc32c: Callable[[bytes], int], data: bytes) -> int:
    """Return TFRecord's masked CRC-32C of `data`."""
    crc = crc32c(data) & 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class Scan(NamedTuple):
    """What `split_records` found: complete records' data, where the next read starts, records skipped."""

    records: list[bytes]
    end: int  # bytes of the buffer consumed: the offset of the first record not read yet
    skipped: int
    resyncing: bool  # in the middle of skipping a corrupt header: look for the next good one


def _header_ok(crc32c: Callable[[bytes], int], buf: bytes, p: int) -> bool:
    length, crc = _LENGTH.unpack_from(buf, p)
    return length <= MAX_RECORD_BYTES and masked_crc(crc32c, buf[p : p + 8]) == crc


def split_records(crc32c: Callable[[bytes], int], buf: bytes, *, resyncing: bool = False) -> Scan:
    """Split `buf` (starting at a record boundary, or mid-skip if `resyncing`) into checked records."""
    records: list[bytes] = []
    p = skipped = 0
    while len(buf) - p >= HEADER_BYTES:
        if resyncing or not _header_ok(crc32c, buf, p):
            q = p if resyncing else p + 1
            last = len(buf) - HEADER_BYTES
            while q <= last and not _header_ok(crc32c, buf, q):
                q += 1
            if not resyncing:
                skipped += 1
            if q > last:  # no good header in what is there yet: go on looking from here next time
                return Scan(records, last + 1, skipped, True)
            p, resyncing = q, False
        (length,) = struct.unpack_from("<Q", buf, p)
        need = HEADER_BYTES + length + FOOTER_BYTES
        if len(buf) - p < need:
            break  # half-written: wait for the rest
        data = buf[p + HEADER_BYTES : p + HEADER_BYTES + length]
        (crc,) = _CRC.unpack_from(buf, p + HEADER_BYTES + length)
        if masked_crc(crc32c, data) == crc:
            records.append(data)
        else:
            skipped += 1
        p += need
    return Scan(records, p, skipped, resyncing)


@dataclass(frozen=True)
class TbValue:
    """One tagged value of an event: `kind` is scalar, text, histogram, image, audio or other."""

    tag: str
    kind: str
    value: float = 0.0
    text: str = ""


@dataclass(frozen=True)
class TbEvent:
    """One decoded event: Unix seconds, step and its summary values (none for file-version events)."""

    wall_time: float
    step: int
    values: tuple[TbValue, ...]


class Codec:
    """The CRC-32C function and the Event decoder, from the optional libraries."""

    def __init__(self, crc32c: Callable[[bytes], int], event_type: Any) -> None:
        self.crc32c = crc32c
        self._event = event_type

    def split(self, buf: bytes, *, resyncing: bool = False) -> Scan:
        """`split_records` with this codec's CRC-32C."""
        return split_records(self.crc32c, buf, resyncing=resyncing)

    def starts_with_record(self, data: bytes) -> bool:
        """Return True if `data` begins with a record header that checks out (an event file's start)."""
        return len(data) >= HEADER_BYTES and _header_ok(self.crc32c, data, 0)

    def decode(self, data: bytes) -> TbEvent | None:
        """Decode one record's data; None if it is not an Event protobuf."""
        try:
            event = self._event.FromString(data)
        except Exception:  # noqa: BLE001 - protobuf's DecodeError, or anything a damaged message raises
            return None
        values = tuple(_value(v) for v in event.summary.value) if event.HasField("summary") else ()
        return TbEvent(float(event.wall_time), int(event.step), values)


def load_codec() -> Codec:
    """Import the optional libraries; raise TensorBoardUnavailable (one line) if they are missing."""
    try:
        import google_crc32c
        from tensorboardX.proto import event_pb2
    except ImportError:
        raise TensorBoardUnavailable(MISSING) from None

    def crc32c(data: bytes) -> int:
        return int(google_crc32c.value(data))

    return Codec(crc32c, event_pb2.Event)


def _value(v: Any) -> TbValue:
    which = v.WhichOneof("value")
    plugin = v.metadata.plugin_data.plugin_name if v.HasField("metadata") else ""
    if which == "simple_value":
        return TbValue(v.tag, "scalar", float(v.simple_value))
    if which == "histo":
        return TbValue(v.tag, "histogram")
    if which in ("image", "audio"):
        return TbValue(v.tag, which)
    if which != "tensor":
        return TbValue(v.tag, "other")
    if plugin in _KNOWN_PLUGINS:
        kind = _KNOWN_PLUGINS[plugin]
        if kind == "text":
            return TbValue(v.tag, "text", text=_strings(v.tensor))
        return TbValue(v.tag, kind)
    number = _single_number(v.tensor)
    if number is not None and plugin in ("scalars", ""):
        return TbValue(v.tag, "scalar", number)
    return TbValue(v.tag, "other")


def _strings(tensor: Any) -> str:
    return "\n".join(bytes(s).decode("utf-8", errors="replace") for s in tensor.string_val)


def _single_number(tensor: Any) -> float | None:
    """Return the value of a tensor holding one number (how TF 2 writes scalars), else None."""
    if any(d.size != 1 for d in tensor.tensor_shape.dim):
        return None
    dtype = int(tensor.dtype)
    lists = {_DT_FLOAT: tensor.float_val, _DT_DOUBLE: tensor.double_val, _DT_INT32: tensor.int_val}
    lists[_DT_INT64] = tensor.int64_val
    if dtype in lists and len(lists[dtype]) == 1:
        return float(lists[dtype][0])
    if dtype == _DT_HALF and len(tensor.half_val) == 1:  # half_val holds the 16 bits in an int
        return float(np.array([tensor.half_val[0]], np.uint16).view(np.float16)[0])
    raw = bytes(tensor.tensor_content)
    formats = {_DT_FLOAT: "<f", _DT_DOUBLE: "<d", _DT_INT32: "<i", _DT_INT64: "<q", _DT_HALF: "<e"}
    if dtype in formats and len(raw) == struct.calcsize(formats[dtype]):
        return float(struct.unpack(formats[dtype], raw)[0])
    return None
