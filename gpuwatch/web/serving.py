"""The waitress server `gpuwatch serve` runs (and bench/bench_query.py's server, to measure the same)."""

from __future__ import annotations

from typing import Any

from waitress.server import create_server

THREADS = 8


def make_server(app: Any, host: str, port: int) -> Any:
    """The waitress server for `app` on host:port, not yet running. OSError: the port is in use."""
    sockets: dict[int, Any] = {}  # what waitress opens: its wake-up trigger, then the listening socket
    try:
        return create_server(
            app,
            map=sockets,
            host=host,
            port=port,
            threads=THREADS,
            ident="gpuwatch",
            asyncore_loop_timeout=5,  # waitress wakes its loop by a trigger; no need to poll each second
        )
    except OSError:  # close the trigger; the idle worker threads waitress started are daemons
        for opened in list(sockets.values()):
            opened.close()
        raise
