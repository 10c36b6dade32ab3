"""Alertmanager's notification templates: Go's text/template semantics, Alertmanager's data, functions and
default templates, checked against the real Alertmanager; templated receiver options; bad templates."""

from __future__ import annotations

import contextlib
from email import message_from_bytes
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.core.errors import ConfigError
from gpuwatch.notify.config import load_templates, parse_notify
from gpuwatch.notify.email import build_message
from gpuwatch.notify.receivers import send
from gpuwatch.notify.templates import FUNCS, default_set, render
from gpuwatch.templating.template import TemplateError, TemplateSet
from tests.conftest import start_alertmanager, wait_until
from tests.test_notify_receivers import NOW, payload
from tests.webhook_server import Hook, hook_server


def go(text: str, data: Any = None) -> str:
    return TemplateSet(FUNCS).render(text, data)


@pytest.mark.parametrize(
    ("text", "data", "out"),
    [
        ("x  {{- 1 -}}  y", None, "x1y"),
        ("{{ if .A }}a{{ else if .B }}b{{ else }}c{{ end }}", {"A": "", "B": [1]}, "b"),
        ("{{ range .L }}{{ . }},{{ else }}none{{ end }}", {"L": []}, "none"),
        ("{{ range $i, $e := .L }}{{ $i }}:{{ $e }} {{ end }}", {"L": ["a", "b"]}, "0:a 1:b "),
        ("{{ range $k, $v := .M }}{{ $k }}={{ $v }};{{ end }}", {"M": {"b": "2", "a": "1"}}, "a=1;b=2;"),
        ("{{ range .L }}{{ if eq . 2 }}{{ break }}{{ end }}{{ . }}{{ end }}", {"L": [1, 2, 3]}, "1"),
        ("{{ range .L }}{{ if eq . 2 }}{{ continue }}{{ end }}{{ . }}{{ end }}", {"L": [1, 2, 3]}, "13"),
        ('{{ $x := "a" }}{{ if true }}{{ $x = "b" }}{{ $y := 1 }}{{ end }}{{ $x }}', None, "b"),
        ("{{ with .M.k }}[{{ . }}]{{ else }}empty{{ end }}", {"M": {"k": "v"}}, "[v]"),
        ('{{ and 1 0 2 }} {{ or 0 "" "z" }} {{ not 0 }}', None, "0 z true"),
        ("{{ 1.5 }} {{ 1e6 }} {{ 100000.0 }} {{ true }} {{ nil }}", None, "1.5 1e+06 100000 true <no value>"),
        ('{{ printf "%s=%d %.1f %q %v" "a" 3 2.25 "q" .L }}', {"L": [1, "x"]}, 'a=3 2.2 "q" [1 x]'),
        (
            '{{ define "t" }}<{{ . }}>{{ end }}{{ template "t" "x" }}{{ template "t" }}',
            None,
            "<x><<no value>>",
        ),
        ('{{ block "b" . }}default {{ . }}{{ end }}', "d", "default d"),
        (
            '{{ len .S }} {{ index .L 1 }} {{ index .M "k" }}',
            {"S": "héllo", "L": [1, 2], "M": {"k": 3}},
            "5 2 3",
        ),
        ('{{ "a b&c" | urlquery }} {{ html "<b>" }}', None, "a+b%26c &lt;b&gt;"),
        ('{{ reReplaceAll "(\\\\w+)@(\\\\w+)" "$2 at ${1}" "me@host" }}', None, "host at me"),
        (
            '{{ stringSlice "a" "b" | join "-" }} {{ match "^gp" "gpu" }} {{ title "gpu hot" }}',
            None,
            "a-b true Gpu Hot",
        ),
        ("{{/* a comment */}}x{{- /* trimmed */ -}}  y", None, "xy"),
        ("{{ (index .L 0).Name }}", {"L": [{"Name": "n"}]}, "n"),
        ('{{ lt 1 2.5 }} {{ ge "b" "a" }} {{ ne 1 2 }} {{ eq 1 3 1 }}', None, "true true true true"),
    ],
)
def test_go_template_semantics(text: str, data: Any, out: str) -> None:
    assert go(text, data) == out


