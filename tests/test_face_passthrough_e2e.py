"""A face passes the store's query answers on unread (query/passthrough.py), end to end: GPU series
written into Debian's VictoriaMetrics 1.79 and Prometheus 2.42 by remote write, a face on each served
by gpuwatch's own server on 127.0.0.1, and what a browser gets from its `/api/v1/query_range` and
`/api/v1/query`: the store's own bytes, the same values, times and label sets as the old reading
gave, gpuwatch's limit and error shapes, and the local buffer's answer once the store is gone."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Sample, stable_labels
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.query.errors import QueryTooLarge
from gpuwatch.query.remote import RemoteBackend
from gpuwatch.query.values import success_body
from gpuwatch.remote.storage import RemoteStorage
from gpuwatch.web import create_app
from gpuwatch.web.serving import make_server, stop_server
from tests.conftest import run_prometheus, run_victoriametrics
from tests.labdata import Series, remote_write

pytestmark = pytest.mark.slow

MAX_SAMPLES = 5000
STEP_MS = 15_000


def gpu_series(end_ms: int) -> list[Series]:
    """An hour of 16 GPUs' utilization and energy counters every 15 s up to `end_ms`, and a series
    whose label value holds `"]` (which the point count on the bytes also counts)."""
    times = np.arange(end_ms - 3_600_000, end_ms + 1, STEP_MS, dtype=np.int64)
    rng = np.random.default_rng(29)
    out = []
    for host in ("node-a", "node-b"):
        for gpu in range(8):
            labels = (("Hostname", host), ("gpu", str(gpu)))
            out.append(Series("DCGM_FI_DEV_GPU_UTIL", labels, times, rng.integers(0, 101, times.size) * 1.0))
            energy = np.cumsum(rng.uniform(0, 6000, times.size)) * 1000
            out.append(Series("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", labels, times, energy))
    out.append(Series("odd", (("note", ']"x'), ("quote", '"')), times, np.full(times.size, 0.25)))
    return out


@contextmanager
def served(rt: Runtime) -> Iterator[str]:
    """The face's app on gpuwatch's own server (waitress), on a free port of 127.0.0.1."""
    server = make_server(create_app(rt), "127.0.0.1", 0)
    server.adj.asyncore_loop_timeout = 0.1
    closing = threading.Event()

    def run() -> None:
        try:
            server.run()
        except (OSError, ValueError):
            if not closing.is_set():
                raise

    loop = threading.Thread(target=run, daemon=True)
    loop.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        closing.set()
        stop_server(server)
        loop.join(5)


def normal(body: dict[str, Any]) -> Any:
    """An answer's data, order-insensitive: {labels: [(time, value text as a float's repr)]}."""
    data = body["data"]

    def value(text: str) -> str:
        return repr(float(text)) if not math.isnan(float(text)) else "nan"

    if data["resultType"] == "matrix":
        return {
            tuple(sorted(s["metric"].items())): [(float(t), value(v)) for t, v in s["values"]]
            for s in data["result"]
        }
    if data["resultType"] == "vector":
        return {tuple(sorted(s["metric"].items())): (float(s["value"][0]), value(s["value"][1])) for s in data["result"]}  # fmt: skip
    return data


@pytest.fixture(params=["victoriametrics", "prometheus"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, AbstractContextManager[str]]:
    """(kind, a context that runs the store and yields its URL)."""

    @contextmanager
    def run() -> Iterator[str]:
        if request.param == "victoriametrics":
            with run_victoriametrics(tmp_path) as url:
                yield url
        else:
            flags = ("--web.enable-remote-write-receiver",)
            with run_prometheus(tmp_path, "global: {scrape_interval: 1m}\n", *flags) as p:
                yield p.url

    return request.param, run()


def test_the_browser_gets_the_stores_answer_as_the_old_reading_gave_it(
    tmp_path: Path, store: tuple[str, AbstractContextManager[str]]
) -> None:
    kind, running = store
    end_ms = int(time.time()) // 60 * 60_000
    clock = FakeClock(end_ms / 1000)
    with ExitStack() as the_store:
        url = the_store.enter_context(running)
        remote_write(gpu_series(end_ms), f"{url}/api/v1/write")
        if kind == "victoriametrics":
            requests.get(f"{url}/internal/force_flush", timeout=10)
        settings = load(
            None,
            {},
            {"data_dir": str(tmp_path / "face"), "storage": {"remote": {"query_url": url}},
             "builtin_rules": False, "query_max_samples": MAX_SAMPLES, "query_timeout": "30s"},
        )  # fmt: skip
        rt = build_runtime(settings, "face", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
        # what only the face holds, for its local buffer
        rt.store.append(Batch(end_ms, [Sample("face_only", stable_labels({"job": "face"}), 7.0)]))
        rt.store.flush()
        old = RemoteBackend(RemoteStorage(url), settings)  # the old reading: parse, then write again
        try:
            with served(rt) as face:
                _ask_the_face(kind, face, url, old, the_store, end_ms)
        finally:
            rt.close()


def _ask_the_face(
    kind: str, face: str, url: str, old: RemoteBackend, the_store: ExitStack, end_ms: int
) -> None:
    start = end_ms - 1_800_000
    span = {"start": str(start / 1000), "end": str(end_ms / 1000)}
    ranges = {
        "DCGM_FI_DEV_GPU_UTIL": 16,
        "rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1m])": 16,
        "sum by (Hostname) (DCGM_FI_DEV_GPU_UTIL)": 2,
        "avg(DCGM_FI_DEV_GPU_UTIL) / 100": 1,
        "odd": 1,
        "1": 1,
    }
    for expr, n in ranges.items():
        params = {"query": expr, **span, "step": "15s"}
        r = requests.post(f"{face}/api/v1/query_range", data=params, timeout=30)
        assert r.status_code == 200, (expr, r.text)
        assert r.headers["Gpuwatch-Answered-By"] == "remote"
        got = normal(r.json())
        assert got == normal(json.loads(success_body(old.range(expr, start, end_ms, STEP_MS)))), expr
        assert len(got) == n and all(len(p) == 121 for p in got.values()), (expr, got)
        # the store's own bytes: asked directly as the face asks, the same answer
        direct = requests.post(
            f"{url}/api/v1/query_range",
            data={"query": expr, "start": f"{start / 1000:.3f}", "end": f"{end_ms / 1000:.3f}",
                  "step": "15.000", "timeout": "30"},
            timeout=30,
        )  # fmt: skip
        assert r.content == direct.content, expr
    for expr in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL[1m]", "scalar(avg(DCGM_FI_DEV_GPU_UTIL))"):
        params = {"query": expr, "time": str(end_ms / 1000)}
        r = requests.get(f"{face}/api/v1/query", params=params, timeout=30)
        assert r.status_code == 200, (expr, r.text)
        assert normal(r.json()) == normal(json.loads(success_body(old.instant(expr, end_ms)))), expr

    # 33 series of an hour's 241 steps: more than query_max_samples, in gpuwatch's shape
    hour = {
        "query": '{__name__=~"DCGM.*|odd"}',
        "start": str((end_ms - 3_600_000) / 1000),
        "end": span["end"],
    }
    r = requests.get(f"{face}/api/v1/query_range", params={**hour, "step": "15"}, timeout=30)
    with pytest.raises(QueryTooLarge) as too_large:
        old.range(hour["query"], end_ms - 3_600_000, end_ms, STEP_MS)
    assert "the remote answered 7,9" in str(too_large.value)  # 7,953 points, or about
    assert r.status_code == 422, r.text
    assert r.json() == {"status": "error", "errorType": "execution", "error": str(too_large.value)}

    # a query the store refuses, in gpuwatch's shape (Prometheus: 400 bad_data; VictoriaMetrics
    # answers a parse error with 422, gpuwatch's `execution`)
    r = requests.get(
        f"{face}/api/v1/query_range", params={"query": "sum(rate(", **span, "step": "15"}, timeout=30
    )
    status, error_type = (400, "bad_data") if kind == "prometheus" else (422, "execution")
    assert (r.status_code, r.json()["status"], r.json()["errorType"]) == (status, "error", error_type)
    assert r.json()["error"] and "\n" not in r.json()["error"]

    the_store.close()  # the store stops: the face's own last 15 minutes answer, saying so
    r = requests.get(
        f"{face}/api/v1/query_range", params={"query": "face_only", **span, "step": "15"}, timeout=30
    )
    assert r.status_code == 200 and r.headers["Gpuwatch-Answered-By"] == "local-buffer"
    body = r.json()
    assert body["warnings"] == [
        f"remote query backend {url} unreachable: cannot connect: Connection refused; "
        "answered from the local buffer (last 15 minutes)"
    ]
    (only,) = body["data"]["result"]
    assert only["metric"] == {"__name__": "face_only", "job": "face"}
    assert only["values"] == [[end_ms / 1000, "7"]]
