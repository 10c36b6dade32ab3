"""The remote query backend as routes and pages use it (`storage.remote`), against a real HTTP server on
127.0.0.1 answering as Prometheus's API does: what is sent (the query text, gpuwatch's timeout and
credentials), and each kind of answer in gpuwatch's shapes (the real stores: test_remote_backend_e2e.py)."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.query.errors import RemoteUnavailable
from gpuwatch.query.remote import RemoteBackend
from gpuwatch.query.values import Matrix, Scalar, Vector
from gpuwatch.remote.storage import RemoteStorage
from gpuwatch.web import create_app
from tests.webhook_server import Hook, hook_server

VECTOR = {
    "status": "success",
    "data": {"resultType": "vector", "result": [{"metric": {"__name__": "up", "job": "a"}, "value": [1790000000.5, "1"]}]},
}  # fmt: skip


@pytest.fixture
def remote() -> Iterator[Hook]:
    with hook_server() as h:
        h.answer = VECTOR
        yield h


def face(tmp_path: Path, query_url: str, local_buffer: str | None = None, **extra: object) -> Runtime:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    remote = {"query_url": query_url, "write_url": f"{query_url}/api/v1/write",
              "authorization": {"credentials_file": str(token)}, "headers": {"X-Scope-OrgID": "lab"}}  # fmt: skip
    if local_buffer is not None:
        remote["local_buffer"] = local_buffer
    settings = load(
        None, {}, {"data_dir": str(tmp_path / "data"), "demo": True, "storage": {"remote": remote}, **extra}
    )
    clock = FakeClock(1_790_000_000)
    return build_runtime(
        settings, "face", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock, blocking_event_wait=False)
    )


@pytest.fixture
def client(tmp_path: Path, remote: Hook) -> Iterator[FlaskClient]:
    rt = face(tmp_path, remote.url, query_timeout="20s")
    yield create_app(rt).test_client()
    rt.close()


def form(body: str) -> dict[str, list[str]]:
    return parse_qs(body, keep_blank_values=True)


def test_a_query_is_sent_as_written_with_gpuwatchs_timeout_and_credentials(
    client: FlaskClient, remote: Hook
) -> None:
    r = client.get(
        "/api/v1/query", query_string={"query": "up == 1", "time": "1790000000.5", "timeout": "5s"}
    )
    assert r.status_code == 200
    assert r.get_json() == VECTOR  # the remote's answer, in gpuwatch's writing of it
    ((path, headers, body),) = remote.requests
    assert path == "/api/v1/query"
    assert form(body) == {"query": ["up == 1"], "time": ["1790000000.500"], "timeout": ["5"]}
    assert headers["Authorization"] == "Bearer s3cret" and headers["X-Scope-OrgID"] == "lab"
    assert headers["User-Agent"].startswith("gpuwatch/")


def test_a_range_query_and_the_label_apis_go_to_the_remote(client: FlaskClient, remote: Hook) -> None:
    remote.answer = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"job": "a"}, "values": [[1790000000, "1"], [1790000015, "NaN"], [1790000030, "+Inf"]]}]}}  # fmt: skip
    r = client.get(
        "/api/v1/query_range",
        query_string={"query": "up", "start": "1790000000", "end": "1790000030", "step": "15"},
    )
    assert r.status_code == 200
    assert r.get_json()["data"]["result"] == [{"metric": {"job": "a"}, "values": [[1790000000, "1"], [1790000015, "NaN"], [1790000030, "+Inf"]]}]  # fmt: skip
    assert form(remote.requests[-1][2])["step"] == ["15.000"]
    remote.answer = {
        "status": "success",
        "data": [{"__name__": "up", "job": "b"}, {"__name__": "up", "job": "a"}],
    }
    r = client.get("/api/v1/series", query_string={"match[]": ['up{job=~"a|b"}', "down"], "limit": "1"})
    assert r.get_json() == {"status": "success", "data": [{"__name__": "up", "job": "a"}], "warnings": ["results truncated due to limit"]}  # fmt: skip
    assert form(remote.requests[-1][2])["match[]"] == ['{__name__="up",job=~"a|b"}', '{__name__="down"}']
    remote.answer = {"status": "success", "data": ["job", "__name__"]}
    assert client.get("/api/v1/labels").get_json()["data"] == ["__name__", "job"]
    remote.answer = {"status": "success", "data": ["b", "a"]}
    r = client.get("/api/v1/label/job/values", query_string={"match[]": "up", "start": "1790000000"})
    assert r.get_json()["data"] == ["a", "b"]
    url = urlsplit(remote.requests[-1][0])
    assert url.path == "/api/v1/label/job/values"
    assert parse_qs(url.query) == {"match[]": ['{__name__="up"}'], "start": ["1790000000.000"]}


@pytest.mark.parametrize(
    ("status", "answer", "ours", "kind"),
    [
        (400, {"status": "error", "errorType": "bad_data", "error": 'invalid parameter "query": 1:5: parse error'}, 400, "bad_data"),
        (422, {"status": "error", "errorType": "422", "error": 'unknown func "foo"'}, 422, "execution"),
        (422, {"status": "error", "errorType": "execution", "error": "many-to-many matching not allowed"}, 422, "execution"),
        (503, {"status": "error", "errorType": "timeout", "error": "query timed out in expression evaluation"}, 503, "timeout"),
    ],
)  # fmt: skip
def test_a_query_the_remote_refuses_is_answered_in_gpuwatchs_shape(
    client: FlaskClient, remote: Hook, status: int, answer: dict[str, str], ours: int, kind: str
) -> None:
    remote.status, remote.answer = status, answer
    r = client.get("/api/v1/query", query_string={"query": "foo(x)"})
    assert r.status_code == ours
    assert r.get_json() == {"status": "error", "errorType": kind, "error": answer["error"]}


@pytest.mark.parametrize(
    ("status", "answer", "text"),
    [
        (500, b"<html>\nInternal Server Error</html>", "HTTP 500: <html>"),
        (502, {"status": "error", "errorType": "internal", "error": "storage node down\nretry"}, "HTTP 502: storage node down"),
        (401, b"Unauthorized", "HTTP 401: Unauthorized"),
        (200, b"not json", "HTTP 200: not json"),
    ],
)  # fmt: skip
def test_a_remote_that_fails_is_one_line_on_the_local_buffers_answer(
    client: FlaskClient, remote: Hook, status: int, answer: object, text: str
) -> None:
    remote.status, remote.answer = status, answer
    r = client.get("/api/v1/query", query_string={"query": "up"})
    assert r.status_code == 200 and r.get_json()["status"] == "success"
    assert r.get_json()["warnings"] == [
        f"remote query backend {remote.url} unreachable: {text}; answered from the local buffer (last 15 minutes)"
    ]
    assert r.headers["Gpuwatch-Answered-By"] == "local-buffer"


def test_without_a_local_buffer_a_remote_that_fails_is_one_line_503(tmp_path: Path, remote: Hook) -> None:
    rt = face(tmp_path, remote.url, local_buffer="0")
    try:
        remote.status, remote.answer = 502, {"status": "error", "errorType": "internal", "error": "down"}
        r = create_app(rt).test_client().get("/api/v1/query", query_string={"query": "up"})
    finally:
        rt.close()
    assert r.status_code == 503
    assert r.get_json() == {"status": "error", "errorType": "unavailable",
                            "error": f"remote query backend {remote.url} unreachable: HTTP 502: down"}  # fmt: skip


def test_without_a_local_buffer_an_unreachable_remote_is_one_line_503_on_the_api_and_the_pages(
    tmp_path: Path,
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    rt = face(tmp_path, url, local_buffer="0")
    try:
        client = create_app(rt).test_client()
        r = client.get("/api/v1/query", query_string={"query": "up"})
        expected = f"remote query backend {url} unreachable: cannot connect: Connection refused"
        assert (r.status_code, r.get_json()["error"]) == (503, expected)
        page = client.get("/api/ui/cluster")
        assert (page.status_code, page.get_json()["error"]) == (503, expected)
        html = client.get("/", headers={"Accept": "text/html"})
        assert html.status_code == 503 and expected.encode() in html.data
    finally:
        rt.close()


def test_an_answer_that_never_comes_is_a_timeout(tmp_path: Path) -> None:
    with socket.socket() as s:  # accepts connections (the kernel's backlog) and never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        rt = face(tmp_path, url, query_timeout="0.2s")
        try:
            r = create_app(rt).test_client().get("/api/v1/query", query_string={"query": "up"})
        finally:
            rt.close()
    assert r.status_code == 503
    assert r.get_json() == {"status": "error", "errorType": "timeout",
                            "error": f"remote query backend {url} did not answer within 0.2 s (setting query_timeout)"}  # fmt: skip


def test_gpuwatchs_own_limits_are_checked_before_anything_is_sent(tmp_path: Path, remote: Hook) -> None:
    rt = face(tmp_path, remote.url, query_max_length=64, query_max_samples=1000)
    try:
        client = create_app(rt).test_client()
        r = client.get("/api/v1/query", query_string={"query": "sum(" * 20 + "up" + ")" * 20})
        assert r.status_code == 400 and "setting query_max_length" in r.get_json()["error"]
        r = client.get(
            "/api/v1/query_range", query_string={"query": "up", "start": "0", "end": "100000", "step": "1"}
        )
        assert r.status_code == 400 and "maximum resolution" in r.get_json()["error"]
        assert remote.requests == []
        remote.answer = {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"i": str(i)}, "value": [1, "1"]} for i in range(1001)]}}  # fmt: skip
        r = client.get("/api/v1/query", query_string={"query": "up"})
        assert r.status_code == 422 and "query_max_samples" in r.get_json()["error"]
    finally:
        rt.close()


def test_the_remote_backends_result_types(remote: Hook) -> None:
    """Scalars, strings, vectors and matrices read back as gpuwatch's own results."""
    backend = RemoteBackend(RemoteStorage(remote.url), load(None, {}, {"data_dir": "unused"}))
    remote.answer = {"status": "success", "data": {"resultType": "scalar", "result": [1790000000.25, "-Inf"]}}
    assert backend.instant("-Inf", 0) == Scalar(1790000000250, float("-inf"))
    remote.answer = VECTOR
    got = backend.instant("up", 0)
    assert isinstance(got, Vector) and got.samples[0].labels == {"__name__": "up", "job": "a"}
    remote.answer = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"b": "2"}, "values": [[1, "1"]]}, {"metric": {"a": "1"}, "values": [[1, "2"], [2, "1e-07"]]}]}}  # fmt: skip
    m = backend.range("x", 1000, 2000, 1000)
    assert isinstance(m, Matrix) and [s.labels for s in m] == [
        {"a": "1"},
        {"b": "2"},
    ]  # sorted, as gpuwatch's
    assert m.series[0].timestamps_ms.tolist() == [1000, 2000] and m.series[0].values.tolist() == [2.0, 1e-07]