def test_a_runaway_template_stops() -> None:
    with pytest.raises(TemplateError, match="more than 200,000 steps"):
        go("{{ range 100000000 }}{{ end }}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{{ if .A }}x", "has no {{end}}"),
        ("{{ end }}", "unexpected {{end}}"),
        ("{{ nosuch . }}", 'function "nosuch" not defined'),
        ("{{ .A", "unclosed action"),
        ('{{ template "x" }}', 'no such template "x"'),
        ("{{ $undefined }}", "undefined variable: $undefined"),
        ('{{ lt 1 "a" }}', "incompatible types for comparison"),
        (
            '{{ define "loop" }}{{ template "loop" . }}{{ end }}{{ template "loop" . }}',
            "maximum template depth",
        ),
        ("{{ .A.__class__ }}", "can't evaluate field"),
        ("{{ .Secret }}", "can't evaluate field Secret"),
        ("{{ break }}", "{{break}} outside {{range}}"),
        ("{{ 'x' }}", 'unexpected "\'" in action'),
    ],
)
def test_template_mistakes_are_errors_not_crashes(text: str, message: str) -> None:
    class Data:
        A = "x"

    with pytest.raises(
        TemplateError, match=message.replace("(", r"\(").replace("{", r"\{").replace("$", r"\$")
    ):
        go(text, Data())


# A receiver with a webhook (to get the exact data Alertmanager rendered) and Slack options exercising the
# template language, Alertmanager's data and functions, and its default templates.
SLACK = {
    "title": '{{ template "slack.default.title" . }}',
    "title_link": '{{ template "slack.default.titlelink" . }}',
    "fallback": '{{ template "slack.default.fallback" . }}',
    "pretext": (
        "{{ .CommonLabels.Remove .GroupLabels.Names | len }} {{ (index .Alerts 0).StartsAt.Format"
        ' "2006-01-02T15:04:05Z07:00 Mon Jan _2 3:04PM .000" }} {{ .Alerts.Firing | len | printf "%d firing" }}'
        " {{ .Receiver | urlquery }} {{ (index .Alerts 0).EndsAt }}"
    ),
    "text": (
        "{{ range $i, $a := .Alerts }}{{ $i }}: {{ $a.Labels.alertname | toUpper }} {{ .Labels.missing }}|"
        '{{ title "hello wORLD-x" }}|{{ .Annotations.summary | reReplaceAll "GPU (\\\\d+)" "card $1" }}\n'
        "{{ range .Labels.SortedPairs }}{{ .Name }}={{ .Value }} {{ end }}"
        '{{ if match "^g" .Labels.gpu }}m{{ else if eq .Labels.gpu "1" "2" }}one{{ else }}other{{ end }}\n'
        '{{ end }}{{ with .CommonAnnotations.nothing }}x{{ else }}empty{{ end }} {{ .GroupLabels.SortedPairs.Values | join "," }}'
        ' {{ html "<a&\'\\">" }} {{ printf "%s-%v-%q-%5.2f" "s" 3 "q" 2.5 }} {{ len .CommonLabels }} {{ and 1 0 }}'
        ' {{ or "" "y" }} {{ not true }} {{ $x := "a" }}{{ $x = "b" }}{{ $x }} {{ print 1 2 "s" 3 }}'
        ' {{ stringSlice "a" "b" }} {{ .CommonLabels }} {{ lt 1 2 }} {{ index .CommonLabels "alertname" }}'
        " {{ .Status }} {{ .ExternalURL }}{{- /* a comment */ -}}\nEND"
    ),
    "footer": '{{ template "__text_alert_list" .Alerts.Firing }}{{ template "email.default.subject" . }}',
    "color": '{{ if eq .Status "firing" }}danger{{ else }}good{{ end }}',
    "username": '{{ template "slack.default.username" . }}',
}


