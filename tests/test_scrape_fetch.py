"""The fetcher over real sockets: body framings, encodings, kept connections, TLS."""

from __future__ import annotations

import gzip
import socket
import ssl
import subprocess
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuwatch.collect.fetch import HttpFetcher
from gpuwatch.collect.scrapeconfig import Tls
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ScrapeError
from tests.conftest import require_tool

Answer = Callable[[int], bytes | None]  # request number on this server -> raw answer; None: close at once


class RawServer:
    """Answers each request with raw bytes; counts connections; closes a connection after an answer
    when `close_after` says so (without telling the client)."""

    def __init__(
        self, answer: Answer, *, close_after: bool = False, tls: ssl.SSLContext | None = None
    ) -> None:
        self.answer, self.close_after, self.tls = answer, close_after, tls
        self.connections = 0
        self.requests = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            self.threads.append(t)
            t.start()

    def _serve(self, sock: socket.socket) -> None:
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
            self.socks.append(sock)
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    got = sock.recv(65536)
                    if not got:
                        return
                    data += got
                _, data = data.split(b"\r\n\r\n", 1)
                self.requests += 1
                out = self.answer(self.requests)
                if out is None:
                    return
                sock.sendall(out)
                if self.close_after:
                    return
        except OSError:
            return
        finally:
            sock.close()

    def close(self) -> None:
        self.listener.close()
        for t in self.threads:
            t.join(5)


@pytest.fixture
def serve() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def make(answer: Answer, **kw: object) -> RawServer:
        servers.append(RawServer(answer, **kw))  # type: ignore[arg-type]
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def spec(address: str, scheme: str = "http", tls: Tls | None = None) -> TargetSpec:
    return TargetSpec(
        job="j", address=address, scheme=scheme, metrics_path="/metrics", params=(("a", "b c"),),
        labels=(("instance", address), ("job", "j")), interval_s=15.0, timeout_s=5.0, tls=tls or Tls(),
    )  # fmt: skip


def http(body: bytes, *headers: str, status: str = "200 OK", version: str = "HTTP/1.1") -> bytes:
    head = "".join(f"{h}\r\n" for h in headers)
    return f"{version} {status}\r\n{head}\r\n".encode() + body


def chunked(body: bytes, size: int) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


PAGE = b"".join(b'm{i="%d"} %d\n' % (i, i) for i in range(3000))


def test_kept_connection_chunked_gzip_and_content_length(serve: Callable[..., RawServer]) -> None:
    bodies = [
        http(chunked(gzip.compress(PAGE), 1000), "Transfer-Encoding: chunked", "Content-Encoding: gzip"),
        http(PAGE, f"Content-Length: {len(PAGE)}", "Content-Type: text/plain; version=0.0.4"),
        http(zlib.compress(PAGE), "Content-Encoding: deflate", f"Content-Length: {len(zlib.compress(PAGE))}"),
    ]
    server = serve(lambda n: bodies[(n - 1) % 3])
    fetcher = HttpFetcher(FakeClock())
    try:
        got = [fetcher(spec(server.address), 5.0) for _ in range(3)]
    finally:
        fetcher.close()
    assert [g.body for g in got] == [PAGE] * 3
    assert got[1].content_type == "text/plain; version=0.0.4"
    assert server.connections == 1, "one connection, kept between scrapes"


def test_a_kept_connection_the_server_closed_is_replaced(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda n: http(b"a %d\n" % n, "Content-Length: 4"), close_after=True)
    fetcher = HttpFetcher(FakeClock())
    try:
        assert [fetcher(spec(server.address), 5.0).body for _ in range(3)] == [b"a 1\n", b"a 2\n", b"a 3\n"]
    finally:
        fetcher.close()
    assert server.connections == 3


def test_a_body_until_close_and_a_server_that_hangs_up(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda n: http(PAGE, version="HTTP/1.0") if n == 1 else None, close_after=True)
    fetcher = HttpFetcher(FakeClock())
    try:
        assert fetcher(spec(server.address), 5.0).body == PAGE
        with pytest.raises(ScrapeError, match="Remote end closed connection"):
            fetcher(spec(server.address), 5.0)
    finally:
        fetcher.close()


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (http(b"x", "Content-Encoding: br", "Content-Length: 1"), "unsupported Content-Encoding 'br'"),
        (http(b"not gzip", "Content-Encoding: gzip", "Content-Length: 8"), "reading the body failed"),
        (http(b"a 1\n", "Content-Length: 40"), "the connection closed 36 bytes early"),
        (http(chunked(PAGE, 1000)[:1500], "Transfer-Encoding: chunked"), "reading the body failed"),
        (b"garbage\r\n\r\n", "not an HTTP answer: status line 'garbage'"),
    ],
    ids=["unknown-encoding", "bad-gzip", "short-body", "short-chunked", "no-status-line"],
)
def test_broken_answers_are_scrape_errors(serve: Callable[..., RawServer], answer: bytes, error: str) -> None:
    server = serve(lambda n: answer, close_after=True)
    fetcher = HttpFetcher(FakeClock())
    try:
        with pytest.raises(ScrapeError, match=error):
            fetcher(spec(server.address), 5.0)
    finally:
        fetcher.close()


def test_only_http_and_https() -> None:
    with pytest.raises(ScrapeError, match="unsupported scheme 'file'"):
        HttpFetcher(FakeClock())(spec("127.0.0.1:1", scheme="file"), 1.0)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = require_tool("openssl")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem")],
        check=True, capture_output=True,
    )  # fmt: skip
    return d / "cert.pem", d / "key.pem"


def test_https_verifies_against_ca_file_or_skips_when_told(
    serve: Callable[..., RawServer], cert: tuple[Path, Path]
) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*cert)
    server = serve(lambda n: http(b"a 1\n", "Content-Length: 4"), tls=context)
    fetcher = HttpFetcher(FakeClock())
    try:
        assert fetcher(spec(server.address, "https", Tls(ca_file=str(cert[0]))), 5.0).body == b"a 1\n"
        assert fetcher(spec(server.address, "https", Tls(insecure_skip_verify=True)), 5.0).body == b"a 1\n"
        with pytest.raises(ScrapeError, match="CERTIFICATE_VERIFY_FAILED"):
            fetcher(spec(server.address, "https"), 5.0)
    finally:
        fetcher.close()
