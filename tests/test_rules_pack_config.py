"""The built-in pack as configured: disable/override by name, language, export, and the pack end to end
on a runtime with simulated GPU faults, training runs and gpuwatch's own trouble counters."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime, configured_rule_groups
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ConfigError
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.rules.evaluate import FIRING
from gpuwatch.rules.load import builtin_files, load_builtin
from gpuwatch.web import create_app
from tests.conftest import GPUWATCH, ROOT, clean_env, require_tool

DEMO_GPUS = 2


def rules_of(settings_overrides: dict[str, object], tmp_path: Path) -> dict[str, object]:
    settings = load(None, {}, {"data_dir": str(tmp_path / "d"), **settings_overrides})
    return {r.name: r for g in configured_rule_groups(settings) for r in g.rules if r.kind == "alert"}


def test_disable_and_override_builtin_rules_by_name(tmp_path: Path) -> None:
    rules = rules_of(
        {
            "builtin_rules": {
                "disable": ["GPUUtilizationLow"],
                "override": {
                    "GPUTemperatureHigh": {
                        "for": "5m",
                        "expr": "DCGM_FI_DEV_GPU_TEMP > 80",
                        "labels": {"severity": "warning", "team": "infra"},
                        "annotations": {"summary": "hot {{ $labels.gpu }}"},
                    }
                },
            }
        },
        tmp_path,
    )
    assert "GPUUtilizationLow" not in rules and "GPUMemoryHigh" in rules
    hot = rules["GPUTemperatureHigh"]
    assert hot.expr == "DCGM_FI_DEV_GPU_TEMP > 80" and hot.for_s == 300  # type: ignore[attr-defined]
    assert dict(hot.labels) == {"severity": "warning", "team": "infra"}  # type: ignore[attr-defined]
    notes = dict(hot.annotations)  # type: ignore[attr-defined]
    assert notes["summary"] == "hot {{ $labels.gpu }}" and "85 °C" in notes["description"]


def test_builtin_rules_false_and_true(tmp_path: Path) -> None:
    assert rules_of({"builtin_rules": False}, tmp_path) == {}
    assert set(rules_of({"builtin_rules": "true"}, tmp_path)) == {
        r.name for g in load_builtin() for r in g.rules if r.kind == "alert"
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"disable": ["GPUTempHigh"]}, "builtin_rules.disable: unknown built-in rule 'GPUTempHigh'"),
        ({"override": {"Nope": {"for": "1m"}}}, "builtin_rules.override: unknown built-in rule 'Nope'"),
        (
            {"override": {"GPULost": {"for": "soon"}}},
            "builtin_rules.override.GPULost.for: expected a duration",
        ),
        ({"override": {"GPULost": {"expr": "up =="}}}, "builtin_rules.override.GPULost.expr:"),
        (
            {"override": {"GPULost": {"severity": "x"}}},
            "builtin_rules.override.GPULost.severity: unknown key",
        ),
        ({"override": {"GPULost": {"annotations": {"s": "{{ nope }}"}}}}, 'function "nope" not defined'),
        ({"disable": ["GPULost"], "override": {"GPULost": {"for": "1m"}}}, "also in disable"),
        ({"disabled": ["GPULost"]}, "builtin_rules.disabled: unknown key; known keys: disable, override"),
        ("sometimes", "builtin_rules: expected true, false or a mapping"),
    ],
)
def test_bad_builtin_rules_setting_is_one_line_naming_it(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(None, {}, {"builtin_rules": value})
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_builtin_rules_setting_stops_serve_with_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatch.yml"
    config.write_text("builtin_rules:\n  disable: [GPUTempHigh]\n")
    proc = subprocess.run(
        [*GPUWATCH, "serve", "--demo", "--config", str(config), "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "gpuwatch: config error: builtin_rules.disable: unknown built-in rule 'GPUTempHigh'"
    )
    assert len(proc.stderr.strip().splitlines()) == 1


def test_language_zh_uses_the_chinese_texts_for_every_builtin_rule(tmp_path: Path) -> None:
    en = rules_of({}, tmp_path)
    zh = rules_of({"language": "zh"}, tmp_path)
    for name, rule in zh.items():
        notes = dict(rule.annotations)  # type: ignore[attr-defined]
        assert set(notes) == {"summary", "description"}, name
        assert notes != dict(en[name].annotations), name  # type: ignore[attr-defined]
        assert any("\u4e00" <= ch <= "\u9fff" for ch in notes["summary"] + notes["description"]), name
    assert all(set(dict(r.annotations)) == {"summary", "description"} for r in en.values())  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="language: expected one of en, zh"):
        load(None, {"GPUWATCH_LANGUAGE": "fr"})


def test_an_override_of_summary_wins_in_chinese_too(tmp_path: Path) -> None:
    rules = rules_of(
        {"language": "zh", "builtin_rules": {"override": {"GPULost": {"annotations": {"summary": "mine"}}}}},
        tmp_path,
    )
    assert dict(rules["GPULost"].annotations)["summary"] == "mine"  # type: ignore[attr-defined]


def test_promtool_accepts_every_builtin_file() -> None:
    promtool = require_tool("promtool")
    files = [str(p) for p in builtin_files()]
    proc = subprocess.run([promtool, "check", "rules", *files], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_export_is_a_rule_file_promtool_accepts(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    mine = tmp_path / "mine.yml"
    mine.write_text(
        "groups:\n  - name: gpuwatch-gpu\n    interval: 30s\n    rules:\n"
        "      - {record: 'node:gpu_util:avg', expr: avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)}\n"
    )
    config = tmp_path / "gpuwatch.yml"
    config.write_text(
        "rule_files: [mine.yml]\nlanguage: zh\n"
        "builtin_rules:\n  disable: [GPUUtilizationLow]\n  override: {GPUTemperatureHigh: {for: 5m}}\n"
    )
    out = tmp_path / "export.yml"
    proc = subprocess.run(
        [*GPUWATCH, "rules", "export", "--config", str(config), "-o", str(out)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    check = subprocess.run([promtool, "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    groups = yaml.safe_load(out.read_text(encoding="utf-8"))["groups"]
    names = [g["name"] for g in groups]
    assert names[0] == "gpuwatch-gpu" and "gpuwatch-gpu-2" in names  # the user's group, renamed
    rules = {r.get("alert") or r.get("record"): r for g in groups for r in g["rules"]}
    assert "GPUUtilizationLow" not in rules and "node:gpu_util:avg" in rules
    assert rules["GPUTemperatureHigh"]["for"] == "5m"
    assert "温度" in rules["GPUTemperatureHigh"]["annotations"]["summary"]
    assert [g.get("interval") for g in groups if g["name"] == "gpuwatch-gpu-2"] == ["30s"]
    n_builtin = sum(len(g.rules) for g in load_builtin())
    assert len(rules) == n_builtin - 1 + 1


def test_rules_export_to_stdout_and_bad_rule_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*GPUWATCH, "rules", "export"], capture_output=True, text=True, env=clean_env(), timeout=60
    )
    assert proc.returncode == 0 and "alert: GPULost" in proc.stdout
    bad = tmp_path / "bad.yml"
    bad.write_text("groups: [{name: g, rules: [{alert: A, expr: 'up =='}]}]")
    proc = subprocess.run(
        [*GPUWATCH, "rules", "export"],
        capture_output=True,
        text=True,
        env=clean_env(GPUWATCH_RULE_FILES=str(bad)),
        timeout=60,
    )
    assert proc.returncode == 1 and "bad.yml: group 'g' rule 0" in proc.stderr
    assert "Traceback" not in proc.stderr


# -- end to end on a runtime ----------------------------------------------------------------------


def _alerts(rt: Runtime) -> dict[tuple[str, str], str]:
    assert rt.rules is not None
    return {
        (
            a.labels and dict(a.labels)["alertname"],
            dict(a.labels).get("gpu") or dict(a.labels).get("run", ""),
        ): a.state
        for _, a in rt.rules.active_alerts()
    }


def _tick(rt: Runtime, clock: FakeClock, minutes: int) -> None:
    assert rt.gpu is not None
    for _ in range(minutes):
        rt.gpu.wait_events(0)
        rt.jobs.run("sample")
        rt.jobs.run("runs")
        rt.store.flush()
        rt.jobs.run("rules")
        clock.advance(60)


def test_pack_on_a_runtime_sees_simulated_gpu_faults(
    runtime: Runtime, nvml: FakeNvml, clock: FakeClock
) -> None:
    _tick(runtime, clock, 2)
    assert {k for k, s in _alerts(runtime).items() if s == FIRING} == set()
    nvml.inject_xid(0, 79)
    nvml.fail_row_remap(0)
    nvml.add_pcie_replays(1, 50)
    nvml.lose_gpu(1)
    _tick(runtime, clock, 3)
    firing = {k for k, s in _alerts(runtime).items() if s == FIRING}
    assert {("GPUXidErrorCritical", "0"), ("GPURowRemapFailure", "0"), ("GPULost", "1")} <= firing
    assert runtime.rules is not None
    errors = [
        (r.name, s.last_error)
        for g in runtime.rules.groups()
        for r, s in zip(g.group.rules, g.status, strict=True)
        if s.health != "ok"
    ]
    assert errors == []
    nvml.recover_gpu(1)
    _tick(runtime, clock, 2)
    assert ("GPULost", "1") not in {k for k, s in _alerts(runtime).items() if s == FIRING}


def test_pcie_replays_from_the_simulated_gpu_fire(runtime: Runtime, nvml: FakeNvml, clock: FakeClock) -> None:
    _tick(runtime, clock, 3)
    nvml.add_pcie_replays(1, 50)
    _tick(runtime, clock, 2)
    assert _alerts(runtime).get(("GPUPCIeReplays", "1")) == FIRING


def test_a_run_that_stops_logging_is_stalled_until_it_finishes(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    assert (
        client.post("/api/v1/runs", json={"run": "sft", "action": "init", "total_steps": 100}).status_code
        == 200
    )
    client.post("/api/v1/push", json={"run": "sft", "step": 1, "metrics": {"loss": 2.0}})
    _tick(runtime, clock, 5)
    assert ("TrainingRunStalled", "sft") not in _alerts(runtime)
    _tick(runtime, clock, 7)
    assert _alerts(runtime).get(("TrainingRunStalled", "sft")) == FIRING
    body = client.get("/metrics").get_data(as_text=True)
    assert 'gpuwatch_training_run_running{run="sft"} 1' in body
    client.post("/api/v1/runs", json={"run": "sft", "action": "finish", "status": "failed"})
    _tick(runtime, clock, 1)
    assert _alerts(runtime).get(("TrainingRunStalled", "sft")) != FIRING


def test_rule_evaluation_failures_are_counted_and_alerted(tmp_path: Path, clock: FakeClock) -> None:
    rules = tmp_path / "bad.yml"
    # Two series with the same labels after the alert's labels: an evaluation error every round.
    rules.write_text(
        'groups: [{name: clash, rules: [{alert: Clash, expr: \'label_replace(vector(1), "a", "x", "", "") '
        'or label_replace(vector(2), "b", "x", "", "")\', labels: {a: x, b: x}}]}]'
    )
    settings = load(None, {}, {"data_dir": str(tmp_path / "d"), "demo": True, "rule_files": [str(rules)]})
    rt = build_runtime(
        settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock, blocking_event_wait=False)
    )
    try:
        _tick(rt, clock, 3)
        body = create_app(rt).test_client().get("/metrics").get_data(as_text=True)
        assert f'gpuwatch_rule_evaluation_failures_total{{rule_group="{rules};clash"}}' in body
        assert _alerts(rt).get(("GpuwatchRuleEvaluationFailures", "")) == FIRING
    finally:
        rt.close()


def test_docs_table_lists_every_builtin_rule() -> None:
    docs = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    for g in load_builtin():
        for r in g.rules:
            if r.kind == "alert":
                assert f"| `{r.name}` |" in docs, f"docs/rules.md does not list {r.name}"


def test_the_docs_name_every_self_metric() -> None:
    from gpuwatch.app.runtime import SELF_METRICS
    from gpuwatch.collect.runs import RUN_METRICS

    docs = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    missing = [m.name for m in (*SELF_METRICS, *RUN_METRICS) if f"`{m.name}`" not in docs]
    assert missing == []
