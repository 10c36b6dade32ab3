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
import http.client
import ssl
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, NamedTuple, cast
from urllib.parse import urlencode

import numpy as np

from gpuwatch import __version__
from gpuwatch.clock import Clock
from gpuwatch.collect.relabel import relabel
from gpuwatch.collect.scrapeconfig import Auth, Relabel, ScrapeConfig, StaticGroup, Tls
from gpuwatch.errors import ScrapeError
from gpuwatch.model import (
    DEFAULT_LABEL_LIMITS,
    STALE_NAN,
    Batch,
    LabelLimits,
    Labels,
    Sample,
    SeriesTable,
    TableSamples,
    make_labels,
)
from gpuwatch.promtext.parser import FamilyMeta, Parser, ParseResult, is_openmetrics_content_type
from gpuwatch.units import format_duration

# Text 0.0.4 only. prometheus_client 0.23-0.26 mangles `vllm:` names when it answers in OpenMetrics, and
# its choose_encoder() ignores q-values: any mention of application/openmetrics-text gets OpenMetrics.
# An OpenMetrics answer (from a server that sends it anyway) is still parsed as OpenMetrics.
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
MAX_BODY_BYTES = 32 * 1024 * 1024
_READ = 256 * 1024  # bytes asked of the socket at a time
REPORT_NAMES = (
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "scrape_samples_post_metric_relabeling",
    "scrape_series_added",
    "gpuwatch_scrape_invalid_lines",
)
_MAX_CACHE = 500_000
_MAX_STAMPED = 1_000_000  # series whose newest timestamped sample a target remembers
_NEVER = "0001-01-01T00:00:00Z"
_NO_NUMBERS = np.zeros(0, np.intp)
_NO_VALUES = np.zeros(0, np.float64)
_VALUE = itemgetter(3)  # a parsed sample's value
_OLDEST = -(2**63)

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
    label_limits: LabelLimits = DEFAULT_LABEL_LIMITS
    relabel: tuple[Relabel, ...] = ()
    auth: Auth | None = None
    tls: Tls = Tls()
    discovered: Labels = ()  # the labels before target relabelling, for /api/v1/targets

    @property
    def is_federation(self) -> bool:
        """Whether this target is another server's `/federate` (what it stored, not its own page)."""
        return self.metrics_path.rstrip("/").endswith("/federate")

    @property
    def url(self) -> str:
        query = f"?{urlencode(self.params)}" if self.params else ""
        return f"{self.scheme}://{self.address}{self.metrics_path}{query}"


