"""Import: the library function and POST /api/v1/import/prometheus with a real in-memory store."""

from __future__ import annotations

import gzip
import math
from collections.abc import Iterator
from types import SimpleNamespace

import numpy as np
import pytest
from flask.testing import FlaskClient
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.collect.importer import group_columns, import_text, prepare
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import SeriesLimitExceeded
from gpuwatch.core.model import LabelLimits, Matcher, SeriesLimits
from gpuwatch.store import Store
from gpuwatch.web import importapi

NOW_MS = 1_700_000_000_000
GOOD = (
    b"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization.\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    b'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 40 1699999940000\n'
    b'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 50 1699999970000\n'
    b'DCGM_FI_DEV_GPU_UTIL{gpu="1"} 7 1699999970000\n'
    b'vllm:num_requests_running{model_name="m"} 3\n'
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW_MS / 1000)


@pytest.fixture
def store(clock: FakeClock) -> Iterator[Store]:
    s = Store.open(None, clock=clock)
    yield s
    s.close()


@pytest.fixture
def runtime(store: Store, clock: FakeClock) -> SimpleNamespace:
    """What the import API reads of a runtime: the store and the clock (conftest's `client` serves it)."""
    settings = SimpleNamespace(label_limits=LabelLimits(), series_limits=SeriesLimits())
    return SimpleNamespace(store=store, clock=clock, settings=settings, access=None)


def _all(store: Store) -> dict[tuple[str, tuple], list[tuple[int, float]]]:
    out = {}
    for s in store.select([Matcher("__name__", "=~", ".+")], 0, 2**62):
        out[(s.name, s.labels)] = list(zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True))
    return out


def test_import_text_writes_series_sorted_with_now_for_missing_timestamps(store: Store) -> None:
    text = GOOD + b'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 45 1699999955000\n'
    result = import_text(store, text, now_ms=NOW_MS)
    assert (result.samples, result.series, result.errors) == (5, 3, [])
    got = _all(store)
    assert got[("DCGM_FI_DEV_GPU_UTIL", (("gpu", "0"),))] == [
        (1699999940000, 40.0),
        (1699999955000, 45.0),
        (1699999970000, 50.0),
    ]
    assert got[("vllm:num_requests_running", (("model_name", "m"),))] == [(NOW_MS, 3.0)]


def test_prepare_keeps_last_of_repeated_timestamp_and_drops_empty_labels() -> None:
    p = prepare(b'm{a=""} 1 10\nm 2 10\nm 3 5\nn NaN\n', now_ms=NOW_MS)
    by_name = {s.name: s for s in p.series}
    assert len(p.series) == 2 and by_name["m"].labels == ()
    assert by_name["m"].timestamps_ms.tolist() == [5, 10] and by_name["m"].values.tolist() == [3.0, 2.0]
    assert math.isnan(by_name["n"].values[0]) and by_name["n"].timestamps_ms.dtype == np.int64


def test_import_text_rejects_everything_on_a_bad_line(store: Store) -> None:
    import_text(store, b"old 1 1000\n", now_ms=NOW_MS)
    before = _all(store)
    result = import_text(store, GOOD + b"bad line here\n", now_ms=NOW_MS)
    assert result.is_rejected and [e.line_no for e in result.errors] == [7]
    assert _all(store) == before


def test_import_text_partial_writes_good_lines(store: Store) -> None:
    result = import_text(store, GOOD + b"bad line here\n", now_ms=NOW_MS, partial=True)
    assert result.samples == 4 and [e.line_no for e in result.errors] == [7]


def test_api_imports_and_answers_counts(client: FlaskClient, store: Store) -> None:
    resp = client.post("/api/v1/import/prometheus", data=GOOD)
    assert resp.status_code == 200, resp.json
    assert resp.json["data"] == {"samples": 4, "series": 3, "errors": [], "errorCount": 0}
    assert len(_all(store)) == 3


