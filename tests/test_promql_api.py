"""The Prometheus-compatible HTTP API, on a minimal Flask app over a real in-memory store."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from flask import Flask
from flask.testing import FlaskClient

from gpuwatch.app.config import load
from gpuwatch.core.clock import FakeClock
from gpuwatch.query.backend import LocalBackend
from gpuwatch.store import Store
from gpuwatch.web.errors import register_error_handlers
from gpuwatch.web.promapi import bp

T0 = 1_700_000_000_000  # ms


class ApiRuntime(SimpleNamespace):
    """What the API's routes use of a runtime; the backend follows the settings a test changes."""

    @property
    def backend(self) -> LocalBackend:
        return LocalBackend(self.queryable, self.store, self.settings, self.clock.monotonic)


@pytest.fixture
def runtime() -> Iterator[SimpleNamespace]:
    clock = FakeClock(start=T0 / 1000 + 3600)
    store = Store.open(None, clock=clock, flush_interval_s=3600.0)
    t = np.arange(T0, T0 + 3600_000, 15_000, dtype=np.int64)
    for gpu in ("0", "1"):
        store.append_series(
            "DCGM_FI_DEV_GPU_UTIL", (("Hostname", "n1"), ("gpu", gpu)), t, np.full(len(t), 50.0 + int(gpu))
        )
    store.append_series("requests_total", (("job", "api"),), t, np.arange(len(t), dtype=np.float64) * 15)
    store.append_series("temp_celsius", (("room", "Küche ☃"),), t, np.full(len(t), 21.5))
    store.flush()
    yield ApiRuntime(
        store=store,
        queryable=store,
        clock=clock,
        settings=load(None, {}, {"data_dir": "unused", "query_timeout": 30, "query_max_samples": 1_000_000}),
        metric_metadata=lambda: {"requests_total": [{"type": "counter", "help": "Requests.", "unit": ""}]},
    )
    store.close()


def make_app(runtime: SimpleNamespace) -> Flask:
    """A minimal Flask app with the API's blueprint and gpuwatch's error handlers."""
    app = Flask(__name__)
    app.register_blueprint(bp)
    register_error_handlers(app)
    app.extensions["gpuwatch"] = runtime
    app.json.sort_keys = False  # type: ignore[attr-defined]  # as create_app
    return app


@pytest.fixture
def client(runtime: SimpleNamespace) -> FlaskClient:
    return make_app(runtime).test_client()


def test_instant_query_shape(client: FlaskClient) -> None:
    r = client.get(
        "/api/v1/query", query_string={"query": "DCGM_FI_DEV_GPU_UTIL", "time": (T0 + 600_000) / 1000}
    )
    assert r.status_code == 200
    body = r.get_json()
    assert body["status"] == "success"
    assert body["data"]["resultType"] == "vector"
    first = body["data"]["result"][0]
    assert first["metric"] == {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "n1", "gpu": "0"}
    assert first["value"] == [1700000600, "50"]


def test_instant_query_defaults_to_clock_and_accepts_rfc3339(client: FlaskClient) -> None:
    r = client.get("/api/v1/query", query_string={"query": "sum(rate(requests_total[5m]))"})
    assert float(r.get_json()["data"]["result"][0]["value"][1]) == pytest.approx(1.0)
    r = client.get("/api/v1/query", query_string={"query": "1.5", "time": "2023-11-14T22:23:20.123Z"})
    assert r.get_json()["data"] == {"resultType": "scalar", "result": [1700000600.123, "1.5"]}


def test_range_query_get_and_form_post(client: FlaskClient) -> None:
    params = {
        "query": "rate(requests_total[1m])",
        "start": T0 / 1000 + 600,
        "end": T0 / 1000 + 900,
        "step": "60s",
    }
    for r in (
        client.get("/api/v1/query_range", query_string=params),
        client.post("/api/v1/query_range", data=params),
    ):
        body = r.get_json()
        assert r.status_code == 200, body
        assert body["data"]["resultType"] == "matrix"
        series = body["data"]["result"][0]
        assert series["metric"] == {"job": "api"}
        assert [round(float(v[1]), 9) for v in series["values"]] == [1.0] * 6
        assert series["values"][0][0] == 1700000600


def test_a_get_reads_the_url_not_its_body(client: FlaskClient) -> None:
    # As Prometheus (Go's ParseForm reads a body only for POST, PUT and PATCH): a form body on a GET is ignored.
    r = client.get(
        "/api/v1/query",
        query_string={"time": "1700000000"},
        data={"query": "2"},
        content_type="application/x-www-form-urlencoded",
    )
    assert r.status_code == 400 and r.get_json()["errorType"] == "bad_data"
    r = client.post("/api/v1/query?time=1700000000", data={"query": "2"})
    assert r.status_code == 200 and r.get_json()["data"]["result"][1] == "2"


