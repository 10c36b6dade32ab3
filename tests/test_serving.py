"""The waitress server `gpuwatch serve` runs (gpuwatch/web/serving.py), over real HTTP on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import requests

from gpuwatch.web.serving import make_server

App = Callable[[dict[str, Any], Callable[..., Any]], list[bytes]]


@contextmanager
def running(app: App) -> Iterator[str]:
    server = make_server(app, "127.0.0.1", 0)
    server.adj.asyncore_loop_timeout = 0.1  # so that the loop sees the close at once
    closing = threading.Event()

    def run() -> None:
        try:
            server.run()
        except (OSError, ValueError):  # the sockets closed under the loop (as `gpuwatch serve` shuts down)
            if not closing.is_set():
                raise

    loop = threading.Thread(target=run, daemon=True)
    loop.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        closing.set()
        server.task_dispatcher.shutdown()
        server.close()
        loop.join(5)


def thread_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    body = str(threading.get_ident()).encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


def test_concurrent_requests_use_several_workers() -> None:
    first_in = threading.Event()
    release = threading.Event()

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ["PATH_INFO"] == "/slow":
            first_in.set()
            release.wait(10)
        return thread_app(environ, start_response)

    with running(app) as base:
        slow: list[str] = []
        t = threading.Thread(target=lambda: slow.append(requests.get(f"{base}/slow", timeout=10).text))
        t.start()
        assert first_in.wait(10)
        quick = requests.get(f"{base}/quick", timeout=10).text  # answered while /slow still holds a worker
        release.set()
        t.join(10)
    assert slow and slow[0] != quick


def test_a_new_client_is_answered_while_hundreds_of_connections_stay_open() -> None:
    # 50 dashboards in browsers keep up to 6 connections each open between their refreshes.
    with running(thread_app) as base:
        port = int(base.rsplit(":", 1)[1])
        held = []
        try:
            for _ in range(300):
                s = socket.create_connection(("127.0.0.1", port), timeout=10)
                held.append(s)
                s.sendall(b"GET /busy HTTP/1.1\r\nHost: x\r\n\r\n")
                assert s.recv(4096).startswith(b"HTTP/1.1 200"), "each kept connection was served"
            assert requests.get(f"{base}/-/health", timeout=10).ok
        finally:
            for s in held:
                s.close()


def test_port_in_use_raises() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError, match="in use"):
            make_server(thread_app, "127.0.0.1", taken.getsockname()[1])
