"""Rule evaluation over a real store with a FakeClock: ALERTS series, persistence, recording rules,
the built-in pack, and the /api/v1/rules, /api/v1/alerts and /-/reload endpoints."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.model import Batch, Sample, make_labels
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.query import Engine, Vector
from gpuwatch.rules.evaluate import FIRING, INACTIVE, PENDING
from gpuwatch.rules.load import load_builtin, load_groups
from gpuwatch.rules.manager import RuleManager
from gpuwatch.store import Store

T0 = 1_800_000_000.0
GPU = {"gpu": "0", "Hostname": "n1", "UUID": "GPU-0"}

HOT = """
groups:
  - name: gpu
    rules:
      - alert: Hot
        expr: DCGM_FI_DEV_GPU_TEMP > 85
        for: 1m
        labels: {severity: critical}
        annotations: {summary: "GPU {{ $labels.gpu }} at {{ $value }} C"}
"""


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    s = Store.open(tmp_path / "data", clock=clock)
    yield s
    s.close()


def put(
    store: Store, clock: FakeClock, name: str, value: float, labels: dict[str, str] | None = None
) -> None:
    store.append(Batch(clock.now_ms(), [Sample(name, make_labels(labels or GPU), value)]))
    store.flush()


def manager(store: Store, clock: FakeClock, text: str = HOT, interval_s: float = 15.0) -> RuleManager:
    return RuleManager(
        store, Engine(store).instant, clock, load_groups(text, "test.yml"), default_interval_s=interval_s
    )


def query(store: Store, clock: FakeClock, expr: str) -> dict[str, float]:
    store.flush()
    result = Engine(store).instant(expr, clock.now_ms())
    assert isinstance(result, Vector)
    return {",".join(f"{k}={v}" for k, v in sorted(s.labels.items())): s.value for s in result}


def states(m: RuleManager) -> list[tuple[str, str, int]]:
    return [(r.name, a.state, a.active_at_ms) for r, a in m.active_alerts()]


def test_alert_goes_pending_firing_resolved_with_alerts_series(store: Store, clock: FakeClock) -> None:
    m = manager(store, clock)
    put(store, clock, "DCGM_FI_DEV_GPU_TEMP", 90)
    m.run_due()
    assert states(m) == [("Hot", PENDING, int(T0 * 1000))]
    base = "Hostname=n1,UUID=GPU-0,__name__=ALERTS,alertname=Hot"
    assert query(store, clock, "ALERTS") == {f"{base},alertstate=pending,gpu=0,severity=critical": 1.0}
    assert list(query(store, clock, "ALERTS_FOR_STATE").values()) == [T0]
    for _ in range(4):
        clock.advance(15)
        put(store, clock, "DCGM_FI_DEV_GPU_TEMP", 91)
        m.run_due()
    assert states(m) == [("Hot", FIRING, int(T0 * 1000))]
    ((_, alert),) = m.active_alerts()
    assert dict(alert.annotations) == {"summary": "GPU 0 at 91 C"}
    assert query(store, clock, "ALERTS") == {f"{base},alertstate=firing,gpu=0,severity=critical": 1.0}, (
        "the pending series got a staleness marker"
    )
    clock.advance(15)
    put(store, clock, "DCGM_FI_DEV_GPU_TEMP", 70)
    m.run_due()
    assert states(m) == [] and m.transitions[0].after == INACTIVE
    assert query(store, clock, "ALERTS") == {} and query(store, clock, "ALERTS_FOR_STATE") == {}


def test_groups_run_only_when_their_interval_has_passed(store: Store, clock: FakeClock) -> None:
    m = manager(store, clock, interval_s=30)
    put(store, clock, "DCGM_FI_DEV_GPU_TEMP", 90)
    m.run_due()
    (g,) = m.groups()
    first = g.last_eval_ms
    clock.advance(15)
    m.run_due()
    assert g.last_eval_ms == first
    clock.advance(15)
    m.run_due()
    assert g.last_eval_ms == first + 30_000


def test_restart_resumes_pending_timer_and_firing_alerts(tmp_path: Path, clock: FakeClock) -> None:
    two = (
        HOT
        + """
      - alert: Now
        expr: DCGM_FI_DEV_GPU_TEMP > 0
"""
    )
    store = Store.open(tmp_path / "data", clock=clock)
    m = manager(store, clock, two)
    put(store, clock, "DCGM_FI_DEV_GPU_TEMP", 90)
    m.run_due()
    assert sorted(states(m)) == [("Hot", PENDING, int(T0 * 1000)), ("Now", FIRING, int(T0 * 1000))]
    store.close()

    clock.advance(30)
    store = Store.open(tmp_path / "data", clock=clock)
    try:
        m = manager(store, clock, two)
        assert sorted(states(m)) == [("Hot", PENDING, int(T0 * 1000)), ("Now", FIRING, int(T0 * 1000))]
        put(store, clock, "DCGM_FI_DEV_GPU_TEMP", 90)
        m.run_due()
        assert m.transitions == [], "nothing new: the firing alert is not re-announced"
        clock.advance(30)
        put(store, clock, "DCGM_FI_DEV_GPU_TEMP", 90)
        m.run_due()
        assert sorted(states(m)) == [("Hot", FIRING, int(T0 * 1000)), ("Now", FIRING, int(T0 * 1000))]
        assert [(t.before, t.after) for t in m.transitions] == [(PENDING, FIRING)]
    finally:
        store.close()


def test_recording_rules_write_samples_later_rules_and_queries_read(store: Store, clock: FakeClock) -> None:
    text = """
