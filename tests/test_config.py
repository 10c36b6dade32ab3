"""Settings precedence and every bad value."""

from __future__ import annotations

import json
from dataclasses import asdict, is_dataclass
from pathlib import Path

import pytest

from gpuwatch.app import config, options
from gpuwatch.app.config import load
from gpuwatch.app.options import DEFAULT_PORT, OPTIONS
from gpuwatch.core.errors import ConfigError

README = Path(__file__).resolve().parent.parent / "README.md"
CONFIGURATION = README.parent / "docs" / "configuration.md"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gpuwatch.yml"
    p.write_text(text)
    return p


def test_defaults(tmp_path: Path) -> None:
    s = load(env={"HOME": str(tmp_path)})
    assert s.port == DEFAULT_PORT
    assert s.port not in (9090, 9093, 9100, 9400, 8000, 3000)
    assert s.sample_interval == 1.0
    assert s.flush_interval == 2.0
    assert s.retention == 14 * 86400 and s.retention_1m == 90 * 86400 and s.retention_1h == 730 * 86400
    assert s.demo is False and s.demo_gpus == 8
    assert s.data_dir == tmp_path / ".local" / "share" / "gpuwatch"


def test_xdg_data_home(tmp_path: Path) -> None:
    assert load(env={"XDG_DATA_HOME": str(tmp_path)}).data_dir == tmp_path / "gpuwatch"


def test_demo_has_its_own_default_data_dir(tmp_path: Path) -> None:
    assert load(None, {"XDG_DATA_HOME": str(tmp_path)}, {"demo": True}).data_dir == tmp_path / "gpuwatch-demo"
    explicit = load(None, {}, {"demo": True, "data_dir": str(tmp_path / "mine")})
    assert explicit.data_dir == tmp_path / "mine"


def test_precedence_file_env_flags(tmp_path: Path) -> None:
    f = write(tmp_path, "port: 9001\nhost: 127.0.0.1\nsample_interval: 5s\nretention: 7d\n")
    s = load(f, {})
    assert (s.port, s.host, s.sample_interval, s.retention) == (9001, "127.0.0.1", 5.0, 7 * 86400)
    s = load(f, {"GPUWATCH_PORT": "9002", "GPUWATCH_SAMPLE_INTERVAL": "2s"})
    assert (s.port, s.host, s.sample_interval) == (9002, "127.0.0.1", 2.0)
    s = load(f, {"GPUWATCH_PORT": "9002"}, {"port": "9003", "host": None})
    assert (s.port, s.host) == (9003, "127.0.0.1")


def test_config_file_from_environment(tmp_path: Path) -> None:
    f = write(tmp_path, "demo: true\ndemo_gpus: 3\n")
    s = load(None, {"GPUWATCH_CONFIG": str(f)})
    assert s.demo is True and s.demo_gpus == 3 and s.config_file == f


def test_demo_flag_and_env_bool() -> None:
    assert load(None, {"GPUWATCH_DEMO": "yes"}).demo is True
    assert load(None, {"GPUWATCH_DEMO": "1"}, {"demo": None}).demo is True
    assert load(None, {"GPUWATCH_DEMO": "0"}, {"demo": True}).demo is True


def test_data_dir_expands_user(tmp_path: Path) -> None:
    s = load(None, {}, {"data_dir": str(tmp_path / "d")})
    assert s.data_dir == tmp_path / "d"


@pytest.mark.parametrize(
    ("where", "key", "value", "needle"),
    [
        ("file", "port", "'http'", "port: expected a whole number from 1 to 65535, got 'http'"),
        ("file", "port", "70000", "port: expected a whole number from 1 to 65535"),
        ("file", "port", "true", "port: expected a whole number"),
        ("file", "sample_interval", "fast", "sample_interval: expected a duration like 15s, got 'fast'"),
        ("file", "sample_interval", "0s", "sample_interval: expected a duration from 100ms to 1h"),
        ("file", "flush_interval", "5m", "flush_interval: expected a duration from 100ms to 1m"),
        ("file", "retention", "10m", "retention: expected a duration from 1h"),
        ("file", "demo", "maybe", "demo: expected true or false"),
        ("file", "demo_gpus", "0", "demo_gpus: expected a whole number from 1 to 1024"),
        ("file", "log_level", "loud", "log_level: expected one of debug, info, warning, error"),
        ("file", "prot", "1", "unknown setting 'prot'"),
        ("file", "host", "[1, 2]", "host: expected a text value"),
        ("file", "query_max_samples", "10", "query_max_samples: expected a whole number"),
        ("env", "PORT", "x", "environment GPUWATCH_PORT: port: expected a whole number"),
        (
            "env",
            "SAMPLE_INTERVAL",
            "soon",
            "environment GPUWATCH_SAMPLE_INTERVAL: sample_interval: expected a duration",
        ),
        ("env", "NOPE", "1", "unknown variable GPUWATCH_NOPE"),
        ("flag", "port", "abc", "command line: port: expected a whole number"),
    ],
)
def test_bad_values_one_clear_line(tmp_path: Path, where: str, key: str, value: str, needle: str) -> None:
    args: tuple[object, ...]
    if where == "file":
        args = (write(tmp_path, f"{key}: {value}\n"), {})
    elif where == "env":
        args = (None, {f"GPUWATCH_{key}": value})
    else:
        args = (None, {}, {key: value})
    with pytest.raises(ConfigError) as e:
        load(*args)  # type: ignore[arg-type]
    msg = str(e.value)
    assert msg.startswith("config error: ")
    assert needle in msg
    assert "\n" not in msg


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("port: [1\n", "line"),
        ("- a\n- b\n", "expected a mapping of settings"),
    ],
)
def test_bad_files(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, text), {})
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load(tmp_path / "nope.yml", {})


