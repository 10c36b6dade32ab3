"""The settings that exist: each one's key, default, parser and help text, and their docs table.

Loading them (YAML file, `GPUWATCH_*` environment, flags) into one `Settings` is `config.py`'s.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuwatch.collect.logconfig import parse_log_files
from gpuwatch.collect.scrapeconfig import parse_scrape_configs, parse_scrape_urls
from gpuwatch.core.units import format_duration, parse_duration
from gpuwatch.notify.alerting import AlertingConfig, parse_alerting
from gpuwatch.notify.config import NotifyConfig, parse_notify
from gpuwatch.remote.config import parse_external_labels, parse_remote_write
from gpuwatch.remote.storage import Storage, parse_storage
from gpuwatch.rules.config import BuiltinRules, parse_builtin_rules, parse_language
from gpuwatch.store.budget import DEFAULT_MB, MIN_MB


def _parse_int(lo: int, hi: int) -> Callable[[object], int]:
    def parse(v: object) -> int:
        if isinstance(v, bool):
            raise ValueError(f"expected a whole number from {lo} to {hi}")
        try:
            n = int(v) if isinstance(v, (int, str)) else None
        except ValueError:
            n = None
        if n is None or not lo <= n <= hi:
            raise ValueError(f"expected a whole number from {lo} to {hi}")
        return n

    return parse


def _parse_optional_int(lo: int, hi: int) -> Callable[[object], int | None]:
    whole = _parse_int(lo, hi)

    def parse(v: object) -> int | None:
        return None if v is None or v == "" else whole(v)

    return parse


def _parse_price(v: object) -> float:
    if isinstance(v, bool):
        raise ValueError("expected a price, a number of at least 0")
    try:
        n = float(v) if isinstance(v, (int, float, str)) else None
    except ValueError:
        n = None
    if n is None or not 0 <= n < 1e9:  # also refuses NaN
        raise ValueError("expected a price, a number of at least 0")
    return n


_SIZE_UNITS = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def _parse_size(v: object) -> int:
    """A size as Prometheus's `--storage.tsdb.retention.size` writes it (`512MB`, `20GB`; powers of
    1024), or bytes; 0: no cap."""
    text = str(v).strip().upper() if isinstance(v, (int, str)) and not isinstance(v, bool) else ""
    num = text.rstrip("KMGTB")
    unit = text[len(num) :] or "B"
    try:
        n = float(num) * _SIZE_UNITS[unit]
    except (KeyError, ValueError):
        raise ValueError(f"expected a size like 20GB or 512MB (or 0: no cap), got {v!r}") from None
    if n < 0 or (0 < n < 64 << 20):
        raise ValueError(f"expected 0 (no cap) or at least 64MB, got {v!r}")
    return int(n)


def _parse_percent(v: object) -> float:
    if isinstance(v, bool):
        raise ValueError("expected a percentage from 0 to 100")
    try:
        n = float(v) if isinstance(v, (int, float, str)) else None
    except ValueError:
        n = None
    if n is None or not 0 <= n <= 100:  # also refuses NaN
        raise ValueError("expected a percentage from 0 to 100")
    return n


def _parse_bool(v: object) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(v, str) and v.strip().lower() in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def _parse_str(v: object) -> str:
    if not isinstance(v, (str, int)) or isinstance(v, bool):
        raise ValueError("expected a text value")
    return str(v)


def _parse_path(v: object) -> Path:
    return Path(_parse_str(v)).expanduser()


def _parse_positive_duration(lo: float, hi: float) -> Callable[[object], float]:
    def parse(v: object) -> float:
        s = parse_duration(v)
        if not lo <= s <= hi:
            raise ValueError(f"expected a duration from {format_duration(lo)} to {format_duration(hi)}")
        return s

    return parse


def _parse_globs(v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [p for p in v.split(",") if p.strip()]
    if not isinstance(v, (list, tuple)) or not all(isinstance(p, str) and p.strip() for p in v):
        raise ValueError("expected a list of file names or globs")
    return tuple(p.strip() for p in v)


def _parse_choice(*choices: str) -> Callable[[object], str]:
    def parse(v: object) -> str:
        s = _parse_str(v).strip().lower()
        if s not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return s

    return parse


def _parse_optional_path(v: object) -> Path | None:
    return None if v is None or v == "" else _parse_path(v)


def _parse_networks(v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [p for p in v.split(",") if p.strip()]
    if not isinstance(v, (list, tuple)) or not all(isinstance(p, str) for p in v):
        raise ValueError("expected a list of addresses or networks (CIDR)")
    out = []
    for p in v:
        try:
            out.append(str(ipaddress.ip_network(p.strip(), strict=False)))
        except ValueError:
            raise ValueError(f"{p.strip()!r} is not an address or a network such as 10.0.0.0/8") from None
    return tuple(out)


def _parse_rate(v: object) -> float:
    try:
        n = float(v) if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None
    except ValueError:
        n = None
    if n is None or not 0 <= n <= 1e6:
        raise ValueError("expected requests a second from 0 (no limit) to 1000000")
    return n


def _parse_dirs(v: object) -> tuple[str, ...]:
    if isinstance(v, str):
        v = [p for p in v.split(",") if p.strip()]
    if v is None:
        return ()
    if not isinstance(v, (list, tuple)) or not all(isinstance(p, str) and p.strip() for p in v):
        raise ValueError("expected a list of folders or globs")
    return tuple(p.strip() for p in v)


def _parse_level(v: object) -> str:
    s = _parse_str(v).lower()
    if s not in ("debug", "info", "warning", "error"):
        raise ValueError("expected one of debug, info, warning, error")
    return s


@dataclass(frozen=True)
class Option:
    """One setting: its key, parser, default and help text."""

    key: str
    parse: Callable[[object], Any]
    default: Any
    help: str
    flag: str | None = None  # CLI flag that sets it, if any


DEFAULT_PORT = 9842
OPTIONS: tuple[Option, ...] = (
    Option("host", _parse_str, "0.0.0.0", "Address to listen on.", "--host"),
    Option("port", _parse_int(1, 65535), DEFAULT_PORT, "TCP port for pages, APIs and /metrics.", "--port"),
    Option(
        "data_dir",
        _parse_path,
        None,
        "Directory for the DuckDB store (default: $XDG_DATA_HOME/gpuwatch, else ~/.local/share/gpuwatch; "
        "with `demo`, the same name with `-demo` appended).",
        "--data-dir",
    ),
    Option("demo", _parse_bool, False, "Simulate GPUs instead of reading NVML.", "--demo"),
    Option("demo_gpus", _parse_int(1, 1024), 8, "Number of simulated GPUs in demo mode."),
    Option("demo_model", _parse_str, "NVIDIA H100 80GB HBM3", "Model name of the simulated GPUs."),
    Option(
        "demo_sources",
        _parse_bool,
        True,
        "In demo mode, also run a simulated vLLM and SGLang server (scraped as jobs `demo-vllm` and "
        "`demo-sglang`) and a simulated training run; false: only simulated GPUs.",
    ),
    Option(
        "demo_history",
        _parse_bool,
        True,
        "In demo mode on an empty data directory, first import 7 days of the simulation's history (its GPUs "
        "every 15 s, coarser before the last day past 8 GPUs; processes, usage counters, training run), so "
        "every page and range has data from the first minute; false: start empty.",
    ),
    Option(
        "hostname",
        _parse_str,
        "",
        "Value of the Hostname label (default: this machine's host name; in Docker pass "
        '`--hostname "$(hostname)"`, or the label is the container id).',
    ),
    Option(
        "proc_root",
        _parse_path,
        Path("/proc"),
        "Where the host's `/proc` is, for the names, users and containers of GPU processes (NVML reports "
        "host PIDs): `/proc` with `--pid=host`, or where the host's `/proc` is mounted (e.g. `/host/proc`).",
    ),
    Option(
        "expect_gpus",
        _parse_bool,
        False,
        "This machine should have NVIDIA GPUs: finding none makes `/-/health` answer 503 `degraded` "
        "(the Docker image sets it, so a container started without `--gpus all` fails its health check).",
    ),
    Option("sample_interval", _parse_positive_duration(0.1, 3600), 1.0, "How often every GPU is sampled."),
    Option(
        "host_interval",
        _parse_positive_duration(1, 3600),
        5.0,
        "How often host figures (CPU, memory, network, disk, InfiniBand; node_exporter's names) are read.",
    ),
    Option(
        "flush_interval",
        _parse_positive_duration(0.1, 60),
        2.0,
        "How often samples are written to disk; at most this much is lost on a crash.",
    ),
    Option(
        "retention",
        _parse_positive_duration(3600, 10 * 31536000),
        14 * 86400.0,
        "How long raw samples are kept (a day is deleted only once its 1-minute and 1-hour points are built).",
    ),
    Option(
        "retention_1m",
        _parse_positive_duration(86400, 10 * 31536000),
        90 * 86400.0,
        "How long 1-minute points are kept (min, max, sum, count, first, last and counter increase of "
        "each minute): what long panels and rates read past `retention`.",
    ),
    Option(
        "retention_1h",
        _parse_positive_duration(86400, 10 * 31536000),
        730 * 86400.0,
        "How long 1-hour points are kept.",
    ),
    Option(
        "retention_size",
        _parse_size,
        20 << 30,
        "Most disk the data directory's database may use (`512MB`, `20GB`; 0: no cap): past 90 % of it the "
        "oldest raw days are deleted, then the oldest 1-minute and 1-hour points (hourly, logged).",
    ),
    Option("query_timeout", _parse_positive_duration(0.1, 3600), 120.0, "Longest time one query may run."),
    Option("query_max_samples", _parse_int(1000, 10**10), 50_000_000, "Most samples one query may load."),
    Option(
        "query_max_length",
        _parse_int(64, 10**7),
        16384,
        "Most bytes one query's text may have; a longer one is refused (400) before it is parsed.",
    ),
    Option(
        "query_max_concurrency",
        _parse_int(1, 1000),
        4,
        "Most PromQL queries and dashboard JSON twins evaluated at once (as Prometheus's "
        "`--query.max-concurrency`); more wait (`query_max_queued`).",
    ),
    Option(
        "query_max_queued",
        _parse_int(0, 10_000),
        16,
        "Most queries waiting for one of `query_max_concurrency`'s turns; past it a query is answered at "
        "once with 503 `unavailable` and `Retry-After`, which the dashboard takes as busy and asks again "
        "next refresh (so `/-/health` never waits behind a queue of queries).",
    ),
    Option(
        "query_max_depth",
        _parse_int(2, 150),
        100,
        "Most nesting levels (brackets plus operators) one query may have; a deeper one is refused (400).",
    ),
    Option(
        "max_silences",
        _parse_int(0, 10**7),
        10_000,
        "Most active and pending silences; a new one past it is refused (400) (0: no limit).",
    ),
    Option(
        "max_silence_size_bytes",
        _parse_int(0, 10**8),
        65_536,
        "Most bytes of matchers, comment and author one silence may hold (0: no limit).",
    ),
    Option(
        "max_posted_alerts",
        _parse_int(1, 10**7),
        10_000,
        "Most alerts posted by other senders (`POST /api/v2/alerts`) held at once; more are refused (400).",
    ),
    Option(
        "label_limit",
        _parse_int(0, 10_000),
        64,
        "Most labels a series may have (metric name included) on every write path: scrape, push, import, "
        "posted alerts (0: no limit).",
    ),
    Option(
        "label_name_length_limit",
        _parse_int(0, 10**6),
        1024,
        "Longest label name on every write path (0: no limit).",
    ),
    Option(
        "label_value_length_limit",
        _parse_int(0, 10**7),
        4096,
        "Longest label value on every write path (0: no limit).",
    ),
    Option(
        "max_new_series_per_request",
        _parse_int(0, 10**9),
        1_000_000,
        "Most new series one push or import may make (refused whole: 413) and one scrape may bring "
        "(the scrape fails, `up` 0) (0: no limit).",
    ),
    Option(
        "max_new_series_per_minute",
        _parse_int(0, 10**9),
        1_000_000,
        "Most new series pushes and imports may make in a minute, and each scrape target bring "
        "(over it: 429, or the scrape fails) (0: no limit).",
    ),
    Option(
        "store_memory_mb",
        _parse_int(MIN_MB, 1_000_000),
        DEFAULT_MB,
        "Memory (MB) the store may hold: DuckDB's buffer (a quarter, at least 64), the series and chunk "
        "indexes (~1 KB a series), and decoded chunks for queries (the rest, at least 16).",
    ),
    Option(
        "chunk_cache_mb",
        _parse_optional_int(0, 1_000_000),
        None,
        "Most memory (MB) for stored chunks kept decoded for queries, within `store_memory_mb` (0: none; "
        "default: what the budget leaves); let go 10 minutes after their last read.",
    ),
    Option(
        "lookback", _parse_positive_duration(1, 86400), 300.0, "PromQL lookback delta for instant vectors."
    ),
    Option("log_level", _parse_level, "info", "Log level: debug, info, warning or error."),
    Option(
        "energy_price_per_kwh",
        _parse_price,
        0.0,
        "Price of a kWh, for the cost of training runs (/api/v1/runs) and of GPU usage (`gpuwatch report`, "
        "the Usage page) (0: no cost shown).",
    ),
    Option("energy_currency", _parse_str, "EUR", "Currency of `energy_price_per_kwh`, shown with each cost."),
    Option(
        "usage_idle_below",
        _parse_percent,
        5.0,
        "GPU utilization (percent) under which an allocated GPU counts as idle-but-held in the usage "
        "figures (`gpuwatch report`, the Usage page).",
    ),
    Option(
        "scrape_interval",
        _parse_positive_duration(1, 86400),
        15.0,
        "How often scrape targets are scraped unless their job sets `scrape_interval` (Prometheus: 1m).",
    ),
    Option(
        "scrape_configs",
        parse_scrape_configs,
        (),
        "Prometheus `scrape_configs` jobs, pasted from prometheus.yml; see docs/scrape.md.",
    ),
    Option(
        "scrape",
        parse_scrape_urls,
        (),
        "URLs to scrape as job `scrape` (repeat the flag; comma-separated in the environment).",
        "--scrape",
    ),
    Option(
        "remote_write",
        parse_remote_write,
        (),
        "Destinations to send every stored sample to by Prometheus remote write (VictoriaMetrics, Prometheus, "
        "Mimir, a gpuwatch hub), as prometheus.yml writes `remote_write`; see docs/remote-write.md.",
    ),
    Option(
        "storage",
        parse_storage,
        Storage(),
        "A remote store the pages, `/api/v1/*` and the rules read from and every sample is written to "
        "(a gpuwatch face on VictoriaMetrics or Prometheus): `{remote: {query_url, write_url, local_buffer}}` "
        "with a `remote_write` entry's credentials and TLS keys; `local_buffer` (default `15m`, `0`: off): while "
        "`query_url` is unreachable the pages and `/api/v1/*` answer from the local store's last minutes with "
        "a warning, and the rules skip their round; see docs/scale.md.",
    ),
    Option(
        "external_labels",
        parse_external_labels,
        (),
        "Labels added to every sample sent by `remote_write` (a series' own label of the same name wins); "
        "also read from `global.external_labels`, as prometheus.yml has them. `Hostname` is added as "
        "`hostname` unless set here (`Hostname: ''` adds none).",
    ),
    Option(
        "log_files",
        parse_log_files,
        (),
        "Training log files to tail (`path` or glob, `run`, `patterns` with named groups, "
        "`from_beginning`, `job`); see docs/logs.md.",
    ),
    Option(
        "tensorboard_dirs",
        _parse_dirs,
        (),
        "TensorBoard run folders (paths or globs) whose event files are read as they grow; a run is a "
        "sub-folder; needs `gpuwatch[tensorboard]`; see docs/training.md.",
    ),
    Option(
        "tensorboard_interval",
        _parse_positive_duration(1, 3600),
        5.0,
        "How often the `tensorboard_dirs` folders are searched and their event files read.",
    ),
    Option(
        "rule_files",
        _parse_globs,
        (),
        "Prometheus rule files (globs, relative to the config file) with alerting and recording rules; "
        "see docs/rules.md.",
    ),
    Option(
        "evaluation_interval",
        _parse_positive_duration(1, 86400),
        15.0,
        "How often rule groups are evaluated unless a group sets `interval`.",
    ),
    Option(
        "builtin_rules",
        parse_builtin_rules,
        BuiltinRules(),
        "The built-in alert rules (docs/rules.md): true, false, or `{disable: [names], override: {name: "
        "{expr, for, keep_firing_for, labels, annotations}}}` (true/false in the environment).",
    ),
    Option(
        "language",
        parse_language,
        "en",
        "Language of the built-in rules' annotations and of the dashboard: en or zh (Chinese).",
    ),
    Option(
        "notify",
        parse_notify,
        NotifyConfig(),
        "Notifications, as alertmanager.yml writes them: `route`, `receivers`, `inhibit_rules`, `global`, "
        "`time_intervals`, `templates`; "
        "see docs/notify.md.",
    ),
    Option(
        "auth",
        _parse_choice("on", "off"),
        "on",
        "on: writes (pushes, imports, posted alerts, silences, reload, deletes) need a token or password, "
        "except from this machine's loopback (see `trust_loopback`); off: nobody is asked (a trusted "
        "network only). See docs/security.md.",
    ),
    Option(
        "read_access",
        _parse_choice("open", "login"),
        "open",
        "open: pages and read APIs answer anyone; login: they need the viewer password (or any token).",
    ),
    Option(
        "read_only",
        _parse_bool,
        False,
        "Refuse every write (403), whoever asks: pushes, imports, alerts, silences, reload.",
    ),
    Option(
        "trust_loopback",
        _parse_bool,
        True,
        "Requests from 127.0.0.1/::1 that came through no proxy act as admin without a credential. "
        "In Docker, requests from the host come from the bridge, not loopback, and need the token.",
    ),
    Option(
        "trusted_proxies",
        _parse_networks,
        (),
        "Reverse proxies (addresses or CIDRs) whose X-Forwarded-For/-Proto are believed; their "
        "requests are never trusted as loopback.",
    ),
    Option(
        "write_rate_limit",
        _parse_rate,
        100.0,
        "Writes a second one client may send (bursts of twice as many); more get 429 (0: no limit).",
    ),
    Option(
        "write_max_bytes",
        _parse_int(1024, 2**40),
        64 * 1024 * 1024,
        "Largest request body any write or login may send; larger ones get 413.",
    ),
    Option(
        "tls_cert_file",
        _parse_optional_path,
        None,
        "PEM certificate (chain): serve HTTPS instead of HTTP (with `tls_key_file`).",
    ),
    Option("tls_key_file", _parse_optional_path, None, "PEM private key of `tls_cert_file`."),
    Option(
        "alerting",
        parse_alerting,
        AlertingConfig(),
        "Alertmanagers to send alerts to, as prometheus.yml writes them (`alertmanagers` with "
        "`static_configs`); see docs/notify.md.",
    ),
)


def settings_table() -> str:
    """Return the markdown table of every setting (kept in docs/configuration.md)."""
    rows = ["| setting (YAML) | environment | flag | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for o in OPTIONS:
        if o.default is None or o.default == "":
            default = "(see meaning)"
        elif o.default == () or o.key in ("notify", "alerting", "storage"):
            default = "(none)"
        elif isinstance(o.default, float) and o.parse.__qualname__.startswith("_parse_positive_duration"):
            default = format_duration(o.default)
        elif o.parse is _parse_size:
            default = f"{o.default >> 30}GB"
        elif isinstance(o.default, bool):
            default = str(o.default).lower()
        else:
            default = str(o.default)
        rows.append(
            f"| `{o.key}` | `GPUWATCH_{o.key.upper()}` | {f'`{o.flag}`' if o.flag else ''} | {default if default.startswith('(') else f'`{default}`'} | {o.help} |"
        )
    return "\n".join(rows)
