"""History for the dashboard's screenshots and benchmarks, ending now.

`record_local(data_dir, hostname, hours)`: what `gpuwatch serve --demo` would have stored over the last
`hours` (every field of the simulated GPUs with their incidents and XIDs, host figures, the simulated
vLLM and SGLang scraped as jobs demo-vllm and demo-sglang, rule evaluations and their ALERTS), recorded
by a runtime on a fake clock, so a demo started afterwards on the same data dir and host name carries
on the same series (the engines' `instance` is their own ephemeral port there).

`import_nodes(data_dir, gpus, days)`: bench/querydata.py's dcgm-exporter GPUs (8 per node, node00,
node01, ...) and vLLM histograms, shifted to end now, written straight into the store.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import querydata

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.collect.fetch import FetchResult
from gpuwatch.collect.scrapeconfig import ScrapeConfig, StaticGroup
from gpuwatch.collect.scrapepool import ScrapePool
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock, SystemClock
from gpuwatch.core.model import make_labels
from gpuwatch.demo.engines import SglangSim, VllmSim
from gpuwatch.demo.incidents import IncidentSchedule
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.store import Store


def record_local(data_dir: Path, hostname: str, hours: float, gpus: int = 8, step_s: float = 15.0) -> int:
    """Record `hours` of the demo's GPUs up to now; return the number of ticks."""
    end = time.time()
    clock = FakeClock(end - hours * 3600)
    settings = load(
        None, {}, {"data_dir": str(data_dir), "demo": True, "demo_gpus": gpus, "hostname": hostname}
    )
    # The same UUIDs (from the host name) and incident schedule as the demo's own simulated GPUs.
    incidents = IncidentSchedule(clock.now(), gpus)
    nvml = FakeNvml(
        gpu_count=gpus, clock=clock, blocking_event_wait=False, hostname=hostname, incidents=incidents
    )
    rt = build_runtime(settings, hostname, clock=clock, nvml=nvml)
    rng = random.Random(0)
    engines = {
        "demo-vllm": VllmSim(rng, clock=clock, incidents=incidents),
        "demo-sglang": SglangSim(rng, clock=clock, incidents=incidents),
    }
    ports = {"demo-vllm": 1, "demo-sglang": 2}  # instance 127.0.0.1:1 and :2 (no port is bound)

    def fetch(spec: TargetSpec, timeout_s: float) -> FetchResult:
        return FetchResult(generate_latest(engines[spec.job].registry), CONTENT_TYPE_LATEST)

    scrapes = ScrapePool(
        [
            ScrapeConfig(job_name=j, static_configs=(StaticGroup((f"127.0.0.1:{p}",)),))
            for j, p in ports.items()
        ],
        default_interval_s=step_s,
        sink=rt.store.append,
        clock=clock,
        fetch=fetch,
    )
    ticks = 0
    try:
        while clock.now() < end - step_s:
            for _ in range(int(step_s)):  # the engines move in 1 s ticks, as the demo's thread moves them
                for engine in engines.values():
                    engine.tick(1.0)
            scrapes.scrape_all()
            if rt.gpu is not None:
                rt.gpu.wait_events(0)  # the XIDs of the incident schedule (a thread waits for them in serve)
            rt.jobs.run("sample")
            rt.jobs.run("host")
            if rt.rules is not None:
                rt.jobs.run("rules")
            clock.advance(step_s)
            ticks += 1
        rt.store.flush()
    finally:
        rt.close()
    return ticks


def import_nodes(data_dir: Path, gpus: int, days: float, end_ms: int | None = None) -> int:
    """Write bench/querydata.py's data set, shifted to end at `end_ms` (now); return its samples."""
    series = querydata.generate(gpus, days)
    end = int(time.time() * 1000) if end_ms is None else end_ms
    shift = end - (querydata.T0_MS + int(days * querydata.DAY_MS))
    shift -= shift % querydata.STEP_MS
    store = Store.open(data_dir, clock=SystemClock(), retention_s=3650 * 86400)
    n = 0
    try:
        for s in series:
            store.append_series(s.name, make_labels(s.labels), s.timestamps_ms + shift, s.values)
            n += len(s.values)
        store.flush()
    finally:
        store.close()
    return n