def test_empty_file_is_defaults(tmp_path: Path) -> None:
    assert load(write(tmp_path, ""), {}).port == DEFAULT_PORT


def test_every_setting_documented() -> None:
    docs = CONFIGURATION.read_text()
    assert options.settings_table() in docs, (
        "docs/configuration.md's settings table is stale: paste options.settings_table()"
    )
    for o in OPTIONS:
        assert f"`GPUWATCH_{o.key.upper()}`" in docs
    assert "(docs/configuration.md)" in README.read_text()  # the README points to it


def test_the_sdk_s_variables_are_not_settings() -> None:
    """A training job's GPUWATCH_URL/RUN/TOKEN (read by gpuwatch.client) must not break `gpuwatch` commands."""
    env = {"GPUWATCH_URL": "http://gpu-node-1:9842", "GPUWATCH_RUN": "job-1", "GPUWATCH_TOKEN": "t"}
    assert config.load(None, env).port == DEFAULT_PORT


def test_a_prometheus_global_block_and_remote_write_are_read(tmp_path: Path) -> None:
    f = tmp_path / "gpuwatch.yml"
    f.write_text(
        "global: {external_labels: {cluster: lab, region: eu}, scrape_interval: 30s}\n"
        "remote_write:\n  - {url: 'http://vm:8428/api/v1/write', name: vm}\n"
    )
    s = load(f, {}, {})
    assert s.external_labels == (("cluster", "lab"), ("region", "eu"))
    assert s.scrape_interval == 30.0
    assert [(d.name, d.url) for d in s.remote_write] == [("vm", "http://vm:8428/api/v1/write")]
    f.write_text("global: {rule_files: [x]}\n")
    with pytest.raises(ConfigError, match=r"global\.rule_files: not a setting here"):
        load(f, {}, {})


def test_storage_remote_reads_both_urls_with_a_remote_write_entrys_credentials(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    f = tmp_path / "gpuwatch.yml"
    f.write_text(
        "storage:\n  remote:\n    query_url: http://victoria-metrics:8428/\n"
        "    write_url: http://victoria-metrics:8428/api/v1/write\n"
        f"    authorization: {{credentials_file: {token}}}\n"
        "    headers: {X-Scope-OrgID: lab}\n    tls_config: {insecure_skip_verify: true}\n"
        "remote_write:\n  - {url: 'http://hub:9842/api/v1/write', name: hub}\n"
    )
    s = load(f, {}, {})
    remote = s.storage.remote
    assert remote is not None and remote.query_url == "http://victoria-metrics:8428"
    assert remote.headers == (("X-Scope-OrgID", "lab"),) and remote.tls.insecure_skip_verify
    assert remote.auth is not None and remote.auth.kind == "Bearer" and remote.auth.secret_file == str(token)
    assert remote.write is not None and remote.write.name == "storage"
    # write_url is one more destination of every stored sample, next to remote_write's
    assert [(d.name, d.url) for d in s.destinations] == [
        ("hub", "http://hub:9842/api/v1/write"),
        ("storage", "http://victoria-metrics:8428/api/v1/write"),
    ]
    assert s.public()["storage"] == {"remote": {"query_url": "http://victoria-metrics:8428",
                                                "write": remote.write.public(), "local_buffer": "15m"}}  # fmt: skip


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ("[]", r"storage: expected a mapping"),
        ("{local: {}}", r"storage\.local: unknown key \(known: remote\)"),
        ("{remote: {write_url: 'http://vm:8428/api/v1/write'}}", r"storage\.remote\.query_url: missing"),
        ("{remote: {query_url: 'vm:8428'}}", r"storage\.remote\.query_url: expected an http"),
        ("{remote: {query_url: 'http://vm:8428/api/v1/query'}}", r"query_url: expected the API's base"),
        ("{remote: {url: 'http://vm:8428'}}", r"storage\.remote\.url: unknown key: name the two URLs"),
        (
            "{remote: {query_url: 'http://vm', write_url: 'ftp://vm'}}",
            r"storage\.remote\.write_url: expected",
        ),
        ("{remote: {query_url: 'http://vm', fast: true}}", r"storage\.remote\.fast: unknown key"),
        ("{remote: {query_url: 'http://vm', write_url: 'http://vm/w', name: hub}}", r"named 'hub' too"),
    ],
)
def test_a_bad_storage_setting_names_its_path(tmp_path: Path, storage: str, message: str) -> None:
    f = write(
        tmp_path, f"storage: {storage}\nremote_write:\n  - {{url: 'http://hub/api/v1/write', name: hub}}\n"
    )
    with pytest.raises(ConfigError, match=message):
        load(f, {}, {})


def test_storage_without_write_url_only_reads(tmp_path: Path) -> None:
    s = load(write(tmp_path, "storage: {remote: {query_url: 'https://prometheus:9090'}}\n"), {}, {})
    assert s.storage.remote is not None and s.storage.remote.write is None
    assert s.destinations == ()


def test_settings_page_shows_no_remote_credentials(tmp_path: Path) -> None:
    """/-/settings writes the settings whole (dataclasses included): passwords must not be in them."""
    f = write(
        tmp_path,
        "remote_write:\n  - {url: 'http://vm/api/v1/write', basic_auth: {username: u, password: pw-1}}\n"
        "storage: {remote: {query_url: 'http://vm', write_url: 'http://vm/w', bearer_token: tok-2}}\n",
    )
    text = json.dumps(load(f, {}, {}).public(), default=lambda o: asdict(o) if is_dataclass(o) else str(o))
    assert "pw-1" not in text and "tok-2" not in text
    assert "http://vm/api/v1/write" in text and "http://vm/w" in text
