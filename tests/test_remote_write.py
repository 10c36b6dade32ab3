"""Prometheus remote write into gpuwatch: the wire format against Google's protobuf, hostile bodies,
and `POST /api/v1/write` storing exactly what was sent (tests/test_remote_write_e2e.py: a real
Prometheus as the sender)."""

from __future__ import annotations

import contextlib
import math
import struct
from typing import Any

import pytest
from flask.testing import FlaskClient
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import STALE_NAN
from gpuwatch.remote.wire import (
    HEADERS,
    TimeSeries,
    WireError,
    compress,
    decode_request,
    decompress,
    encode_request,
    encode_series,
)

T0 = 1_790_000_000_000  # the fake clock's start, in ms


def _proto_classes() -> tuple[Any, Any]:
    """prometheus.WriteRequest and TimeSeries built with Google's protobuf from their definition."""
    f = descriptor_pb2.FileDescriptorProto(name="gw_remote_test.proto", package="gwtest", syntax="proto3")
    label = f.message_type.add(name="Label")
    label.field.add(name="name", number=1, type=9, label=1)
    label.field.add(name="value", number=2, type=9, label=1)
    sample = f.message_type.add(name="Sample")
    sample.field.add(name="value", number=1, type=1, label=1)
    sample.field.add(name="timestamp", number=2, type=3, label=1)
    ts = f.message_type.add(name="TimeSeries")
    ts.field.add(name="labels", number=1, type=11, label=3, type_name=".gwtest.Label")
    ts.field.add(name="samples", number=2, type=11, label=3, type_name=".gwtest.Sample")
    wr = f.message_type.add(name="WriteRequest")
    wr.field.add(name="timeseries", number=1, type=11, label=3, type_name=".gwtest.TimeSeries")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    get = message_factory.GetMessageClass
    return get(pool.FindMessageTypeByName("gwtest.WriteRequest")), get(
        pool.FindMessageTypeByName("gwtest.TimeSeries")
    )


WriteRequest, ProtoSeries = _proto_classes()

label_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
series_strategy = st.lists(
    st.tuples(
        st.lists(st.tuples(label_text, label_text), max_size=4),
        st.lists(
            st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), st.floats(allow_nan=True, allow_infinity=True)),
            max_size=5,
        ),
    ),
    max_size=4,
)


def _bits(values: tuple[float, ...] | list[float]) -> list[int]:
    return [struct.unpack("<Q", struct.pack("<d", v))[0] for v in values]


@settings(max_examples=150, deadline=None)
@given(series_strategy)
def test_requests_read_as_googles_protobuf_writes_them(data: list[Any]) -> None:
    request = WriteRequest()
    for labels, samples in data:
        ts = request.timeseries.add()
        for name, value in labels:
            ts.labels.add(name=name, value=value)
        for t, v in samples:
            ts.samples.add(value=v, timestamp=t)
    body = compress_roundtrip(request.SerializeToString())
    cache: dict[bytes, Any] = {}  # the receiver's: the second read finds every label run in it
    for got in (decode_request(body), decode_request(body, cache), decode_request(body, cache)):
        assert [list(s.labels) for s in got] == [labels for labels, _ in data]
        assert [list(s.timestamps_ms) for s in got] == [[t for t, _ in samples] for _, samples in data]
        assert [_bits(s.values) for s in got] == [_bits([v for _, v in samples]) for _, samples in data]


@settings(max_examples=150, deadline=None)
@given(series_strategy)
def test_requests_written_here_read_as_googles_protobuf(data: list[Any]) -> None:
    body = encode_request(encode_series(labels, [t for t, _ in s], [v for _, v in s]) for labels, s in data)
    parsed = WriteRequest.FromString(body)
    assert [[(label.name, label.value) for label in ts.labels] for ts in parsed.timeseries] == [
        pairs for pairs, _ in data
    ]
    for ts, (_, samples) in zip(parsed.timeseries, data, strict=True):
        assert [(s.timestamp, *_bits([s.value])) for s in ts.samples] == [
            (t, *_bits([v])) for t, v in samples
        ]


def compress_roundtrip(body: bytes) -> bytes:
    return decompress(compress(body), 1 << 20)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_a_wire_error(body: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_request(body)
    with contextlib.suppress(WireError):
        decode_request(body, {})


def test_every_truncation_of_a_request_is_a_wire_error_or_a_shorter_request() -> None:
    body = encode_request(
        [encode_series([("__name__", "up"), ("job", "node")], [T0, T0 + 1000], [1.0, 0.0])] * 3
    )
    for cut in range(len(body)):
        for cache in (None, {}):
            try:
                got = decode_request(body[:cut], cache)
            except WireError:
                continue
            assert len(got) < 3  # only whole series survive a cut between them


def test_a_body_claiming_to_inflate_past_the_cap_is_refused_unread() -> None:
    bomb = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) + b"\x00" * 10  # a header of 4 GiB
    with pytest.raises(WireError, match="inflates to 4294967295 bytes"):
        decompress(bomb, 64 << 20)
    with pytest.raises(WireError, match="not a snappy block"):
        decompress(b"\x05abc", 1 << 20)


def test_a_field_with_the_wrong_wire_type_is_named() -> None:
    with pytest.raises(WireError, match="TimeSeries field 2 with wire type 0"):
        decode_request(b"\x0a\x02\x10\x01")  # timeseries { samples: varint 1 }


# -- POST /api/v1/write ----------------------------------------------------------------------------


def write(client: FlaskClient, *series: bytes, headers: dict[str, str] | None = None) -> Any:
    return client.post("/api/v1/write", data=compress(encode_request(series)), headers=headers or HEADERS)