groups:
  - name: rec
    rules:
      - record: gpu:temp:max
        expr: max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)
        labels: {source: rule}
      - alert: HostHot
        expr: gpu:temp:max > 80
"""
    m = manager(store, clock, text)
    for gpu, temp in (("0", 70.0), ("1", 88.0)):
        put(store, clock, "DCGM_FI_DEV_GPU_TEMP", temp, {**GPU, "gpu": gpu})
    m.run_due()
    assert query(store, clock, "gpu:temp:max") == {"Hostname=n1,__name__=gpu:temp:max,source=rule": 88.0}
    assert states(m) == [("HostHot", FIRING, int(T0 * 1000))]
    (g,) = m.groups()
    assert [s.health for s in g.status] == ["ok", "ok"]


def test_a_failing_rule_is_reported_and_others_still_run(store: Store, clock: FakeClock) -> None:
    text = """
groups:
  - name: g
    rules:
      - record: dup
        expr: label_replace(DCGM_FI_DEV_GPU_TEMP, "gpu", "x", "", "")
      - alert: Hot
        expr: DCGM_FI_DEV_GPU_TEMP > 85
"""
    m = manager(store, clock, text)
    for gpu in ("0", "1"):
        put(store, clock, "DCGM_FI_DEV_GPU_TEMP", 90, {**GPU, "gpu": gpu})
    m.run_due()
    (g,) = m.groups()
    assert g.status[0].health == "err" and "same labelset" in g.status[0].last_error
    assert len(m.active_alerts()) == 2


# -- the built-in pack ----------------------------------------------------------------------------


def _run_pack(store: Store, clock: FakeClock, minutes: int, figures: dict[str, float]) -> RuleManager:
    gpu = [g for g in load_builtin() if g.name == "gpuwatch-gpu"]  # the rest: tests/test_rules_pack.py
    m = RuleManager(store, Engine(store).instant, clock, gpu, default_interval_s=60)
    for _ in range(minutes + 1):
        store.append(
            Batch(
                clock.now_ms(),
                [Sample(n, make_labels({**GPU, "modelName": "H100"}), v) for n, v in figures.items()],
            )
        )
        store.flush()
        m.run_due()
        clock.advance(60)
    return m


HEALTHY = {
    "DCGM_FI_DEV_GPU_UTIL": 80.0,
    "DCGM_FI_DEV_FB_USED": 40000.0,
    "DCGM_FI_DEV_FB_TOTAL": 81559.0,
    "DCGM_FI_DEV_GPU_TEMP": 60.0,
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0,
}


@pytest.mark.parametrize(
    ("alertname", "bad", "minutes", "summary"),
    [
        ("GPUUtilizationLow", {"DCGM_FI_DEV_GPU_UTIL": 3.0}, 30, "GPU 0 on n1 is nearly idle"),
        ("GPUMemoryHigh", {"DCGM_FI_DEV_FB_USED": 78000.0}, 5, "GPU 0 on n1 memory is almost full"),
        ("GPUTemperatureHigh", {"DCGM_FI_DEV_GPU_TEMP": 92.0}, 10, "GPU 0 on n1 is running hot"),
        (
            "GPUECCError",
            {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 2.0},
            0,
            "GPU 0 on n1 reports uncorrectable ECC errors",
        ),
    ],
)
def test_builtin_rule_fires_and_resolves(
    store: Store, clock: FakeClock, alertname: str, bad: dict[str, float], minutes: int, summary: str
) -> None:
    _run_pack(store, clock, 2, HEALTHY)  # a healthy history first: nothing fires
    if minutes:
        m = _run_pack(store, clock, minutes - 1, {**HEALTHY, **bad})
        assert [(r.name, a.state) for r, a in m.active_alerts()] == [(alertname, PENDING)], "not before `for`"
    m = _run_pack(store, clock, 0, {**HEALTHY, **bad})  # a new manager: resumes the stored state
    firing = [(r.name, a) for r, a in m.active_alerts() if a.state == FIRING]
    assert [n for n, _ in firing] == [alertname]
    alert = firing[0][1]
    assert (
        dict(alert.annotations)["summary"] == summary
        and "<error" not in dict(alert.annotations)["description"]
    )
    assert dict(alert.labels)["severity"] in ("warning", "critical")
    minutes_to_clear = 61 if alertname == "GPUECCError" else 1  # increase(...[1h]) forgets after an hour
    m = _run_pack(
        store, clock, minutes_to_clear, {**HEALTHY, **bad, **({} if alertname == "GPUECCError" else HEALTHY)}
    )
    assert m.active_alerts() == []


# -- runtime, web API and reload ------------------------------------------------------------------


@pytest.fixture
def runtime(tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    rules = tmp_path / "rules.yml"
    rules.write_text(HOT.replace("for: 1m", "for: 0s"))
    settings = load(
        None,
        {},
        {"data_dir": str(tmp_path / "data"), "demo": True, "rule_files": [str(tmp_path / "*.yml")]},
    )
    rt = build_runtime(settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
    yield rt
    rt.close()


def test_api_alerts_and_rules_in_prometheus_shapes(
    runtime: Runtime, client: FlaskClient, clock: FakeClock, tmp_path: Path
) -> None:
    put(runtime.store, clock, "DCGM_FI_DEV_GPU_TEMP", 90.5)
    assert runtime.jobs.run("rules")
    alerts = client.get("/api/v1/alerts").get_json()
    assert alerts["status"] == "success"
    builtin, hot = [
        a for a in alerts["data"]["alerts"] if a["labels"]["alertname"] in ("GPUTemperatureHigh", "Hot")
    ]
    assert builtin["labels"]["alertname"] == "GPUTemperatureHigh" and builtin["state"] == "pending"
    assert hot == {
        "labels": {**GPU, "alertname": "Hot", "severity": "critical"},
        "annotations": {"summary": "GPU 0 at 90.5 C"},
        "state": "firing",
        "activeAt": "2027-01-15T08:00:00Z",
        "value": "9.05e+01",
    }
    groups = client.get("/api/v1/rules").get_json()["data"]["groups"]
    assert groups[0]["name"] == "gpuwatch-gpu" and groups[-1]["name"] == "gpu"  # built-in groups first
    assert {g["file"] for g in groups[:-1]} == {"builtin"} and groups[-1]["file"] == str(
        tmp_path / "rules.yml"
    )
    user = groups[-1]
    (rule,) = user["rules"]
    assert rule["type"] == "alerting" and rule["state"] == "firing" and rule["health"] == "ok"
    assert rule["name"] == "Hot" and rule["query"] == "DCGM_FI_DEV_GPU_TEMP > 85" and rule["duration"] == 0
    assert rule["alerts"] == [hot] and user["interval"] == 15
    recording = client.get("/api/v1/rules?type=record").get_json()["data"]["groups"]
    assert [g["file"] for g in recording] == ["builtin"] * len(recording)  # only the built-in ones
    only = client.get("/api/v1/rules?rule_name[]=Hot").get_json()["data"]["groups"]
    assert [g["name"] for g in only] == ["gpu"]
    assert client.get("/api/v1/rules?type=bogus").status_code == 400


def test_reload_keeps_previous_rules_when_a_file_is_bad(client: FlaskClient, tmp_path: Path) -> None:
    (tmp_path / "more.yml").write_text("groups: [{name: more, rules: [{record: 'x:y', expr: vector(1)}]}]")
    assert client.post("/-/reload").get_json() == {"status": "success"}
    names = [
        g["name"] for g in client.get("/api/v1/rules").get_json()["data"]["groups"] if g["file"] != "builtin"
    ]
    assert names == ["more", "gpu"]  # files in glob order: more.yml, rules.yml
    (tmp_path / "more.yml").write_text("groups: [{name: more, rules: [{alert: A, expr: 'up =='}]}]")
    bad = client.post("/-/reload")
    assert bad.status_code == 400 and "more.yml: group 'more' rule 0 (alert 'A')" in bad.get_json()["error"]
    after = [
        g["name"] for g in client.get("/api/v1/rules").get_json()["data"]["groups"] if g["file"] != "builtin"
    ]
    assert after == names


def test_bad_rule_file_at_start_is_a_config_error(tmp_path: Path, clock: FakeClock) -> None:
    (tmp_path / "bad.yml").write_text("groups: [{name: g, rules: [{alert: A, expr: up, for: x}]}]")
    settings = load(
        None, {}, {"data_dir": str(tmp_path / "data"), "demo": True, "rule_files": str(tmp_path / "bad.yml")}
    )
    with pytest.raises(ConfigError, match=r"rule_files: .*bad.yml: group 'g' rule 0 \(alert 'A'\): for:"):
        build_runtime(settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))


def test_builtin_rules_can_be_turned_off(tmp_path: Path, clock: FakeClock) -> None:
    settings = load(None, {}, {"data_dir": str(tmp_path / "data"), "demo": True, "builtin_rules": False})
    rt = build_runtime(settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
    try:
        assert rt.rules is not None and rt.rules.groups() == []
        assert "rules" in rt.jobs.names()
    finally:
        rt.close()
