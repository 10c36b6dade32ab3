"""Query results (scalar, string, instant vector, matrix) and their Prometheus JSON form."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np

_orjson: Any
try:  # formats floats ~5x faster than `repr` (shortest round-trip digits, the same text where both are plain)
    import orjson as _orjson
except ImportError:  # pragma: no cover - a declared dependency; without it values go through `repr`
    _orjson = None


@dataclass(frozen=True)
class Scalar:
    """A single number at the evaluation time."""

    time_ms: int
    value: float


@dataclass(frozen=True)
class String:
    """A string literal at the evaluation time."""

    time_ms: int
    value: str


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector; `labels` include `__name__` where kept."""

    labels: dict[str, str]
    time_ms: int
    value: float


@dataclass(frozen=True)
class Vector:
    """An instant vector, in the order the engine produced it."""

    samples: list[Sample] = field(default_factory=list)

    def __iter__(self) -> Iterator[Sample]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)


@dataclass(frozen=True)
class Series:
    """One series of a matrix: int64 millisecond timestamps and float64 values."""

    labels: dict[str, str]
    timestamps_ms: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class Matrix:
    """A range vector or a range-query result, series sorted by label set."""

    series: list[Series] = field(default_factory=list)

    def __iter__(self) -> Iterator[Series]:
        return iter(self.series)

    def __len__(self) -> int:
        return len(self.series)


Result = Scalar | String | Vector | Matrix


def format_value(value: float) -> str:
    """Format `value` as Go's strconv.FormatFloat(v, 'f', -1, 64) does."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    text = format(Decimal(repr(float(value))), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def format_json_value(value: float) -> str:
    """Format a sample value as Prometheus's HTTP API writes it: Go's 'f' format, but 'e' where
    |value| < 1e-6 or >= 1e21 (`1e+21`, `1.5e-07`, as jsoniter's float encoding Prometheus uses)."""
    a = abs(value)
    if a != 0 and (a < 1e-6 or a >= 1e21) and not math.isinf(a):
        return repr(float(value))  # Python's shortest digits, exponent with a sign and 2+ digits: Go's 'e'
    return format_value(value)


def _format_one(value: float) -> str:
    text = repr(value)
    if "e" in text or "n" in text:  # exponent, nan, inf
        return format_json_value(value)
    return text[:-2] if text.endswith(".0") else text


def format_values(values: np.ndarray) -> list[str]:
    """`format_json_value` of each value, fast: `repr` is the same text wherever it has no exponent."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        a = np.abs(v)
        plain = (a >= 1e-3) & (a < 1e15)  # repr writes these without an exponent
        zero = (v == 0) & ~np.signbit(v)  # "0" (Go writes -0 as "-0", handled below)
        integral = (plain & (v == np.trunc(v))) | zero  # repr writes these with a ".0" that Go leaves out
        nan = np.isnan(v)
    if integral.all():
        return list(map(str, v.astype(np.int64).tolist()))
    if _orjson is not None:
        out = _fast_reprs(v)
    else:  # pragma: no cover - orjson is a declared dependency
        out = list(map(float.__repr__, v.tolist()))
        for i in np.flatnonzero(integral).tolist():
            out[i] = out[i][:-2]
    if nan.any():
        for i in np.flatnonzero(nan).tolist():
            out[i] = "NaN"
    other = ~(plain | zero | nan)
    if other.any():
        for i in np.flatnonzero(other).tolist():
            out[i] = _format_one(float(v[i]))
    return out


def _fast_reprs(v: np.ndarray) -> list[str]:
    """`repr` of each float64 in `v` without the ".0" of whole numbers, exact wherever `repr` writes no
    exponent (1e-3 <= |v| < 1e15, or 0): orjson's shortest round-trip digits are the same there (it
    writes other values differently: `1e-5`, `null`; `format_values` replaces those). Shortest digits
    never end in a 0 after the point, so ".0," only ever ends a whole number."""
    text = _orjson.dumps(np.ascontiguousarray(v), option=_orjson.OPT_SERIALIZE_NUMPY).decode("ascii")
    return (text[1:-1] + ",").replace(".0,", ",")[:-1].split(",")


def format_times(times_ms: np.ndarray) -> list[str]:
    """The JSON text of `format_time` of each millisecond timestamp."""
    return _times_text(np.asarray(times_ms, dtype=np.int64)).split(",") if len(times_ms) else []


def _times_text(t: np.ndarray) -> str:
    """The JSON texts of `format_time` of each of `t` (int64 ms, not empty), joined by commas."""
    if not (t % 1000).any():
        if _orjson is not None:
            return _orjson.dumps(t // 1000, option=_orjson.OPT_SERIALIZE_NUMPY).decode("ascii")[1:-1]
        return ",".join(map(str, (t // 1000).tolist()))
    return ",".join(json.dumps(format_time(x)) for x in t.tolist())


def format_time(time_ms: int) -> float | int:
    """Return a millisecond timestamp as Unix seconds, the way Prometheus's JSON writes it."""
    time_ms = int(time_ms)
    if time_ms % 1000 == 0:
        return time_ms // 1000
    return time_ms / 1000


