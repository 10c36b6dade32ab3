"""Targets of one job are scraped together at start, then each at its own phase of the interval."""

from __future__ import annotations

import itertools
from typing import Any

from gpuwatch.collect.fetch import FetchResult
from gpuwatch.collect.scrapeconfig import parse_scrape_configs
from gpuwatch.collect.scrapepool import ScrapePool, phase
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock


class Recorder:
    """An executor that notes which target was submitted when, and runs nothing."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.submitted: dict[str, list[float]] = {}

    def submit(self, fn: Any, target: Any) -> None:
        self.submitted.setdefault(target.spec.address, []).append(self.clock.monotonic())


def never(spec: TargetSpec, timeout_s: float) -> FetchResult:
    raise AssertionError("nothing is fetched here")


def test_targets_spread_over_the_interval_after_the_first_scrape() -> None:
    clock = FakeClock(1_800_000_000)
    targets = [f"10.0.0.{i}:8000" for i in range(20)]
    jobs = [{"job_name": "vllm", "scrape_interval": "5s", "static_configs": [{"targets": targets}]}]
    pool = ScrapePool(
        parse_scrape_configs(jobs), default_interval_s=15, sink=lambda b: None, clock=clock, fetch=never
    )
    executor = Recorder(clock)
    start = clock.monotonic()
    for _ in range(200):  # 20 s in 100 ms steps
        pool._tick(executor)  # type: ignore[arg-type]
        clock.advance(0.1)
    assert sorted(executor.submitted) == sorted(targets)
    seconds = []
    for address, times in executor.submitted.items():
        assert times[0] == start, "every target is scraped at once at start"
        gaps = [round(b - a, 6) for a, b in itertools.pairwise(times[1:])]
        assert gaps and set(gaps) == {5.0}, (address, gaps)  # then every 5 s, at its own phase
        seconds.append(round(times[1] - start, 6))
        assert 1.0 <= seconds[-1] <= 6.0, (address, seconds[-1])
    assert len(set(seconds)) >= 15 and max(seconds) - min(seconds) > 2.5, seconds
    spec = next(iter(pool.targets())).spec
    assert 0 <= phase(spec) < 5 and phase(spec) == phase(spec)