def stored(client: FlaskClient, selector: str) -> dict[str, list[tuple[int, str]]]:
    """Raw samples of the last hour, by label set (as Prometheus's `metric[1h]` gives them)."""
    resp = client.get(
        "/api/v1/query", query_string={"query": f"{selector}[1h]", "time": str((T0 + 600_000) / 1000)}
    )
    assert resp.status_code == 200, resp.json
    return {
        ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items())): [
            (int(round(t * 1000)), v) for t, v in r["values"]
        ]
        for r in resp.json["data"]["result"]
    }


def test_a_request_is_stored_as_sent(client: FlaskClient) -> None:
    resp = write(
        client,
        encode_series(
            [("job", "node"), ("__name__", "gpu_temp"), ("gpu", "0")], [T0, T0 + 1000], [41.0, 42.5]
        ),
        encode_series([("__name__", "gpu_temp"), ("gpu", "1"), ("job", "node")], [T0 + 500], [50.0]),
        encode_series([("__name__", "up"), ("job", "node"), ("zone", "")], [T0], [1.0]),  # "" is no label
    )
    assert resp.status_code == 204 and resp.data == b""
    assert stored(client, "gpu_temp") == {
        "__name__=gpu_temp,gpu=0,job=node": [(T0, "41"), (T0 + 1000, "42.5")],
        "__name__=gpu_temp,gpu=1,job=node": [(T0 + 500, "50")],
    }
    assert stored(client, "up") == {"__name__=up,job=node": [(T0, "1")]}


def test_a_retried_batch_changes_nothing_and_late_samples_are_kept(client: FlaskClient) -> None:
    batch = encode_series([("__name__", "power_watts"), ("gpu", "0")], [T0 + 2000, T0 + 3000], [300.0, 310.0])
    assert write(client, batch).status_code == 204
    assert write(client, batch).status_code == 204  # the sender did not see the first 204
    # a node catching up after an outage sends older samples, out of order within the series
    late = encode_series([("__name__", "power_watts"), ("gpu", "0")], [T0 + 1000, T0], [290.0, 280.0])
    assert write(client, late).status_code == 204
    assert stored(client, "power_watts") == {
        "__name__=power_watts,gpu=0": [
            (T0, "280"),
            (T0 + 1000, "290"),
            (T0 + 2000, "300"),
            (T0 + 3000, "310"),
        ]
    }


def test_staleness_markers_and_special_values_are_kept(client: FlaskClient, clock: FakeClock) -> None:
    resp = write(
        client,
        encode_series([("__name__", "odd")], [T0, T0 + 1000, T0 + 2000], [math.inf, -0.5, math.nan]),
        encode_series([("__name__", "going")], [T0, T0 + 1000], [1.0, STALE_NAN]),
    )
    assert resp.status_code == 204
    assert stored(client, "odd") == {"__name__=odd": [(T0, "+Inf"), (T0 + 1000, "-0.5"), (T0 + 2000, "NaN")]}
    # a staleness marker ends the series: an instant query after it finds nothing
    at = client.get("/api/v1/query", query_string={"query": "going", "time": str((T0 + 1500) / 1000)})
    assert at.json["data"]["result"] == []


def test_bad_series_are_refused_and_named_the_good_ones_stored(client: FlaskClient) -> None:
    resp = write(
        client,
        encode_series([("__name__", "fine"), ("gpu", "0")], [T0], [1.0]),
        encode_series([("__name__", "twice"), ("gpu", "0"), ("gpu", "1")], [T0], [1.0]),
        encode_series([("gpu", "0")], [T0], [1.0]),
        encode_series([("__name__", "bad-name")], [T0], [1.0]),
        encode_series([("__name__", "x"), ("a", "v" * 5000)], [T0], [1.0]),  # over label_value_length_limit
    )
    assert resp.status_code == 400
    body = resp.json
    assert body["errorType"] == "bad_data" and body["error"].startswith(
        "4 series refused, the other 1 stored: "
    )
    for reason in (
        "a label name appears twice",
        "no __name__ label",
        "'bad-name' is not a Prometheus name",
        "series x: value of label 'a' is longer than 4096 characters (label_value_length_limit)",
    ):
        assert reason in body["error"]
    assert body["data"] == {"stored_samples": 1, "refused_samples": 4}
    assert stored(client, "fine") == {"__name__=fine,gpu=0": [(T0, "1")]}


def test_a_body_that_is_not_a_write_request_is_a_400(client: FlaskClient) -> None:
    resp = client.post("/api/v1/write", data=b"up 1\n", headers={"Content-Encoding": "snappy"})
    assert resp.status_code == 400 and resp.json["error"].startswith("not a remote-write request: ")
    garbage = compress(b"\x0a\xff\xff\xff\xff\x0f")
    resp = client.post("/api/v1/write", data=garbage, headers=HEADERS)
    assert resp.status_code == 400 and "runs past the end" in resp.json["error"]
    resp = client.post("/api/v1/write", data=b"x", headers={**HEADERS, "Content-Encoding": "gzip"})
    assert resp.status_code == 400 and "snappy" in resp.json["error"]


def test_a_body_over_the_cap_is_a_413(client: FlaskClient) -> None:
    resp = client.post("/api/v1/write", data=b"\x00" * (16 * 1024 * 1024 + 1), headers=HEADERS)
    assert resp.status_code == 413


def test_native_histograms_are_refused_by_series() -> None:
    from gpuwatch.remote.receive import received

    got = received([TimeSeries((("__name__", "latency"),), (), (), histograms=2)])
    assert got.columns.samples == 0 and got.samples_refused == 2
    assert "native histogram" in got.refused[0]
