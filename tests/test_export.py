"""`/api/export` and `gpuwatch export`: a query's answer or a selector's raw samples as Parquet or CSV,
read back by pandas with the same numbers the Prometheus API gives."""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import requests
from flask import Flask
from flask.testing import FlaskClient

from gpuwatch.app.config import load
from gpuwatch.cli.main import main
from gpuwatch.core.clock import FakeClock
from gpuwatch.store import Store
from gpuwatch.web.errors import register_error_handlers
from gpuwatch.web.exportapi import bp as export_bp
from gpuwatch.web.promapi import bp as prom_bp
from tests.conftest import wait_until
from tests.test_promql_api import ApiRuntime

T0 = 1_700_000_000_000  # ms
HOUR = 3_600_000


def fill(store: Store) -> None:
    """Two GPUs' utilization every 15 s for 6 hours (one NaN, one +Inf) and a counter."""
    t = np.arange(T0, T0 + 6 * HOUR, 15_000, dtype=np.int64)
    for gpu in ("0", "1"):
        v = 50.0 + int(gpu) + np.arange(len(t)) % 7
        if gpu == "1":
            v[3], v[4] = math.nan, math.inf
        store.append_series("DCGM_FI_DEV_GPU_UTIL", (("Hostname", "n1"), ("gpu", gpu)), t, v)
    store.append_series("requests_total", (("job", "api"), ("value", "x")), t, np.arange(len(t)) * 15.0)
    store.flush()


@pytest.fixture
def client() -> Iterator[FlaskClient]:
    clock = FakeClock(start=T0 / 1000 + 6 * 3600)
    store = Store.open(None, clock=clock, flush_interval_s=3600.0)
    fill(store)
    app = Flask(__name__)
    app.register_blueprint(prom_bp)
    app.register_blueprint(export_bp)
    register_error_handlers(app)
    app.extensions["gpuwatch"] = ApiRuntime(
        store=store,
        queryable=store,
        clock=clock,
        settings=load(None, {}, {"data_dir": "unused", "query_timeout": 30, "query_max_samples": 1000}),
    )
    yield app.test_client()
    store.close()


def export(client: FlaskClient, **params: object) -> pd.DataFrame:
    r = client.post("/api/export", data={k: str(v) for k, v in params.items()})
    assert r.status_code == 200, r.get_json()
    fmt = params.get("format", "parquet")
    assert r.headers["Content-Disposition"] == f'attachment; filename="gpuwatch-export.{fmt}"'
    if fmt == "csv":
        return pd.read_csv(io.BytesIO(r.data), parse_dates=["timestamp"], dtype={"gpu": str})
    return pd.read_parquet(io.BytesIO(r.data))


def test_raw_samples_of_a_selector_with_nan_and_inf_kept(client: FlaskClient) -> None:
    df = export(client, query='DCGM_FI_DEV_GPU_UTIL{gpu="1"}', start=T0 / 1000, end=(T0 + 600_000) / 1000)
    assert list(df.columns) == ["timestamp", "__name__", "Hostname", "gpu", "value"]
    assert len(df) == 41  # every 15 s from T0 to T0 + 10 min, both ends included
    assert df["timestamp"].iloc[0] == pd.Timestamp(T0, unit="ms", tz="UTC")
    assert (df["timestamp"].diff().dropna() == pd.Timedelta(seconds=15)).all()
    assert set(df["gpu"]) == {"1"} and set(df["Hostname"]) == {"n1"}
    assert math.isnan(df["value"].iloc[3]) and df["value"].iloc[4] == math.inf
    assert df["value"].iloc[5] == 51.0 + 5


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_range_query_exports_the_numbers_the_api_answers(client: FlaskClient, fmt: str) -> None:
    q = {
        "query": "avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m])",
        "start": T0 / 1000 + 600,
        "end": T0 / 1000 + 3000,
        "step": 60,
    }
    api = client.get("/api/v1/query_range", query_string=q).get_json()["data"]["result"]
    df = export(client, **q, format=fmt)
    assert "__name__" not in df.columns and len(df) == sum(len(s["values"]) for s in api)
    for s in api:
        got = df[df["gpu"] == s["metric"]["gpu"]]
        want = [float(v) for _, v in s["values"]]
        assert got["timestamp"].tolist() == [pd.Timestamp(t, unit="s", tz="UTC") for t, _ in s["values"]]
        np.testing.assert_array_equal(got["value"].to_numpy(), want)  # NaN where the window held one


