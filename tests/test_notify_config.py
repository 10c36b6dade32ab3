"""`notify:` and `alerting:` as pasted from alertmanager.yml and prometheus.yml; each mistake is one
sentence naming its path, and `gpuwatch serve` exits 2 with it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuwatch.app.config import load
from gpuwatch.core.errors import ConfigError
from gpuwatch.notify.alerting import parse_alerting
from gpuwatch.notify.config import parse_notify
from gpuwatch.notify.matchers import parse_matchers
from tests.conftest import GPUWATCH, clean_env

ALERTMANAGER_YML = """
global:
  resolve_timeout: 5m
  smtp_smarthost: 'mail.lab:587'
  smtp_from: 'gpuwatch@lab'
  smtp_auth_username: 'gpuwatch'
  smtp_auth_password: 'secret'
route:
  receiver: default
  group_by: ['alertname', 'Hostname']
  routes:
    - matchers: ['severity="critical"', 'team=~"ml|infra"']
      receiver: oncall
      repeat_interval: 1h
    - match: {severity: warning}
      match_re: {alertname: 'GPU.+'}
      receiver: default
      group_by: ['...']
receivers:
  - name: default
    email_configs: [{to: 'lab@lab'}]
  - name: oncall
    webhook_configs: [{url: 'http://127.0.0.1:5001/hook', max_alerts: 10}]
inhibit_rules:
  - source_match: {alertname: GPULost}
    target_match_re: {alertname: '.+'}
    equal: ['Hostname', 'gpu']
"""


def parse(text: str) -> Any:
    return parse_notify(yaml.safe_load(text))


def test_an_alertmanager_yml_pastes_unchanged() -> None:
    cfg = parse(ALERTMANAGER_YML)
    assert cfg.route is not None
    crit, warn = cfg.route.routes
    assert crit.receiver == "oncall" and crit.repeat_interval_s == 3600 and crit.group_wait_s == 30
    assert crit.group_by == ("alertname", "Hostname")  # inherited
    assert crit.match({"severity": "critical", "team": "ml"}) == [crit]
    assert cfg.route.match({"severity": "critical", "team": "web"}) == [cfg.route]
    assert warn.key == '{}/{alertname=~"GPU.+",severity="warning"}' and warn.group_by_all
    email = cfg.receivers[0].integrations[0]
    assert email.option("smarthost") == "mail.lab:587" and email.option("auth_username") == "gpuwatch"
    assert not email.send_resolved and cfg.receivers[1].integrations[0].send_resolved
    assert cfg.inhibit_rules[0].equal == ("Hostname", "gpu")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ('alertname="GPU Lost"', [("alertname", "=", "GPU Lost")]),
        ("severity=~warn|crit", [("severity", "=~", "warn|crit")]),
        ('{a!="x,y", b!~"z"}', [("a", "!=", "x,y"), ("b", "!~", "z")]),
        (r'msg="say \"hi\""', [("msg", "=", 'say "hi"')]),
    ],
)
def test_matcher_syntax(text: str, parsed: list[tuple[str, str, str]]) -> None:
    assert [(m.name, m.op, m.value) for m in parse_matchers(text)] == parsed


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"route": {"receiver": "default", "routes": [{"receiver": "pager"}]}},
            "config error: notify.route.routes[0].receiver: unknown receiver 'pager'; defined receivers: default",
        ),
        (
            {"route": {"receiver": "default", "group_wait": "soon"}},
            "config error: notify.route.group_wait: expected a duration like 30s or 4h, got 'soon'",
        ),
        (
            {"route": {"receiver": "default", "routes": [{"matchers": ['severity="crit']}]}},
            "config error: notify.route.routes[0].matchers[0]: a quoted value is not closed",
        ),
        (
            {"route": {"receiver": "default", "routes": [{"matchers": ["severity"]}]}},
            "config error: notify.route.routes[0].matchers[0]: expected a matcher like "
            'alertname="GPULost" or severity=~"warn|crit", got \'severity\'',
        ),
        (
            {"route": {"receiver": "default", "routes": [{"match_re": {"gpu": "(["}}]}},
            "config error: notify.route.routes[0].match_re.gpu: invalid regular expression '([' "
            "(missing ]: [)",
        ),
        (
            {"receivers": [{"name": "default", "pagerduty_configs": [{}]}]},
            "config error: notify.receivers[0].pagerduty_configs: not supported by gpuwatch; use "
            "apprise_configs with an Apprise URL or webhook_configs instead",
        ),
        (
            {"receivers": [{"name": "default", "webhook_configs": [{"url": "ftp://x"}]}]},
            "config error: notify.receivers[0].webhook_configs[0].url: expected an http:// or https:// URL, got 'ftp://x'",
        ),
    ],
)
def test_mistakes_are_one_sentence_naming_the_path(change: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"route": {"receiver": "default"}, "receivers": [{"name": "default"}]}
    with pytest.raises(ConfigError) as e:
        parse_notify({**base, **change})
    assert str(e.value) == message


def test_alerting_block_as_in_prometheus_yml() -> None:
    cfg = parse_alerting(
        {
            "alertmanagers": [
                {
                    "static_configs": [{"targets": ["127.0.0.1:9093", "am2:9093"]}],
                    "path_prefix": "/am/",
                    "timeout": "5s",
                }
            ]
        }
    )
    assert [t.url for t in cfg.alertmanagers] == [
        "http://127.0.0.1:9093/am/api/v2/alerts",
        "http://am2:9093/am/api/v2/alerts",
    ]
    assert cfg.alertmanagers[0].timeout_s == 5
    with pytest.raises(
        ConfigError,
        match=r"^config error: alerting.alertmanagers\[0\].static_configs\[0\].targets\[0\]: expected host:port",
    ):
        parse_alerting({"alertmanagers": [{"static_configs": [{"targets": ["http://am:9093"]}]}]})


def test_settings_carry_notify_and_alerting(tmp_path: Path) -> None:
    f = tmp_path / "gpuwatch.yml"
    f.write_text(
        yaml.safe_dump({"notify": yaml.safe_load(ALERTMANAGER_YML), "alerting": {"alertmanagers": []}})
    )
    s = load(f, {}, {})
    assert s.notify.receiver("oncall") is not None
    assert "secret" not in str(s.public())


def test_serve_exits_2_with_one_line_for_a_bad_route(tmp_path: Path) -> None:
    f = tmp_path / "gpuwatch.yml"
    f.write_text("notify:\n  route: {receiver: nobody}\n  receivers: [{name: team}]\n")
    r = subprocess.run(
        [*GPUWATCH, "serve", "--config", str(f), "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert r.returncode == 2
    assert (
        r.stderr
        == "gpuwatch: config error: notify.route.receiver: unknown receiver 'nobody'; defined receivers: team\n"
    )
