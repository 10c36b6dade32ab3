"""Rule files, the alert state machine and templates, as pure functions; `gpuwatch rules check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.cli.main import main
from gpuwatch.rules.evaluate import FIRING, INACTIVE, PENDING, evaluate, record_samples
from gpuwatch.rules.load import Rule, RuleFileError, load_builtin, load_files, load_groups
from gpuwatch.rules.template import check_template, go_float, humanize, humanize_duration, printf, render

T0 = 1_800_000_000_000
GPU0 = {"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "0", "Hostname": "n1"}


def hot(value: float = 90.0) -> list[tuple[dict[str, str], float]]:
    return [(GPU0, value)]


RULE = Rule("alert", "Hot", "DCGM_FI_DEV_GPU_TEMP > 85", for_s=60, labels=(("severity", "critical"),))


# -- the state machine ----------------------------------------------------------------------------


def test_pending_then_firing_after_for_then_resolved_and_dropped_after_15m() -> None:
    state, tr = evaluate(RULE, hot(), {}, T0)
    (a,) = state.values()
    assert (
        a.state == PENDING
        and a.active_at_ms == T0
        and [(t.before, t.after) for t in tr] == [(INACTIVE, PENDING)]
    )
    assert dict(a.labels) == {"alertname": "Hot", "gpu": "0", "Hostname": "n1", "severity": "critical"}
    state, tr = evaluate(RULE, hot(), state, T0 + 30_000)
    assert next(iter(state.values())).state == PENDING and tr == []
    state, tr = evaluate(RULE, hot(91), state, T0 + 60_000)
    (a,) = state.values()
    assert a.state == FIRING and a.fired_at_ms == T0 + 60_000 and a.active_at_ms == T0 and a.value == 91
    assert [(t.before, t.after) for t in tr] == [(PENDING, FIRING)]
    state, tr = evaluate(RULE, [], state, T0 + 75_000)
    (a,) = state.values()
    assert a.state == INACTIVE and a.resolved_at_ms == T0 + 75_000
    assert [(t.before, t.after) for t in tr] == [(FIRING, INACTIVE)]
    state, _ = evaluate(RULE, [], state, T0 + 75_000 + 15 * 60_000)
    assert len(state) == 1, "resolved alerts are kept 15 minutes"
    state, _ = evaluate(RULE, [], state, T0 + 75_000 + 15 * 60_000 + 1)
    assert state == {}


def test_pending_alert_that_goes_away_is_dropped_and_restarts_its_timer() -> None:
    state, _ = evaluate(RULE, hot(), {}, T0)
    state, tr = evaluate(RULE, [], state, T0 + 15_000)
    assert state == {} and [(t.before, t.after) for t in tr] == [(PENDING, INACTIVE)]
    state, _ = evaluate(RULE, hot(), state, T0 + 30_000)
    state, _ = evaluate(RULE, hot(), state, T0 + 75_000)
    assert next(iter(state.values())).state == PENDING, "for counts from the new active_at"


def test_no_for_fires_on_the_first_evaluation() -> None:
    rule = Rule("alert", "Now", "up == 0")
    state, tr = evaluate(rule, [({"instance": "a"}, 0.0)], {}, T0)
    assert next(iter(state.values())).state == FIRING
    assert [(t.before, t.after) for t in tr] == [(INACTIVE, PENDING), (PENDING, FIRING)]


def test_keep_firing_for_keeps_it_firing_then_resolves() -> None:
    rule = Rule("alert", "Hot", "x", for_s=0, keep_firing_for_s=60)
    state, _ = evaluate(rule, hot(), {}, T0)
    state, tr = evaluate(rule, [], state, T0 + 15_000)
    (a,) = state.values()
    assert a.state == FIRING and a.keep_firing_since_ms == T0 + 15_000 and tr == []
    state, _ = evaluate(rule, [], state, T0 + 74_000)
    assert next(iter(state.values())).state == FIRING
    state, tr = evaluate(rule, [], state, T0 + 75_000)
    assert next(iter(state.values())).state == INACTIVE and [(t.before, t.after) for t in tr] == [
        (FIRING, INACTIVE)
    ]


def test_keep_firing_since_resets_when_the_condition_returns() -> None:
    rule = Rule("alert", "Hot", "x", keep_firing_for_s=60)
    state, _ = evaluate(rule, hot(), {}, T0)
    state, _ = evaluate(rule, [], state, T0 + 15_000)
    state, _ = evaluate(rule, hot(), state, T0 + 30_000)
    assert next(iter(state.values())).keep_firing_since_ms is None
    state, _ = evaluate(rule, [], state, T0 + 45_000)
    state, _ = evaluate(rule, [], state, T0 + 100_000)
    assert next(iter(state.values())).state == FIRING


def test_resolved_alert_that_returns_starts_pending_again() -> None:
    state, _ = evaluate(RULE, hot(), {}, T0)
    state, _ = evaluate(RULE, hot(), state, T0 + 60_000)
    state, _ = evaluate(RULE, [], state, T0 + 75_000)
    state, _tr = evaluate(RULE, hot(), state, T0 + 90_000)
    (a,) = state.values()
    assert a.state == PENDING and a.active_at_ms == T0 + 90_000 and a.resolved_at_ms is None


def test_annotations_and_labels_are_templated_per_alert() -> None:
    rule = Rule(
        "alert",
        "Hot",
        "x",
        labels=(("where", "{{ $labels.Hostname }}/{{ $labels.gpu }}"),),
        annotations=(("summary", "GPU {{ $labels.gpu }} at {{ $value }} C"),),
    )
    state, _ = evaluate(rule, hot(90.5), {}, T0)
    (a,) = state.values()
    assert dict(a.labels)["where"] == "n1/0" and dict(a.annotations) == {"summary": "GPU 0 at 90.5 C"}
    state, _ = evaluate(rule, hot(92), state, T0 + 15_000)
    assert dict(next(iter(state.values())).annotations)["summary"] == "GPU 0 at 92 C"


def test_record_samples_take_the_rule_name_and_labels() -> None:
    rule = Rule("record", "gpu:temp:max", "max(x)", labels=(("team", "ml"),))
    (s,) = record_samples(rule, [({"__name__": "x", "gpu": "0"}, 3.0)])
    assert s.name == "gpu:temp:max" and dict(s.labels) == {"gpu": "0", "team": "ml"} and s.value == 3.0


# -- templates ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value", "expected"),
    [
        ("{{ $value }}", 85.0, "85"),
        ("{{ $value }}", 1e6, "1e+06"),
        ("{{ $value | humanize }}", 1234567.0, "1.235M"),
        ("{{ $value | humanize }}", 0.0123, "12.3m"),
        ("{{ humanize $value }}", 0.0, "0"),
        ("{{ $value | humanizePercentage }}", 0.9312, "93.12%"),
        ("{{ $value | humanizeDuration }}", 3725.0, "1h 2m 5s"),
        ("{{ $value | humanizeDuration }}", 90061.0, "1d 1h 1m 1s"),
        ("{{ $value | humanizeDuration }}", 0.25, "250ms"),
        ("{{ $value | humanize1024 }}", 2048.0, "2ki"),
        ('{{ printf "%.2f" $value }}', 3.14159, "3.14"),
        ('{{ $value | printf "%.1f%%" }}', 99.25, "99.2%"),
        ("{{ .Value }} {{ .Labels.gpu }}", 2.0, "2 0"),
        ("{{ $labels.missing }}", 1.0, "<no value>"),
        ("a {{- ' ' -}} b", 1.0, '<error expanding template: unexpected "\'" in action>'),
        ("{{ if gt $value 90.0 }}critical{{ else }}warning{{ end }}", 95.0, "critical"),
        ("{{ range $k, $v := $labels }}{{ $k }}={{ $v }}{{ end }}", 1.0, "gpu=0"),
        ("{{ with $labels.gpu }}GPU {{ . }}{{ end }}{{ with $labels.none }}x{{ end }}", 1.0, "GPU 0"),
        ('{{ reReplaceAll "(\\\\d)" "#$1" $labels.gpu }} {{ match "^0$" $labels.gpu }}', 1.0, "#0 true"),
        ("{{ 1700000000 | humanizeTimestamp }}", 1.0, "2023-11-14 22:13:20 +0000 UTC"),
        (
            '{{ "node-1.lab:9100" | stripPort }} {{ "node-1.lab:9100" | stripDomain }}',
            1.0,
            "node-1.lab node-1:9100",
        ),
        (
            '{{ query "up" }}',
            1.0,
            "<error expanding template: query is not supported in gpuwatch's templates>",
        ),
        ("x {{- $labels.gpu -}} y", 1.0, "x0y"),
        ("{{ $externalLabels.cluster }}", 1.0, "lab"),
        ("{{ $labels.gpu | toUpper }}", 1.0, "0"),
    ],
)
def test_template_rendering(text: str, value: float, expected: str) -> None:
    assert render(text, {"gpu": "0"}, value, {"cluster": "lab"}) == expected


def test_template_errors_show_in_the_text_and_never_raise() -> None:
    assert render("{{ nope $value }}", {}, 1.0) == '<error expanding template: function "nope" not defined>'
    assert render("{{ __import__('os').system('id') }}", {}, 1.0).startswith("<error expanding template:")
    assert render("{{ .Foo }}", {}, 1.0).startswith("<error expanding template:")
    assert render("{{ $value", {}, 1.0).startswith("<error expanding template:")
    assert check_template("{{ $labels.gpu | humanize }}") is None
    assert "not defined" in (check_template("{{ eval 1 }}") or "")


def test_label_values_are_substituted_never_executed() -> None:
    evil = {"gpu": "{{ .Foo }}", "job": "{{ __import__('os').system('touch /tmp/pwned') }}"}
    out = render("{{ $labels.gpu }} {{ $labels.job }}", evil, 1.0)
    assert out == "{{ .Foo }} {{ __import__('os').system('touch /tmp/pwned') }}"
    assert render("{{ $labels.gpu | humanize }}", evil, 1.0).startswith(
        "<error expanding template: cannot convert"
    )
    assert render("{{ $labels.gpu }}", {"gpu": "{{ $value }}"}, 5.0) == "{{ $value }}"


def test_go_number_formats() -> None:
    assert [go_float(v) for v in (0.95, 1e-5, 123456.7, -2.0, float("nan"), float("inf"))] == [
        "0.95",
        "1e-05",
        "123456.7",
        "-2",
        "NaN",
        "+Inf",
    ]
    assert humanize(float("nan")) == "NaN" and humanize_duration(-65.0) == "-1m 5s"
    assert printf("%d", 3.0) == "%!d(float64=3)" and printf("%s-%s", "a") == "a-%!s(MISSING)"


# -- rule files -----------------------------------------------------------------------------------

GOOD = """
groups:
  - name: gpu
    interval: 30s
    rules:
      - record: gpu:util:avg
        expr: avg(DCGM_FI_DEV_GPU_UTIL)
      - alert: Hot
        expr: DCGM_FI_DEV_GPU_TEMP > 85
        for: 10m
        keep_firing_for: 5m
        labels: {severity: critical}
        annotations: {summary: "GPU {{ $labels.gpu }} hot"}
