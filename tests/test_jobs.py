"""Jobs record runs, durations and errors, and never raise into the scheduler."""

from __future__ import annotations

import threading

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.jobs import JobRegistry


def test_success_failure_and_recovery() -> None:
    clock = FakeClock(1_700_000_000)
    jobs = JobRegistry(clock)
    calls = {"n": 0}

    def work() -> None:
        calls["n"] += 1
        clock.advance(0.25)
        if calls["n"] == 2:
            raise OSError("disk full")

    jobs.add("sample", work, 1.0)
    assert jobs.run("sample") is True
    assert jobs.run("sample") is False
    (state,) = jobs.states()
    assert state["runs"] == 2 and state["failures"] == 1
    assert state["last_error"] == "OSError: disk full"
    assert state["last_duration_s"] == 0.25
    assert state["last_run_ms"] == 1_700_000_000_250
    assert jobs.run("sample") is True
    assert jobs.states()[0]["last_error"] is None


def test_single_instance() -> None:
    jobs = JobRegistry(FakeClock())
    entered, release = threading.Event(), threading.Event()
    jobs.add("slow", lambda: (entered.set(), release.wait(10)), 1.0)
    t = threading.Thread(target=jobs.run, args=("slow",))
    t.start()
    assert entered.wait(10)
    assert jobs.run("slow") is False  # still running: skipped, not queued
    release.set()
    t.join(10)
    assert jobs.states()[0]["runs"] == 1
