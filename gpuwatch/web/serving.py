"""The HTTP server `gpuwatch serve` runs (and bench/bench_query.py's server, to measure the same).

Plain HTTP: waitress. HTTPS (`tls_cert_file`/`tls_key_file`): waitress has no TLS, so Werkzeug's
threaded server with an `ssl` context serves instead; for many users or HTTP/2, put a reverse proxy
in front (docs/security.md).
"""

from __future__ import annotations

import logging
import ssl
from pathlib import Path
from typing import Any

from waitress.server import create_server
from werkzeug.serving import WSGIRequestHandler
from werkzeug.serving import make_server as make_werkzeug_server

THREADS = 8  # workers where `threads_for` is not asked (benches, tests)
# Workers besides the costly requests' running and waiting ones (web/admission.py): they answer
# /-/health, pages, assets and the 503s of costly requests past the queue while those are all taken.
SPARE_THREADS = 4
# Open connections waitress serves at once. Its default, 100, is 16 browsers' worth (a browser keeps
# up to 6 connections to a host open): with 50 dashboards open, new connections, /-/health among
# them, waited in the listen backlog until the client gave up (bench/README.md, "Soak"). Idle
# connections still close after waitress's `channel_timeout` (120 s).
CONNECTION_LIMIT = 1000


def threads_for(running: int, waiting: int) -> int:
    """Workers for `running` costly requests at once and `waiting` more (web/admission.py), plus spares."""
    return running + waiting + SPARE_THREADS


class TlsError(Exception):
    """The certificate or key cannot be loaded."""


def tls_context(cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """A server context for the PEM `cert_file` and `key_file` (TLS 1.2 and later). TlsError: unusable."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for path in (cert_file, key_file):
        if not path.is_file():
            raise TlsError(f"cannot read {path}: no such file")
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    except (ssl.SSLError, OSError) as e:
        raise TlsError(f"cannot load {cert_file} with {key_file}: {e}") from None
    return ctx


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # no line per request, as waitress writes none

    def log_error(self, format: str, *args: Any) -> None:
        logging.getLogger("gpuwatch.web").debug("https: " + format, *args)


class _TlsServer:
    """Werkzeug's threaded server with TLS, with waitress's run/close shape."""

    def __init__(self, app: Any, host: str, port: int, context: ssl.SSLContext) -> None:
        self._server = make_werkzeug_server(
            host, port, app, threaded=True, ssl_context=context, request_handler=_QuietHandler
        )

    def run(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def make_server(
    app: Any, host: str, port: int, tls: ssl.SSLContext | None = None, threads: int = THREADS
) -> Any:
    """The server for `app` on host:port (HTTPS with `tls`; plain HTTP with `threads` workers), not yet
    running. OSError: the port is in use."""
    if tls is not None:
        return _TlsServer(app, host, port, tls)
    sockets: dict[int, Any] = {}  # what waitress opens: its wake-up trigger, then the listening socket
    try:
        return create_server(
            app,
            map=sockets,
            host=host,
            port=port,
            threads=threads,
            ident="gpuwatch",
            asyncore_loop_timeout=5,  # waitress wakes its loop by a trigger; no need to poll each second
            connection_limit=CONNECTION_LIMIT,
            asyncore_use_poll=True,  # select() fails on descriptors past 1024; poll has no such limit
        )
    except OSError:  # close the trigger; the idle worker threads waitress started are daemons
        for opened in list(sockets.values()):
            opened.close()
        raise


def stop_server(server: Any) -> None:
    """Stop accepting and close; requests in flight finish first."""
    if isinstance(server, _TlsServer):
        server.close()
        return
    # A worker that answers after close() pulls a closed trigger (EBADF): let requests finish first.
    server.task_dispatcher.shutdown()
    server.close()
