"""A real `gpuwatch serve --demo` whose query turns are all taken by slow queries: `/-/health` answers,
the queries past the limits are answered 503 `unavailable` at once (never another 5xx, never a hang),
GPU samples keep arriving every sample interval, and SIGTERM stops the process while they are asked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
import requests

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


def _gpu_times(server: Server) -> np.ndarray | None:
    """The stored times of GPU 0's utilisation over 10 minutes; None when the query was refused (busy)."""
    r = server.get("/api/v1/query", params={"query": 'DCGM_FI_DEV_GPU_UTIL{gpu="0"}[10m]'})
    if r.status_code == 503:
        return None
    assert r.status_code == 200, r.text
    found = r.json()["data"]["result"]
    return np.array([float(t) for t, _ in found[0]["values"]]) if found else np.zeros(0)


def _new_samples_since(server: Server, start: float) -> int:
    times = _gpu_times(server)
    return -1 if times is None else int((times > start).sum())


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
    wait_until(lambda: _new_samples_since(server, 0) >= 3, 30, "no GPU samples")
    times = _gpu_times(server)
    assert times is not None
    start = times[-1]
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
        # ~6 s of samples while the clients keep the turns taken, measured in stored samples
        wait_until(lambda: _new_samples_since(server, start) >= 6, 120, "sampling stopped")
        got: list[np.ndarray | None] = []
        wait_until(lambda: got.append(_gpu_times(server)) or got[-1] is not None, 60, "always busy")
        seen = list(answers)
        # /metrics counts the refusals (the sample job's figure, a sample interval behind)
        wait_until(lambda: _refused(server) > 0, 30, "gpuwatch_queries_refused_total stayed 0")
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
    times = got[-1]
    assert times is not None
    during = times[times >= start]
    gaps = np.diff(during)
    assert during.size >= 6 and gaps.max() <= 2.0, f"gaps over 2 sample intervals: {gaps[gaps > 2.0]}"
    assert "Traceback" not in server.log
