"""Read `scrape_configs` exactly as Prometheus writes them, and `--scrape URL`, into frozen targets specs.

Supported per job: `job_name`, `scrape_interval`, `scrape_timeout`, `metrics_path`, `scheme` (http or
https only), `params`, `static_configs` (`targets`, `labels`), `file_sd_configs` (`files`,
`refresh_interval`), `basic_auth`, `authorization` (and the older `bearer_token`/`bearer_token_file`),
`tls_config` (`ca_file`, `cert_file`, `key_file`, `insecure_skip_verify`), `honor_labels`,
`honor_timestamps`, `sample_limit`, `relabel_configs` and `metric_relabel_configs` (`keep`, `drop`,
`replace`, `labeldrop`, `labelkeep`, `labelmap`). Every other key is an error that names its path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from gpuwatch.core import regex
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.regex import Regex
from gpuwatch.core.units import parse_duration

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_PATH = "/metrics"
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
RELABEL_ACTIONS = ("replace", "keep", "drop", "labeldrop", "labelkeep", "labelmap")
_UNSUPPORTED_HINT = "not supported by gpuwatch (targets come from static_configs or file_sd_configs)"


@dataclass(frozen=True)
class Relabel:
    """One `metric_relabel_configs` entry; `regex` is anchored as in Prometheus."""

    action: str = "replace"
    source_labels: tuple[str, ...] = ()
    separator: str = ";"
    regex: Regex = field(default_factory=lambda: regex.compile_anchored("(.*)"))
    target_label: str = ""
    replacement: str = "$1"


@dataclass(frozen=True)
class StaticGroup:
    """A group of `host:port` targets sharing extra labels."""

    targets: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Auth:
    """How to authenticate: basic auth or an Authorization header, each value inline or from a file."""

    kind: str  # "basic" or the Authorization type ("Bearer", ...)
    username: str = ""
    secret: str = ""
    secret_file: str = ""


@dataclass(frozen=True)
class Tls:
    """TLS options for https targets."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure_skip_verify: bool = False


@dataclass(frozen=True)
class ScrapeConfig:
    """One scrape job; `scrape_interval`/`scrape_timeout` None means the global default."""

    job_name: str
    scrape_interval: float | None = None
    scrape_timeout: float | None = None
    metrics_path: str = DEFAULT_PATH
    scheme: str = "http"
    params: tuple[tuple[str, str], ...] = ()
    static_configs: tuple[StaticGroup, ...] = ()
    file_sd_files: tuple[str, ...] = ()
    auth: Auth | None = None
    tls: Tls = Tls()
    honor_labels: bool = False
    honor_timestamps: bool = True
    sample_limit: int = 0
    metric_relabel_configs: tuple[Relabel, ...] = ()
    relabel_configs: tuple[Relabel, ...] = ()

    def interval_s(self, default_s: float) -> float:
        """Return the scrape interval, falling back to gpuwatch's global `scrape_interval`."""
        return self.scrape_interval if self.scrape_interval is not None else default_s

    def timeout_s(self, default_interval_s: float) -> float:
        """Return the scrape timeout: as configured, else 10s but never longer than the interval."""
        if self.scrape_timeout is not None:
            return self.scrape_timeout
        return min(DEFAULT_TIMEOUT_S, self.interval_s(default_interval_s))

    def public(self) -> dict[str, Any]:
        """Return the job as JSON-friendly values with secrets hidden (for /-/settings)."""
        return {
            "job_name": self.job_name,
            "scrape_interval": self.scrape_interval,
            "scrape_timeout": self.scrape_timeout,
            "metrics_path": self.metrics_path,
            "scheme": self.scheme,
            "targets": [t for g in self.static_configs for t in g.targets],
            "file_sd_files": list(self.file_sd_files),
            "auth": None if self.auth is None else self.auth.kind,
            "honor_labels": self.honor_labels,
            "sample_limit": self.sample_limit,
            "relabel_configs": len(self.relabel_configs),
            "metric_relabel_configs": len(self.metric_relabel_configs),
        }


def _fail(path: str, message: str, got: object = None, *, show: bool = True) -> ConfigError:
    suffix = f", got {got!r}" if show else ""
    return ConfigError(f"config error: {path}: {message}{suffix}")