def test_api_bad_line_is_400_with_line_number_and_store_unchanged(client: FlaskClient, store: Store) -> None:
    client.post("/api/v1/import/prometheus", data=b"kept 1 1000\n")
    before = _all(store)
    resp = client.post("/api/v1/import/prometheus", data=GOOD + b'x{a="1" 2\n' + b"1bad 3\n")
    assert resp.status_code == 400
    body = resp.json
    assert body["status"] == "error" and body["errorType"] == "bad_data"
    assert body["error"].startswith("line 7: ") and "line 8: invalid metric name" in body["error"]
    assert [e["line"] for e in body["data"]["errors"]] == [7, 8]
    assert _all(store) == before


def test_api_lists_at_most_20_errors(client: FlaskClient) -> None:
    resp = client.post("/api/v1/import/prometheus", data=b"bad\n" * 30)
    assert resp.status_code == 400
    assert len(resp.json["data"]["errors"]) == 20 and resp.json["data"]["errorCount"] == 30
    assert resp.json["error"].endswith("(and 10 more)")


def test_api_partial(client: FlaskClient, store: Store) -> None:
    resp = client.post("/api/v1/import/prometheus?partial=1", data=GOOD + b"oops\n")
    assert resp.status_code == 200
    assert resp.json["data"]["samples"] == 4 and resp.json["data"]["errors"] == [
        {"line": 7, "error": "missing value"}
    ]


def test_api_openmetrics_by_content_type_and_gzip(client: FlaskClient, store: Store) -> None:
    body = gzip.compress(b"# TYPE t gauge\nt 1 1700000000.5\n# EOF\n")
    resp = client.post(
        "/api/v1/import/prometheus",
        data=body,
        headers={"Content-Encoding": "gzip", "Content-Type": "application/openmetrics-text; version=1.0.0"},
    )
    assert resp.status_code == 200, resp.json
    assert _all(store)[("t", ())] == [(1700000000500, 1.0)]
    # the same body declared as text: `# EOF` is a comment there, the float timestamp is an error
    resp = client.post("/api/v1/import/prometheus?format=text", data=b"t 1 1700000000.5\n# EOF\n")
    assert resp.status_code == 400 and "expected integer milliseconds" in resp.json["error"]


def test_a_time_beyond_int64_milliseconds_refuses_its_series(client: FlaskClient, store: Store) -> None:
    # OpenMetrics allows 1e16 seconds (its own test suite has 1.2e19); as int64 milliseconds it was an
    # OverflowError, a 500 (found by tests/test_fuzz_e2e.py). Now an error naming the series, a 400.
    body = b"far 1 9999999999999999\nnear 2 1700000000\n# EOF\n"
    resp = client.post("/api/v1/import/prometheus", data=body)
    assert resp.status_code == 400, resp.json
    assert "series far: timestamp 10000000000000000000 ms out of range" in resp.json["error"]
    assert ("far", ()) not in _all(store)


def test_api_body_size_cap(client: FlaskClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importapi, "MAX_BODY_BYTES", 100)
    resp = client.post("/api/v1/import/prometheus", data=b"m 1\n" * 50)
    assert resp.status_code == 413 and resp.json["status"] == "error"
    resp = client.post(
        "/api/v1/import/prometheus", data=gzip.compress(b"m 1\n" * 50), headers={"Content-Encoding": "gzip"}
    )
    assert resp.status_code == 413


def test_api_bad_gzip(client: FlaskClient) -> None:
    resp = client.post("/api/v1/import/prometheus", data=b"not gzip", headers={"Content-Encoding": "gzip"})
    assert resp.status_code == 400 and "gzip" in resp.json["error"]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ('big{v="' + "x" * 5000 + '"} 1 1000', "value of label 'v' is longer than 4096 characters"),
        ("many{" + ",".join(f'l{i}="v"' for i in range(70)) + "} 1 1000", "more than 64 labels"),
        ("y{" + "l" * 2000 + '="v"} 1 1000', "is longer than 1024 characters"),
    ],
)
def test_series_over_the_label_limits_are_refused_as_push_refuses_them(
    client: FlaskClient, store: Store, line: str, problem: str
) -> None:
    body = "ok 1 1000\n" + line + "\n" + line.replace(" 1 1000", " 2 2000") + "\n"
    r = client.post("/api/v1/import/prometheus", data=body)
    assert r.status_code == 400 and problem in r.get_json()["error"]
    assert r.get_json()["error"].count(problem) == 1, "one error per series, not per sample"
    assert _all(store) == {}, "all or nothing"
    r = client.post("/api/v1/import/prometheus?partial=true", data=body)
    assert r.status_code == 200 and list(_all(store)) == [("ok", ())]


