"""History for the dashboard's screenshots and benchmarks, ending now.

`record_local(data_dir, hostname, hours)`: what `gpuwatch serve --demo` would have stored over the last
`hours` (every field of the simulated GPUs, host figures, rule evaluations and their ALERTS), recorded
by a runtime on a fake clock, so a demo started afterwards on the same data dir and host name carries
on the same series.

`import_nodes(data_dir, gpus, days)`: bench/querydata.py's dcgm-exporter GPUs (8 per node, node00,
node01, ...) and vLLM histograms, shifted to end now, written straight into the store.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import querydata

from gpuwatch.app import build_runtime
from gpuwatch.clock import FakeClock, SystemClock
from gpuwatch.config import load
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.model import make_labels
from gpuwatch.store import Store


def record_local(data_dir: Path, hostname: str, hours: float, gpus: int = 8, step_s: float = 15.0) -> int:
    """Record `hours` of the demo's GPUs up to now; return the number of ticks."""
    end = time.time()
    clock = FakeClock(end - hours * 3600)
    settings = load(
        None, {}, {"data_dir": str(data_dir), "demo": True, "demo_gpus": gpus, "hostname": hostname}
    )
    nvml = FakeNvml(gpu_count=gpus, clock=clock, blocking_event_wait=False)
    rt = build_runtime(settings, hostname, clock=clock, nvml=nvml)
    ticks = 0
    try:
        while clock.now() < end - step_s:
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
