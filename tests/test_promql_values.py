"""Prometheus JSON of query results: the fast array formatters equal the one-value-at-a-time ones."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuwatch.core.model import STALE_NAN
from gpuwatch.query.values import (
    Matrix,
    Sample,
    Scalar,
    Series,
    Vector,
    format_json_value,
    format_time,
    format_times,
    format_values,
    to_prometheus_json,
    to_prometheus_json_bytes,
    to_prometheus_json_text,
)

special = st.sampled_from(
    [
        0.0,
        -0.0,
        math.nan,
        STALE_NAN,
        math.inf,
        -math.inf,
        1e-3,
        1e-4,
        9.999e-4,
        1e15,
        1e16,
        1e15 - 1,
        2.0**53,
        5e-324,
        1.7976931348623157e308,
        0.1,
        1 / 3,
        100.0,
        -100.0,
        123456789.125,
    ]
)
floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    special,
    st.integers(-(2**60), 2**60).map(float),
    st.decimals(-1e6, 1e6, places=3, allow_nan=False, allow_infinity=False).map(float),
    st.integers(0, 2**64 - 1).map(lambda b: struct.unpack("<d", struct.pack("<Q", b))[0]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(floats, max_size=60))
@example([0.0, -0.0, math.nan, math.inf, -math.inf, 1.0])
@example([0.0, 0.0, 2.0])
@example([0.0, 0.5, math.nan, 1e-7])
def test_format_values_equals_format_json_value(values: list[float]) -> None:
    assert format_values(np.array(values, dtype=np.float64)) == [format_json_value(v) for v in values]


@settings(max_examples=200, deadline=None)
@given(st.lists(floats, min_size=1, max_size=5).map(lambda v: v * 20))
def test_format_values_all_integral_or_plain_runs(values: list[float]) -> None:
    arr = np.array(values, dtype=np.float64)
    assert format_values(arr) == [format_json_value(v) for v in values]
    whole = np.round(np.abs(arr[np.isfinite(arr)]) % 1e14) + 1
    assert format_values(whole) == [format_json_value(v) for v in whole.tolist()]


@given(st.lists(st.integers(-(2**52), 2**52), max_size=30), st.booleans())
def test_format_times_equals_format_time(times: list[int], whole: bool) -> None:
    t = np.array(times, dtype=np.int64) * (1000 if whole else 1)
    assert format_times(t) == [json.dumps(format_time(x)) for x in t.tolist()]


label_values = st.text(max_size=6)  # any unicode, quotes and backslashes included


@st.composite
def matrices(draw: st.DrawFn, repeats: bool = False) -> Matrix:
    series = []
    # With `repeats`, values come from a small pool, so that series repeat them (each distinct value
    # is formatted once): -0.0 next to 0.0, NaNs of different payloads, equal values in other series.
    pool = [*draw(st.lists(floats, min_size=1, max_size=4)), 0.0, -0.0, math.nan, STALE_NAN]
    values = st.sampled_from(pool) if repeats else floats
    grid = np.arange(draw(st.integers(0, 8)), dtype=np.int64) * draw(
        st.sampled_from([1, 15_000, 60_000, 1500])
    )
    for _ in range(draw(st.integers(0, 4))):
        labels = draw(
            st.dictionaries(st.sampled_from(["__name__", "gpu", "job", "é"]), label_values, max_size=3)
        )
        keep = draw(st.lists(st.booleans(), min_size=grid.size, max_size=grid.size))
        t = grid[np.array(keep, dtype=bool)] if grid.size else grid
        v = np.array(draw(st.lists(values, min_size=t.size, max_size=t.size)), dtype=np.float64)
        series.append(Series(labels, t, v))
    return Matrix(series)


@settings(max_examples=150, deadline=None)
@given(matrices())
def test_matrix_json_text_equals_json_dumps(m: Matrix) -> None:
    assert to_prometheus_json_text(m) == json.dumps(to_prometheus_json(m), separators=(",", ":"))


@settings(max_examples=100, deadline=None)
@given(matrices(repeats=True))
def test_matrix_json_text_with_repeated_values_equals_json_dumps(m: Matrix) -> None:
    assert to_prometheus_json_text(m) == json.dumps(to_prometheus_json(m), separators=(",", ":"))
    assert to_prometheus_json_bytes(m, "<", ">\n") == ("<" + to_prometheus_json_text(m) + ">\n").encode()


def test_other_results_json_text() -> None:
    for r in (Scalar(1500, 2.0), Vector([Sample({"a": "b"}, 1000, -0.0)])):
        assert to_prometheus_json_text(r) == json.dumps(to_prometheus_json(r), separators=(",", ":"))
        assert to_prometheus_json_bytes(r, "<", ">") == ("<" + to_prometheus_json_text(r) + ">").encode()


def test_values_formatted_by_orjson_equal_repr() -> None:
    # 1e-3 <= |v| < 1e15 (and 0), where `format_values` takes orjson's digits as they are: random bit
    # patterns over that range, plus the decimals and quotients that queries produce.
    import orjson  # noqa: F401  # a declared dependency: format_values takes its fast path

    rng = np.random.default_rng(7)
    bits = rng.integers(np.float64(1e-3).view(np.int64), np.float64(1e15).view(np.int64), 200_000)
    v = np.concatenate(
        [
            bits.view(np.float64),
            rng.integers(0, 10**9, 50_000) / 1000,
            rng.integers(1, 10**6, 50_000) / rng.integers(1, 3600, 50_000),
            [0.0, 1e-3, 1e15 - 0.125, 0.1, 1 / 3, 2 / 3],
        ]
    )
    v = np.concatenate([v, -v])
    v = np.concatenate([v, np.trunc(v[:1000]), [0.0]])
    reprs = [r[:-2] if r.endswith(".0") else r for r in map(float.__repr__, v.tolist())]
    assert format_values(v) == reprs


def test_matrix_json_text_the_same_without_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpuwatch.query import values

    rng = np.random.default_rng(3)
    ts = np.arange(0, 600_000, 15_000, dtype=np.int64)
    m = Matrix(
        [
            Series(
                {"a": str(i)}, ts, np.where(rng.random(len(ts)) < 0.3, np.nan, rng.random(len(ts)) * 10**i)
            )
            for i in range(-5, 17)
        ]
    )
    fast = to_prometheus_json_text(m)
    monkeypatch.setattr(values, "_orjson", None)
    assert to_prometheus_json_text(m) == fast == json.dumps(to_prometheus_json(m), separators=(",", ":"))


def test_the_api_writes_extreme_values_with_an_exponent_as_prometheus_does() -> None:
    """Prometheus's JSON: Go's 'f' format, 'e' below 1e-6 and from 1e21 (seen from Prometheus 2.42:
    `vector(1e21)` is "1e+21", `vector(1e-7)` is "1e-07")."""
    cases = {1e21: "1e+21", 1e-7: "1e-07", -1.5e-7: "-1.5e-07", 1e20: "100000000000000000000", 1e-6: "0.000001",
             1.7976931348623157e308: "1.7976931348623157e+308", 5e-324: "5e-324", 0.25: "0.25", 3.0: "3"}  # fmt: skip
    assert {v: format_json_value(v) for v in cases} == cases
    assert format_values(np.array(list(cases))) == list(cases.values())