def target_specs(
    config: ScrapeConfig,
    groups: tuple[StaticGroup, ...],
    default_interval_s: float,
    dropped: list[dict[str, str]] | None = None,
    label_limits: LabelLimits = DEFAULT_LABEL_LIMITS,
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
                    label_limits=label_limits,
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
    """Fetch with the standard library's `http.client`: http and https only, no redirects, no proxies,
    gzip, a body cap (decompressed, so a gzip bomb stops at the cap), a deadline for the whole fetch.

    A connection is kept for the next scrape where the server allows it (per scheme, address and TLS
    options; prometheus_client's server closes it after each answer). A kept connection that the
    server has closed meanwhile is replaced once, before anything was read. `close()` closes the kept
    ones. This does per scrape what `requests` did in several layers (a session, a prepared request,
    cookies, urllib3's response), for about a third of its CPU (bench/README.md, Scrape).
    """

    def __init__(self, clock: Clock, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self._clock = clock
        self.max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, str, Tls], list[http.client.HTTPConnection]] = {}
        self._contexts: dict[Tls, ssl.SSLContext] = {}
        self._closed = False

    def close(self) -> None:
        """Close the kept connections; later fetches still work, and close what they open."""
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
            self._closed = True
        for conn in conns:
            conn.close()

    def _context(self, tls: Tls) -> ssl.SSLContext:
        context = self._contexts.get(tls)
        if context is None:
            if tls.insecure_skip_verify:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            else:
                context = ssl.create_default_context(cafile=tls.ca_file or None)
            if tls.cert_file:
                context.load_cert_chain(tls.cert_file, tls.key_file or None)
            self._contexts[tls] = context
        return context

    def _connect(self, spec: TargetSpec, timeout_s: float) -> http.client.HTTPConnection:
        if spec.scheme == "http":
            return http.client.HTTPConnection(spec.address, timeout=timeout_s)
        if spec.scheme == "https":
            return http.client.HTTPSConnection(
                spec.address, timeout=timeout_s, context=self._context(spec.tls)
            )
        raise ScrapeError(f"unsupported scheme {spec.scheme!r}; use http or https")

    def __call__(self, spec: TargetSpec, timeout_s: float) -> FetchResult:  # noqa: C901 - one branch per transport outcome of a scrape
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
        query = f"?{urlencode(spec.params)}" if spec.params else ""
        path = f"{spec.metrics_path}{query}"
        deadline = self._clock.monotonic() + timeout_s
        key = (spec.scheme, spec.address, spec.tls)
        with self._lock:
            idle = self._idle.get(key)
            conn = idle.pop() if idle else None
        reused = conn is not None
        try:
            try:
                if conn is None:
                    conn = self._connect(spec, timeout_s)
                try:
                    response, sock = _request(conn, path, headers)
                except (ConnectionResetError, BrokenPipeError, ssl.SSLEOFError):  # RemoteDisconnected too
                    if not reused:
                        raise
                    conn.close()  # the server closed the kept connection: once more, on a new one
                    conn = self._connect(spec, timeout_s)
                    response, sock = _request(conn, path, headers)
            except TimeoutError:
                raise ScrapeError(f"timed out after {timeout_s:g}s (scrape_timeout)") from None
            except http.client.RemoteDisconnected as e:
                raise ScrapeError(str(e)) from None
            except http.client.BadStatusLine as e:
                raise ScrapeError(
                    f"not an HTTP answer: status line {_short(repr(str(e.args[0] if e.args else '').strip()))}"
                ) from None
            except (
                OSError,
                http.client.HTTPException,
                ValueError,
            ) as e:  # OSError: also ssl, a missing ca_file
                raise ScrapeError(_short(e)) from None
            if response.status != 200:
                hint = " (redirects are not followed)" if 300 <= response.status < 400 else ""
                raise ScrapeError(f"server returned HTTP status {response.status} {response.reason}{hint}")
            body = self._body(response, sock, deadline, timeout_s)
            response.close()  # read to its end; a kept connection needs its response closed
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if response.will_close:
            conn.close()
        else:
            with self._lock:
                if not self._closed:
                    self._idle.setdefault(key, []).append(conn)
                    conn = None
            if conn is not None:
                conn.close()
        return FetchResult(body, response.getheader("Content-Type"))

    def _body(
        self, response: http.client.HTTPResponse, sock: Any, deadline: float, timeout_s: float
    ) -> bytes:
        """Read the body to the end, decompressed, within the deadline and the size cap."""
        encoding = (response.getheader("Content-Encoding") or "").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            decoder: Any = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            decoder = zlib.decompressobj()
        elif encoding in ("", "identity"):
            decoder = None
        else:
            raise ScrapeError(f"unsupported Content-Encoding {encoding!r}")
        cap, clock = self.max_body_bytes, self._clock
        chunks, size = [], 0
        try:
            while True:
                left = deadline - clock.monotonic()
                if left <= 0:
                    raise TimeoutError
                # read1 returns after each network read, so a server that trickles bytes cannot hold
                # the scrape past its deadline; each read waits at most for what is left of it.
                sock.settimeout(left)
                chunk = response.read1(_READ)
                if decoder is not None:
                    chunk = decoder.decompress(chunk, cap + 1 - size) if chunk else decoder.flush()
                if not chunk:
                    break
                size += len(chunk)
                if size > cap:
                    raise ScrapeError(f"body larger than {cap} bytes; scrape abandoned")
                chunks.append(chunk)
            if response.length:  # http.client ends a Content-Length body that stops short quietly
                raise ScrapeError(
                    f"reading the body failed: the connection closed {response.length} bytes early"
                )
        except TimeoutError:
            raise ScrapeError(f"timed out after {timeout_s:g}s (scrape_timeout) reading the body") from None
        except (OSError, http.client.HTTPException, zlib.error) as e:
            raise ScrapeError(f"reading the body failed: {_short(e)}") from None
        return b"".join(chunks)


def _request(
    conn: http.client.HTTPConnection, path: str, headers: dict[str, str]
) -> tuple[http.client.HTTPResponse, Any]:
    """Send the GET and read the status and headers; also return the socket (a response that closes
    the connection keeps reading from it after `conn` has let go of it)."""
    conn.request("GET", path, headers=headers)
    sock = conn.sock
    return conn.getresponse(), sock


def _short(e: BaseException | str) -> str:
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


