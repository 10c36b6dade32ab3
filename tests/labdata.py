"""A lab's data, made in-process on a fake clock, to ask the same queries of gpuwatch's engine and of a
remote store holding the same samples (tests/test_remote_backend_e2e.py).

`generate` runs a demo node for `minutes` ending at a given time, through the demo's incidents
(gpuwatch/demo/incidents.py): simulated GPUs (the GPU and gpuwatch's own figures every 5 s), the
host's real figures, a vLLM and an SGLang server scraped every 15 s, a training run pushing through
`/api/v1/push` (and a second whose loss turns NaN), the runs job and the built-in rules (so the
recorded series are there too). What the store then holds is the data set: written into a fresh store
(`load_store`) and into a remote by remote write (`remote_write`), slice by slice in time order, as a
Prometheus takes them. `steady` keeps the part both remotes answer alike.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import requests
from prometheus_client import generate_latest

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.collect.fetch import FetchResult
from gpuwatch.collect.scrapeconfig import parse_scrape_configs
from gpuwatch.collect.scrapepool import ScrapePool
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Labels, Matcher
from gpuwatch.demo.engines import SglangSim, VllmSim
from gpuwatch.demo.incidents import IncidentSchedule
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.remote.wire import HEADERS, compress, encode_request, encode_series
from gpuwatch.store import Store
from gpuwatch.web import create_app

NODE = "node-a"
RUN = "llama-sft"
NAN_RUN = "llama-diverged"  # its loss turns NaN in the last minute
STEP_S = 5  # GPU and own figures
SCRAPE_S = 15  # scrapes, host, pushes, runs, rules


@dataclass(frozen=True)
class Series:
    name: str
    labels: Labels
    timestamps_ms: np.ndarray
    values: np.ndarray


@dataclass(frozen=True)
class LabData:
    """The series, the names the node's metadata calls counters, and the newest sample's time."""

    series: list[Series]
    counters: frozenset[str]
    end_ms: int


def _counter(name: str, counters: frozenset[str]) -> bool:
    return name in counters or name.endswith(("_total", "_bucket", "_count", "_sum"))


def generate(tmp_path: Path, end_s: int, minutes: int = 52) -> LabData:
    """Every series a demo node stores over `minutes` up to `end_s` (Unix seconds).

    Samples are taken half a second off the whole seconds: a query at a whole second never has a
    sample exactly at its window's start, where Prometheus 2 (closed windows) and Prometheus 3,
    gpuwatch and VictoriaMetrics (windows open at the start) differ (docs/scale.md)."""
    clock = FakeClock(end_s - minutes * 60 - 0.5)
    settings = load(None, {}, {"data_dir": str(tmp_path / "lab"), "demo": True, "demo_sources": False})
    # the demo's incidents (a GPU overheating, a latency spike, an XID with the GPU lost for 90 s), so
    # that the rules' queries have something to say
    incidents = IncidentSchedule(clock.now(), 2)
    nvml = FakeNvml(gpu_count=2, clock=clock, blocking_event_wait=False, hostname=NODE, incidents=incidents)
    rt = build_runtime(settings, NODE, clock=clock, nvml=nvml)
    try:
        rng = random.Random(7)
        vllm = VllmSim(rng, clock=clock, incidents=incidents)
        sglang = SglangSim(rng, clock=clock, incidents=incidents)
        bodies: dict[str, Callable[[], bytes]] = {
            "127.0.0.1:8001": lambda: generate_latest(vllm.registry),
            "127.0.0.1:8002": lambda: generate_latest(sglang.registry),
        }

        def fetch(spec: TargetSpec, timeout_s: float) -> FetchResult:
            return FetchResult(bodies[spec.address](), "text/plain; version=0.0.4; charset=utf-8")

        jobs = [
            {"job_name": "vllm", "static_configs": [{"targets": ["127.0.0.1:8001"]}]},
            {"job_name": "sglang", "static_configs": [{"targets": ["127.0.0.1:8002"]}]},
        ]
        pool = ScrapePool(
            parse_scrape_configs(jobs),
            default_interval_s=SCRAPE_S,
            sink=rt.store.append,
            clock=clock,
            fetch=fetch,
        )
        client = create_app(rt).test_client()
        started = client.post(
            "/api/v1/runs", json={"run": RUN, "action": "init", "total_steps": 100_000, "gpus": ["0"]}
        )
        assert started.status_code == 200, started.get_json()
        step = 0
        for i in range(minutes * 60 // STEP_S + 1):
            if i:
                clock.advance(STEP_S)
                for _ in range(STEP_S):
                    vllm.tick(1.0)
                    sglang.tick(1.0)
            rt.sample()
            if i % (SCRAPE_S // STEP_S) == 0:
                rt.sample_host()
                pool.scrape_all()
                step += 30
                loss = 2.5 * math.exp(-step / 20_000) + 0.05 * math.sin(step / 500)
                metrics = {"loss": loss, "learning_rate": 2e-5, "grad_norm": 1.0 + 0.2 * math.cos(step / 300),
                           "throughput_tokens_per_second": 5200.0 + 100 * math.sin(step / 700)}  # fmt: skip
                if step % 600 == 0:
                    metrics |= {"eval_loss": loss * 1.1, "checkpoint_seconds": 40.0}
                pushed = client.post("/api/v1/push", json={"run": RUN, "step": step, "metrics": metrics})
                assert pushed.status_code == 200, pushed.get_json()
                diverged = clock.now() > end_s - 60
                pushed = client.post(
                    "/api/v1/push",
                    json={"run": NAN_RUN, "step": step, "metrics": {"loss": "NaN" if diverged else loss}},
                )
                assert pushed.status_code == 200, pushed.get_json()
                rt.sample_runs()
                rt.store.flush()
                assert rt.rules is not None
                rt.rules.run_due()
        rt.store.flush()
        counters = frozenset(m.name for m in rt.metadata.values() if m.type == "counter")
        out = []
        for s in rt.store.select([Matcher("__name__", "=~", ".+")], 0, end_s * 1000):
            if s.timestamps_ms.size:
                out.append(Series(s.name, s.labels, s.timestamps_ms.copy(), s.values.copy()))
        return LabData(out, counters, clock.now_ms())
    finally:
        rt.close()


def steady(data: LabData, minutes: int) -> LabData:
    """The first `minutes` of `data` as VictoriaMetrics and Prometheus answer alike (docs/scale.md):
    only the series that last the whole span (no counter starts inside a window, no series stops
    without a staleness marker: VictoriaMetrics ends a series after a gap of about two sample
    intervals, Prometheus and gpuwatch carry its last value for the 5-minute lookback), none holding
    a NaN (VictoriaMetrics drops NaN samples), and every counter rising at its own constant rate
    (VictoriaMetrics' `rate` takes the change since the sample before the window and does not
    extrapolate, Prometheus's takes the change within it and does: the same figure on a steady
    counter, not on others)."""
    start = min(int(s.timestamps_ms[0]) for s in data.series)
    end = start + minutes * 60_000
    margin = 60_000  # more than the longest sample interval (15 s)
    out = []
    for s in data.series:
        keep = s.timestamps_ms <= end
        t, v = s.timestamps_ms[keep], s.values[keep]
        if t.size < 2 or t[0] > start + margin or t[-1] < end - margin or np.isnan(v).any():
            continue
        if np.diff(t).max() > margin:
            continue
        if _counter(s.name, data.counters):
            v0, v1 = float(v[0]), max(float(v[-1]), float(v[0]))
            v = v0 + (v1 - v0) * (t - t[0]) / max(1, int(t[-1] - t[0]))
        out.append(Series(s.name, s.labels, t, v))
    return LabData(out, data.counters, max(int(s.timestamps_ms[-1]) for s in out))


def load_store(series: list[Series], path: Path, clock: FakeClock) -> Store:
    """A fresh store at `path` holding exactly `series`."""
    store = Store.open(path, clock=clock, flush_interval_s=3600.0)
    store.append_many([(s.name, s.labels, s.timestamps_ms, s.values) for s in series])
    store.flush()
    return store


def _slices(series: list[Series], slice_ms: int) -> Iterator[list[bytes]]:
    lo = min(int(s.timestamps_ms[0]) for s in series)
    hi = max(int(s.timestamps_ms[-1]) for s in series)
    for start in range(lo, hi + 1, slice_ms):
        messages = []
        for s in series:
            keep = (s.timestamps_ms >= start) & (s.timestamps_ms < start + slice_ms)
            if keep.any():
                labels = sorted({"__name__": s.name, **dict(s.labels)}.items())
                messages.append(
                    encode_series(labels, s.timestamps_ms[keep].tolist(), s.values[keep].tolist())
                )
        yield messages


def remote_write(series: list[Series], url: str, slice_ms: int = 300_000, per_request: int = 500) -> int:
    """Write `series` to a remote-write `url` in time order (five minutes of every series at a time,
    as a Prometheus TSDB takes them); return the samples written."""
    written = 0
    for messages in _slices(series, slice_ms):
        for i in range(0, len(messages), per_request):
            body = compress(encode_request(messages[i : i + per_request]))
            r = requests.post(url, data=body, headers=HEADERS, timeout=30)
            assert r.status_code in (200, 204), (r.status_code, r.text[:500])
    for s in series:
        written += int(s.timestamps_ms.size)
    return written