def _duration(path: str, raw: object) -> float:

    try:
        value = parse_duration(raw)
    except ValueError:
        raise _fail(path, "expected a duration like 15s", raw) from None
    if value <= 0:
        raise _fail(path, "expected a duration above zero", raw)
    return value


def _text(path: str, raw: object) -> str:
    if not isinstance(raw, str):
        raise _fail(path, "expected a text value", raw)
    return raw


def _bool(path: str, raw: object) -> bool:
    if not isinstance(raw, bool):
        raise _fail(path, "expected true or false", raw)
    return raw


def _mapping(path: str, raw: object) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _fail(path, "expected a mapping", raw)
    return {str(k): v for k, v in raw.items()}


def _list(path: str, raw: object) -> list[Any]:
    if not isinstance(raw, list):
        raise _fail(path, "expected a list", raw)
    return raw


def _check_keys(path: str, data: dict[str, Any], known: tuple[str, ...]) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(f"config error: {path}.{key}: unknown key; known keys: {', '.join(known)}")


def _label_name(path: str, raw: object) -> str:
    name = _text(path, raw)
    if not LABEL_NAME.fullmatch(name):
        raise _fail(path, "expected a label name like instance_group", raw)
    return name


def _labels(path: str, raw: object) -> tuple[tuple[str, str], ...]:
    out = {}
    for k, v in _mapping(path, raw).items():
        name = _label_name(f"{path}.{k}", k)
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise _fail(f"{path}.{k}", "expected a text value", v)
        out[name] = str(v)
    return tuple(sorted(out.items()))


def _target(path: str, raw: object) -> str:
    text = _text(path, raw).strip()
    if not text or "/" in text or any(c.isspace() for c in text):
        raise _fail(path, "expected host:port (scheme and path go in `scheme` and `metrics_path`)", raw)
    return text


def targets_group(path: str, raw: object) -> StaticGroup:
    """Validate one `{targets: [...], labels: {...}}` group (static_configs or a file_sd file)."""
    data = _mapping(path, raw)
    _check_keys(path, data, ("targets", "labels"))
    targets = tuple(
        _target(f"{path}.targets[{i}]", t)
        for i, t in enumerate(_list(f"{path}.targets", data.get("targets", [])))
    )
    return StaticGroup(targets, _labels(f"{path}.labels", data.get("labels") or {}))


def _regex(path: str, raw: object) -> Regex:
    text = _text(path, raw) if not isinstance(raw, (int, float)) or isinstance(raw, bool) else str(raw)
    try:
        return regex.compile_anchored(text)
    except regex.RegexError as e:
        raise _fail(path, f"invalid regular expression ({e.reason})", raw) from None


def _relabel(path: str, raw: object) -> Relabel:
    data = _mapping(path, raw)
    _check_keys(path, data, ("source_labels", "separator", "regex", "target_label", "replacement", "action"))
    action = _text(f"{path}.action", data.get("action", "replace")).lower()
    if action not in RELABEL_ACTIONS:
        raise _fail(f"{path}.action", f"expected one of {', '.join(RELABEL_ACTIONS)}", data.get("action"))
    sources = tuple(
        _label_name(f"{path}.source_labels[{i}]", s)
        for i, s in enumerate(_list(f"{path}.source_labels", data.get("source_labels", [])))
    )
    rule = Relabel(
        action=action,
        source_labels=sources,
        separator=_text(f"{path}.separator", data.get("separator", ";")),
        regex=_regex(f"{path}.regex", data.get("regex", "(.*)")),
        target_label=_text(f"{path}.target_label", data.get("target_label", "")),
        replacement=_text(f"{path}.replacement", data.get("replacement", "$1")),
    )
    if action == "replace" and not rule.target_label:
        raise _fail(path, "action replace needs a target_label", show=False)
    if action in ("keep", "drop") and not sources:
        raise _fail(path, f"action {action} needs source_labels", show=False)
    return rule


