"""Scrape one Prometheus-format target: fetch over HTTP, parse, label, relabel, track staleness.

`Target.scrape()` returns the batches to store: the scraped samples with the target's `job` and
`instance` (and static) labels, Prometheus's report series (`up`, `scrape_duration_seconds`,
`scrape_samples_scraped`, `scrape_samples_post_metric_relabeling`, `scrape_series_added`) plus
`gpuwatch_scrape_invalid_lines`, and a staleness marker for every series the previous scrape had and
this one has not (all of them when the target is down), so queries stop seeing it at once.
Fetching is separate (`fetch(spec, timeout_s) -> FetchResult`), so tests can hand in bytes.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode

import requests
import urllib3

from gpuwatch import __version__
from gpuwatch.clock import Clock
from gpuwatch.collect.relabel import relabel
from gpuwatch.config import format_duration
from gpuwatch.errors import ScrapeError
from gpuwatch.model import STALE_NAN, Batch, Labels, Sample, make_labels
from gpuwatch.scrapeconfig import Auth, Relabel, ScrapeConfig, StaticGroup, Tls
from gpuwatch.textformat import FamilyMeta, Parser, is_openmetrics_content_type

# Text 0.0.4 only. prometheus_client 0.23-0.26 mangles `vllm:` names when it answers in OpenMetrics, and
# its choose_encoder() ignores q-values: any mention of application/openmetrics-text gets OpenMetrics.
# An OpenMetrics answer (from a server that sends it anyway) is still parsed as OpenMetrics.
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
MAX_BODY_BYTES = 32 * 1024 * 1024
REPORT_NAMES = (
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
    "gpuwatch_scrape_invalid_lines",
)
_MAX_CACHE = 500_000
_NEVER = "0001-01-01T00:00:00Z"
_MISSING: Any = object()

SeriesKey = tuple[str, Labels]


@dataclass(frozen=True)
class TargetSpec:
    """One concrete target: where to fetch, how, and which labels its samples get."""

    job: str
    address: str
    scheme: str
    metrics_path: str
    params: tuple[tuple[str, str], ...]
    labels: Labels  # the target labels: job, instance and static/file_sd labels
    interval_s: float
    timeout_s: float
    honor_labels: bool = False
    honor_timestamps: bool = True
    sample_limit: int = 0
    relabel: tuple[Relabel, ...] = ()
    auth: Auth | None = None
    tls: Tls = Tls()
    discovered: Labels = ()  # the labels before target relabelling, for /api/v1/targets

    @property
    def url(self) -> str:
        query = f"?{urlencode(self.params)}" if self.params else ""
        return f"{self.scheme}://{self.address}{self.metrics_path}{query}"


def target_specs(
    config: ScrapeConfig,
    groups: tuple[StaticGroup, ...],
    default_interval_s: float,
    dropped: list[dict[str, str]] | None = None,
) -> list[TargetSpec]:
    """Expand a job's target groups into specs, applying `relabel_configs` as Prometheus does.

    Before relabelling a target has `__address__`, `__scheme__`, `__metrics_path__`,
    `__scrape_interval__`, `__scrape_timeout__`, `__param_<name>`, `job` and its group's labels (which
    win). Afterwards `instance` defaults to `__address__` and labels starting with `__` are removed.
    Targets that relabelling drops (or leaves without a usable address or scheme) go to `dropped`.
    """
    interval, timeout = config.interval_s(default_interval_s), config.timeout_s(default_interval_s)
    base = {
        "__scheme__": config.scheme,
        "__metrics_path__": config.metrics_path,
        "__scrape_interval__": format_duration(interval),
        "__scrape_timeout__": format_duration(timeout),
        "job": config.job_name,
    }
    for name, value in config.params:
        base.setdefault(f"__param_{name}", value)
    out = []
    for group in groups:
        for address in group.targets:
            labels = {"__address__": address, **base, **dict(group.labels)}
            discovered = dict(labels)
            if config.relabel_configs:
                result = relabel(labels, config.relabel_configs)
                address = (result or {}).get("__address__", "")
                scheme = (result or {}).get("__scheme__", "")
                if result is None or not address or "/" in address or scheme not in ("http", "https"):
                    if dropped is not None:
                        dropped.append(discovered)
                    continue
            params = dict(config.params)
            params.update({k[len("__param_") :]: v for k, v in labels.items() if k.startswith("__param_")})
            labels.setdefault("instance", labels["__address__"])
            out.append(
                TargetSpec(
                    job=config.job_name,
                    address=labels["__address__"],
                    scheme=labels["__scheme__"],
                    metrics_path=labels.get("__metrics_path__") or "/metrics",
                    params=tuple(params.items()),
                    labels=make_labels({k: v for k, v in labels.items() if not k.startswith("__")}),
                    interval_s=interval,
                    timeout_s=timeout,
                    honor_labels=config.honor_labels,
                    honor_timestamps=config.honor_timestamps,
                    sample_limit=config.sample_limit,
                    relabel=config.metric_relabel_configs,
                    auth=config.auth,
                    tls=config.tls,
                    discovered=tuple(sorted(discovered.items())),
                )
            )
    return out


class FetchResult(NamedTuple):
    """A successful fetch: the (decompressed) body and its Content-Type."""

    body: bytes
    content_type: str | None


Fetch = Callable[[TargetSpec, float], FetchResult]


def _secret(auth: Auth) -> str:
    if not auth.secret_file:
        return auth.secret
    try:
        return Path(auth.secret_file).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ScrapeError(f"cannot read {auth.secret_file}: {e.strerror or e}") from None


class HttpFetcher:
    """Fetch with `requests`: no redirects, no proxies from the environment, a body cap, a deadline."""

    def __init__(self, clock: Clock, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self._clock = clock
        self.max_body_bytes = max_body_bytes
        self._local = threading.local()  # requests.Session is not thread-safe: one per pool thread

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
            session.trust_env = False  # no proxy or .netrc surprises for a local scrape
        return session

    def __call__(self, spec: TargetSpec, timeout_s: float) -> FetchResult:
        headers = {
            "Accept": ACCEPT,
            "Accept-Encoding": "gzip",
            "User-Agent": f"gpuwatch/{__version__}",
            "X-Prometheus-Scrape-Timeout-Seconds": f"{timeout_s:g}",
        }
        if spec.auth is not None:
            secret = _secret(spec.auth)
            if spec.auth.kind == "basic":
                token = base64.b64encode(f"{spec.auth.username}:{secret}".encode()).decode()
                headers["Authorization"] = f"Basic {token}"
            else:
                headers["Authorization"] = f"{spec.auth.kind} {secret}"
        verify: bool | str = not spec.tls.insecure_skip_verify
        if spec.tls.ca_file and verify:
            verify = spec.tls.ca_file
        cert = (spec.tls.cert_file, spec.tls.key_file) if spec.tls.cert_file else None
        deadline = self._clock.monotonic() + timeout_s
        try:
            response = self._session().get(
                spec.url,
                headers=headers,
                timeout=timeout_s,
                stream=True,
                allow_redirects=False,
                verify=verify,
                cert=cert,
            )
        except requests.Timeout:
            raise ScrapeError(f"timed out after {timeout_s:g}s (scrape_timeout)") from None
        except (requests.RequestException, OSError, ValueError) as e:  # OSError: e.g. a missing ca_file
            raise ScrapeError(_short(e)) from None
        with response:
            if response.status_code != 200:
                hint = " (redirects are not followed)" if 300 <= response.status_code < 400 else ""
                raise ScrapeError(
                    f"server returned HTTP status {response.status_code} {response.reason}{hint}"
                )
            chunks, size = [], 0
            raw = response.raw
            # read1 returns after each network read, so a server that trickles bytes cannot hold the
            # scrape past its deadline (read() would wait until 64 KiB had arrived).
            read = getattr(raw, "read1", None) or raw.read
            try:
                while True:
                    chunk = read(65536, decode_content=True)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        raise ScrapeError(f"body larger than {self.max_body_bytes} bytes; scrape abandoned")
                    if self._clock.monotonic() > deadline:
                        raise ScrapeError(f"timed out after {timeout_s:g}s (scrape_timeout) reading the body")
                    chunks.append(chunk)
            except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as e:
                if "timed out" in str(e).lower():
                    raise ScrapeError(
                        f"timed out after {timeout_s:g}s (scrape_timeout) reading the body"
                    ) from None
                raise ScrapeError(f"reading the body failed: {_short(e)}") from None
            return FetchResult(b"".join(chunks), response.headers.get("Content-Type"))


def _short(e: BaseException) -> str:
    """One line for a requests/urllib3 error (they nest whole reprs of their causes)."""
    text = str(e)
    for marker in ("Connection refused", "Name or service not known", "Temporary failure in name resolution"):
        if marker in text:
            return marker.lower()
    return text if len(text) <= 200 else text[:200] + "..."


def _iso(ms: int | None) -> str:
    if ms is None:
        return _NEVER
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat().replace("+00:00", "Z")


class _Series:
    """One final series of a target (after target labels and metric_relabel_configs), shared by every
    line that names it; `gen` is the number of the last scrape that had it (staleness, series added)."""

    __slots__ = ("name", "labels", "gen")

    def __init__(self, name: str, labels: Labels) -> None:
        self.name = name
        self.labels = labels
        self.gen = -1  # scrape numbers start at 1


class Target:
    """One target's scraper and its state: the label caches, the series seen last time, its health.

    The scrape cache (as Prometheus's scrapeCache): the raw text of a line's series (the parser's
    `keys`) -> the final series it becomes, or None where metric_relabel_configs drop it; an
    unchanged line then costs a dict lookup and its value. Lines without a key (timestamps, escapes,
    OpenMetrics) are looked up by parsed name and labels. Every final series is one `_Series` object,
    so staleness and `scrape_series_added` compare scrape numbers instead of hashing label sets. The
    cache lives as long as the target: a configuration change (relabel rules included) makes a new
    `TargetSpec` and so a new `Target` with an empty cache.
    """

    def __init__(self, spec: TargetSpec, fetch: Fetch, clock: Clock) -> None:
        self.spec = spec
        self._fetch = fetch
        self._clock = clock
        self._parser = Parser()
        self._by_key: dict[str, _Series | None] = {}  # raw series text -> final series
        self._by_labels: dict[SeriesKey, _Series | None] = {}  # parsed (name, labels) -> final series
        self._series: dict[SeriesKey, _Series] = {}  # final (name, labels) -> its one _Series
        self._gen = 0  # number of the last scrape; a failed one counts, with no series
        self._last: list[_Series] = []  # the series the last scrape had (no timestamp), each once
        self.health = "unknown"
        self.last_error = ""
        self.last_scrape_ms: int | None = None
        self.last_duration_s = 0.0
        self.last_invalid_lines = 0
        self.first_invalid_line = ""
        self.invalid_lines_total = 0
        self.scrapes = 0
        self.metadata: dict[str, FamilyMeta] = {}  # HELP/TYPE/UNIT from the last successful scrape
        self.lock = threading.Lock()  # held while a scrape runs: never two at once for one target

    def _labels(self, name: str, labels: Labels) -> SeriesKey | None:
        """Attach the target labels (honor_labels decides conflicts), then metric_relabel_configs."""
        spec = self.spec
        d = dict(labels)
        for k, v in spec.labels:
            if spec.honor_labels:
                if not d.get(k):
                    d[k] = v
            else:
                old = d.get(k)
                if old:
                    exported = "exported_" + k
                    while exported in d:
                        exported = "exported_" + exported
                    d[exported] = old
                d[k] = v
        if spec.relabel:
            d["__name__"] = name
            result = relabel(d, spec.relabel)
            if result is None:
                return None
            name = result.pop("__name__", "")
            if not name:
                return None
        return name, make_labels(d)

    def _final(self, name: str, labels: Labels) -> _Series | None:
        final = self._labels(name, labels)
        if final is None:
            return None
        found = self._series.get(final)
        if found is None:
            found = self._series[final] = _Series(*final)
        return found

    def _lookup(self, name: str, labels: Labels) -> _Series | None:
        key = (name, labels)
        found = self._by_labels.get(key, _MISSING)
        if found is _MISSING:
            found = self._by_labels[key] = self._final(name, labels)
        return found  # type: ignore[no-any-return]

    def _trim(self) -> None:
        """Forget cached lines and series once there are too many; keep the last scrape's series."""
        if max(len(self._by_key), len(self._by_labels), len(self._series)) > _MAX_CACHE:
            self._by_key.clear()
            self._by_labels.clear()
            self._series = {(s.name, s.labels): s for s in self._last}

    def scrape(self) -> list[Batch]:
        """Scrape once; return the batches to store (the first one is stamped with the scrape time)."""
        clock, spec = self._clock, self.spec
        now_ms = clock.now_ms()
        start = clock.monotonic()
        samples: list[Sample] = []
        stamped: dict[int, list[Sample]] = {}
        current: list[_Series] = []
        gen, prev_gen, added = self._gen + 1, self._gen, 0
        error, scraped, invalid, first_invalid = "", 0, 0, ""
        try:
            result = self._fetch(spec, spec.timeout_s)
            parsed = self._parser.parse(
                result.body, openmetrics=is_openmetrics_content_type(result.content_type)
            )
            invalid = len(parsed.errors)
            first_invalid = str(parsed.errors[0]) if parsed.errors else ""
            scraped = len(parsed.samples)
            if parsed.metadata:
                self.metadata = parsed.metadata
            self._trim()
            by_key, lookup = self._by_key, self._lookup
            honor_ts = spec.honor_timestamps
            keys = parsed.keys if len(parsed.keys) == scraped else [None] * scraped
            append, current_append = samples.append, current.append
            for (name, labels, ts, value), key in zip(parsed.samples, keys, strict=True):
                if key is None:
                    series = lookup(name, labels)
                else:
                    series = by_key.get(key, _MISSING)
                    if series is _MISSING:
                        series = by_key[key] = self._final(name, labels)
                if series is None:
                    continue
                if ts is None or not honor_ts:
                    append(Sample(series.name, series.labels, value))
                    if series.gen != gen:
                        if series.gen != prev_gen:
                            added += 1
                        series.gen = gen
                        current_append(series)
                else:
                    stamped.setdefault(ts, []).append(Sample(series.name, series.labels, value))
            post = len(samples) + sum(len(s) for s in stamped.values())
            if spec.sample_limit and post > spec.sample_limit:
                raise ScrapeError(
                    f"sample_limit exceeded: {post} samples after relabelling, limit {spec.sample_limit}"
                )
        except ScrapeError as e:
            error = str(e)
            samples, stamped, current, added = [], {}, [], 0
            gen += 1  # a number no series has: the next scrape counts every series as added
        post = len(samples) + sum(len(s) for s in stamped.values())
        duration = clock.monotonic() - start
        samples.extend(Sample(s.name, s.labels, STALE_NAN) for s in self._last if s.gen != gen)
        self._gen, self._last = gen, current
        target = spec.labels
        samples.extend(
            (
                Sample("up", target, 0.0 if error else 1.0),
                Sample("scrape_duration_seconds", target, duration),
                Sample("scrape_samples_scraped", target, float(scraped)),
                Sample("scrape_samples_post_metric_relabeling", target, float(post)),
                Sample("scrape_series_added", target, float(added)),
                Sample("gpuwatch_scrape_invalid_lines", target, float(invalid)),
            )
        )
        self.scrapes += 1
        self.health = "down" if error else "up"
        self.last_error = error
        self.last_scrape_ms = now_ms
        self.last_duration_s = duration
        self.last_invalid_lines = invalid
        self.first_invalid_line = first_invalid
        self.invalid_lines_total += invalid
        return [Batch(now_ms, samples), *(Batch(ts, s) for ts, s in sorted(stamped.items()))]

    def stale_batch(self, now_ms: int) -> Batch:
        """Staleness markers for every series of this target (it was removed from the configuration)."""
        keys = [*((s.name, s.labels) for s in self._last), *((n, self.spec.labels) for n in REPORT_NAMES)]
        self._last = []
        self._gen += 1
        return Batch(now_ms, [Sample(n, labels, STALE_NAN) for n, labels in keys])

    def state(self) -> dict[str, Any]:
        """Return this target as Prometheus's /api/v1/targets shows an active target."""
        spec = self.spec
        return {
            "discoveredLabels": dict(spec.discovered),
            "labels": dict(spec.labels),
            "scrapePool": spec.job,
            "scrapeUrl": spec.url,
            "globalUrl": spec.url,
            "lastError": self.last_error,
            "lastScrape": _iso(self.last_scrape_ms),
            "lastScrapeDuration": self.last_duration_s,
            "health": self.health,
            "scrapeInterval": format_duration(spec.interval_s),
            "scrapeTimeout": format_duration(spec.timeout_s),
            "invalidLines": self.last_invalid_lines,
            "firstInvalidLine": self.first_invalid_line,
        }
