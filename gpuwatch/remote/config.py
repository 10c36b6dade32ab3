"""`remote_write:` as prometheus.yml writes it, read into frozen settings (docs/remote-write.md).

Per destination: `url`, `name`, `remote_timeout`, `headers`, `basic_auth` / `authorization` /
`bearer_token(_file)`, `tls_config`, `write_relabel_configs`, and `queue_config`'s
`max_samples_per_send`, `batch_send_deadline`, `min_backoff`, `max_backoff`, `retry_on_http_429`.
Prometheus's other queue keys (`capacity`, `max_shards`, `min_shards`, ...) size a memory queue that
gpuwatch does not have (its queue is the store), so they are accepted and ignored; any other key is an
error naming its path. gpuwatch's own: `queue_config.max_backlog`, how far behind a destination may fall
before its oldest unsent samples are skipped (default: the retention); `queue_config.live_first`, send
live samples ahead of a backlog (for receivers that take older samples: gpuwatch, VictoriaMetrics, a
Prometheus with an out-of-order window), and `queue_config.catch_up_rate`, the samples/s of that
backlog (sender.py).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpuwatch.collect.scrapeconfig import Auth, Relabel, Tls, parse_auth, parse_relabel, parse_tls
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.units import parse_duration

_KEYS = (
    "url",
    "name",
    "remote_timeout",
    "headers",
    "basic_auth",
    "authorization",
    "bearer_token",
    "bearer_token_file",
    "tls_config",
    "write_relabel_configs",
    "queue_config",
    "metadata_config",
    "send_exemplars",
    "send_native_histograms",
    "proxy_url",
    "follow_redirects",
    "enable_http2",
)
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_QUEUE_KEYS = (
    "max_samples_per_send",
    "batch_send_deadline",
    "min_backoff",
    "max_backoff",
    "retry_on_http_429",
    "max_backlog",
    "live_first",
    "catch_up_rate",
)
_QUEUE_IGNORED = ("capacity", "max_shards", "min_shards", "sample_age_limit")
# Headers the protocol sets; Prometheus refuses them in `headers` too.
_RESERVED_HEADERS = (
    "authorization",
    "host",
    "content-encoding",
    "content-type",
    "x-prometheus-remote-write-version",
    "user-agent",
)


@dataclass(frozen=True)
class QueueConfig:
    """How a destination is sent to (Prometheus's defaults, but 429s retried: gpuwatch loses nothing)."""

    max_samples_per_send: int = 2000
    batch_send_deadline_s: float = 5.0
    min_backoff_s: float = 0.03
    max_backoff_s: float = 5.0
    retry_on_http_429: bool = True
    max_backlog_s: float | None = None  # None: the retention
    live_first: bool = False  # in order by default: a Prometheus refuses samples older than its newest
    catch_up_rate: int = 20_000  # samples/s of a backlog sent behind the live lane (live_first)


@dataclass(frozen=True)
class RemoteWrite:
    """One `remote_write` destination."""

    url: str
    name: str
    remote_timeout_s: float = 30.0
    headers: tuple[tuple[str, str], ...] = ()
    auth: Auth | None = None
    tls: Tls = Tls()
    write_relabel_configs: tuple[Relabel, ...] = ()
    queue: QueueConfig = QueueConfig()

    def public(self) -> dict[str, Any]:
        """What `/-/settings` shows: no secrets."""
        return {"url": self.url, "name": self.name, "queue_config": {
            "max_samples_per_send": self.queue.max_samples_per_send,
            "batch_send_deadline": self.queue.batch_send_deadline_s,
            "retry_on_http_429": self.queue.retry_on_http_429,
            "live_first": self.queue.live_first,
            "catch_up_rate": self.queue.catch_up_rate,
        }}  # fmt: skip


def _fail(path: str, message: str, got: object = None) -> ConfigError:
    shown = "" if got is None else f", got {got!r}"
    return ConfigError(f"config error: {path}: {message}{shown}")


def _mapping(path: str, raw: object) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _fail(path, "expected a mapping", raw)
    return raw


def _duration(path: str, raw: object) -> float:
    try:
        return parse_duration(raw)
    except (TypeError, ValueError):
        raise _fail(path, "expected a duration like 30s", raw) from None


def _positive_int(path: str, raw: object, most: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= most:
        raise _fail(path, f"expected a whole number from 1 to {most}", raw)
    return raw


def _queue(path: str, raw: object) -> QueueConfig:
    data = _mapping(path, raw)
    unknown = [k for k in data if k not in _QUEUE_KEYS + _QUEUE_IGNORED]
    if unknown:
        raise _fail(f"{path}.{unknown[0]}", f"unknown key (known: {', '.join(_QUEUE_KEYS)})")
    q = QueueConfig()
    flags = {}
    for key in ("retry_on_http_429", "live_first"):
        flags[key] = data.get(key, getattr(q, key))
        if not isinstance(flags[key], bool):
            raise _fail(f"{path}.{key}", "expected true or false", flags[key])
    out = QueueConfig(
        max_samples_per_send=_positive_int(f"{path}.max_samples_per_send", data.get("max_samples_per_send", q.max_samples_per_send), 100_000),
        batch_send_deadline_s=_duration(f"{path}.batch_send_deadline", data.get("batch_send_deadline", q.batch_send_deadline_s)),
        min_backoff_s=_duration(f"{path}.min_backoff", data.get("min_backoff", q.min_backoff_s)),
        max_backoff_s=_duration(f"{path}.max_backoff", data.get("max_backoff", q.max_backoff_s)),
        retry_on_http_429=flags["retry_on_http_429"],
        live_first=flags["live_first"],
        catch_up_rate=_positive_int(f"{path}.catch_up_rate", data.get("catch_up_rate", q.catch_up_rate), 10_000_000),
        max_backlog_s=_duration(f"{path}.max_backlog", data["max_backlog"]) if "max_backlog" in data else None,
    )  # fmt: skip
    if out.min_backoff_s > out.max_backoff_s:
        raise _fail(path, "min_backoff is longer than max_backoff")
    if out.batch_send_deadline_s <= 0:
        raise _fail(
            f"{path}.batch_send_deadline", "expected a duration above 0", data.get("batch_send_deadline")
        )
    return out


def parse_destination(path: str, raw: object) -> RemoteWrite:
    """One destination at config path `path` (a `remote_write` entry, or `storage.remote`'s writing)."""
    data = _mapping(path, raw)
    unknown = [k for k in data if k not in _KEYS]
    if unknown:
        raise _fail(f"{path}.{unknown[0]}", "unknown key")
    url = data.get("url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        raise _fail(f"{path}.url", "expected an http:// or https:// URL", url)
    name = data.get("name", hashlib.sha256(url.encode()).hexdigest()[:6])
    if not isinstance(name, str) or not name:
        raise _fail(f"{path}.name", "expected a name", name)
    headers = _mapping(f"{path}.headers", data.get("headers") or {})
    for key, value in headers.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise _fail(f"{path}.headers", "expected text names and values", {key: value})
        if key.lower() in _RESERVED_HEADERS:
            raise _fail(
                f"{path}.headers.{key}", "is set by remote write itself (use authorization for credentials)"
            )
    relabels = data.get("write_relabel_configs") or []
    if not isinstance(relabels, list):
        raise _fail(f"{path}.write_relabel_configs", "expected a list", relabels)
    return RemoteWrite(
        url=url,
        name=name,
        remote_timeout_s=_duration(f"{path}.remote_timeout", data.get("remote_timeout", 30.0)),
        headers=tuple(sorted(headers.items())),
        auth=parse_auth(path, data),
        tls=parse_tls(f"{path}.tls_config", data.get("tls_config") or {}),
        write_relabel_configs=tuple(
            parse_relabel(f"{path}.write_relabel_configs[{i}]", r) for i, r in enumerate(relabels)
        ),
        queue=_queue(f"{path}.queue_config", data.get("queue_config") or {}),
    )


def parse_remote_write(raw: object) -> tuple[RemoteWrite, ...]:
    """`remote_write:` (a list of destinations); names must differ (each keeps its own watermark)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _fail("remote_write", "expected a list of destinations", raw)
    out = tuple(parse_destination(f"remote_write[{i}]", d) for i, d in enumerate(raw))
    names = [d.name for d in out]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _fail(
                f"remote_write[{i}].name", f"two destinations are named {name!r} (each keeps its own place)"
            )
    return out


def parse_external_labels(raw: object) -> tuple[tuple[str, str], ...]:
    """`external_labels` (or `global.external_labels`): label names to values."""
    if raw is None:
        return ()
    data = _mapping("external_labels", raw)
    out = []
    for name, value in data.items():
        if not isinstance(name, str) or not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
            raise _fail("external_labels", "expected Prometheus label names (not starting with __)", name)
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise _fail(f"external_labels.{name}", "expected a text value", value)
        out.append((name, str(value)))
    return tuple(sorted(out))


def sent_labels(external_labels: tuple[tuple[str, str], ...], hostname: str) -> tuple[tuple[str, str], ...]:
    """Return the labels added to every series sent: `Hostname` (gpuwatch's `hostname`), then
    `external_labels`.

    gpuwatch's own figures (`gpuwatch_gpus`, `process_cpu_seconds_total`, the remote-write counters)
    carry no label naming the machine, nor does a scrape of `127.0.0.1:8000`: two nodes writing to one
    hub or VictoriaMetrics would write one series between them. A series' own `Hostname` wins, as
    every external label; `external_labels: {Hostname: ''}` sends none.
    """
    return tuple(sorted({"Hostname": hostname, **dict(external_labels)}.items()))