@pytest.mark.slow
def test_templates_render_as_the_real_alertmanager_renders_them(tmp_path: Path) -> None:
    with hook_server() as hook:
        config = {
            "route": {"receiver": "lab.team", "group_wait": "1s", "group_by": ["alertname"]},
            "receivers": [
                {
                    "name": "lab.team",
                    "webhook_configs": [{"url": hook.url + "/hook"}],
                    "slack_configs": [{"api_url": hook.url + "/slack", **SLACK}],
                }
            ],
        }
        with start_alertmanager(tmp_path, yaml.safe_dump(config)) as url:
            alerts = [
                {
                    "labels": {"alertname": "GPUHot", "gpu": "1", "severity": "critical"},
                    "annotations": {"summary": "GPU 1 is at 90C"},
                    "startsAt": "2026-11-30T08:00:00.123Z",
                    "generatorURL": "http://gw/q",
                },
                {
                    "labels": {"alertname": "GPUHot", "gpu": "2", "severity": "critical"},
                    "annotations": {"summary": "GPU 2 hot"},
                    "startsAt": "2026-11-30T08:01:00Z",
                },
            ]
            requests.post(url + "/api/v2/alerts", json=alerts, timeout=5).raise_for_status()
            wait_until(lambda: len(hook.requests) >= 2, 30, "Alertmanager did not notify in 30s")
        sent = {path: body for path, _, body in hook.requests}
    data = sent["/hook"]  # the webhook payload is the template data Alertmanager used
    theirs = sent["/slack"]
    cfg = load_templates(parse_notify(config), None)
    slack = cfg.receivers[0].integrations[1]
    assert slack.kind == "slack"
    with hook_server() as ours_hook:
        slack = type(slack)(**{**slack.__dict__, "url": ours_hook.url + "/slack"})
        send(slack, data, now_ms=NOW)
        ours = ours_hook.requests[0][2]
    for key in ("title", "title_link", "fallback", "pretext", "text", "footer", "color"):
        assert ours["attachments"][0][key] == theirs["attachments"][0][key], key
    assert ours["username"] == theirs["username"] == "Alertmanager"


def test_template_files_and_defines(tmp_path: Path) -> None:
    (tmp_path / "lab.tmpl").write_text(
        '{{ define "lab.title" }}[{{ .Status | toUpper }}] {{ .CommonLabels.alertname }}{{ end }}\n'
        '{{ define "lab.body" }}{{ range .Alerts }}* {{ .Labels.gpu }}: {{ .Annotations.summary }}\n{{ end }}{{ end }}'
    )
    raw = {
        "route": {"receiver": "r"},
        "templates": ["*.tmpl"],  # relative to the config file's folder
        "receivers": [
            {
                "name": "r",
                "dingtalk_configs": [
                    {
                        "url": "http://127.0.0.1:1/robot",
                        "title": '{{ template "lab.title" . }}',
                        "message": '{{ template "lab.body" . }}',
                    }
                ],
            }
        ],
    }
    cfg = load_templates(parse_notify(raw), tmp_path)
    with hook_server() as hook:
        ding = cfg.receivers[0].integrations[0]
        send(type(ding)(**{**ding.__dict__, "url": hook.url + "/robot"}), payload(), now_ms=NOW)
        body = hook.requests[0][2]
    assert body["markdown"]["title"] == "[FIRING] GPUHot"
    assert body["markdown"]["text"] == "#### [FIRING] GPUHot\n\n* 0: GPUHot on 0\n* 1: GPUHot on 1\n"


def test_email_subject_html_and_text(tmp_path: Path) -> None:
    raw = {
        "route": {"receiver": "r"},
        "receivers": [
            {
                "name": "r",
                "email_configs": [
                    {
                        "to": "lab@example.org",
                        "from": "gw@example.org",
                        "smarthost": "127.0.0.1:25",
                        "headers": {"Subject": "{{ len .Alerts }} alerts: {{ .CommonLabels.alertname }}"},
                        "html": '{{ template "email.default.html" . }}',
                        "text": "{{ range .Alerts }}{{ .Labels.gpu }} {{ end }}",
                    }
                ],
            }
        ],
    }
    cfg = load_templates(parse_notify(raw), None)
    msg = message_from_bytes(build_message(cfg.receivers[0].integrations[0], payload(), NOW).as_bytes())
    assert msg["Subject"] == "2 alerts: GPUHot"
    parts = {
        p.get_content_type(): p.get_payload(decode=True).decode() for p in msg.walk() if not p.is_multipart()
    }
    assert parts["text/plain"].strip() == "0 1"
    assert "<html" in parts["text/html"] and "GPUHot" in parts["text/html"]


