"""A real HTTP receiver on 127.0.0.1 for notification and remote query tests: records every POST (and
GET), can answer with an error."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Hook:
    """Requests received (path with query, headers, JSON body: form bodies as text, None for a GET);
    `status`/`answer` set the reply (an `answer` of bytes is sent as it is)."""

    def __init__(self, port: int = 0) -> None:
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.status = 200
        self.answer: Any = {"errcode": 0, "errmsg": "ok", "code": 0}
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                try:
                    data = json.loads(body)
                except ValueError:
                    data = body.decode(errors="replace")
                hook.requests.append((self.path, dict(self.headers.items()), data))
                self._answer()

            def do_GET(self) -> None:
                hook.requests.append((self.path, dict(self.headers.items()), None))
                self._answer()

            def _answer(self) -> None:
                out = hook.answer if isinstance(hook.answer, bytes) else json.dumps(hook.answer).encode()
                self.send_response(hook.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def bodies(self) -> list[Any]:
        return [b for _, _, b in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join()


@contextmanager
def hook_server(port: int = 0) -> Iterator[Hook]:
    h = Hook(port)
    try:
        yield h
    finally:
        h.close()