def test_a_connection_dropped_before_the_answer_is_asked_again_once() -> None:
    """A kept-alive connection reset under a query (the remote restarted, or died as it was asked) is
    asked again on a new connection; two drops in a row are one line, as any failure."""
    body = json.dumps(VECTOR).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body), body)  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        served: list[str] = []

        def serve(plan: list[str]) -> None:
            for what in plan:
                conn, _ = s.accept()
                conn.recv(65536)
                if what == "reset":  # SO_LINGER 0: the close sends RST, as a killed process's kernel
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                else:
                    conn.sendall(answer)
                served.append(what)
                conn.close()

        backend = RemoteBackend(RemoteStorage(url), load(None, {}, {"data_dir": "unused"}))
        for plan in (["reset", "answer"], ["reset", "reset"]):
            served.clear()
            t = threading.Thread(target=serve, args=(plan,), daemon=True)
            t.start()
            if plan[-1] == "answer":
                got = backend.instant("up", 0)
                assert isinstance(got, Vector) and got.samples[0].labels == {"__name__": "up", "job": "a"}
            else:
                with pytest.raises(
                    RemoteUnavailable,
                    match=f"^remote query backend {url} unreachable: connection dropped before the answer: \\S",
                ):
                    backend.instant("up", 0)
            t.join(5)
            assert served == plan


def test_a_remote_that_dies_in_the_middle_of_its_answer_is_one_line() -> None:
    """A remote killed while writing a chunked answer: one plain line, not requests' class name."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"

        def serve() -> None:
            conn, _ = s.accept()
            conn.recv(65536)
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n'
                         b'40\r\n{"status":"success","data":')  # fmt: skip
            conn.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        backend = RemoteBackend(RemoteStorage(url), load(None, {}, {"data_dir": "unused"}))
        with pytest.raises(RemoteUnavailable) as got:
            backend.instant("up", 0)
        t.join(5)
    assert str(got.value).startswith(
        f"remote query backend {url} unreachable: connection dropped during the answer: "
    )
    assert "Error" not in str(got.value) and "\n" not in str(got.value), str(got.value)