def test_parse_error_is_bad_data(client: FlaskClient) -> None:
    r = client.get("/api/v1/query", query_string={"query": "sum(", "time": "1700000000"})
    assert r.status_code == 400
    body = r.get_json()
    assert body["status"] == "error" and body["errorType"] == "bad_data" and body["error"]


def test_execution_error_is_422(client: FlaskClient) -> None:
    r = client.get("/api/v1/query", query_string={"query": "histogram_count(x)", "time": "1700000000"})
    assert r.status_code == 422
    assert r.get_json()["errorType"] == "execution"
    assert "native histograms" in r.get_json()["error"]


def test_too_many_points_is_bad_data(client: FlaskClient) -> None:
    params = {"query": "up", "start": "0", "end": "1000000", "step": "1"}
    r = client.get("/api/v1/query_range", query_string=params)
    assert r.status_code == 400
    assert "exceeded maximum resolution of 11,000 points per timeseries" in r.get_json()["error"]


@pytest.mark.parametrize(
    ("url", "status", "error_type", "error"),
    [
        (
            "/api/v1/query_range?query=up&start=x&end=10&step=1",
            400,
            "bad_data",
            'invalid parameter "start": cannot parse "x" to a valid timestamp',
        ),
        (  # a time without a zone, as Prometheus refuses it
            "/api/v1/query?query=up&time=2023-11-14T22:13:20",
            400,
            "bad_data",
            'invalid parameter "time": cannot parse "2023-11-14T22:13:20" to a valid timestamp',
        ),
        (  # beyond the +-2^62 ms gpuwatch takes
            "/api/v1/query?query=1&time=1e20",
            400,
            "bad_data",
            'invalid parameter "time": cannot parse "1e20" to a valid timestamp',
        ),
        (
            "/api/v1/query_range?query=up&start=0&end=10&step=fast",
            400,
            "bad_data",
            'invalid parameter "step": cannot parse "fast" to a valid duration',
        ),
        (
            "/api/v1/query_range?query=up&start=0&end=10&step=-15",
            400,
            "bad_data",
            'invalid parameter "step": zero or negative query resolution step widths are not accepted. '
            "Try a positive integer",
        ),
        ("/api/v1/query_range?query=up&start=0&end=10", 400, "bad_data", 'invalid parameter "step": missing'),
        ("/api/v1/query?time=1700000600", 400, "bad_data", 'invalid parameter "query": empty query'),
        (
            "/api/v1/series?match[]=up&start=tomorrow",
            400,
            "bad_data",
            'invalid parameter "start": cannot parse "tomorrow" to a valid timestamp',
        ),
    ],
)
def test_parameter_errors_are_prometheus_json(
    client: FlaskClient, url: str, status: int, error_type: str, error: str
) -> None:
    r = client.get(url)
    assert r.status_code == status and r.mimetype == "application/json"
    assert r.get_json() == {"status": "error", "errorType": error_type, "error": error}


def test_a_query_string_that_is_not_utf8_is_bad_data(client: FlaskClient) -> None:
    r = client.get("/api/v1/query", environ_overrides={"QUERY_STRING": "query=\xff"})
    assert r.status_code == 400
    assert r.get_json() == {
        "status": "error",
        "errorType": "bad_data",
        "error": "invalid query string: not UTF-8",
    }
    assert client.get("/api/v1/query", query_string={"query": "1"}).status_code == 200


def test_head_and_other_methods(client: FlaskClient) -> None:
    r = client.head("/api/v1/query?query=1")
    assert r.status_code == 200 and r.get_data() == b"" and int(r.headers["Content-Length"]) > 0
    r = client.put("/api/v1/query?query=1")
    assert r.status_code == 405 and r.get_json()["status"] == "error"
    r = client.post("/api/v1/query", json={"query": "1"})  # not a form: the query is not read from it
    assert r.status_code == 400 and r.get_json()["error"] == 'invalid parameter "query": empty query'


def test_sample_limit_is_execution_error_and_server_keeps_serving(client: FlaskClient) -> None:
    rt = client.application.extensions["gpuwatch"]
    rt.settings = replace(rt.settings, query_max_samples=10)
    r = client.get("/api/v1/query", query_string={"query": "count_over_time(requests_total[1h])"})
    assert r.status_code == 422
    assert "too many samples" in r.get_json()["error"]
    rt.settings = replace(rt.settings, query_max_samples=1_000_000)
    assert client.get("/api/v1/query", query_string={"query": "1"}).status_code == 200


