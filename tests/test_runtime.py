"""The runtime's jobs over a real store with a fake clock: sampling, retention, XID events, self metrics."""

from __future__ import annotations

from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher
from gpuwatch.demo.nvml import FakeNvml

DEMO_GPUS = 2


def util_points(rt: Runtime) -> int:
    rt.store.flush()
    series = rt.store.select([Matcher("__name__", "=", "DCGM_FI_DEV_GPU_UTIL")], 0, 2**62)
    return sum(len(s.timestamps_ms) for s in series)


def test_retention_job_drops_old_samples(runtime: Runtime, clock: FakeClock) -> None:
    for _ in range(3):
        runtime.jobs.run("sample")
        clock.advance(1)
    assert util_points(runtime) == 6
    clock.advance(31 * 86400)
    runtime.jobs.run("sample")
    assert runtime.jobs.run("retention") is True
    assert util_points(runtime) == 2, "only the newest tick is within 30 days"


def test_xid_event_reaches_the_store(runtime: Runtime, clock: FakeClock, nvml: FakeNvml) -> None:
    runtime.jobs.run("sample")
    nvml.inject_xid(1, 79)
    assert runtime.gpu is not None
    runtime.gpu.wait_events(0)
    clock.advance(1)
    runtime.jobs.run("sample")
    runtime.store.flush()
    (xid,) = runtime.store.select(
        [Matcher("__name__", "=", "DCGM_FI_DEV_XID_ERRORS"), Matcher("gpu", "=", "1")], 0, 2**62
    )
    assert list(xid.values) == [0.0, 79.0]
    (count,) = runtime.store.select([Matcher("__name__", "=", "gpuwatch_xid_errors_total")], 0, 2**62)
    assert dict(count.labels)["xid"] == "79" and count.values[-1] == 1


def test_self_metrics_are_stored(runtime: Runtime, clock: FakeClock) -> None:
    runtime.jobs.run("sample")
    clock.advance(1)
    runtime.jobs.run("sample")
    runtime.store.flush()
    names = {s.name for s in runtime.store.select([Matcher("__name__", "=~", "gpuwatch_.*")], 0, 2**62)}
    assert {
        "gpuwatch_build_info",
        "gpuwatch_gpus",
        "gpuwatch_store_series",
        "gpuwatch_job_runs_total",
    } <= names


def test_the_schedulers_own_log_lines_name_the_job(runtime: Runtime) -> None:
    """APScheduler words a skipped or missed run as `Execution of job "<job>" skipped ...`: the job is
    named as `/-/jobs` names it ("rules"), not by the function that runs them all."""
    runtime.start()
    scheduled = {str(job).split(" (trigger")[0] for job in runtime._scheduler.get_jobs()}
    assert scheduled == set(runtime.jobs.names())
    assert "rules" in scheduled
