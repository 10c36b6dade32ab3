"""Costly requests take turns (web/admission.py): a bounded number run, a bounded number wait, the rest
are answered 503 `unavailable` at once, and cheap requests never wait for them."""

from __future__ import annotations

import threading

from flask.testing import FlaskClient

from gpuwatch.web.admission import Admission, is_costly
from tests.conftest import wait_until


def test_past_the_running_and_the_waiting_a_request_is_refused_at_once() -> None:
    admission = Admission(running=1, waiting=1, wait_s=60)
    assert admission.enter()  # the one turn
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(admission.enter()))
    waiter.start()
    wait_until(lambda: admission.waiting == 1, 10, "the second request did not wait")
    assert admission.enter() is False  # one runs, one waits: the third is refused, without waiting
    assert admission.refused == 1
    admission.leave()  # the waiting one gets the turn
    waiter.join()
    assert got == [True] and admission.running == 1 and admission.waiting == 0
    admission.leave()
    assert admission.enter() and admission.running == 1


def test_a_request_that_waits_longer_than_wait_s_is_refused() -> None:
    admission = Admission(running=1, waiting=4, wait_s=0)
    assert admission.enter()
    assert admission.enter() is False and admission.waiting == 0 and admission.refused == 1


def test_with_no_waiting_allowed_a_request_past_the_running_is_refused() -> None:
    admission = Admission(running=2, waiting=0, wait_s=60)
    assert admission.enter() and admission.enter()
    assert admission.enter() is False
    admission.leave()
    assert admission.enter()


def test_closing_refuses_the_waiting_and_every_later_request() -> None:
    admission = Admission(running=1, waiting=4, wait_s=60)
    assert admission.enter()
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(admission.enter()))
    waiter.start()
    wait_until(lambda: admission.waiting == 1, 10, "the second request did not wait")
    admission.close()
    waiter.join()
    assert got == [False] and admission.enter() is False
    admission.leave()
    assert admission.enter() is False


def test_the_costly_routes_are_the_queries_and_the_twins() -> None:
    assert is_costly("/api/v1/query") and is_costly("/api/v1/query_range")
    assert is_costly("/api/ui/cluster") and is_costly("/api/ui/gpus/node-1/0")
    for cheap in (
        "/-/health",
        "/-/healthy",
        "/",
        "/gpus/node-1/0",
        "/metrics",
        "/api/v1/labels",
        "/static/x.js",
    ):
        assert not is_costly(cheap), cheap


def test_a_query_past_the_limits_is_503_unavailable_with_retry_after_and_health_still_answers(
    client: FlaskClient,
) -> None:
    admission: Admission = client.application.extensions["gpuwatch.admission"]
    assert (admission.running_max, admission.waiting_max) == (4, 16)  # the defaults
    admission.waiting_max = 0
    for _ in range(4):  # every turn taken, as by four slow queries
        assert admission.enter()
    try:
        for path in (
            "/api/v1/query?query=up",
            "/api/v1/query_range?query=up&start=0&end=60&step=15",
            "/api/ui/cluster",
        ):
            r = client.get(path)
            assert r.status_code == 503, (path, r.status_code)
            assert r.headers["Retry-After"] == "1"
            body = r.get_json()
            assert body["status"] == "error" and body["errorType"] == "unavailable"
            assert body["error"].startswith("too many concurrent queries")
        assert client.get("/-/health").status_code == 200
        assert client.get("/").status_code == 200  # a page is not a twin: it does not take a turn
    finally:
        for _ in range(4):
            admission.leave()
    assert client.get("/api/v1/query?query=up").status_code == 200
    assert admission.running == 0  # every answered request gave its turn back


def test_a_refused_request_and_a_failed_one_give_back_nothing_they_did_not_take(client: FlaskClient) -> None:
    admission: Admission = client.application.extensions["gpuwatch.admission"]
    assert client.get("/api/v1/query?query=(((").status_code == 400  # answered in its turn, an error
    assert client.get("/api/v1/query_range?query=up").status_code == 400
    assert admission.running == 0 and admission.refused == 0