def test_a_template_that_fails_at_send_time_still_sends_the_default(hook: Hook) -> None:
    raw = {
        "route": {"receiver": "r"},
        "receivers": [
            {"name": "r", "slack_configs": [{"api_url": hook.url + "/s", "title": '{{ template "nope" . }}'}]}
        ],
    }
    send(load_templates(parse_notify(raw), None).receivers[0].integrations[0], payload(), now_ms=NOW)
    title = hook.requests[0][2]["attachments"][0]["title"]
    assert title == '[FIRING:1] GPUHot (critical) (template error in title: no such template "nope")'


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"title": "{{ if . }}"}, "slack_configs[0].title: template error: {{if}} has no {{end}}"),
        ({"text": "{{ nosuch }}"}, 'slack_configs[0].text: template error: function "nosuch" not defined'),
    ],
)
def test_bad_templates_are_config_errors(change: dict[str, Any], message: str) -> None:
    raw = {
        "route": {"receiver": "r"},
        "receivers": [{"name": "r", "slack_configs": [{"api_url": "http://x/", **change}]}],
    }
    with pytest.raises(ConfigError) as e:
        parse_notify(raw)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bad_template_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "bad.tmpl").write_text('{{ define "x" }}unclosed')
    cfg = parse_notify({"route": {"receiver": "r"}, "receivers": [{"name": "r"}], "templates": ["bad.tmpl"]})
    with pytest.raises(ConfigError, match=r"notify\.templates: .*bad\.tmpl: define 'x' has no \{\{end\}\}"):
        load_templates(cfg, tmp_path)


def test_defaults_parse() -> None:
    names = default_set().defines
    assert {"slack.default.title", "email.default.html", "__subject"} <= set(names)
    assert render(default_set(), '{{ template "__subject" . }}', payload()) == "[FIRING:1] GPUHot (critical)"


@pytest.fixture
def hook() -> Any:
    with hook_server() as h:
        yield h


def test_notify_test_uses_the_template_files_next_to_the_config(tmp_path: Path, hook: Hook) -> None:
    from tests.test_notify_receivers import run_cli

    etc = tmp_path / "etc"
    (etc / "templates").mkdir(parents=True)
    (etc / "templates" / "lab.tmpl").write_text(
        '{{ define "lab.title" }}lab: {{ .CommonLabels.alertname }}{{ end }}'
    )
    conf = etc / "gpuwatch.yml"
    notify = {
        "templates": ["templates/*.tmpl"],
        "route": {"receiver": "chat"},
        "receivers": [
            {
                "name": "chat",
                "slack_configs": [{"api_url": hook.url + "/s", "title": '{{ template "lab.title" . }}'}],
            }
        ],
    }
    conf.write_text(yaml.safe_dump({"notify": notify}))
    ok = run_cli("notify", "test", "--config", str(conf), "chat", cwd=tmp_path)  # not run from etc/
    assert ok.returncode == 0, ok.stderr
    assert hook.requests[0][2]["attachments"][0]["title"] == "lab: GpuwatchTestNotification"
    (etc / "templates" / "lab.tmpl").write_text('{{ define "lab.title" }}unclosed')
    bad = run_cli("notify", "test", "--config", str(conf), "chat", cwd=tmp_path)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1 and "notify.templates: " in bad.stderr and "lab.tmpl" in bad.stderr


_PIECES = [
    "{{",
    "}}",
    "{{-",
    "-}}",
    " ",
    "if",
    "else",
    "end",
    "range",
    "with",
    "define",
    "template",
    "block",
    '"t"',
    ".",
    ".Alerts",
    ".Labels",
    ".Status",
    "$",
    "$x",
    ":=",
    "=",
    "|",
    "(",
    ")",
    "len",
    "printf",
    '"%d"',
    "eq",
    "and",
    "index",
    "0",
    "1.5",
    "-1",
    "nil",
    "true",
    "`raw`",
    "'",
    "text",
    "\n",
    "/*",
    "*/",
    ",",
    "break",
]
_PIECES += [
    "toUpper",
    "join",
    "title",
    "reReplaceAll",
    "match",
    "stringSlice",
    ".Labels.Remove",
    ".SortedPairs",
    "lt",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_PIECES), max_size=30))
def test_any_template_text_renders_or_is_a_template_error(pieces: list[str]) -> None:
    text = "".join(pieces)
    with contextlib.suppress(TemplateError):
        render(default_set(), text, payload())


def test_the_webhook_receiver_is_escaped_as_alertmanager_escapes_it() -> None:
    from gpuwatch.notify.alert import webhook_payload

    p = webhook_payload(
        receiver="lab.team", group_key="{}", group_labels={}, alerts=[], now_ms=NOW, external_url=""
    )
    assert p["receiver"] == "lab\\.team"  # Alertmanager 0.25 sends regexp.QuoteMeta of the name


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*_PIECES, "$labels", "$value", "humanize", "$labels.gpu"]), max_size=30))
def test_a_rule_template_never_raises(pieces: list[str]) -> None:
    from gpuwatch.rules.template import render as render_rule

    assert isinstance(render_rule("".join(pieces), {"gpu": "0"}, 1.5), str)
