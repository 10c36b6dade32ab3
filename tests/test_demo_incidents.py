"""The demo over a simulated hour: a healthy lab with its scheduled incidents, judged by the built-in rules.

The real pieces run on a FakeClock: the demo's FakeNvml through the GPU collector into a real store, the
simulated vLLM and SGLang registries scraped by a ScrapePool, the simulated training run pushing through
the SDK to the real push API (a Flask test client as its transport), and the rule manager with every
built-in group. GPUs are sampled and servers scraped every 30 s of simulated time; the rules run and the active
alerts are recorded every minute.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.collect.fetch import FetchResult
from gpuwatch.collect.scrapeconfig import parse_scrape_configs
from gpuwatch.collect.scrapepool import ScrapePool
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock
from gpuwatch.demo.engines import SglangSim, VllmSim
from gpuwatch.demo.incidents import (
    EXPECTED,
    IDLE,
    KINDS,
    LATENCY,
    PCIE,
    STALL,
    THROTTLE,
    XID,
    IncidentSchedule,
)
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.demo.training import TrainingSim
from gpuwatch.web import create_app

START = 1_800_000_000.0
SCRAPE_S = 30  # GPUs sampled and servers scraped
STEP_S = 60  # rules evaluated (as `evaluation_interval: 60`), alerts recorded
WARMUP_S = 180  # the warming-up GPU loads its model for a minute at start: GPUUtilizationLow is pending


class Timeline:
    """(seconds since start, {alert name: state}) every STEP_S."""

    def __init__(self) -> None:
        self.points: list[tuple[float, dict[str, str]]] = []

    def names(self, t0: float, t1: float) -> set[str]:
        return {n for t, active in self.points if t0 <= t < t1 for n in active}

    def firing(self, t0: float, t1: float) -> set[str]:
        return {n for t, active in self.points if t0 <= t < t1 for n, s in active.items() if s == "firing"}


def _simulate(tmp_path: Path, seconds: float, gpu_count: int = 8) -> tuple[Timeline, IncidentSchedule]:
    clock = FakeClock(START)
    settings = load(
        None,
        {},
        {
            "data_dir": str(tmp_path / "data"),
            "demo": True,
            "demo_sources": False,
            "demo_gpus": gpu_count,
            "evaluation_interval": 60,
        },
    )
    schedule = IncidentSchedule(START, gpu_count)
    nvml = FakeNvml(
        gpu_count=gpu_count, clock=clock, hostname="lab-1", incidents=schedule, blocking_event_wait=False
    )
    rt: Runtime = build_runtime(settings, "lab-1", clock=clock, nvml=nvml)
    rng = random.Random(11)
    vllm = VllmSim(rng, clock=clock, incidents=schedule)
    sglang = SglangSim(rng, clock=clock, incidents=schedule)
    bodies = {"vllm:8000": vllm.registry, "sglang:30000": sglang.registry}

    def fetch(spec: TargetSpec, timeout_s: float) -> FetchResult:
        return FetchResult(generate_latest(bodies[spec.address]), "text/plain; version=0.0.4")

    jobs = [
        {"job_name": "demo-vllm", "static_configs": [{"targets": ["vllm:8000"]}]},
        {"job_name": "demo-sglang", "static_configs": [{"targets": ["sglang:30000"]}]},
    ]
    pool = ScrapePool(parse_scrape_configs(jobs), default_interval_s=SCRAPE_S, sink=rt.store.append, clock=clock, fetch=fetch)  # fmt: skip
    web = create_app(rt).test_client()

    def transport(method: str, url: str, body: Any, timeout: float) -> int:
        return int(web.open(url.removeprefix("http://gpuwatch.test"), method=method, json=body).status_code)

    training = TrainingSim(
        "http://gpuwatch.test", rng, clock, total_steps=50_000, incidents=schedule, transport=transport
    )
    timeline = Timeline()
    assert rt.rules is not None and rt.gpu is not None
    try:
        t = 0
        while t < seconds:
            for _ in range(SCRAPE_S // 10):
                clock.advance(10)
                vllm.tick(10)
                sglang.tick(10)
                for _ in range(10):
                    training.tick()  # a step a second
            t += SCRAPE_S
            rt.gpu.wait_events(0)
            rt.jobs.run("sample")
            pool.scrape_all()
            if t % STEP_S == 0:
                if training.run is not None:
                    training.run.flush(5)
                rt.jobs.run("runs")
                rt.store.flush()
                rt.rules.run_due()
                active: dict[str, str] = {}
                for rule, alert in rt.rules.active_alerts():
                    if active.get(rule.name) != "firing":
                        active[rule.name] = alert.state
                timeline.points.append((t, active))
    finally:
        training.close()
        rt.close()
    return timeline, schedule


@pytest.fixture(scope="module")
def hour(tmp_path_factory: pytest.TempPathFactory) -> tuple[Timeline, IncidentSchedule]:
    return _simulate(tmp_path_factory.mktemp("demo-hour"), 3600)


def test_each_incident_raises_its_alert_in_its_window(hour: tuple[Timeline, IncidentSchedule]) -> None:
    timeline, schedule = hour
    incidents = {i.kind: i for i in schedule.hour(0)}
    assert set(incidents) == {THROTTLE, IDLE, LATENCY, STALL, XID}
    seen = {}
    for kind, incident in incidents.items():
        expected, tail = EXPECTED[kind]
        seen[kind] = timeline.names(incident.start_s, incident.end_s + tail)
        assert seen[kind] <= expected, kind
    assert {"GPUTemperatureHigh", "GPUThrottled", "GPUMemoryTemperatureHigh"} <= seen[THROTTLE]
    assert "GPUMemoryTemperatureHigh" in timeline.firing(
        incidents[THROTTLE].start_s, incidents[THROTTLE].end_s + 60
    )
    assert seen[IDLE] == {"GPUUtilizationLow", "GPUMemoryHeldIdle"}  # pending only: 3 of their 30 minutes
    assert not timeline.firing(incidents[IDLE].start_s, incidents[IDLE].end_s)
    assert {"InferenceLatencyHigh", "InferenceTTFTHigh"} <= seen[LATENCY]
    assert "TrainingRunStalled" in timeline.firing(incidents[STALL].start_s, incidents[STALL].end_s + 60)
    assert {"GPUXidErrorCritical", "GPULost"} <= timeline.firing(incidents[XID].start_s, 3600)


def test_healthy_between_incidents(hour: tuple[Timeline, IncidentSchedule]) -> None:
    """Outside an incident's window (its start to its end plus its alerts' tail) no alert is active, and
    inside it only the alerts that incident explains; never more than a handful at once."""
    timeline, schedule = hour
    healthy = 0
    for t, active in timeline.points:
        if t < WARMUP_S:
            continue
        explained: set[str] = set()
        for incident in schedule.during(t - 3700, t + 1):
            expected, tail = EXPECTED[incident.kind]
            if incident.start_s <= t < incident.end_s + tail:
                explained |= expected
        assert set(active) <= explained, f"at {t:.0f} s: {sorted(set(active) - explained)} unexplained"
        assert len(active) <= 6, f"at {t:.0f} s: {sorted(active)}"
        healthy += not active
    assert healthy * STEP_S >= 600  # at least ten minutes of the hour without any alert


def test_schedule_rotates_and_is_deterministic() -> None:
    a, b = IncidentSchedule(START), IncidentSchedule(START)
    assert [a.hour(h) for h in range(4)] == [b.hour(h) for h in range(4)]
    kinds = {i.kind for h in range(4) for i in a.hour(h)}
    assert kinds == set(KINDS)
    assert len({i.gpu for h in range(4) for i in a.hour(h) if i.kind == THROTTLE}) == 4
    assert {i.engine for h in range(2) for i in a.hour(h) if i.kind == LATENCY} == {"vllm", "sglang"}
    assert [i.xid for h in (0, 2) for i in a.hour(h) if i.kind == XID] == [79, 31]
    assert [i.kind for i in a.hour(1)][-1] == PCIE
    # active() and started_between() agree with the table
    (hot,) = [i for i in a.hour(1) if i.kind == THROTTLE]
    assert a.active(START + hot.start_s + 1, THROTTLE) == hot
    assert a.active(START + hot.end_s, THROTTLE) is None
    assert a.started_between(START, START + 7200, XID) == [i for i in a.hour(0) if i.kind == XID]
