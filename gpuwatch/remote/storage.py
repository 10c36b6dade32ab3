"""`storage.remote`: a remote store (VictoriaMetrics, Prometheus, Mimir) that gpuwatch's pages, API and
rules read from, and that every sample gpuwatch stores is written to (docs/scale.md).

```yaml
storage:
  remote:
    query_url: http://victoria-metrics:8428       # /api/v1/query, query_range, series, labels are added
    write_url: http://victoria-metrics:8428/api/v1/write
    local_buffer: 15m   # while query_url is unreachable, the pages draw the local store's last 15m (0: not)
    # any key of a remote_write entry: headers, authorization, bearer_token(_file), basic_auth,
    # tls_config, remote_timeout, queue_config, write_relabel_configs, name (default: storage)
```

The credentials and TLS settings are a `remote_write` entry's and serve both URLs. `write_url` is a
remote_write destination like any other (its own watermark, named `storage` unless `name` says
otherwise); without it, the rules' recorded series and `ALERTS` stay in the local store.
`local_buffer`: how far back the pages and the API answer from the local store while `query_url` cannot
be reached (query/fallback.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gpuwatch.collect.scrapeconfig import Auth, Tls
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.units import format_duration, parse_duration
from gpuwatch.remote.config import RemoteWrite, parse_destination

DESTINATION_NAME = "storage"
_OWN_KEYS = ("query_url", "write_url", "local_buffer")
LOCAL_BUFFER_S = 900.0  # 15 minutes: what a face shows of its own store while the remote is down
_API_SUFFIXES = ("/api/v1/query", "/api/v1/query_range", "/api/v1/write", "/api/v1/")


@dataclass(frozen=True)
class RemoteStorage:
    """The remote store: where queries go (`query_url`, a Prometheus HTTP API's base) and where
    samples are written (`write`, None when only read)."""

    query_url: str
    headers: tuple[tuple[str, str], ...] = ()
    auth: Auth | None = None
    tls: Tls = Tls()
    write: RemoteWrite | None = None
    local_buffer_s: float = LOCAL_BUFFER_S  # answered from the local store while unreachable (0: not)

    def public(self) -> dict[str, Any]:
        """What `/-/settings` shows: no secrets."""
        return {
            "query_url": self.query_url,
            "write": self.write.public() if self.write is not None else None,
            "local_buffer": format_duration(self.local_buffer_s) if self.local_buffer_s else "0s",
        }


@dataclass(frozen=True)
class Storage:
    """The `storage` setting: local only (the default), or a remote store (`remote`)."""

    remote: RemoteStorage | None = None

    def public(self) -> dict[str, Any]:
        """What `/-/settings` shows: no secrets."""
        return {"remote": self.remote.public() if self.remote is not None else None}


def _fail(path: str, message: str, got: object = None) -> ConfigError:
    shown = "" if got is None else f", got {got!r}"
    return ConfigError(f"config error: {path}: {message}{shown}")


def _url(path: str, raw: object) -> str:
    if not isinstance(raw, str) or urlsplit(raw).scheme not in ("http", "https") or not urlsplit(raw).netloc:
        raise _fail(path, "expected an http:// or https:// URL", raw)
    return raw


def _query_url(path: str, raw: object) -> str:
    url = _url(path, raw).rstrip("/")
    if url.endswith(_API_SUFFIXES):
        raise _fail(
            path,
            "expected the API's base, e.g. http://victoria-metrics:8428 (gpuwatch adds /api/v1/query)",
            raw,
        )
    return url


def parse_storage(raw: object) -> Storage:
    """`storage:` as a mapping with one key, `remote` (see the module's text)."""
    if raw is None:
        return Storage()
    if not isinstance(raw, dict):
        raise _fail("storage", "expected a mapping like {remote: {query_url: ..., write_url: ...}}", raw)
    unknown = [k for k in raw if k != "remote"]
    if unknown:
        raise _fail(f"storage.{unknown[0]}", "unknown key (known: remote)")
    data = raw.get("remote")
    if data is None:
        return Storage()
    path = "storage.remote"
    if not isinstance(data, dict):
        raise _fail(path, "expected a mapping with query_url and write_url", data)
    if "url" in data:
        raise _fail(f"{path}.url", "unknown key: name the two URLs query_url and write_url")
    if "query_url" not in data:
        raise _fail(f"{path}.query_url", "missing: the remote's query API, e.g. http://victoria-metrics:8428")
    query_url = _query_url(f"{path}.query_url", data["query_url"])
    write_url = _url(f"{path}.write_url", data["write_url"]) if data.get("write_url") is not None else None
    buffer_s = LOCAL_BUFFER_S
    if data.get("local_buffer") is not None:
        try:
            buffer_s = parse_duration(data["local_buffer"])
        except ValueError:
            raise _fail(
                f"{path}.local_buffer", "expected a duration like 15m (0: no fallback)", data["local_buffer"]
            ) from None
    rest = {k: v for k, v in data.items() if k not in _OWN_KEYS}
    rest.setdefault("name", DESTINATION_NAME)
    # The credentials and TLS are a remote_write entry's, read by its parser (the URL only stands in
    # where there is nothing to write to).
    dest = parse_destination(path, {**rest, "url": write_url or query_url})
    return Storage(
        RemoteStorage(
            query_url=query_url,
            headers=dest.headers,
            auth=dest.auth,
            tls=dest.tls,
            write=dest if write_url is not None else None,
            local_buffer_s=buffer_s,
        )
    )