class Target:
    """One target's scraper and its state: the label caches, the series seen last time, its health.

    The scrape cache (as Prometheus's scrapeCache): the raw text of a line's series (the parser's
    `keys`) -> the number of the final series it becomes (after target labels, `honor_labels` and
    metric_relabel_configs) in the target's `SeriesTable`, or -1 where metric_relabel_configs drop it;
    an unchanged line then costs a dict lookup, done for the whole page in one `map`. Lines without a
    key (timestamps, escapes, OpenMetrics) are looked up by parsed name and labels. Staleness and
    `scrape_series_added` compare scrape numbers kept per series number in an array, and the batch
    carries the numbers and values as arrays (`TableSamples`), so the store maps them to its series
    ids with one numpy take. The cache lives as long as the target: a configuration change (relabel
    rules included) makes a new `TargetSpec` and so a new `Target` with an empty cache.
    """

    def __init__(self, spec: TargetSpec, fetch: Fetch, clock: Clock) -> None:
        self.spec = spec
        self._fetch = fetch
        self._clock = clock
        self._parser = Parser()
        self._new_table([])
        self._gen = 0  # number of the last scrape; a failed one counts, with no series
        self.health = "unknown"
        self.last_error = ""
        self.last_scrape_ms: int | None = None
        self.last_duration_s = 0.0
        self.last_invalid_lines = 0
        self.first_invalid_line = ""
        self.invalid_lines_total = 0
        self.last_out_of_order = 0  # timestamped samples of the last scrape not newer than the series' last
        self.scrapes = 0
        self.metadata: dict[str, FamilyMeta] = {}  # HELP/TYPE/UNIT from the last successful scrape
        self.lock = threading.Lock()  # held while a scrape runs: never two at once for one target
        # Per series, the newest timestamp stored of its timestamped samples (federation sends them).
        self._stamped_ms: dict[SeriesKey, int] = {}

    def _new_table(self, keep: list[SeriesKey]) -> None:
        """Start a new series table holding the report series and `keep` (the last scrape's series)."""
        table = self._table = SeriesTable()
        self._report = np.array([table.add(n, self.spec.labels) for n in REPORT_NAMES], np.intp)
        self._by_key: dict[str, int] = {}  # raw series text -> number of the final series, -1: dropped
        self._by_labels: dict[SeriesKey, int] = {}  # parsed (name, labels) -> the same
        self._series: dict[SeriesKey, int] = {k: table.add(*k) for k in keep}  # final -> its number
        self._gens = np.full(max(64, 2 * len(table)), -1, np.int64)  # number -> last scrape that had it
        self._gens[len(REPORT_NAMES) : len(table)] = getattr(self, "_gen", 0)
        self._last = np.arange(len(REPORT_NAMES), len(table), dtype=np.intp)  # last scrape's, each once

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

    def _final(self, name: str, labels: Labels) -> int:
        final = self._labels(name, labels)
        if final is None:
            return -1
        found = self._series.get(final)
        if found is None:
            problem = self.spec.label_limits.problem((("__name__", final[0]), *final[1]))
            if problem is not None:  # as Prometheus's label limits: the whole scrape fails
                raise ScrapeError(f"label limits exceeded: {final[0]}: {problem}")
            found = self._series[final] = self._table.add(*final)
        return found

    def _lookup(self, name: str, labels: Labels) -> int:
        key = (name, labels)
        found = self._by_labels.get(key)
        if found is None:
            found = self._by_labels[key] = self._final(name, labels)
        return found

    def _trim(self) -> None:
        """Forget cached lines and series once there are too many; keep the last scrape's series."""
        if max(len(self._by_key), len(self._by_labels), len(self._series)) > _MAX_CACHE:
            names, labels = self._table.names, self._table.labels
            self._new_table([(names[i], labels[i]) for i in self._last.tolist()])

    def _numbers(
        self, parsed: ParseResult, stamped: dict[int, list[Sample]], newest: dict[SeriesKey, int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's series number (-1: dropped) and value; timestamped samples go to `stamped`
        (by time) and the newest time of each of their series to `newest`."""
        samples, keys, n = parsed.samples, parsed.keys, len(parsed.samples)
        by_key = self._by_key
        if len(keys) == n and None not in keys:  # text format, every line `<series> <value>`
            text_keys = cast("list[str]", keys)
            index = np.fromiter(map(by_key.get, text_keys, repeat(-2)), np.intp, n)
            if n and index.min() < -1:  # lines not seen before (-2)
                for j in np.flatnonzero(index == -2).tolist():
                    found = by_key.get(text_keys[j])  # a page may name a new series twice
                    if found is None:
                        found = by_key[text_keys[j]] = self._final(*samples[j][:2])
                    index[j] = found
            return index, np.fromiter(map(_VALUE, samples), np.float64, n)
        numbers: list[int] = []
        values: list[float] = []
        honor_ts = self.spec.honor_timestamps
        names, labels = self._table.names, self._table.labels
        stamped_ms = self._stamped_ms
        for (name, labels_, ts, value), key in zip(
            samples, keys if len(keys) == n else repeat(None), strict=False
        ):
            if key is None:
                number = self._lookup(name, labels_)
            else:
                number = by_key.get(key, -2)
                if number == -2:
                    number = by_key[key] = self._final(name, labels_)
            if ts is None or not honor_ts or number < 0:
                numbers.append(number)
                values.append(value)
                continue
            final = (names[number], labels[number])
            if ts > newest.get(final, stamped_ms.get(final, _OLDEST)):
                newest[final] = ts
                stamped.setdefault(ts, []).append(Sample(final[0], final[1], value))
            else:
                # Not newer than what this target already gave for the series: a federated sample
                # that did not change since the last scrape (a duplicate) or one out of order.
                # Prometheus drops both (the duplicate silently); so does gpuwatch.
                self.last_out_of_order += 1
        return np.array(numbers, np.intp), np.array(values, np.float64)

    def _mark(self, index: np.ndarray, gen: int) -> tuple[np.ndarray, int]:
        """Record that scrape `gen` had the series `index`; return them each once, and how many are new."""
        gens = self._gens
        if gens.size < len(self._table):
            grown = np.full(2 * len(self._table), -1, np.int64)
            grown[: gens.size] = gens
            gens = self._gens = grown
        if index.size and np.bincount(index).max() > 1:  # a series twice in one page: first one counts
            _, first = np.unique(index, return_index=True)
            index = index[np.sort(first)]
        added = int(np.count_nonzero(gens[index] != gen - 1))
        gens[index] = gen
        return index, added

    def scrape(self) -> list[Batch]:
        """Scrape once; return the batches to store (the first one is stamped with the scrape time)."""
        clock, spec = self._clock, self.spec
        now_ms = clock.now_ms()
        start = clock.monotonic()
        index, values = _NO_NUMBERS, _NO_VALUES
        stamped: dict[int, list[Sample]] = {}
        newest: dict[SeriesKey, int] = {}
        current = _NO_NUMBERS
        gen, added = self._gen + 1, 0
        error, scraped, invalid, first_invalid = "", 0, 0, ""
        self.last_out_of_order = 0
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
            index, values = self._numbers(parsed, stamped, newest)
            if index.size and index.min() < 0:
                keep = index >= 0
                index, values = index[keep], values[keep]
            post = index.size + sum(len(s) for s in stamped.values())
            if spec.sample_limit and post > spec.sample_limit:
                raise ScrapeError(
                    f"sample_limit exceeded: {post} samples after relabelling, limit {spec.sample_limit}"
                )
            current, added = self._mark(index, gen)
            if newest:
                if len(self._stamped_ms) > _MAX_STAMPED:
                    self._stamped_ms.clear()
                self._stamped_ms.update(newest)
        except ScrapeError as e:
            error = str(e)
            index, values, stamped, current, added = _NO_NUMBERS, _NO_VALUES, {}, _NO_NUMBERS, 0
            gen += 1  # a number no series has: the next scrape counts every series as added
        post = index.size + sum(len(s) for s in stamped.values())
        duration = clock.monotonic() - start
        last = self._last
        stale = last[self._gens[last] != gen] if last.size else last
        self._gen, self._last = gen, current
        report = np.array(
            [0.0 if error else 1.0, duration, float(scraped), float(post), float(added), float(invalid)]
        )
        samples = TableSamples(
            self._table,
            np.concatenate((index, stale, self._report)),
            np.concatenate((values, np.full(stale.size, STALE_NAN), report)),
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

    def has_series(self, name: str, labels: Labels) -> bool:
        """Whether this target's scrapes made the series `name{labels}` (its report series included)."""
        return (name, labels) in self._series or (labels == self.spec.labels and name in REPORT_NAMES)

    def stale_batch(self, now_ms: int) -> Batch:
        """Staleness markers for every series of this target (it was removed from the configuration)."""
        names, labels = self._table.names, self._table.labels
        keys = [
            *((names[i], labels[i]) for i in self._last.tolist()),
            *((n, self.spec.labels) for n in REPORT_NAMES),
        ]
        self._last = _NO_NUMBERS
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
