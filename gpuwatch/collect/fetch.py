"""Fetch a target's page over HTTP: `HttpFetcher` (http.client, gzip, a body cap, a deadline, kept
connections) and the `Fetch` seam, `fetch(spec, timeout_s) -> FetchResult`, that tests fill with bytes."""

from __future__ import annotations

import base64
import http.client
import ssl
import threading
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import urlencode

from gpuwatch import __version__
from gpuwatch.collect.scrapeconfig import Auth, Tls
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import ScrapeError

# Text 0.0.4 only. prometheus_client 0.23-0.26 mangles `vllm:` names when it answers in OpenMetrics, and
# its choose_encoder() ignores q-values: any mention of application/openmetrics-text gets OpenMetrics.
# An OpenMetrics answer (from a server that sends it anyway) is still parsed as OpenMetrics.
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
MAX_BODY_BYTES = 32 * 1024 * 1024
_READ = 256 * 1024  # bytes asked of the socket at a time


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
