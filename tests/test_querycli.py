"""`gpuwatch import` and `gpuwatch query` through gpuwatch.cli.main.main, on a stopped data directory and a server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from gpuwatch.cli.main import main
from gpuwatch.cli.query import UsageError, format_metric, parse_duration_ms, parse_time_ms, render_table
from gpuwatch.core.clock import FakeClock
from gpuwatch.store import Store

T0 = 1_700_000_000  # seconds
SERIES = "".join(
    f'gpu_util{{gpu="{g}"}} {10 * g + i} {(T0 + 15 * i) * 1000}\n' for g in range(2) for i in range(5)
)


@pytest.fixture(autouse=True)
def _no_user_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("GPUWATCH_"):
            monkeypatch.delenv(key)


def _import(tmp_path: Path, text: str, *extra: str) -> int:
    f = tmp_path / "in.prom"
    f.write_text(text)
    return main(["import", str(f), "--data-dir", str(tmp_path / "data"), *extra])


def test_import_then_query_on_stopped_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _import(tmp_path, SERIES) == 0
    assert capsys.readouterr().out == f"imported 10 samples in 2 series from {tmp_path / 'in.prom'}\n"
    data = str(tmp_path / "data")

    assert main(["query", "gpu_util", "--time", str(T0 + 60), "--data-dir", data, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["resultType"] == "vector"
    assert {r["metric"]["gpu"]: r["value"] for r in got["result"]} == {
        "0": [T0 + 60, "4"],
        "1": [T0 + 60, "14"],
    }

    assert main(["query", "sum(gpu_util)", "--time", "2023-11-14T22:14:20Z", "--data-dir", data]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["SERIES", "VALUE", "TIME"]
    assert "{}" in out and "18" in out and "2023-11-14T22:14:20.000Z" in out

    argv = ["query", 'gpu_util{gpu="1"}', "--start", str(T0), "--end", str(T0 + 60), "--step", "30s"]
    assert main([*argv, "--data-dir", data]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        'gpu_util{gpu="1"}',
        "  2023-11-14T22:13:20.000Z  10",
        "  2023-11-14T22:13:50.000Z  12",
        "  2023-11-14T22:14:20.000Z  14",
    ]


def test_import_bad_line_reports_file_line_and_imports_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _import(tmp_path, SERIES + "broken{ 1\n") == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'in.prom'}:11: " in err and "nothing imported" in err
    assert not (tmp_path / "data" / "gpuwatch.duckdb").exists() or _count(tmp_path / "data") == 0
    assert _import(tmp_path, SERIES + "broken{ 1\n", "--partial") == 0
    assert "imported 10 samples" in capsys.readouterr().out


def _count(data_dir: Path) -> int:
    store = Store.open(data_dir, clock=FakeClock(), read_only=True)
    try:
        from gpuwatch.core.model import Matcher

        return sum(len(s.values) for s in store.select([Matcher("__name__", "=~", ".+")], 0, 2**62))
    finally:
        store.close()


def test_store_in_use_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    holder = Store.open(tmp_path / "data", clock=FakeClock())
    try:
        assert _import(tmp_path, SERIES) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is in use by a running gpuwatch; use --url http://" in err
        assert main(["query", "up", "--data-dir", str(tmp_path / "data")]) == 2
        assert "in use" in capsys.readouterr().err
    finally:
        holder.close()


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["query", "sum(", "--data-dir", "{d}"], 1, ""),
        (
            ["query", "up", "--time", "yesterday", "--data-dir", "{d}"],
            2,
            "cannot parse 'yesterday' as a time",
        ),
        (["query", "up", "--start", "now-1h", "--step", "fast", "--data-dir", "{d}"], 2, "as a duration"),
        (["query", "up", "--end", "now", "--data-dir", "{d}"], 2, "--end and --step need --start"),
        (["query", "up", "--url", "http://127.0.0.1:1"], 2, "cannot reach http://127.0.0.1:1"),
        (["import", "{d}/missing.prom", "--data-dir", "{d}"], 2, "cannot read"),
    ],
)
def test_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    _import(tmp_path, SERIES)
    capsys.readouterr()
    d = str(tmp_path / "data")
    assert main([a.replace("{d}", d) for a in argv]) == code
    err = capsys.readouterr().err
    assert err.startswith("gpuwatch: ") and err.count("\n") == 1 and message in err
    assert "Traceback" not in err


def test_time_and_duration_parsing() -> None:
    now = 1_700_000_000_000
    assert parse_time_ms("now", now) == now
    assert parse_time_ms("now-1h", now) == now - 3_600_000
    assert parse_time_ms("-90s", now) == now - 90_000
    assert parse_time_ms("now+1m", now) == now + 60_000
    assert parse_time_ms("1700000000.5", now) == 1_700_000_000_500
    assert parse_time_ms("2023-11-14T22:13:20Z", now) == 1_700_000_000_000
    assert parse_time_ms("2023-11-14T23:13:20+01:00", now) == 1_700_000_000_000
    assert parse_duration_ms("15s") == 15_000 and parse_duration_ms("1m30s") == 90_000
    assert parse_duration_ms("0.5") == 500 and parse_duration_ms("250ms") == 250
    for bad in ("", "1x", "s", "inf"):
        with pytest.raises(UsageError):
            parse_duration_ms(bad)


def test_render_table_shapes() -> None:
    assert render_table({"resultType": "scalar", "result": [T0, "2"]}) == "2  @ 2023-11-14T22:13:20.000Z\n"
    assert render_table({"resultType": "vector", "result": []}) == "(no data)\n"
    assert format_metric({"__name__": "m", "b": "2", "a": 'x"y'}) == 'm{a="x"y", b="2"}'
    assert format_metric({}) == "{}"


@pytest.mark.slow
def test_import_and_query_through_a_running_server(
    serve, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    srv = serve("--demo")
    f = tmp_path / "in.prom"
    f.write_text(SERIES)
    assert main(["import", str(f), "--url", srv.url]) == 0
    assert "imported 10 samples in 2 series" in capsys.readouterr().out
    assert main(["import", str(f), "--data-dir", str(srv.data_dir)]) == 2
    assert "use --url" in capsys.readouterr().err
    argv = ["query", 'gpu_util{gpu="1"}', "--start", str(T0), "--end", str(T0 + 60), "--step", "30s"]
    assert main([*argv, "--url", srv.url, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [v[1] for v in got["result"][0]["values"]] == ["10", "12", "14"]
    bad = tmp_path / "bad.prom"
    bad.write_text("ok 1\nnot valid\n")
    assert main(["import", str(bad), "--url", srv.url]) == 1
    assert f"{bad}:2: invalid value 'valid'" in capsys.readouterr().err
    resp = requests.post(srv.url + "/api/v1/import/prometheus", data=b"ok 1\nnot valid\n", timeout=10)
    assert resp.status_code == 400 and resp.json()["error"] == "line 2: invalid value 'valid'"
