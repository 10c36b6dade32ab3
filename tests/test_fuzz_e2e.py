"""Thousands of generated requests over every endpoint family against one real `gpuwatch serve --demo`.

The inputs (tests/fuzzinputs.py, seeded) cover PromQL instant and range queries, Pushgateway and JSON
pushes, runs, imports, the label, series, metadata and federation APIs, silences and posted alerts.
Four clients send them over keep-alive sessions to a server with a notification route, so that alerts
also go through grouping and the notification queue. Afterwards: no answer was a 5xx, none took longer
than the query timeout plus a second, the process still samples and answers, a marker series imported
before is intact, and the log holds no traceback.

CI runs 6,000 inputs (98 s on 2 cores, idle or with two soaks beside); FUZZ_INPUTS and FUZZ_SEED
run more, or another stream, on demand: `FUZZ_SEED=7 FUZZ_INPUTS=50000 pytest -s tests/test_fuzz_e2e.py`.
A failure names the seed and the input's number; `tests.fuzzinputs.requests_for(seed, n, now_s)` gives
it back.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.conftest import Server, clean_env, free_port, wait_until
from tests.fuzzinputs import Request, requests_for

pytestmark = pytest.mark.slow

QUERY_TIMEOUT_S = 5.0
CLIENTS = 4
NOTIFY = """
notify:
  route: {{receiver: hook, group_by: [alertname, a, job], group_wait: 0s, group_interval: 1s}}
  receivers:
    - name: hook
      webhook_configs: [{{url: "http://127.0.0.1:{port}/hook"}}]
"""
MARKER = "".join(f'fuzz_marker_total{{k="{i}"}} {i * 10} {1_700_000_000_000 + i * 1000}\n' for i in range(50))


def _sendable(value: Any) -> Any:
    """Strings as UTF-8 bytes (lone surrogates kept), so that `requests` sends what was generated."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, list):
        return [_sendable(v) for v in value]
    if isinstance(value, dict):
        return {k: _sendable(v) for k, v in value.items()}
    return value


def _send(session: requests.Session, url: str, req: Request) -> tuple[int, float, str]:
    method, path, kw = req
    kw = {k: _sendable(v) if k in ("params", "data") else v for k, v in kw.items()}
    target = url + quote(path.encode("utf-8", "surrogatepass"), safe="/:@")
    t0 = time.monotonic()
    try:
        r = session.request(method, target, timeout=QUERY_TIMEOUT_S + 30, **kw)
    except requests.RequestException as e:
        return 0, time.monotonic() - t0, f"{type(e).__name__}: {e}"
    return r.status_code, time.monotonic() - t0, r.text[:300] if r.status_code >= 500 else ""


def _timed_out_as_asked(req: Request, answer: tuple[int, int, float, str]) -> bool:
    form = req[2].get("params") or req[2].get("data")
    asked = isinstance(form, dict) and "timeout" in form
    return asked and answer[1] == 503 and '"errorType":"timeout"' in answer[3]


def _marker(server: Server) -> list[tuple[float, str]]:
    r = server.get(
        "/api/v1/query_range",
        params={"query": "sum(fuzz_marker_total)", "start": "1700000000", "end": "1700000049", "step": "1"},
    )
    assert r.status_code == 200, r.text
    found = r.json()["data"]["result"]
    return [(float(t), v) for t, v in found[0]["values"]] if found else []


def _sample_runs(server: Server) -> int:
    return next(j["runs"] for j in server.get("/-/jobs").json()["jobs"] if j["name"] == "sample")


def test_generated_requests_never_answer_5xx_or_stall(serve: Callable[..., Server], tmp_path: Path) -> None:
    n = int(os.environ.get("FUZZ_INPUTS", "6000"))
    seed = int(os.environ.get("FUZZ_SEED", "15"))
    env = clean_env(
        GPUWATCH_FLUSH_INTERVAL="0.5s",
        GPUWATCH_DEMO_GPUS="2",
        GPUWATCH_QUERY_TIMEOUT=f"{QUERY_TIMEOUT_S:g}s",
        GPUWATCH_WRITE_RATE_LIMIT="0",
    )
    # A route, so that posted alerts and rule alerts go through grouping and the notification queue
    # too (its webhook is a port nobody listens on: deliveries fail and are retried, quietly).
    config = tmp_path / "gpuwatch.yml"
    config.write_text(NOTIFY.format(port=free_port()))
    server = serve("--demo", "--config", str(config), env=env)
    r = requests.post(server.url + "/api/v1/import/prometheus", data=MARKER, timeout=30)
    assert r.status_code in (200, 204), r.text
    wait_until(lambda: len(_marker(server)) == 50, 30, "the marker series was not stored")
    before = _marker(server)

    inputs = list(requests_for(seed, n, int(time.time())))
    answers: list[tuple[int, int, float, str]] = []  # (input number, status, seconds, 5xx text)
    lock = threading.Lock()

    def client(k: int) -> None:
        session = requests.Session()
        got = []
        for i in range(k, n, CLIENTS):
            status, took, text = _send(session, server.url, inputs[i])
            got.append((i, status, took, text))
        with lock:
            answers.extend(got)

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took_s = time.monotonic() - t0

    def show(a: tuple[int, int, float, str]) -> str:
        method, path, kw = inputs[a[0]]
        return f"seed {seed} input {a[0]}: {method} {path} {kw!r:.400} -> {a[1]} in {a[2]:.1f}s {a[3]}"

    assert len(answers) == n
    # A query that runs out of the time its request asked for (`timeout=1ms`) is a 503 as Prometheus
    # answers it; any other 5xx, and any request left unanswered, fails.
    failed = [a for a in answers if (a[1] >= 500 and not _timed_out_as_asked(inputs[a[0]], a)) or a[1] == 0]
    assert not failed, f"{len(failed)} of {n} inputs failed:\n" + "\n".join(show(a) for a in failed[:10])
    slow = [a for a in answers if a[2] > QUERY_TIMEOUT_S + 1]
    assert not slow, "answers slower than the query timeout plus 1 s:\n" + "\n".join(
        show(a) for a in slow[:10]
    )
    assert server.get("/-/health").status_code == 200
    assert _marker(server) == before, "the marker series changed"
    runs = _sample_runs(server)
    wait_until(lambda: _sample_runs(server) > runs + 1, 30, "the sampler stopped")
    assert server.stop() == 0
    log = server.log
    assert "Traceback" not in log and "unhandled error" not in log, log[-3000:]
    statuses = Counter(a[1] for a in answers)
    slowest = max(a[2] for a in answers)
    print(
        f"{n} inputs in {took_s:.1f} s (slowest answer {slowest:.2f} s); by status: {dict(sorted(statuses.items()))}"
    )