def _auth(path: str, data: dict[str, Any]) -> Auth | None:
    found = [k for k in ("basic_auth", "authorization", "bearer_token", "bearer_token_file") if k in data]
    if len(found) > 1:
        raise _fail(path, f"use only one of {', '.join(found)}", show=False)
    if not found:
        return None
    key = found[0]
    if key == "bearer_token":
        return Auth("Bearer", secret=_text(f"{path}.{key}", data[key]))
    if key == "bearer_token_file":
        return Auth("Bearer", secret_file=_text(f"{path}.{key}", data[key]))
    sub = _mapping(f"{path}.{key}", data[key])
    if key == "basic_auth":
        _check_keys(f"{path}.{key}", sub, ("username", "password", "password_file"))
        if "password" in sub and "password_file" in sub:
            raise _fail(f"{path}.{key}", "use password or password_file, not both", show=False)
        return Auth(
            "basic",
            username=_text(f"{path}.{key}.username", sub.get("username", "")),
            secret=_text(f"{path}.{key}.password", sub.get("password", "")),
            secret_file=_text(f"{path}.{key}.password_file", sub.get("password_file", "")),
        )
    _check_keys(f"{path}.{key}", sub, ("type", "credentials", "credentials_file"))
    if "credentials" in sub and "credentials_file" in sub:
        raise _fail(f"{path}.{key}", "use credentials or credentials_file, not both", show=False)
    kind = _text(f"{path}.{key}.type", sub.get("type", "Bearer"))
    if kind.lower() == "basic":
        raise _fail(f"{path}.{key}.type", "use basic_auth for Basic authentication", kind)
    return Auth(
        kind,
        secret=_text(f"{path}.{key}.credentials", sub.get("credentials", "")),
        secret_file=_text(f"{path}.{key}.credentials_file", sub.get("credentials_file", "")),
    )


def _tls(path: str, raw: object) -> Tls:
    data = _mapping(path, raw)
    _check_keys(path, data, ("ca_file", "cert_file", "key_file", "insecure_skip_verify", "server_name"))
    return Tls(
        ca_file=_text(f"{path}.ca_file", data.get("ca_file", "")),
        cert_file=_text(f"{path}.cert_file", data.get("cert_file", "")),
        key_file=_text(f"{path}.key_file", data.get("key_file", "")),
        insecure_skip_verify=_bool(f"{path}.insecure_skip_verify", data.get("insecure_skip_verify", False)),
    )


_JOB_KEYS = (
    "job_name",
    "scrape_interval",
    "scrape_timeout",
    "metrics_path",
    "scheme",
    "params",
    "static_configs",
    "file_sd_configs",
    "basic_auth",
    "authorization",
    "bearer_token",
    "bearer_token_file",
    "tls_config",
    "honor_labels",
    "honor_timestamps",
    "sample_limit",
    "metric_relabel_configs",
    "relabel_configs",
    "follow_redirects",
    "enable_http2",
)


