"""Settings: defaults < YAML file < GPUWATCH_* environment < CLI flags, validated at load.

What settings exist, their defaults and parsers are `options.py`'s; this module loads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuwatch.app.options import OPTIONS
from gpuwatch.collect.logconfig import LogFileConfig
from gpuwatch.collect.scrapeconfig import ScrapeConfig
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.model import LabelLimits, SeriesLimits
from gpuwatch.notify.alerting import AlertingConfig
from gpuwatch.notify.config import NotifyConfig
from gpuwatch.remote.config import RemoteWrite
from gpuwatch.remote.storage import Storage
from gpuwatch.rules.config import BuiltinRules


def _default_data_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", "~")) / ".local" / "share")
    return Path(base).expanduser() / "gpuwatch"


_BY_KEY = {o.key: o for o in OPTIONS}
# Read by the training SDK (gpuwatch.client) in a training job's environment, where `gpuwatch` commands
# may run too: not settings, and so no setting may be named url, run or token.
SDK_VARIABLES = frozenset({"GPUWATCH_URL", "GPUWATCH_RUN", "GPUWATCH_TOKEN"})


@dataclass(frozen=True)
class Settings:
    """Every setting, validated; see options.OPTIONS for meaning and defaults."""

    host: str
    port: int
    data_dir: Path
    demo: bool
    demo_gpus: int
    demo_model: str
    hostname: str
    sample_interval: float
    host_interval: float
    flush_interval: float
    retention: float
    query_timeout: float
    query_max_samples: int
    lookback: float
    log_level: str
    scrape_interval: float = 15.0
    scrape_configs: tuple[ScrapeConfig, ...] = ()
    scrape: tuple[str, ...] = ()
    remote_write: tuple[RemoteWrite, ...] = ()
    storage: Storage = Storage()
    external_labels: tuple[tuple[str, str], ...] = ()
    log_files: tuple[LogFileConfig, ...] = ()
    tensorboard_dirs: tuple[str, ...] = ()
    tensorboard_interval: float = 5.0
    rule_files: tuple[str, ...] = ()
    evaluation_interval: float = 15.0
    builtin_rules: BuiltinRules = BuiltinRules()
    language: str = "en"
    notify: NotifyConfig = NotifyConfig()
    alerting: AlertingConfig = AlertingConfig()
    demo_sources: bool = True
    demo_history: bool = True
    store_memory_mb: int = 256
    chunk_cache_mb: int | None = None
    retention_1m: float = 90 * 86400.0
    retention_1h: float = 730 * 86400.0
    retention_size: int = 20 << 30
    max_silences: int = 10_000
    max_silence_size_bytes: int = 65_536
    max_posted_alerts: int = 10_000
    query_max_length: int = 16384
    query_max_depth: int = 100
    query_max_concurrency: int = 4
    query_max_queued: int = 16
    label_limit: int = 64
    label_name_length_limit: int = 1024
    label_value_length_limit: int = 4096
    max_new_series_per_request: int = 1_000_000
    max_new_series_per_minute: int = 1_000_000
    proc_root: Path = Path("/proc")
    expect_gpus: bool = False
    auth: str = "on"
    read_access: str = "open"
    read_only: bool = False
    trust_loopback: bool = True
    trusted_proxies: tuple[str, ...] = ()
    write_rate_limit: float = 100.0
    write_max_bytes: int = 64 * 1024 * 1024
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    energy_price_per_kwh: float = 0.0
    energy_currency: str = "EUR"
    usage_idle_below: float = 5.0
    config_file: Path | None = None

    @property
    def label_limits(self) -> LabelLimits:
        """The limits every write path checks labels against."""
        return LabelLimits(self.label_limit, self.label_name_length_limit, self.label_value_length_limit)

    @property
    def series_limits(self) -> SeriesLimits:
        """The limits on new series every push, import and scrape is held to."""
        return SeriesLimits(self.max_new_series_per_request, self.max_new_series_per_minute)

    @property
    def destinations(self) -> tuple[RemoteWrite, ...]:
        """Where every stored sample is sent: `remote_write`, and `storage.remote`'s `write_url`."""
        remote = self.storage.remote
        return (
            (*self.remote_write, remote.write) if remote is not None and remote.write else self.remote_write
        )

    def public(self) -> dict[str, Any]:
        """Return the settings as JSON-friendly values (for /-/settings)."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name in ("scrape_configs", "remote_write"):
                v = [c.public() for c in v]  # without passwords and tokens
            elif f.name == "log_files":
                v = [c.public() for c in v]
            elif f.name in ("builtin_rules", "notify", "alerting", "storage"):
                v = v.public()
            out[f.name] = str(v) if isinstance(v, Path) else v
        return out


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"config error: cannot read {path}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise ConfigError(f"config error: {path}{where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config error: {path}: expected a mapping of settings at the top level")
    return data


# prometheus.yml's `global:` keys and the settings they are here
_GLOBAL_KEYS = {
    "external_labels": "external_labels",
    "scrape_interval": "scrape_interval",
    "evaluation_interval": "evaluation_interval",
}


def _prometheus_global(data: dict[str, Any], source: str) -> dict[str, Any]:
    """A `global:` block pasted from prometheus.yml, as the settings it sets (a top-level one wins)."""
    block = data.get("global")
    if block is None:
        return data
    if not isinstance(block, dict):
        raise ConfigError(f"config error: {source}: global: expected a mapping, got {block!r}")
    out = {k: v for k, v in data.items() if k != "global"}
    for key, raw in block.items():
        name = _GLOBAL_KEYS.get(str(key))
        if name is None:
            raise ConfigError(
                f"config error: {source}: global.{key}: not a setting here (global takes "
                f"{', '.join(_GLOBAL_KEYS)})"
            )
        out.setdefault(name, raw)
    return out


def _apply(key: str, raw: object, source: str) -> Any:
    option = _BY_KEY.get(key)
    if option is None:
        raise ConfigError(
            f"config error: {source}: unknown setting '{key}'; known settings: {', '.join(_BY_KEY)}"
        )
    try:
        return option.parse(raw)
    except ValueError as e:
        raise ConfigError(f"config error: {source}: {key}: {e}, got {raw!r}") from None


def load(
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Settings:
    """Build Settings from defaults, then `file`, then `GPUWATCH_*` in `env`, then `overrides` (CLI)."""
    env = env or {}
    values: dict[str, Any] = {o.key: o.default for o in OPTIONS}
    overrides = dict(overrides or {})
    if file is None and env.get("GPUWATCH_CONFIG"):
        file = Path(env["GPUWATCH_CONFIG"])
    if file is not None:
        for key, raw in _prometheus_global(_read_file(file), str(file)).items():
            values[str(key)] = _apply(str(key), raw, str(file))
    for name, raw in env.items():
        if not name.startswith("GPUWATCH_") or name == "GPUWATCH_CONFIG" or name in SDK_VARIABLES:
            continue
        key = name[len("GPUWATCH_") :].lower()
        if key not in _BY_KEY:
            raise ConfigError(f"config error: environment: unknown variable {name}")
        values[key] = _apply(key, raw, f"environment {name}")
    for key, raw in overrides.items():
        if raw is not None:
            values[key] = _apply(key, raw, "command line")
    if values["data_dir"] is None:
        # Simulated history must never mix with a real GPU's: the demo gets its own default directory.
        default = _default_data_dir(env)
        values["data_dir"] = default.with_name(default.name + "-demo") if values["demo"] else default
    if (values["tls_cert_file"] is None) != (values["tls_key_file"] is None):
        raise ConfigError("config error: tls_cert_file and tls_key_file go together; set both or neither")
    _check_destinations(values["remote_write"], values["storage"])
    return Settings(**values, config_file=file)


def _check_destinations(remote_write: tuple[RemoteWrite, ...], storage: Storage) -> None:
    """`storage.remote`'s writing is one more destination: its name must differ from remote_write's
    (each keeps its own watermark)."""
    dest = storage.remote.write if storage.remote is not None else None
    if dest is not None and dest.name in {d.name for d in remote_write}:
        raise ConfigError(
            f"config error: storage.remote.name: a remote_write destination is named {dest.name!r} too "
            "(each keeps its own place); give one of them another name"
        )
