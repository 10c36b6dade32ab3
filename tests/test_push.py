"""Pushgateway API and JSON training pushes, through Flask's test client over a real store.

The Pushgateway tests use the real `prometheus_client.push_to_gateway` / `pushadd_to_gateway` /
`delete_from_gateway`, with a handler that hands their HTTP request to the test client.
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import delete_from_gateway, push_to_gateway, pushadd_to_gateway

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.collect.push import PushError, parse_grouping_key, parse_training, training_name
from gpuwatch.collect.runs import SeenThrottle
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher, SeriesData, is_stale
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.web import create_app


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_790_000_000)


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    settings = load(None, {}, {"data_dir": str(tmp_path / "data"), "demo": True})
    nvml = FakeNvml(gpu_count=1, clock=clock, blocking_event_wait=False)
    rt = build_runtime(settings, "node-1", clock=clock, nvml=nvml)
    yield rt
    rt.close()


def handler_for(client: FlaskClient) -> Callable[..., Callable[[], None]]:
    """A prometheus_client push handler that sends the request to the Flask test client."""

    def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]], data: bytes):  # type: ignore[no-untyped-def]
        def send() -> None:
            path = urlsplit(url).path
            resp = client.open(path, method=method, data=data, headers=dict(headers))
            if resp.status_code >= 400:
                raise OSError(
                    f"error talking to pushgateway: {resp.status_code} {resp.get_data(as_text=True)}"
                )

        return send

    return handler


def series(runtime: Runtime, name: str, **labels: str) -> list[SeriesData]:
    runtime.store.flush()
    matchers = [Matcher("__name__", "=", name), *(Matcher(k, "=", v) for k, v in labels.items())]
    return runtime.store.select(matchers, 0, 2**62)


def values(runtime: Runtime, name: str, **labels: str) -> list[float]:
    found = series(runtime, name, **labels)
    assert len(found) == 1, f"expected one {name} series, got {[s.labels for s in found]}"
    return [float(v) for v in found[0].values]


def test_push_to_gateway_stores_with_grouping_key(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    reg = CollectorRegistry()
    g = Gauge("training_loss", "loss", ["phase"], registry=reg)
    g.labels("train").set(2.5)
    c = Counter("batches", "batches done", registry=reg)
    c.inc(7)
    h = Histogram("step_seconds", "step time", buckets=(0.1, 1.0), registry=reg)
    h.observe(0.5)
    push_to_gateway(
        "gw:9842", job="sft", registry=reg, grouping_key={"instance": "node-3"}, handler=handler_for(client)
    )
    assert values(runtime, "training_loss", job="sft", instance="node-3", phase="train") == [2.5]
    assert values(runtime, "batches_total", job="sft") == [7.0]
    assert values(runtime, "step_seconds_bucket", job="sft", le="1.0") == [1.0]
    assert values(runtime, "push_time_seconds", job="sft", instance="node-3") == [clock.now()]


def test_put_replaces_group_post_replaces_families_delete_marks_stale(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    handler = handler_for(client)
    reg = CollectorRegistry()
    Gauge("a", "a", registry=reg).set(1)
    Gauge("b", "b", registry=reg).set(2)
    push_to_gateway("gw", job="j", registry=reg, handler=handler)
    clock.advance(1)
    only_a = CollectorRegistry()
    Gauge("a", "a", registry=only_a).set(10)
    pushadd_to_gateway("gw", job="j", registry=only_a, handler=handler)  # POST: b stays
    assert values(runtime, "a", job="j") == [1, 10]
    assert values(runtime, "b", job="j") == [2, 2]  # every push writes the whole group, as a scrape would
    clock.advance(1)
    push_to_gateway("gw", job="j", registry=only_a, handler=handler)  # PUT: b goes, with a marker
    b = values(runtime, "b", job="j")
    assert b[:2] == [2, 2] and is_stale(b[2])
    clock.advance(1)
    delete_from_gateway("gw", job="j", handler=handler)
    a = values(runtime, "a", job="j")
    assert a[:3] == [1, 10, 10] and is_stale(a[3])
    assert is_stale(values(runtime, "push_time_seconds", job="j")[-1])
    assert len(runtime.pushes) == 0
    delete_from_gateway("gw", job="j", handler=handler)  # deleting an absent group is fine


def test_groups_are_written_again_every_interval(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    reg = CollectorRegistry()
    Gauge("up_to_date", "x", registry=reg).set(3)
    push_to_gateway("gw", job="nightly", registry=reg, handler=handler_for(client))
    pushed_at = clock.now()
    for _ in range(3):
        clock.advance(15)
        runtime.jobs.run("push")
    found = series(runtime, "up_to_date", job="nightly")[0]
    assert [float(v) for v in found.values] == [3, 3, 3, 3]
    assert list(found.timestamps_ms) == [int((pushed_at + 15 * i) * 1000) for i in range(4)]
    assert values(runtime, "push_time_seconds", job="nightly") == [pushed_at] * 4


def test_grouping_key_base64_and_empty_values(runtime: Runtime, client: FlaskClient) -> None:
    reg = CollectorRegistry()
    Gauge("g", "g", registry=reg).set(1)
    key = {"path": "/data/run 1", "empty": ""}
    push_to_gateway("gw", job="a/b", registry=reg, grouping_key=key, handler=handler_for(client))
    assert values(runtime, "g", job="a/b", path="/data/run 1") == [1]
    assert parse_grouping_key("job@base64/YS9i/x/1") == (("job", "a/b"), ("x", "1"))
    assert parse_grouping_key("job/j/x@base64/YQ") == (("job", "j"), ("x", "a"))  # padding optional


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("job", "must be /metrics/job"),
        ("instance/x", "must be /metrics/job"),
        ("job/j/instance", "has no value"),
        ("job/j/0bad/x", "invalid label name"),
        ("job/j/__x/x", "invalid label name"),
        ("job@base64/!!", "not valid base64"),
        ("job@base64/=", "job name is empty"),
        ("job/j/a/1/a/2", "appears twice"),
    ],
)
def test_bad_grouping_keys(path: str, problem: str) -> None:
    with pytest.raises(PushError, match=problem):
        parse_grouping_key(path)


@pytest.mark.parametrize(
    ("body", "headers", "status", "problem"),
    [
        (b"not a metric line\n", {}, 400, "line 1"),
        (b"x 1 1700000000000\n", {}, 400, "must not carry timestamps"),
        (b'x{job="other"} 1\n', {}, 400, "conflicts with the grouping key"),
        (b"x 1\nx 2\n", {}, 400, "appears twice"),
        (b"x 1\n", {"Content-Encoding": "gzip"}, 400, "cannot decompress"),
        (b"x 1\n", {"Content-Encoding": "snappy"}, 400, "Content-Encoding"),
        (
            b"\x00\x01",
            {"Content-Type": "application/vnd.google.protobuf; encoding=delimited"},
            415,
            "protobuf",
        ),
        (b"x 1\n" * (3 * 1024 * 1024), {}, 413, "larger than 8 MiB"),
    ],
)
def test_bad_pushes_get_400_json(
    client: FlaskClient, runtime: Runtime, body: bytes, headers: dict[str, str], status: int, problem: str
) -> None:
    resp = client.put("/metrics/job/j", data=body, headers=headers)
    assert resp.status_code == status
    data = resp.get_json()
    assert data["status"] == "error" and data["errorType"] == "bad_data" and problem in data["error"]
    assert len(runtime.pushes) == 0


def test_gzip_push_and_nan_values(client: FlaskClient, runtime: Runtime) -> None:
    body = gzip.compress(b"# TYPE x gauge\nx NaN\ny +Inf\n")
    resp = client.post("/metrics/job/j", data=body, headers={"Content-Encoding": "gzip"})
    assert resp.status_code == 200
    assert math.isnan(values(runtime, "x", job="j")[0]) and values(runtime, "y", job="j") == [math.inf]


# -- JSON pushes ------------------------------------------------------------------------------------


def test_training_names() -> None:
    assert training_name("loss") == "training_loss"
    assert training_name("lr") == training_name("learning_rate") == "training_learning_rate"
    assert training_name("tokens_per_second") == "training_throughput_tokens_per_second"
    assert training_name("samples_per_second") == "training_throughput_samples_per_second"
    assert training_name("training_throughput") == "training_throughput"
    assert training_name("eval_acc") == "training_eval_acc"


def test_json_push_one_and_many(client: FlaskClient, runtime: Runtime, clock: FakeClock) -> None:
    one = {"run": "llama", "step": 120, "metrics": {"loss": 2.31, "lr": 3e-4}}
    resp = client.post("/api/v1/push", json=one)
    assert resp.status_code == 200, resp.get_json()
    assert values(runtime, "training_loss", run="llama", job="training") == [2.31]
    assert values(runtime, "training_step", run="llama") == [120]
    t0 = clock.now() + 1
    many = [
        {
            "run": "llama",
            "step": 121 + i,
            "time": t0 + i,
            "metrics": {"loss": 2.0 - i / 10, "grad_norm": "NaN"},
        }
        for i in range(3)
    ]
    many.append({"run": "other", "metrics": {"tokens_per_second": "+Inf"}, "labels": {"team": "nlp"}})
    assert client.post("/api/v1/push", json=many).status_code == 200
    found = series(runtime, "training_loss", run="llama")[0]
    assert [float(v) for v in found.values] == [2.31, 2.0, 1.9, 1.8]
    assert list(found.timestamps_ms)[1:] == [int((t0 + i) * 1000) for i in range(3)]
    assert all(math.isnan(v) for v in values(runtime, "training_grad_norm", run="llama"))
    assert values(runtime, "training_throughput_tokens_per_second", run="other", team="nlp") == [math.inf]
    runtime.store.flush()
    runs = {r["run"]: r for r in client.get("/api/v1/runs").get_json()["data"]}
    assert runs["llama"]["last_step"] == 123 and runs["llama"]["status"] == "running"
    assert runs["other"]["last_step"] is None


def test_json_push_accepts_nan_literals(client: FlaskClient, runtime: Runtime) -> None:
    body = b'{"run": "r", "metrics": {"loss": NaN, "x": Infinity, "y": -Infinity}}'
    assert client.post("/api/v1/push", data=body, content_type="application/json").status_code == 200
    assert math.isnan(values(runtime, "training_loss", run="r")[0])
    assert values(runtime, "training_y", run="r") == [-math.inf]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"{", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"42", "expected an object"),
        (b'{"metrics": {"loss": 1}}', "run"),
        (b'{"run": "", "metrics": {}}', "run"),
        (b'{"run": "r", "metrics": [1]}', "metrics"),
        (b'{"run": "r", "metrics": {"lo ss": 1}}', "invalid metric name"),
        (b'{"run": "r", "metrics": {"loss": "high"}}', "expected a number"),
        (b'{"run": "r", "metrics": {"loss": true}}', "expected a number"),
        (b'{"run": "r", "metrics": {"loss": null}}', "expected a number"),
        (b'{"run": "r", "step": "ten"}', "step"),
        (b'{"run": "r", "step": 1' + b"0" * 400 + b"}", "out of range"),
        (b'{"run": "r", "time": -1}', "time"),
        (b'{"run": "r", "labels": {"__x": "1"}}', "invalid label name"),
        (b'{"run": "r", "labels": {"a": 1}}', "expected a string"),
        (b'{"run": "r", "colour": 1}', "unknown field"),
        (b'[{"run": "r"}, 7]', "body[1]"),
    ],
)
def test_bad_json_pushes_get_400(client: FlaskClient, body: bytes, problem: str) -> None:
    resp = client.post("/api/v1/push", data=body, content_type="application/json")
    assert resp.status_code == 400
    data = resp.get_json()
    assert data["status"] == "error" and data["errorType"] == "bad_data" and problem in data["error"]


def test_too_many_labels_and_points() -> None:
    labels = {f"l{i}": "v" for i in range(70)}
    with pytest.raises(PushError, match="more than 64 labels"):
        parse_training({"run": "r", "labels": labels}, 0)
    with pytest.raises(PushError, match="at most 10000"):
        parse_training([{"run": "r"}] * 10_001, 0)


# -- runs -------------------------------------------------------------------------------------------


def test_runs_init_progress_eta_finish(client: FlaskClient, clock: FakeClock) -> None:
    init: dict[str, Any] = {
        "run": "sft",
        "action": "init",
        "total_steps": 1000,
        "config": {"lr": 3e-4, "model": "llama-7b"},
        "host": "node-1",
        "gpus": [0, 1],
    }
    assert client.post("/api/v1/runs", json=init).status_code == 200
    start = clock.now()
    for step in range(0, 101, 10):
        client.post("/api/v1/push", json={"run": "sft", "step": step, "metrics": {"loss": 1.0}})
        clock.advance(10)  # one step a second
    run = client.get("/api/v1/runs").get_json()["data"][0]
    assert run["run"] == "sft" and run["status"] == "running" and run["start"] == start
    assert run["total_steps"] == 1000 and run["last_step"] == 100 and run["progress"] == 0.1
    assert run["steps_per_second"] == pytest.approx(1.0)
    assert run["eta_seconds"] == pytest.approx(900.0)
    assert run["config"] == {"lr": 3e-4, "model": "llama-7b"} and run["gpus"] == [0, 1]
    assert run["is_stalled"] is False
    clock.advance(3600)
    assert client.get("/api/v1/runs").get_json()["data"][0]["is_stalled"] is True
    done = client.post("/api/v1/runs", json={"run": "sft", "action": "finish", "status": "failed"})
    assert done.status_code == 200
    run = client.get("/api/v1/runs").get_json()["data"][0]
    assert run["status"] == "failed" and run["end"] == clock.now() and run["eta_seconds"] is None


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"run": "r"}, "action"),
        ({"run": "r", "action": "finish", "status": "meh"}, "status"),
        ({"run": "r", "action": "init", "total_steps": -1}, "total_steps"),
        ({"run": "r", "action": "init", "total_steps": 10**30}, "total_steps"),
        ({"run": "r", "action": "finish", "step": 10**400}, "step"),
        ({"run": "r", "action": "init", "config": [1]}, "config"),
        ({"run": "r", "action": "init", "gpus": "0,1"}, "gpus"),
    ],
)
def test_bad_run_requests(client: FlaskClient, body: dict[str, Any], problem: str) -> None:
    resp = client.post("/api/v1/runs", data=json.dumps(body), content_type="application/json")
    assert resp.status_code == 400 and problem in resp.get_json()["error"]


def test_seen_throttle_and_runs_read_the_newest_step(
    client: FlaskClient, runtime: Runtime, clock: FakeClock
) -> None:
    throttle = SeenThrottle(interval_ms=10_000)
    assert throttle.admit("a", 0) and not throttle.admit("a", 9_999) and throttle.admit("b", 1)
    assert throttle.admit("a", 10_000)
    for step in range(5):  # one second apart: only the first sighting is written to the runs table
        client.post("/api/v1/push", json={"run": "fast", "step": step, "metrics": {"loss": 1.0}})
        clock.advance(1)
    runtime.store.flush()
    run = client.get("/api/v1/runs").get_json()["data"][0]
    assert run["last_step"] == 4 and run["last_seen"] == clock.now() - 1  # from training_step
    assert run["steps_per_second"] == pytest.approx(1.0)


_json = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
_keys = st.sampled_from(
    ["run", "step", "metrics", "time", "labels", "action", "total_steps", "config", "gpus"]
)
_objects = st.dictionaries(_keys, _json, max_size=6)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(_json, _objects, st.lists(_objects, max_size=3)))
def test_json_endpoints_never_answer_500(client: FlaskClient, body: Any) -> None:
    text = json.dumps(body)  # NaN and Infinity literals included
    for path in ("/api/v1/push", "/api/v1/runs"):
        resp = client.post(path, data=text, content_type="application/json")
        assert resp.status_code in (200, 400), (path, text, resp.get_data(as_text=True))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.text(max_size=40), body=st.binary(max_size=200), method=st.sampled_from(["PUT", "POST", "DELETE"])
)
def test_pushgateway_never_answers_500(client: FlaskClient, path: str, body: bytes, method: str) -> None:
    resp = client.open("/metrics/job/" + path, method=method, data=body)
    assert resp.status_code in (200, 400, 404, 405), resp.get_data(as_text=True)


@pytest.mark.parametrize("number", ["9" * 5000, "-" + "1" * 4400])
def test_json_numbers_too_big_to_read_are_a_400(client: FlaskClient, number: str) -> None:
    for path, text in (
        ("/api/v1/push", '{"run": "r", "step": 1, "metrics": {"loss": ' + number + "}}"),
        ("/api/v1/runs", '{"action": "init", "run": "r", "total_steps": ' + number + "}"),
    ):
        resp = client.post(path, data=text, content_type="application/json")
        body = resp.get_json()
        assert resp.status_code == 400 and body["errorType"] == "bad_data", (path, body)


def test_a_label_with_a_lone_surrogate_is_stored_and_read_back(client: FlaskClient, runtime: Runtime) -> None:
    body = '{"run": "r", "step": 1, "metrics": {"loss": 0.5}, "labels": {"note": "\\udcff"}}'
    r = client.post("/api/v1/push", data=body, content_type="application/json")
    assert r.status_code == 200, r.get_json()
    runtime.store.flush()
    (sd,) = runtime.store.select([Matcher("__name__", "=", "training_loss")], 0, 2**62)
    assert dict(sd.labels)["note"] == "\udcff"


def test_a_lone_surrogate_in_a_label_leaves_every_read_answering(
    client: FlaskClient, runtime: Runtime
) -> None:
    # Once one pushed label held "\udcff", regex selectors over it, /api/v1/series and /federate
    # answered 500 (found by tests/test_fuzz_e2e.py).
    body = '{"run": "r", "step": 1, "metrics": {"loss": 0.5}, "labels": {"note": "\\udcff"}}'
    assert client.post("/api/v1/push", data=body, content_type="application/json").status_code == 200
    runtime.store.flush()
    for path, args in [
        ("/api/v1/query", {"query": '{note=~".+"}'}),
        ("/api/v1/query", {"query": 'training_loss{note!~"x"}'}),
        ("/api/v1/series", {"match[]": '{note=~".+"}'}),
        ("/federate", {"match[]": '{note=~".+"}'}),
    ]:
        r = client.get(path, query_string=args)
        assert r.status_code == 200, (path, r.get_data(as_text=True)[:300])
        assert "note" in r.get_data(as_text=True)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/push", '{"run": "\\udcff", "step": 1, "metrics": {"loss": 1}}'),
        ("/api/v1/runs", '{"run": "\\udcff", "action": "init"}'),
        ("/api/v1/runs", '{"run": "r", "action": "init", "host": "\\udcff"}'),
    ],
)
def test_a_run_name_the_store_cannot_hold_is_a_400_not_a_write_error(
    client: FlaskClient, runtime: Runtime, path: str, body: str
) -> None:
    # A run named "\udcff" reached DuckDB, which refused it: a 503, and a store write error counted
    # (GpuwatchStoreWriteErrors, /-/health degraded) for one bad request (tests/test_fuzz_e2e.py).
    r = client.post(path, data=body, content_type="application/json")
    assert r.status_code == 400 and "UTF-8" in r.get_json()["error"], r.get_json()
    runtime.store.flush()
    assert runtime.store.counters()["write_errors"] == 0


# -- new series limits ------------------------------------------------------------------------------


@pytest.fixture
def limited(tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest) -> Iterator[FlaskClient]:
    per_request, per_minute = request.param
    settings = load(
        None,
        {},
        {
            "data_dir": str(tmp_path / "data"),
            "demo": True,
            "max_new_series_per_request": per_request,
            "max_new_series_per_minute": per_minute,
        },
    )
    nvml = FakeNvml(gpu_count=1, clock=clock, blocking_event_wait=False)
    rt = build_runtime(settings, "node-1", clock=clock, nvml=nvml)
    app = create_app(rt)
    app.config["TESTING"] = True
    yield app.test_client()
    rt.close()


def _page(*pods: int) -> bytes:
    return "".join(f'up_pods{{pod="p{i}"}} 1\n' for i in pods).encode()


@pytest.mark.parametrize("limited", [(3, 0)], indirect=True)
def test_a_push_with_more_new_series_than_allowed_is_413_and_leaves_the_group_as_it_was(
    limited: FlaskClient,
) -> None:
    assert limited.put("/metrics/job/j", data=_page(0, 1)).status_code == 200  # + push_time_seconds: 3
    resp = limited.put("/metrics/job/j", data=_page(0, 1, 2, 3, 4, 5))
    assert resp.status_code == 413
    assert "max_new_series_per_request (3)" in resp.get_json()["error"]
    rt = limited.application.extensions["gpuwatch"]
    stored = series(rt, "up_pods")
    assert sorted(dict(s.labels)["pod"] for s in stored) == ["p0", "p1"]
    assert sorted(dict(s.labels)["pod"] for s in rt.pushes.current() if s.name == "up_pods") == ["p0", "p1"]
    resp = limited.post("/api/v1/push", json={"run": "r", "metrics": {"a": 1, "b": 2, "c": 3, "d": 4}})
    assert resp.status_code == 413 and "max_new_series_per_request" in resp.get_json()["error"]
    assert rt.store.select([Matcher("run", "=", "r")], 0, 2**62) == []


@pytest.mark.parametrize("limited", [(0, 5)], indirect=True)
def test_pushes_beyond_the_minute_s_new_series_are_429_until_it_has_passed(
    limited: FlaskClient, clock: FakeClock
) -> None:
    assert limited.put("/metrics/job/a", data=_page(0, 1)).status_code == 200  # 3 new
    assert limited.put("/metrics/job/a", data=_page(0, 1)).status_code == 200  # none new
    resp = limited.put("/metrics/job/b", data=_page(0, 1))  # 3 more
    assert resp.status_code == 429 and "max_new_series_per_minute (5)" in resp.get_json()["error"]
    clock.advance(61)
    assert limited.put("/metrics/job/b", data=_page(0, 1)).status_code == 200
