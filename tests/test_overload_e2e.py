"""A real `gpuwatch serve --demo` whose query turns are all taken by slow queries: `/-/health` answers,
the queries past the limits are answered 503 `unavailable` at once (never another 5xx, never a hang),
GPU samples keep arriving every sample interval, and SIGTERM stops the process while they are asked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests

from gpuwatch.core.clock import SystemClock
from gpuwatch.core.model import Matcher
from gpuwatch.store import Store
from tests.conftest import Server, clean_env, wait_until

pytestmark = pytest.mark.slow

# ~0.4 s of CPU on an idle core (2.6 M subquery steps sorted): long enough that the clients below
# overlap, well inside the query limits.
SLOW = {"query": "quantile_over_time(0.5, vector(time())[30d:1s])", "timeout": "60s"}
CLIENTS = 6  # more than the one running and one waiting query this server allows


def _ask_slow(server: Server, stop: threading.Event, answers: list[tuple[int, str, str]]) -> None:
    session = requests.Session()
    while not stop.is_set():
        try:
            r = session.get(server.url + "/api/v1/query", params=SLOW, timeout=120)
        except requests.RequestException as e:
            answers.append((0, str(e), ""))
            continue
        error_type = r.json().get("errorType", "") if r.status_code != 200 else ""
        answers.append((r.status_code, error_type, r.headers.get("Retry-After", "")))


def _latest_gpu_ms(server: Server) -> int | None:
    """When GPU 0's utilisation was last sampled, from `/federate`: it takes no query turn, so it
    answers however busy the queries keep the server."""
    r = server.get("/federate", params={"match[]": 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}'})
    assert r.status_code == 200, r.text
    lines = [x for x in r.text.splitlines() if x.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    return int(lines[0].split()[-1]) if lines else None


def _stored_gpu_times_s(data_dir: Path, since_ms: int) -> np.ndarray:
    """GPU 0's utilisation sample times (s) from `since_ms` on, read from the store once gpuwatch has exited."""
    store = Store.open(data_dir, clock=SystemClock())
    try:
        matchers = [Matcher("__name__", "=", "DCGM_FI_DEV_GPU_UTIL"), Matcher("gpu", "=", "0")]
        (series,) = store.select(matchers, since_ms, 2**62)
        return series.timestamps_ms / 1000
    finally:
        store.close()


def _refused(server: Server) -> float:
    lines = server.get("/metrics").text.splitlines()
    return next(float(x.split()[-1]) for x in lines if x.startswith("gpuwatch_queries_refused_total "))


def test_slow_queries_past_the_limits_are_503_while_health_and_sampling_go_on(
    serve: Callable[..., Server],
) -> None:
    env = clean_env(
        GPUWATCH_FLUSH_INTERVAL="0.5s",
        GPUWATCH_DEMO_GPUS="2",
        GPUWATCH_QUERY_MAX_CONCURRENCY="1",
        GPUWATCH_QUERY_MAX_QUEUED="1",
    )
    server = serve("--demo", env=env)
    wait_until(lambda: _latest_gpu_ms(server) is not None, 30, "no GPU samples")
    start_ms = _latest_gpu_ms(server)
    assert start_ms is not None
    stop = threading.Event()
    answers: list[tuple[int, str, str]] = []
    clients = [threading.Thread(target=_ask_slow, args=(server, stop, answers)) for _ in range(CLIENTS)]
    for c in clients:
        c.start()
    health: list[int] = []
    try:
        wait_until(lambda: any(a[0] == 503 for a in answers), 60, "no query was refused")
        for _ in range(5):  # while the clients keep every turn taken
            health.append(server.get("/-/health").status_code)
        # ~6 s of samples while the clients keep the turns taken
        wait_until(lambda: (_latest_gpu_ms(server) or 0) >= start_ms + 6000, 120, "sampling stopped")
        # /metrics counts the refusals (the sample job's figure, a sample interval behind)
        wait_until(lambda: _refused(server) > 0, 30, "gpuwatch_queries_refused_total stayed 0")
        seen = list(answers)
        rc = server.stop()  # SIGTERM with the clients still asking
    finally:
        stop.set()
        for c in clients:
            c.join(120)
    assert rc == 0
    assert health == [200] * 5
    statuses = {a[0] for a in seen}
    assert statuses <= {200, 503}, [a for a in seen if a[0] not in (200, 503)][:5]
    assert 200 in statuses, "no slow query was answered"
    refused = [a for a in seen if a[0] == 503]
    assert all(a[1:] == ("unavailable", "1") for a in refused), refused[:5]
    # every sample taken meanwhile, from the store (the API's queries were the busy ones)
    during = _stored_gpu_times_s(server.data_dir, start_ms)
    gaps = np.diff(during)
    assert during.size >= 6 and gaps.max() <= 2.0, f"gaps over 2 sample intervals: {gaps[gaps > 2.0]}"
    assert "Traceback" not in server.log
