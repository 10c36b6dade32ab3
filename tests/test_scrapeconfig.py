"""`scrape_configs` as Prometheus writes them, `--scrape URL`, and one-line errors for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.app.config import load
from gpuwatch.cli import main as cli
from gpuwatch.collect.scrapeconfig import parse_scrape_configs, url_config
from gpuwatch.core.errors import ConfigError

PROMETHEUS_YML = """
scrape_configs:
  - job_name: vllm
    scrape_interval: 5s
    scrape_timeout: 3s
    metrics_path: /metrics
    scheme: http
    params:
      format: [prometheus]
    honor_labels: true
    sample_limit: 50000
    static_configs:
      - targets: ['10.0.0.5:8000', 'gpu-node-2:8000']
        labels:
          cluster: lab
    file_sd_configs:
      - files: ['targets/*.json']
        refresh_interval: 1m
    basic_auth:
      username: prom
      password_file: /etc/prom/pass
    metric_relabel_configs:
      - source_labels: [__name__]
        regex: 'vllm:(.*)'
        action: keep
      - regex: 'pod_template_hash'
        action: labeldrop
    tls_config:
      insecure_skip_verify: false
    follow_redirects: false
    enable_http2: true
  - job_name: tgi
    authorization:
      credentials_file: /run/token
    static_configs:
      - targets: ['localhost:3000']
"""


def test_prometheus_block_loads_as_written(tmp_path: Path) -> None:
    f = tmp_path / "gpuwatch.yml"
    f.write_text(PROMETHEUS_YML)
    settings = load(f, {}, {"data_dir": str(tmp_path)})
    vllm, tgi = settings.scrape_configs
    assert vllm.job_name == "vllm" and vllm.scrape_interval == 5.0 and vllm.scrape_timeout == 3.0
    assert vllm.params == (("format", "prometheus"),)
    assert vllm.static_configs[0].targets == ("10.0.0.5:8000", "gpu-node-2:8000")
    assert vllm.static_configs[0].labels == (("cluster", "lab"),)
    assert vllm.file_sd_files == ("targets/*.json",)
    assert vllm.auth is not None and vllm.auth.kind == "basic" and vllm.auth.secret_file == "/etc/prom/pass"
    assert [r.action for r in vllm.metric_relabel_configs] == ["keep", "labeldrop"]
    assert vllm.honor_labels and vllm.sample_limit == 50000
    assert tgi.auth is not None and tgi.auth.kind == "Bearer" and tgi.auth.secret_file == "/run/token"
    # Prometheus's defaults, with gpuwatch's global scrape_interval (15s) standing in for 1m
    assert tgi.metrics_path == "/metrics" and tgi.scheme == "http"
    assert tgi.interval_s(settings.scrape_interval) == 15.0 and tgi.timeout_s(15.0) == 10.0
    assert tgi.timeout_s(5.0) == 5.0, "the default timeout never exceeds the interval"
    public = settings.public()["scrape_configs"]
    assert public[0]["auth"] == "basic" and "pass" not in str(public)


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        (
            [{"job_name": "a", "static_configs": []}, {"job_name": "b", "scrape_interval": "fast"}],
            "config error: scrape_configs[1].scrape_interval: expected a duration like 15s, got 'fast'",
        ),
        ([{"static_configs": []}], "config error: scrape_configs[0]: job_name is missing"),
        (
            [{"job_name": "a", "scrape_intervall": "5s"}],
            "config error: scrape_configs[0].scrape_intervall: unknown key; known keys: job_name,",
        ),
        ([{"job_name": "a"}, {"job_name": "a"}], "config error: scrape_configs[1].job_name: found twice"),
        (
            [{"job_name": "a", "scheme": "file"}],
            "config error: scrape_configs[0].scheme: expected http or https, got 'file'",
        ),
        (
            [{"job_name": "a", "scrape_interval": "5s", "scrape_timeout": "10s"}],
            "config error: scrape_configs[0].scrape_timeout: must not be longer than scrape_interval",
        ),
        (
            [{"job_name": "a", "static_configs": [{"targets": ["http://x:1/metrics"]}]}],
            "config error: scrape_configs[0].static_configs[0].targets[0]: expected host:port",
        ),
        (
            [{"job_name": "a", "static_configs": [{"targets": ["x:1"], "labels": {"bad-name": "v"}}]}],
            "config error: scrape_configs[0].static_configs[0].labels.bad-name: expected a label name",
        ),
        (
            [{"job_name": "a", "metric_relabel_configs": [{"action": "hashmod"}]}],
            "config error: scrape_configs[0].metric_relabel_configs[0].action: expected one of",
        ),
        (
            [{"job_name": "a", "metric_relabel_configs": [{"regex": "(", "action": "labeldrop"}]}],
            "config error: scrape_configs[0].metric_relabel_configs[0].regex: invalid regular expression",
        ),
        (
            [{"job_name": "a", "metric_relabel_configs": [{"source_labels": ["x"]}]}],
            "config error: scrape_configs[0].metric_relabel_configs[0]: action replace needs a target_label",
        ),
        (
            [{"job_name": "a", "sample_limit": -1}],
            "config error: scrape_configs[0].sample_limit: expected a whole number",
        ),
        (
            [{"job_name": "a", "kubernetes_sd_configs": []}],
            "config error: scrape_configs[0].kubernetes_sd_configs: not",
        ),
        (
            [{"job_name": "a", "follow_redirects": True}],
            "config error: scrape_configs[0].follow_redirects: gpuwatch",
        ),
        ("just text", "config error: scrape_configs: expected a list, got 'just text'"),
    ],
)
def test_bad_values_fail_with_one_line_naming_the_path(jobs: object, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(None, {}, {"scrape_configs": jobs})
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_environment_takes_yaml_and_comma_separated_urls() -> None:
    settings = load(
        None,
        {
            "GPUWATCH_SCRAPE_CONFIGS": "[{job_name: x, static_configs: [{targets: ['h:1']}]}]",
            "GPUWATCH_SCRAPE": "http://a:1/metrics,https://b:2/m?x=1",
        },
    )
    assert settings.scrape_configs[0].job_name == "x"
    assert settings.scrape == ("http://a:1/metrics", "https://b:2/m?x=1")


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://h/x", "h:8000", "http:///metrics"])
def test_scrape_url_must_be_http(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^config error: scrape\[0\]: expected"):
        load(None, {}, {"scrape": [url]})


def test_url_config_splits_the_url() -> None:
    c = url_config("https://node-3:8000/prom/metrics?format=text")
    assert (c.job_name, c.scheme, c.metrics_path, c.params) == (
        "scrape",
        "https",
        "/prom/metrics",
        (("format", "text"),),
    )
    assert c.static_configs[0].targets == ("node-3:8000",)
    assert url_config("http://h:1").metrics_path == "/metrics"


def test_scrape_flag_is_repeatable(tmp_path: Path) -> None:
    args = cli._parser().parse_args(
        ["serve", "--scrape", "http://127.0.0.1:1/metrics", "--scrape", "http://127.0.0.1:2/metrics"]
    )
    settings = cli._settings(args, {})
    assert settings.scrape == ("http://127.0.0.1:1/metrics", "http://127.0.0.1:2/metrics")


def test_empty_list_is_fine() -> None:
    assert parse_scrape_configs(None) == () and parse_scrape_configs([]) == ()