def _job(path: str, raw: object) -> ScrapeConfig:  # noqa: C901 - one check per scrape_config key
    data = _mapping(path, raw)
    for key in data:
        if key.endswith("_sd_configs") and key != "file_sd_configs":
            raise ConfigError(f"config error: {path}.{key}: {_UNSUPPORTED_HINT}")
    _check_keys(path, data, _JOB_KEYS)
    if "job_name" not in data:
        raise _fail(path, "job_name is missing", show=False)
    job = _text(f"{path}.job_name", data["job_name"])
    if not job:
        raise _fail(f"{path}.job_name", "expected a non-empty name", job)
    interval = (
        _duration(f"{path}.scrape_interval", data["scrape_interval"]) if "scrape_interval" in data else None
    )
    timeout = (
        _duration(f"{path}.scrape_timeout", data["scrape_timeout"]) if "scrape_timeout" in data else None
    )
    if interval is not None and timeout is not None and timeout > interval:
        raise _fail(
            f"{path}.scrape_timeout", "must not be longer than scrape_interval", data["scrape_timeout"]
        )
    scheme = _text(f"{path}.scheme", data.get("scheme", "http")).lower()
    if scheme not in ("http", "https"):
        raise _fail(f"{path}.scheme", "expected http or https", data.get("scheme"))
    metrics_path = _text(f"{path}.metrics_path", data.get("metrics_path", DEFAULT_PATH))
    if not metrics_path.startswith("/"):
        raise _fail(f"{path}.metrics_path", "expected a path starting with /", metrics_path)
    params: list[tuple[str, str]] = []
    for name, values in _mapping(f"{path}.params", data.get("params") or {}).items():
        for i, v in enumerate(_list(f"{path}.params.{name}", values)):
            params.append((name, _text(f"{path}.params.{name}[{i}]", v)))
    static = tuple(
        targets_group(f"{path}.static_configs[{i}]", g)
        for i, g in enumerate(_list(f"{path}.static_configs", data.get("static_configs") or []))
    )
    files: list[str] = []
    for i, sd in enumerate(_list(f"{path}.file_sd_configs", data.get("file_sd_configs") or [])):
        sd_path = f"{path}.file_sd_configs[{i}]"
        sd_data = _mapping(sd_path, sd)
        _check_keys(sd_path, sd_data, ("files", "refresh_interval"))
        if "refresh_interval" in sd_data:
            _duration(f"{sd_path}.refresh_interval", sd_data["refresh_interval"])
        for j, f in enumerate(_list(f"{sd_path}.files", sd_data.get("files", []))):
            files.append(_text(f"{sd_path}.files[{j}]", f))
    limit = data.get("sample_limit", 0)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise _fail(f"{path}.sample_limit", "expected a whole number (0 means no limit)", limit)
    if data.get("follow_redirects", False) is not False:
        raise _fail(
            f"{path}.follow_redirects",
            "gpuwatch never follows redirects; remove it or set false",
            data["follow_redirects"],
        )
    if "enable_http2" in data:
        _bool(f"{path}.enable_http2", data["enable_http2"])
    return ScrapeConfig(
        job_name=job,
        scrape_interval=interval,
        scrape_timeout=timeout,
        metrics_path=metrics_path,
        scheme=scheme,
        params=tuple(params),
        static_configs=static,
        file_sd_files=tuple(files),
        auth=_auth(path, data),
        tls=_tls(f"{path}.tls_config", data.get("tls_config") or {}),
        honor_labels=_bool(f"{path}.honor_labels", data.get("honor_labels", False)),
        honor_timestamps=_bool(f"{path}.honor_timestamps", data.get("honor_timestamps", True)),
        sample_limit=limit,
        relabel_configs=tuple(
            _relabel(f"{path}.relabel_configs[{i}]", r)
            for i, r in enumerate(_list(f"{path}.relabel_configs", data.get("relabel_configs") or []))
        ),
        metric_relabel_configs=tuple(
            _relabel(f"{path}.metric_relabel_configs[{i}]", r)
            for i, r in enumerate(
                _list(f"{path}.metric_relabel_configs", data.get("metric_relabel_configs") or [])
            )
        ),
    )


def parse_scrape_configs(raw: object) -> tuple[ScrapeConfig, ...]:
    """Validate a `scrape_configs` list (YAML text from the environment is accepted too)."""
    if isinstance(raw, str):
        import yaml

        try:
            raw = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise _fail("scrape_configs", "expected a YAML list of jobs", raw) from None
    if raw is None:
        return ()
    jobs = tuple(_job(f"scrape_configs[{i}]", j) for i, j in enumerate(_list("scrape_configs", raw)))
    seen: set[str] = set()
    for i, job in enumerate(jobs):
        if job.job_name in seen:
            raise _fail(
                f"scrape_configs[{i}].job_name", "found twice; job names must be unique", job.job_name
            )
        seen.add(job.job_name)
    return jobs


def parse_scrape_urls(raw: object) -> tuple[str, ...]:
    """Validate `--scrape URL` values (a list, or one comma-separated text from the environment)."""
    items = raw.split(",") if isinstance(raw, str) else raw
    if not isinstance(items, (list, tuple)):
        raise _fail("scrape", "expected a list of http(s) URLs", raw)
    out = []
    for i, item in enumerate(items):
        url = _text(f"scrape[{i}]", item).strip()
        if url:
            url_config(url, f"scrape[{i}]")
            out.append(url)
    return tuple(out)


def url_config(url: str, path: str = "scrape") -> ScrapeConfig:
    """Turn `http://host:port/path?query` into a job named `scrape` with one target."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise _fail(path, "expected an http:// or https:// URL", url)
    if not parts.hostname or parts.username or parts.password or parts.fragment:
        raise _fail(path, "expected a URL like http://host:port/metrics", url)
    return ScrapeConfig(
        job_name="scrape",
        metrics_path=parts.path or DEFAULT_PATH,
        scheme=parts.scheme,
        params=tuple(parse_qsl(parts.query, keep_blank_values=True)),
        static_configs=(StaticGroup((parts.netloc,)),),
    )


# The pieces of a scrape job that remote_write and other blocks in Prometheus's shape share.
parse_auth = _auth
parse_tls = _tls
parse_relabel = _relabel