def to_prometheus_json(result: Result) -> dict[str, Any]:
    """Return the `data` object of Prometheus's query API for `result`."""
    if isinstance(result, Scalar):
        return {
            "resultType": "scalar",
            "result": [format_time(result.time_ms), format_json_value(result.value)],
        }
    if isinstance(result, String):
        return {"resultType": "string", "result": [format_time(result.time_ms), result.value]}
    if isinstance(result, Vector):
        return {
            "resultType": "vector",
            "result": [
                {"metric": dict(s.labels), "value": [format_time(s.time_ms), format_json_value(s.value)]}
                for s in result.samples
            ],
        }
    if isinstance(result, Matrix):
        return {
            "resultType": "matrix",
            "result": [
                {
                    "metric": dict(s.labels),
                    "values": [
                        [format_time(t), format_json_value(v)]
                        for t, v in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True)
                    ],
                }
                for s in result.series
            ],
        }
    raise TypeError(f"not a query result: {type(result).__name__}")


def to_prometheus_json_text(result: Result) -> str:
    """`json.dumps(to_prometheus_json(result), separators=(",", ":"))`, built faster for matrices.

    The values of all series are formatted in one `format_values` call (with orjson ~0.1 us a value;
    without it each distinct value, by bit pattern, is formatted once: range results repeat values a
    lot, and `repr` of a float, ~0.45 us, is then most of the cost). Timestamps are formatted once per
    time grid, as the text before each value (`"],[t,"`), and the whole text is one `join`."""
    if not isinstance(result, Matrix):
        return json.dumps(to_prometheus_json(result), separators=(",", ":"))
    return _matrix_text(result, "", "")


def to_prometheus_json_bytes(result: Result, head: str, tail: str) -> bytes:
    """`head + to_prometheus_json_text(result) + tail`, UTF-8, with one copy of the text fewer (an
    HTTP body around it: `{"status":"success","data":` ... `}`)."""
    if not isinstance(result, Matrix):
        return (head + to_prometheus_json_text(result) + tail).encode()
    return _matrix_text(result, head, tail).encode()


def success_body(result: Result) -> bytes:
    """The HTTP API's success answer for `result`, `{"status":"success","data":...}`, as the bytes
    `jsonify` would send."""
    return to_prometheus_json_bytes(result, '{"status":"success","data":', "}\n")


def _time_prefixes(times_ms: np.ndarray) -> list[str]:
    """'[t0,"', '"],[t1,"', ...: the text before each value of a series, made by one replace and one
    split of the times' text rather than an f-string per point."""
    t = np.asarray(times_ms, dtype=np.int64)
    if not t.size:
        return []
    return ("[" + _times_text(t).replace(",", ',"\x00"],[') + ',"').split("\x00")


def _matrix_text(result: Matrix, head: str, tail: str) -> str:
    if not result.series:
        return head + '{"resultType":"matrix","result":[]}' + tail
    values = np.concatenate([np.asarray(s.values, dtype=np.float64) for s in result.series])
    if _orjson is not None:
        texts: Any = format_values(values)
        inverse: Any = None
    else:
        distinct, inverse = np.unique(values.view(np.int64), return_inverse=True)
        texts = np.array(format_values(distinct.view(np.float64)), dtype=object)
    out = [head, '{"resultType":"matrix","result":[']
    last: tuple[np.ndarray, list[str]] | None = None
    pos = 0
    for k, s in enumerate(result.series):
        ts = s.timestamps_ms
        if last is not None and np.array_equal(last[0], ts):
            before = last[1]  # the series of a range query mostly share one time grid
        else:
            before = _time_prefixes(ts)
            last = (ts, before)
        n = len(before)
        points = [""] * (2 * n)
        points[0::2] = before
        points[1::2] = texts[pos : pos + n] if inverse is None else texts[inverse[pos : pos + n]].tolist()
        pos += n
        metric = json.dumps(dict(s.labels), separators=(",", ":"))
        out.append(("," if k else "") + '{"metric":' + metric + ',"values":[')
        out += points
        out.append('"]]}' if n else "]}")
    out.append("]}" + tail)
    return "".join(out)