def test_a_label_named_like_a_column_keeps_its_values(client: FlaskClient) -> None:
    df = export(client, query="requests_total", start=T0 / 1000, end=T0 / 1000 + 30)
    assert list(df.columns) == ["timestamp", "__name__", "job", "value_label", "value"]
    assert df["value_label"].tolist() == ["x"] * 3 and df["value"].tolist() == [0.0, 15.0, 30.0]


def test_an_answer_with_no_series_is_an_empty_file(client: FlaskClient) -> None:
    df = export(client, query="nothing_here", start=T0 / 1000, end=T0 / 1000 + 60)
    assert len(df) == 0 and list(df.columns) == ["timestamp", "value"]


@pytest.mark.parametrize(
    ("params", "status", "words"),
    [
        ({"start": T0 / 1000}, 400, "empty query"),
        ({"query": "up"}, 400, '"start": missing'),
        ({"query": "up", "start": T0 / 1000, "format": "xlsx"}, 400, "expected parquet or csv"),
        ({"query": "sum(up)", "start": T0 / 1000}, 400, "give a step to export any expression"),
        ({"query": "up offset 5m", "start": T0 / 1000}, 400, "not a series selector"),
        ({"query": "up", "start": T0 / 1000 + 60, "end": T0 / 1000}, 400, "must not be before"),
        ({"query": "up{", "start": T0 / 1000, "step": 15}, 400, ""),
        ({"query": '{__name__=~".+"}', "start": T0 / 1000, "end": T0 / 1000 + 6 * 3600}, 422, "samples"),
    ],
)
def test_bad_exports_are_json_errors(
    client: FlaskClient, params: dict[str, object], status: int, words: str
) -> None:
    r = client.post("/api/export", data={k: str(v) for k, v in params.items()})
    assert r.status_code == status
    body = r.get_json()
    assert body["status"] == "error" and words in body["error"]


def test_the_cli_exports_from_a_stopped_data_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store.open(tmp_path / "data", clock=FakeClock(start=T0 / 1000 + 6 * 3600))
    fill(store)
    store.close()
    out = tmp_path / "util.parquet"
    argv = ["export", "DCGM_FI_DEV_GPU_UTIL", "--start", str(T0 / 1000), "--end", str(T0 / 1000 + 60)]
    assert main([*argv, "-o", str(out), "--data-dir", str(tmp_path / "data")]) == 0
    assert capsys.readouterr().out == f"wrote {out}: 10 rows\n"
    df = pd.read_parquet(out)
    assert df.groupby("gpu")["value"].size().to_dict() == {"0": 5, "1": 5}
    csv = tmp_path / "sum.csv"
    argv = ["export", "sum(DCGM_FI_DEV_GPU_UTIL)", "--start", str(T0 / 1000), "--end", str(T0 / 1000 + 60)]
    assert main([*argv, "--step", "30s", "-o", str(csv), "--data-dir", str(tmp_path / "data")]) == 0
    assert pd.read_csv(csv)["value"].tolist() == [101.0, 105.0, math.inf]  # 50 + 51, 52 + 53, 54 + inf


@pytest.mark.parametrize(
    ("extra", "code", "words"),
    [
        (["-o", "x.xlsx"], 2, "cannot tell the format of x.xlsx"),
        (["-o", "x.csv", "--step", "0s"], 2, "--step must be positive"),
        (["-o", "x.csv", "--end", "0"], 2, "--end must not be before --start"),
        (["-o", "x.csv", "--url", "http://127.0.0.1:1"], 2, "cannot reach http://127.0.0.1:1"),
    ],
)
def test_cli_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], code: int, words: str
) -> None:
    assert main(["export", "up", "--start", "now-1h", *extra]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


def test_the_cli_exports_through_a_running_server(
    serve, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    srv = serve("--demo")
    query = srv.url + "/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP"
    wait_until(lambda: requests.get(query, timeout=10).json()["data"]["result"], 30, "no GPU temperature")
    out = tmp_path / "demo.parquet"
    assert (
        main(
            [
                "export",
                "DCGM_FI_DEV_GPU_TEMP",
                "--start",
                "now-10m",
                "--step",
                "5s",
                "-o",
                str(out),
                "--url",
                srv.url,
            ]
        )
        == 0
    )
    rows = int(capsys.readouterr().out.split(": ")[1].split()[0].replace(",", ""))
    df = pd.read_parquet(out)
    assert len(df) == rows > 0 and df["value"].between(20, 100).all() and df["gpu"].nunique() >= 1
    assert main(["export", "sum(up)", "--start", "now-10m", "-o", str(out), "--url", srv.url]) == 1
    assert "give a step" in capsys.readouterr().err
