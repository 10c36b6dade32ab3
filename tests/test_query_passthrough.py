"""A face passes a remote store's query answer on unread where its bytes show a success within
gpuwatch's limits (query/passthrough.py): what the bytes must show, the point count's bound on any
labels (Hypothesis), and through the API against a real HTTP server on 127.0.0.1 what the browser gets
(the real stores: test_face_passthrough_e2e.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.query.passthrough import points_at_most, result_type
from gpuwatch.web import create_app
from tests.test_query_remote import face
from tests.webhook_server import Hook, hook_server


def compact(answer: dict[str, Any]) -> bytes:
    """`answer` as Prometheus and VictoriaMetrics write it: no spaces, non-ASCII as it is."""
    return json.dumps(answer, separators=(",", ":"), ensure_ascii=False).encode()


def matrix(series: list[tuple[dict[str, str], list[tuple[float, str]]]], **top: Any) -> dict[str, Any]:
    result = [{"metric": m, "values": [[t, v] for t, v in points]} for m, points in series]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}, **top}


def vector(samples: list[tuple[dict[str, str], float, str]]) -> dict[str, Any]:
    result = [{"metric": m, "value": [t, v]} for m, t, v in samples]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


# VictoriaMetrics 1.79's answers, as it wrote them (a label value with `]"` in it)
VM_MATRIX = (
    b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"m","a":"x",'
    b'"b":"]\\""},"values":[[1796483437,"0"],[1796483452,"1"],[1796483467.5,"2"]]}]}}'
)
VM_VECTOR = (
    b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"m","a":"x"},'
    b'"value":[1796483497,"3"]}]}}'
)


def test_the_answers_of_prometheus_and_victoriametrics_pass_and_are_counted() -> None:
    assert result_type(VM_MATRIX) == "matrix" and points_at_most(VM_MATRIX) == 4  # 3 and the label's `"]`
    assert result_type(VM_VECTOR) == "vector" and points_at_most(VM_VECTOR) == 1
    # Prometheus puts its warnings after the data; VictoriaMetrics its isPartial before it
    prom = compact(matrix([({"job": "a"}, [(1.5, "1"), (2, "NaN")])], warnings=["partial"]))
    assert result_type(prom) == "matrix" and points_at_most(prom) == 3  # the warning counts too: a bound
    vm = b'{"status":"success","isPartial":false,' + compact(matrix([({}, [(1, "+Inf")])]))[20:]
    assert result_type(vm) == "matrix" and points_at_most(vm) == 1


@pytest.mark.parametrize(
    "body",
    [
        json.dumps(matrix([({"a": "1"}, [(1, "1")])])).encode(),  # spaces: another writer, read
        b'{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}',
        b'{"status":"success","data":{"resultType":"string","result":[1,"x"]}}',
        b'{"status":"error","errorType":"bad_data","error":"parse error"}',
        b'{"data":{"resultType":"matrix","result":[]},"status":"success"}',  # the status last
        b'{"status":"success","data":{"result":[],"resultType":"matrix"}}',  # the type after the result
        VM_MATRIX[:-4],  # cut short (HTTP's own framing catches a cut the bytes cannot show)
        VM_MATRIX[:60],
        b"",
        b"<html>Bad Gateway</html>",
        # Prometheus's native histograms, which gpuwatch's reading leaves out
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"histogram":[1,{"count":"2"}]}]}}',
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"histograms":[[1,{"count":"2"}]]}]}}',
    ],
)  # fmt: skip
def test_anything_else_is_read(body: bytes) -> None:
    assert result_type(body) is None


def test_labels_that_look_like_the_layout_do_not_fool_it() -> None:
    """A label named `resultType` or `data`, a value that is the layout's own text: still the answer's
    type, and a histogram-named label is not a histogram."""
    tricky = {"resultType": "matrix", "data": '{"resultType":"matrix","result":[', "histogram": "[1]"}
    assert result_type(compact(vector([(tricky, 1, "1")]))) == "vector"
    assert result_type(compact(matrix([(tricky, [(1, "1")])]))) == "matrix"


labels = st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=12), max_size=4)
values = st.sampled_from(["0", "1", "-1.5", "1e+300", "NaN", "+Inf", "-Inf", "0.1"])
points = st.lists(st.tuples(st.integers(0, 2**40).map(lambda t: t / 1000), values), max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(labels, points), max_size=5), st.lists(st.text(max_size=12), max_size=2))
def test_the_count_is_never_below_the_points_whatever_the_labels(
    series: list[tuple[dict[str, str], list[tuple[float, str]]]], warnings: list[str]
) -> None:
    body = compact(matrix(series, **({"warnings": warnings} if warnings else {})))
    exact = sum(len(p) for _, p in series)
    assert result_type(body) == "matrix"
    assert points_at_most(body) >= exact
    clean = not warnings and not any("]" in k + v for m, _ in series for k, v in m.items())
    if clean:
        assert points_at_most(body) == exact


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(labels, st.integers(0, 2**40).map(lambda t: t / 1000), values), max_size=6))
def test_the_count_is_never_below_a_vectors_samples(samples: list[tuple[dict[str, str], float, str]]) -> None:
    body = compact(vector(samples))
    assert result_type(body) == "vector" and points_at_most(body) >= len(samples)


# -- through the API -------------------------------------------------------------------------------------
@pytest.fixture
def remote() -> Iterator[Hook]:
    with hook_server() as h:
        yield h


@pytest.fixture
def client(tmp_path: Path, remote: Hook) -> Iterator[FlaskClient]:
    rt = face(tmp_path, remote.url, query_max_samples=1000)
    yield create_app(rt).test_client()
    rt.close()


RANGE = {"query": "m", "start": "1796483437", "end": "1796483467.5", "step": "15"}


def test_the_browser_gets_the_remotes_own_bytes(client: FlaskClient, remote: Hook) -> None:
    remote.answer = VM_MATRIX
    r = client.get("/api/v1/query_range", query_string=RANGE)
    assert r.status_code == 200 and r.data == VM_MATRIX
    assert r.mimetype == "application/json" and r.headers["Gpuwatch-Answered-By"] == "remote"
    remote.answer = VM_VECTOR
    r = client.post("/api/v1/query", data={"query": "m"})
    assert r.status_code == 200 and r.data == VM_VECTOR


def test_an_answer_it_cannot_judge_is_read_and_written_as_before(client: FlaskClient, remote: Hook) -> None:
    remote.answer = json.dumps(matrix([({"b": "2"}, [(1, "1")]), ({"a": "1"}, [(1, "2")])])).encode()
    r = client.get("/api/v1/query_range", query_string=RANGE)
    assert r.status_code == 200 and r.data != remote.answer
    assert [s["metric"] for s in r.get_json()["data"]["result"]] == [{"a": "1"}, {"b": "2"}]  # sorted
    remote.answer = b'{"status":"success","data":{"resultType":"scalar","result":[1796483437,"2"]}}'
    r = client.get("/api/v1/query_range", query_string=RANGE)
    assert r.get_json()["data"] == {"resultType": "matrix", "result": [{"metric": {}, "values": [[1796483437, "2"]]}]}  # fmt: skip


def test_query_max_samples_holds_on_the_bytes_and_on_the_exact_count(
    client: FlaskClient, remote: Hook
) -> None:
    many: list[tuple[float, str]] = [(1790000000 + i, "1") for i in range(1001)]
    remote.answer = compact(matrix([({"a": "1"}, many[:600]), ({"a": "2"}, many[600:])]))
    r = client.get("/api/v1/query_range", query_string=RANGE)
    assert r.status_code == 422 and r.get_json()["errorType"] == "execution"
    assert "the remote answered 1,001 samples, more than query_max_samples (1,000)" in r.get_json()["error"]
    # 1,000 points but 1,002 `"]` (two label values begin with `]`): over the bound, read, within the limit
    remote.answer = compact(matrix([({"a": "]x", "b": "]"}, many[:1000])]))
    assert points_at_most(remote.answer) == 1002
    r = client.get("/api/v1/query_range", query_string=RANGE)
    assert r.status_code == 200 and len(r.get_json()["data"]["result"][0]["values"]) == 1000
    remote.answer = compact(matrix([({"a": "1"}, many[:1000])]))
    assert client.get("/api/v1/query_range", query_string=RANGE).data == remote.answer  # at the limit
    remote.answer = compact(vector([({"i": str(i)}, 1, "1") for i in range(1001)]))
    r = client.get("/api/v1/query", query_string={"query": "m"})
    assert r.status_code == 422 and "query_max_samples" in r.get_json()["error"]


def test_a_remote_error_keeps_gpuwatchs_shape(client: FlaskClient, remote: Hook) -> None:
    remote.status = 400
    remote.answer = b'{"status":"error","errorType":"bad_data","error":"1:2: parse error: unexpected"}'
    r = client.get("/api/v1/query_range", query_string=RANGE)
    assert r.status_code == 400
    assert r.get_json() == {
        "status": "error",
        "errorType": "bad_data",
        "error": "1:2: parse error: unexpected",
    }
    # a success body under an error status is the status's: never passed on
    remote.status, remote.answer = 503, VM_MATRIX
    r = client.get("/api/v1/query_range", query_string=RANGE)
    assert r.headers["Gpuwatch-Answered-By"] == "local-buffer" and r.data != VM_MATRIX
    assert "HTTP 503" in r.get_json()["warnings"][0]