def test_query_length_and_depth_settings_apply(client: FlaskClient) -> None:
    rt = client.application.extensions["gpuwatch"]
    rt.settings = replace(rt.settings, query_max_length=64, query_max_depth=3)
    r = client.get("/api/v1/query", query_string={"query": "requests_total" + " + requests_total" * 4})
    assert r.status_code == 400 and "setting query_max_length" in r.get_json()["error"]
    r = client.get("/api/v1/query", query_string={"query": "((((1))))"})
    assert r.status_code == 400 and "setting query_max_depth" in r.get_json()["error"]
    assert client.get("/api/v1/query", query_string={"query": "(1)"}).status_code == 200


def test_timeout_is_503(client: FlaskClient) -> None:
    r = client.get("/api/v1/query", query_string={"query": "up", "timeout": "-1s"})
    assert r.status_code in (400, 503)
    r = client.get("/api/v1/query", query_string={"query": "requests_total", "timeout": "-1"})
    assert r.status_code == 503
    assert r.get_json()["errorType"] == "timeout"


def test_series_labels_and_values(client: FlaskClient) -> None:
    r = client.get("/api/v1/series", query_string={"match[]": 'DCGM_FI_DEV_GPU_UTIL{gpu=~"0|1"}'})
    assert r.get_json()["data"] == [
        {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "n1", "gpu": "0"},
        {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": "n1", "gpu": "1"},
    ]
    assert client.get("/api/v1/series").status_code == 400
    r = client.get("/api/v1/labels")
    assert r.get_json()["data"] == ["Hostname", "__name__", "gpu", "job", "room"]
    r = client.post("/api/v1/labels", data={"match[]": "requests_total"})
    assert r.get_json()["data"] == ["__name__", "job"]
    r = client.get("/api/v1/label/__name__/values")
    assert r.get_json()["data"] == ["DCGM_FI_DEV_GPU_UTIL", "requests_total", "temp_celsius"]
    r = client.get("/api/v1/label/gpu/values", query_string={"limit": "1"})
    body = r.get_json()
    assert body["data"] == ["0"] and body["warnings"]


def test_metadata_and_buildinfo(client: FlaskClient) -> None:
    r = client.get("/api/v1/metadata")
    assert r.get_json()["data"]["requests_total"][0]["type"] == "counter"
    assert client.get("/api/v1/metadata", query_string={"metric": "nope"}).get_json()["data"] == {}
    info = client.get("/api/v1/status/buildinfo").get_json()["data"]
    assert set(info) >= {"version", "revision", "branch", "buildUser", "buildDate", "goVersion"}


def test_web_module_does_not_import_duckdb() -> None:
    import ast
    from pathlib import Path

    import gpuwatch.web.promapi
    import gpuwatch.web.queryapi

    for mod in (gpuwatch.web.promapi, gpuwatch.web.queryapi):
        tree = ast.parse(Path(mod.__file__).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(n.startswith(("duckdb", "gpuwatch.collect", "gpuwatch.store")) for n in names), mod


def test_range_query_body_is_byte_for_byte_what_jsonify_sends(client: FlaskClient) -> None:
    from gpuwatch.query import Engine, to_prometheus_json

    app = client.application
    runtime = app.extensions["gpuwatch"]
    start, end = T0 + 600_000, T0 + 1_800_000
    for expr in (
        "rate(requests_total[1m]) / 7",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_UTIL > 50",
        "temp_celsius",
    ):
        r = client.get(
            "/api/v1/query_range",
            query_string={"query": expr, "start": start / 1000, "end": end / 1000, "step": "15s"},
        )
        assert r.status_code == 200
        want = Engine(runtime.store, lookback_ms=300_000).range(expr, start, end, 15_000)
        with app.app_context():
            expected = app.json.response({"status": "success", "data": to_prometheus_json(want)})
        assert r.mimetype == expected.mimetype
        assert r.get_data() == expected.get_data()


def test_an_unexpected_error_is_a_500_json_answer_and_the_next_query_is_served(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gpuwatch.query import Engine

    original = Engine.instant

    def broken(self: Engine, text: str, time_ms: int) -> object:
        if text == "boom":
            raise RuntimeError("disk on fire")
        return original(self, text, time_ms)

    monkeypatch.setattr(Engine, "instant", broken)
    r = client.get("/api/v1/query", query_string={"query": "boom"})
    assert r.status_code == 500
    assert r.get_json() == {
        "status": "error",
        "errorType": "internal",
        "error": "internal error: RuntimeError: disk on fire",
    }
    assert [rec.getMessage() for rec in caplog.records] == ["unhandled error on /api/v1/query"]
    assert client.get("/api/v1/query", query_string={"query": "1"}).status_code == 200