"""


def test_good_file_loads() -> None:
    (g,) = load_groups(GOOD, "good.yml")
    assert g.name == "gpu" and g.interval_s == 30 and g.key == "good.yml;gpu"
    rec, hot_rule = g.rules
    assert rec.kind == "record" and rec.name == "gpu:util:avg"
    assert (
        hot_rule.for_s == 600
        and hot_rule.keep_firing_for_s == 300
        and hot_rule.labels == (("severity", "critical"),)
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("groups: [{name: g, rules: [{alert: A, expr: 'up =='}]}]", "group 'g' rule 0 (alert 'A'): expr:"),
        (
            "groups: [{name: g, rules: [{alert: A, record: b, expr: up}]}]",
            "exactly one of 'alert' and 'record'",
        ),
        ("groups: [{name: g, rules: [{record: 'bad name', expr: up}]}]", "invalid recording rule name"),
        ("groups: [{name: g, rules: [{alert: A, expr: up, for: soon}]}]", "for: expected a duration"),
        ("groups: [{name: g, rules: [{record: r, expr: up, for: 5m}]}]", "'for' is only for alerting rules"),
        ("groups: [{name: g, rules: [{alert: A, expr: up, labels: {0bad: x}}]}]", "invalid label name"),
        ("groups: [{name: g, rules: [{alert: A, expr: up, annotations: {s: '{{ oops }}'}}]}]", "not defined"),
        ("groups: [{name: g, rules: [{alert: A, expr: up, severity: x}]}]", "unknown field(s) severity"),
        ("groups: [{name: g, rules: []}, {name: g, rules: []}]", "repeated group name"),
        ("groups: [{rules: []}]", "'name' must be a non-empty string"),
        ("rules: []", "expected a mapping with one key, 'groups'"),
        ("groups: [{name: g\n", "bad.yml line"),
    ],
)
def test_bad_files_are_rejected_with_file_rule_and_reason(text: str, reason: str) -> None:
    with pytest.raises(RuleFileError) as e:
        load_groups(text, "bad.yml")
    assert any(line.startswith("bad.yml") and reason in line for line in e.value.errors), e.value.errors


def test_load_files_reports_every_bad_file(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text("groups: [{name: g, rules: [{alert: A, expr: 'up =='}]}]")
    (tmp_path / "b.yml").write_text("groups: [{name: h, rules: [{alert: B, expr: up, for: x}]}]")
    with pytest.raises(RuleFileError) as e:
        load_files([tmp_path / "a.yml", tmp_path / "b.yml", tmp_path / "missing.yml"])
    assert len(e.value.errors) == 3 and "missing.yml: cannot read" in e.value.errors[2]


def test_builtin_pack_loads() -> None:
    names = [r.name for g in load_builtin() for r in g.rules]
    # The source design's four GPU rules come first, with their names (the rest: tests/test_rules_pack.py).
    assert names[:4] == ["GPUUtilizationLow", "GPUMemoryHigh", "GPUTemperatureHigh", "GPUECCError"]
    assert {g.file for g in load_builtin()} == {"builtin"}


# -- gpuwatch rules check -------------------------------------------------------------------------


def test_rules_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.yml"
    good.write_text(GOOD)
    bad = tmp_path / "bad.yml"
    bad.write_text("groups: [{name: g, rules: [{alert: A, expr: 'up =='}]}]")
    assert main(["rules", "check", str(good)]) == 0
    assert capsys.readouterr().out == f"{good}: 2 rules found\n"
    assert main(["rules", "check", str(good), str(bad)]) == 1
    out = capsys.readouterr()
    assert f"{good}: 2 rules found" in out.out
    assert f"{bad}: FAILED" in out.err and "alert 'A'" in out.err