def _new_series(first: int, n: int) -> str:
    return "".join(f'fresh{{pod="p{i}"}} {i} 1000\n' for i in range(first, first + n))


def test_an_import_with_more_new_series_than_allowed_is_413_naming_the_setting_and_writes_nothing(
    client: FlaskClient, store: Store, runtime: SimpleNamespace
) -> None:
    runtime.settings.series_limits = SeriesLimits(per_request=3, per_minute=0)
    r = client.post("/api/v1/import/prometheus", data=_new_series(0, 4))
    assert r.status_code == 413
    assert "max_new_series_per_request (3)" in r.get_json()["error"]
    assert _all(store) == {}, "all or nothing"
    assert client.post("/api/v1/import/prometheus", data=_new_series(0, 3)).status_code == 200
    # series already stored are not new: 3 known + 3 new passes
    assert client.post("/api/v1/import/prometheus", data=_new_series(0, 6)).status_code == 200
    assert len(_all(store)) == 6


def test_new_series_beyond_the_minute_s_allowance_are_429_until_the_minute_has_passed(
    client: FlaskClient, store: Store, runtime: SimpleNamespace, clock: FakeClock
) -> None:
    runtime.settings.series_limits = SeriesLimits(per_request=0, per_minute=5)
    assert client.post("/api/v1/import/prometheus", data=_new_series(0, 3)).status_code == 200
    clock.advance(30)
    r = client.post("/api/v1/import/prometheus", data=_new_series(3, 3))
    assert r.status_code == 429
    assert "max_new_series_per_minute (5)" in r.get_json()["error"]
    assert len(_all(store)) == 3
    clock.advance(31)  # the first import's series are more than a minute old
    assert client.post("/api/v1/import/prometheus", data=_new_series(3, 3)).status_code == 200
    assert len(_all(store)) == 6


def test_import_text_raises_series_limit_exceeded_and_writes_nothing(store: Store) -> None:
    with pytest.raises(SeriesLimitExceeded, match="max_new_series_per_request"):
        import_text(store, _new_series(0, 5), now_ms=NOW_MS, series_limits=SeriesLimits(4, 0))
    assert _all(store) == {}


def test_an_import_of_long_and_short_series_is_written_whole(store: Store) -> None:
    long_series = "".join(f"long {i} {1000 + i}\n" for i in range(3000))
    result = import_text(store, long_series + _new_series(0, 10), now_ms=NOW_MS)
    assert (result.samples, result.series) == (3010, 11)
    got = _all(store)
    assert len(got) == 11 and got[("long", ())][:2] == [(1000, 0.0), (1001, 1.0)]
    assert len(got[("long", ())]) == 3000


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.sampled_from([(), (("x", "1"),), (("x", ""),), (("x", "2"), ("y", ""))]),
            st.one_of(st.none(), st.integers(0, 5)),
            st.integers(0, 100).map(float),
        ),
        max_size=40,
    )
)
def test_grouped_columns_match_grouping_sample_by_sample(
    samples: list[tuple[str, tuple[tuple[str, str], ...], int | None, float]],
) -> None:
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], dict[int, float]] = {}
    for name, labels, t, v in samples:  # the last line of a repeated time wins; empty labels dropped
        key = (name, tuple(p for p in labels if p[1]))
        expected.setdefault(key, {})[7 if t is None else t] = v
    columns = group_columns(samples, [], now_ms=7)
    got = {}
    for k, key in enumerate(zip(columns.names, columns.labels, strict=True)):
        t, v = columns.series(k)
        assert (np.diff(t) > 0).all()
        got[key] = dict(zip(t.tolist(), v.tolist(), strict=True))
    assert got == expected
    assert list(got) == list(expected), "series in order of first appearance"
