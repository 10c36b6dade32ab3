"""A face whose remote store is down (`storage.remote.local_buffer`): the API and the pages answer from
the local store's last minutes with one warning line, the remote is asked again after a few seconds,
the warning goes once it answers; the rules skip their round and keep their alerts. Real DuckDB, real
HTTP on 127.0.0.1 (a port nobody listens on, or a server that fails and recovers), a fake clock."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.model import Batch, Sample, stable_labels
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.query.fallback import RETRY_S
from gpuwatch.web import create_app
from tests.webhook_server import Hook, hook_server

START = 1_790_000_000.0
MINUTE_MS = 60_000
DOWN = (502, b"<html>Bad Gateway</html>")


def nobody_listens() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def warning(url: str, why: str, buffer: str = "15 minutes") -> str:
    return f"remote query backend {url} unreachable: {why}; answered from the local buffer (last {buffer})"


REFUSED = "cannot connect: Connection refused"


def face(tmp_path: Path, url: str, **remote: object) -> Runtime:
    """A face on `url` whose store holds `job_load` of the last 30 minutes, a point a minute (value:
    the minute), and the clock at the last."""
    settings = load(
        None,
        {},
        {
            "data_dir": str(tmp_path / "data"),
            "storage": {"remote": {"query_url": url, **remote}},
            "builtin_rules": False,
            "rule_files": [str(tmp_path / "rules.yml")],
        },
    )
    (tmp_path / "rules.yml").write_text(
        "groups:\n- name: lab\n  rules:\n"
        "  - alert: Hot\n    expr: job_load > 20\n"
        "  - record: job:load:max\n    expr: max(job_load)\n"
    )
    clock = FakeClock(START)
    rt = build_runtime(settings, "face", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
    for minute in range(31):
        rt.store.append(Batch(clock.now_ms(), [Sample("job_load", stable_labels({"job": "train"}), minute)]))
        if minute < 30:
            clock.advance(60)
    rt.store.flush()
    return rt


def now_ms() -> int:
    return int(START * 1000) + 30 * MINUTE_MS


@pytest.fixture
def down(tmp_path: Path) -> Iterator[tuple[Runtime, FlaskClient, str]]:
    url = nobody_listens()
    rt = face(tmp_path, url)
    yield rt, create_app(rt).test_client(), url
    rt.close()


def test_an_unreachable_remotes_queries_are_answered_from_the_local_buffer_with_one_warning(
    down: tuple[Runtime, FlaskClient, str],
) -> None:
    _, client, url = down
    r = client.get("/api/v1/query", query_string={"query": "job_load"})
    assert r.status_code == 200 and r.headers["Gpuwatch-Answered-By"] == "local-buffer"
    body = r.get_json()
    assert body["status"] == "success" and body["warnings"] == [warning(url, REFUSED)]
    assert [s["value"][1] for s in body["data"]["result"]] == ["30"]

    # a range over the last hour: only the buffer's 15 minutes, on the query's own steps
    end = now_ms() // 1000
    r = client.get(
        "/api/v1/query_range",
        query_string={"query": "job_load", "start": str(end - 3600), "end": str(end), "step": "120"},
    )
    body = r.get_json()
    assert r.status_code == 200 and body["warnings"] == [warning(url, REFUSED)]
    ((series,),) = [body["data"]["result"]]
    times = [t for t, _ in series["values"]]
    assert times[0] == end - 3600 + 23 * 120 and times[-1] == end  # the first step not before now-15m
    assert [v for _, v in series["values"]] == [str(m) for m in range(16, 31, 2)]

    # a range that ends before the buffer: nothing, said as such
    r = client.get(
        "/api/v1/query_range",
        query_string={"query": "job_load", "start": str(end - 3600), "end": str(end - 1800), "step": "60"},
    )
    assert r.get_json()["data"]["result"] == [] and r.get_json()["warnings"] == [warning(url, REFUSED)]


def test_series_and_labels_come_from_the_buffer_too(down: tuple[Runtime, FlaskClient, str]) -> None:
    rt, client, url = down
    rt.store.append(Batch(int(START * 1000), [Sample("old_metric", (), 1.0)]))  # 30 minutes ago
    rt.store.flush()
    r = client.get("/api/v1/series", query_string={"match[]": "job_load"})
    assert r.status_code == 200 and r.get_json()["warnings"] == [warning(url, REFUSED)]
    assert r.get_json()["data"] == [{"__name__": "job_load", "job": "train"}]
    names = client.get("/api/v1/label/__name__/values").get_json()
    assert "job_load" in names["data"] and "old_metric" not in names["data"]
    assert names["warnings"] == [warning(url, REFUSED)]
    labels = client.get("/api/v1/labels", query_string={"match[]": "job_load", "limit": "1"}).get_json()
    assert labels["data"] == ["__name__"]
    assert labels["warnings"] == [warning(url, REFUSED), "results truncated due to limit"]


def test_the_pages_and_their_twins_carry_the_line(down: tuple[Runtime, FlaskClient, str]) -> None:
    _, client, url = down
    twin = client.get("/api/ui/cluster")
    assert twin.status_code == 200 and twin.headers["Gpuwatch-Answered-By"] == "local-buffer"
    assert twin.get_json()["warnings"] == [warning(url, REFUSED)] and "panels" in twin.get_json()
    page = client.get("/", headers={"Accept": "text/html"})
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    assert f'<div id="gw-remote" class="gw-remote" role="status">{warning(url, REFUSED)}</div>' in html
    # what asks no query says nothing
    assert "Gpuwatch-Answered-By" not in client.get("/-/health").headers


def test_the_buffer_is_a_setting(tmp_path: Path) -> None:
    url = nobody_listens()
    rt = face(tmp_path, url, local_buffer="5m")
    try:
        client = create_app(rt).test_client()
        end = now_ms() // 1000
        body = client.get(
            "/api/v1/query_range",
            query_string={"query": "job_load", "start": str(end - 3600), "end": str(end), "step": "60"},
        ).get_json()
        assert body["warnings"] == [warning(url, REFUSED, "5 minutes")]
        assert [v for _, v in body["data"]["result"][0]["values"]] == [str(m) for m in range(25, 31)]
        assert client.get("/-/settings").get_json()["storage"]["remote"]["local_buffer"] == "5m"
    finally:
        rt.close()
    with pytest.raises(ConfigError, match=r"storage\.remote\.local_buffer: expected a duration like 15m"):
        load(None, {}, {"data_dir": "x", "storage": {"remote": {"query_url": url, "local_buffer": "soon"}}})


@pytest.fixture
def flaky(tmp_path: Path) -> Iterator[tuple[Runtime, FlaskClient, Hook]]:
    with hook_server() as remote:
        remote.answer = {"status": "success", "data": {"resultType": "vector", "result": []}}
        rt = face(tmp_path, remote.url)
        yield rt, create_app(rt).test_client(), remote
        rt.close()


def queries(remote: Hook) -> int:
    return sum(1 for path, _, _ in remote.requests if path.startswith("/api/v1/query"))


def test_a_failed_remote_is_asked_again_after_a_few_seconds_and_the_warning_goes_when_it_answers(
    flaky: tuple[Runtime, FlaskClient, Hook],
) -> None:
    rt, client, remote = flaky
    remote.status, remote.answer = DOWN
    first = client.get("/api/v1/query", query_string={"query": "job_load"})
    assert first.get_json()["warnings"] == [warning(remote.url, "HTTP 502: <html>Bad Gateway</html>")]
    for _ in range(5):  # a page's other panels: not one waits for the remote
        assert client.get("/api/v1/query", query_string={"query": "job_load"}).status_code == 200
    assert queries(remote) == 1

    rt.clock.advance(RETRY_S)  # type: ignore[attr-defined]
    remote.status, remote.answer = 200, {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "job_load", "job": "train"}, "value": [now_ms() / 1000, "7"]}]}}  # fmt: skip
    back = client.get("/api/v1/query", query_string={"query": "job_load"})
    assert queries(remote) == 2
    assert "warnings" not in back.get_json() and back.headers["Gpuwatch-Answered-By"] == "remote"
    assert back.get_json()["data"]["result"][0]["value"][1] == "7"
    assert "warnings" not in client.get("/api/ui/cluster").get_json()


def test_a_query_the_remote_refuses_is_its_own_error_not_the_buffers(
    flaky: tuple[Runtime, FlaskClient, Hook],
) -> None:
    _, client, remote = flaky
    remote.status = 400
    remote.answer = {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"}
    r = client.get("/api/v1/query", query_string={"query": "job_("})
    assert r.status_code == 400 and r.get_json()["error"] == "parse error at char 5"
    assert r.headers["Gpuwatch-Answered-By"] == "remote"


def rule(rt: Runtime, name: str) -> Any:
    assert rt.rules is not None
    ((group,),) = [rt.rules.groups()]
    return next(
        (st, alerts)
        for r, st, alerts in zip(group.group.rules, group.status, group.alerts, strict=True)
        if r.name == name
    )


def test_the_rules_skip_a_round_the_remote_cannot_answer_and_no_alert_resolves(
    flaky: tuple[Runtime, FlaskClient, Hook],
) -> None:
    rt, client, remote = flaky
    assert rt.rules is not None
    hot = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"job": "train"}, "value": [now_ms() / 1000, "30"]}]}}  # fmt: skip
    remote.answer = hot
    rt.rules.evaluate_all()
    st, alerts = rule(rt, "Hot")
    assert st.health == "ok" and [a.state for a in alerts.values()] == ["firing"]

    remote.status, remote.answer = DOWN
    asked = len(remote.requests)
    for _ in range(3):
        rt.clock.advance(15)  # type: ignore[attr-defined]
        rt.rules.evaluate_all()
        assert rt.rules.transitions == []
    # each round's first rule asked (RETRY_S has passed since), the others not at all
    assert len(remote.requests) == asked + 3
    for name in ("Hot", "job:load:max"):
        st, alerts = rule(rt, name)
        assert st.health == "err"
        assert st.last_error == (
            f"remote query backend {remote.url} unreachable: HTTP 502: <html>Bad Gateway</html>; "
            "round skipped, alerts kept as they were"
        )
    assert [a.state for a in rule(rt, "Hot")[1].values()] == ["firing"]  # the local buffer is not read
    rules = client.get("/api/v1/rules").get_json()["data"]["groups"][0]["rules"]
    assert {r["health"] for r in rules} == {"err"}
    assert [a["state"] for a in rules[0]["alerts"]] == ["firing"]
    assert rt.rules.failure_counts() == {f"{rt.settings.rule_files[0]};lab": 6}

    # the remote back, the alert's condition gone: now, and only now, it resolves
    rt.clock.advance(RETRY_S)  # type: ignore[attr-defined]
    remote.status, remote.answer = 200, {"status": "success", "data": {"resultType": "vector", "result": []}}
    rt.rules.evaluate_all()
    assert [(t.before, t.after) for t in rt.rules.transitions] == [("firing", "inactive")]
    assert rule(rt, "Hot")[0].health == "ok"
