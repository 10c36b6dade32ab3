"""The demo's week of history: numpy twins equal to the simulation, a history equal to what the live
collector samples, and `gpuwatch serve --demo`'s start on an empty data directory (fake clock): the
week imported, the Usage page and `gpuwatch report` finding its users, run and idle-held GPU with the
hours and kWh of the stored samples, the cluster page's charts reaching back 7 days, the live demo
going on from the history without a reset."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.cli.main import main
from gpuwatch.collect.nvml import GpuCollector
from gpuwatch.collect.processes import user_name
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher
from gpuwatch.demo.history import DemoHistory, history_ticks, old_step_s
from gpuwatch.demo.historyruns import training_history
from gpuwatch.demo.incidents import NOTEBOOK_GPU, TRAINING_GPUS, IncidentSchedule
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.demo.readings import WorkloadArrays
from gpuwatch.demo.training import TRAINING_RUN, TrainingSim
from gpuwatch.demo.workload import MODELS, Workload
from gpuwatch.web import create_app
from tests.test_demo import Recorder

START = 1_800_000_000.0  # 2027-01-15 08:00 UTC
WEEK_S = 7 * 86400


def test_numpy_twins_equal_the_workload_at_sampled_times() -> None:
    """Every field of every role, bit for bit: the warm-up, incidents of all kinds, the counters."""
    w = Workload(4, MODELS["NVIDIA H100 80GB HBM3"], "mixed", 3, START, incidents=IncidentSchedule(START, 4))
    rng = np.random.default_rng(1)
    t = np.concatenate([np.arange(0.0, 600.0, 3.7), np.sort(rng.uniform(600.0, 26 * 3600.0, 120)).round(1)])
    arrays = WorkloadArrays(w, START + float(t[-1]))
    mismatched: dict[str, int] = {}
    for i in range(4):
        got = arrays.readings(i, START + t)
        for k, at in enumerate(t):
            want = w.reading(i, START + float(at), 0)
            for f in dataclasses.fields(want):
                if float(got[f.name][k]) != float(getattr(want, f.name)):
                    mismatched[f.name] = mismatched.get(f.name, 0) + 1
    assert mismatched == {}
    replays = arrays.pcie_replays(3, START + t)
    assert replays.tolist() == [w.pcie_replays(3, START + float(x)) for x in t] and replays.max() > 0


def test_a_history_is_what_the_live_collector_samples(tmp_path: Path) -> None:
    """Two hours on 8 GPUs at 15 s, with a GPU off the bus, its re-probes, throttling, an idle
    notebook, a stalled run and PCIe replays: every series, time and value the same."""
    ticks, step_ms = 450, 15_000
    proc = tmp_path / "proc"

    def demo(clock: FakeClock) -> FakeNvml:
        nvml = FakeNvml(8, clock=clock, hostname="lab-1", incidents=IncidentSchedule(START, 8),
                        blocking_event_wait=False, serving_pid=4242, start=START)  # fmt: skip
        nvml.write_proc_root(proc)
        return nvml

    clock = FakeClock(START)
    live = demo(clock)
    collector = GpuCollector(live, hostname="lab-1", proc_root=proc)
    collector.open()
    collector.assign_runs({("lab-1", str(i), live.workload.uuid(i)): [TRAINING_RUN] for i in TRAINING_GPUS})
    got: dict[tuple[str, Any], list[tuple[int, float]]] = {}
    for k in range(ticks):
        clock.advance(15.0 if k else 0.0)
        collector.wait_events(0)
        batch = collector.collect(clock.now_ms())
        for s in [*batch.samples, *collector.usage_samples()]:
            got.setdefault((s.name, s.labels), []).append((batch.timestamp_ms, s.value))
    collector.close()
    history = DemoHistory(demo(FakeClock(START)), "lab-1", proc, int(START * 1000) + ticks * step_ms,
                          days=ticks * step_ms / 86_400_000, run_gpus=list(TRAINING_GPUS))  # fmt: skip
    want = {(n, labels): (t, v) for chunk in history.chunks() for n, labels, t, v in chunk if t.size}
    gpu_side = {k for k in want if not k[0].startswith(("training_", "gpuwatch_training_", "gpuwatch_run_"))}
    assert gpu_side == set(got)
    assert {n for n, _ in got} >= {"gpuwatch_xid_errors_total", "DCGM_FI_PROF_PCIE_TX_BYTES"}
    assert (
        max(
            v
            for t, v in got[next(k for k in got if k[0] == "gpuwatch_gpu_lost" and dict(k[1])["gpu"] == "5")]
        )
        == 1
    )
    for key, samples in got.items():
        t, v = want[key]
        assert t.tolist() == [a for a, _ in samples], key
        assert v.tolist() == [b for _, b in samples], key


def test_the_training_history_steps_as_the_live_run(tmp_path: Path) -> None:
    """Steps, checkpoints and the stalls of the schedule fall on the same seconds as TrainingSim's."""
    clock = FakeClock(START)
    schedule = IncidentSchedule(START, 8)
    sent = Recorder()
    sim = TrainingSim("http://gpuwatch.invalid", random.Random(4), clock, total_steps=900, checkpoint_every=100,
                      checkpoint_ticks=3, incidents=schedule, transport=sent)  # fmt: skip
    seconds = 2 * 3600
    for k in range(seconds):
        clock.advance(1.0 if k else 0.0)
        sim.tick()
    sim.close()
    points = [p for body in sent.bodies if isinstance(body, list) for p in body]
    run = training_history(START, START + seconds, incidents=schedule, gpus=[], runs_ticks_ms=np.array([], np.int64),
                           total_steps=900, checkpoint_every=100, checkpoint_ticks=3)  # fmt: skip
    series = {(name, dict(labels)["job"]): (t, v) for name, labels, t, v in run.series}
    t, steps = series[("training_step", "training")]
    assert t.tolist() == [int(round(p["time"] * 1000)) for p in points]
    assert steps.tolist() == [p["step"] for p in points]
    t, waited = series[("training_checkpoint_seconds", "training")]
    live = [(int(round(p["time"] * 1000)), p["metrics"]["checkpoint_seconds"]) for p in points
            if "checkpoint_seconds" in p["metrics"]]  # fmt: skip
    assert list(zip(t.tolist(), waited.tolist(), strict=True)) == live
    assert len(series[("training_loss", "demo-log")][0]) == len(series[("training_loss", "training")][0])
    assert run.step == sim.step or (run.step == 0 and sim.step == 900)


def test_ticks_are_15_s_over_the_last_day_and_coarser_before_for_big_labs() -> None:
    end = int(START * 1000)
    t = history_ticks(end, 7, 15, old_step_s(8))
    assert t[0] == end - WEEK_S * 1000 and t[-1] == end - 15_000 and set(np.diff(t).tolist()) == {15_000}
    big = history_ticks(end, 7, 15, old_step_s(64))
    assert big[0] == t[0] and set(np.diff(big).tolist()) == {15_000, 60_000}
    assert (np.diff(big) == 15_000).sum() == 86400 // 15 - 1


# -- `gpuwatch serve --demo` on an empty data directory ---------------------------------------------


@dataclass
class Demo:
    rt: Runtime
    client: FlaskClient
    data_dir: Path
    start_ms: int
    end_ms: int
    log: str
    before: dict[tuple[str, Any], float]  # each counter's last value in the history


def series(rt: Runtime, name: str, end_ms: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    found = rt.store.select([Matcher("__name__", "=", name)], 0, end_ms)
    return {s.label_dict().get("gpu", ""): (s.timestamps_ms, s.values) for s in found}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """`build_runtime` as `gpuwatch serve --demo` calls it, 4 GPUs on a fake clock; one live tick after."""
    data_dir = tmp_path_factory.mktemp("demohist") / "data"
    clock = FakeClock(START)
    settings = load(None, {}, {"data_dir": str(data_dir), "demo": True, "demo_gpus": 4})
    handler, logger = _Lines(), logging.getLogger("gpuwatch")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        rt = build_runtime(settings, "lab-1", clock=clock)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    counters = ("gpuwatch_usage_", "gpuwatch_user_", "gpuwatch_pcie_", "DCGM_FI_DEV_TOTAL_ENERGY")
    end_ms = clock.now_ms()
    before = {
        (s.name, s.labels): float(s.values[-1])
        for s in rt.store.select([Matcher("__name__", "=~", "|".join(c + ".*" for c in counters))], 0, end_ms)
    }
    try:
        clock.advance(1.0)
        rt.jobs.run("sample")  # the live sampler's first tick
        rt.store.flush()
        yield Demo(rt, create_app(rt).test_client(), data_dir, end_ms - WEEK_S * 1000, clock.now_ms(),
                   "\n".join(handler.lines), before)  # fmt: skip
    finally:
        rt.close()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def held(demo: Demo, gpu: int, idle: bool | None = None) -> tuple[float, float]:
    """What the stored samples say of `gpu`: seconds held by a process (since the tick before; under 5 %
    utilization for `idle`, at least 5 % for not `idle`) and the kWh its energy counter rose meanwhile."""
    ticks = series(demo.rt, "gpuwatch_gpu_lost", demo.end_ms)[str(gpu)][0]
    util = dict(
        zip(
            *(a.tolist() for a in series(demo.rt, "DCGM_FI_DEV_GPU_UTIL", demo.end_ms)[str(gpu)]), strict=True
        )
    )
    mj = dict(
        zip(
            *(
                a.tolist()
                for a in series(demo.rt, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", demo.end_ms)[str(gpu)]
            ),
            strict=True,
        )
    )
    procs = set(series(demo.rt, "gpuwatch_process_gpu_memory_bytes", demo.end_ms)[str(gpu)][0].tolist())
    seconds = kwh = 0.0
    for a, b in zip(ticks[:-1].tolist(), ticks[1:].tolist(), strict=True):
        if b in procs and (idle is None or (util[b] < 5) == idle):
            seconds += (b - a) / 1000
            if a in mj:
                kwh += (mj[b] - mj[a]) / 3.6e9
    return seconds, kwh


def usage(demo: Demo, by: str) -> dict[str, Any]:
    q = {"start": str(demo.start_ms / 1000), "end": str(demo.end_ms / 1000), "by": by}
    r = demo.client.get("/api/ui/usage", query_string=q)
    assert r.status_code == 200, r.get_json()
    report: dict[str, Any] = r.get_json()["data"]["report"]
    return report


def test_a_new_demo_imports_its_week_and_says_so(demo: Demo) -> None:
    (line,) = [x for x in demo.log.splitlines() if x.startswith("demo: imported")]
    assert (
        line.startswith("demo: imported 7 days of history (")
        and " series, " in line
        and " samples) in " in line
    )
    assert demo.rt.store.stats()["samples"] > 5_000_000
    first = min(int(t[0]) for t, _ in series(demo.rt, "DCGM_FI_DEV_GPU_UTIL", demo.end_ms).values())
    assert first == demo.start_ms
    (run,) = demo.rt.store.runs()
    assert run.name == TRAINING_RUN and run.status == "running" and run.start_ms == demo.start_ms


def test_the_last_hour_is_at_the_live_sampler_s_second_and_the_day_before_at_15_s(demo: Demo) -> None:
    """A 1-hour chart of a new demo is as fine as the live one: no 15-s stretch the live samples replace."""
    t, _ = series(demo.rt, "DCGM_FI_DEV_GPU_UTIL", demo.end_ms)["0"]
    hour = t[(t >= demo.end_ms - 3_600_000) & (t < demo.end_ms)]  # the history's, not the live tick
    assert hour.size >= 3_598 and set(np.diff(hour).tolist()) == {1_000}
    day = np.diff(t[(t >= demo.end_ms - 86_400_000) & (t < demo.end_ms - 3_700_000)])
    assert set(day.tolist()) == {15_000}


def test_the_usage_page_finds_the_week_s_users_run_and_idle_gpu(demo: Demo) -> None:
    report = usage(demo, "user")
    users = {r["group"]["user"]: r for r in report["rows"]}
    trainer, notebook, server = user_name(1000), user_name(1001), user_name(0)
    assert set(users) == {trainer, notebook, server}
    # the notebook idles 12:00-15:00 of every hour, holding its GPU: 3 minutes an hour, top of the list
    assert report["rows"][0]["group"] == {"user": notebook}
    idle_s, _ = held(demo, NOTEBOOK_GPU, idle=True)
    assert idle_s == pytest.approx(7 * 24 * 180, rel=0.01)
    nb = users[notebook]
    assert nb["idle_held_gpu_hours"] * 3600 == pytest.approx(idle_s, rel=0.01)
    seconds, kwh = held(demo, NOTEBOOK_GPU)
    assert nb["allocated_gpu_hours"] * 3600 == pytest.approx(seconds, rel=0.01)
    assert nb["energy_kwh"] == pytest.approx(kwh, rel=0.01)
    # the trainer's GPUs: the training GPU and the one that warmed up
    mine = [held(demo, g) for g in (0, 3)]
    assert users[trainer]["allocated_gpu_hours"] * 3600 == pytest.approx(sum(s for s, _ in mine), rel=0.01)
    assert users[trainer]["energy_kwh"] == pytest.approx(sum(k for _, k in mine), rel=0.01)
    assert users[server]["allocated_gpu_hours"] * 3600 == pytest.approx(held(demo, 1)[0], rel=0.01)
    # the run holds the training GPU the whole week
    (run,) = [r for r in usage(demo, "run")["rows"] if r["group"]["run"] == TRAINING_RUN]
    assert run["allocated_gpu_hours"] * 3600 == pytest.approx(held(demo, 0)[0], rel=0.01)
    assert run["allocated_gpu_hours"] > 6.9 * 24 and run["energy_kwh"] == pytest.approx(
        held(demo, 0)[1], rel=0.01
    )


def test_gpuwatch_report_gives_the_week_from_the_data_directory(
    demo: Demo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / "data"
    shutil.copytree(demo.data_dir, copy, ignore=shutil.ignore_patterns("LOCK"))
    span = ["--start", str(demo.start_ms / 1000), "--end", str(demo.end_ms / 1000)]
    assert main(["report", *span, "--data-dir", str(copy), "--format", "json"]) == 0
    got = {r["group"]["user"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    page = {r["group"]["user"]: r for r in usage(demo, "user")["rows"]}
    assert got.keys() == page.keys()
    for user, r in page.items():
        assert got[user]["allocated_gpu_hours"] == pytest.approx(r["allocated_gpu_hours"])
        assert got[user]["idle_held_gpu_hours"] == pytest.approx(r["idle_held_gpu_hours"])
        assert got[user]["energy_kwh"] == pytest.approx(r["energy_kwh"])


def test_the_cluster_page_s_charts_reach_back_seven_days(demo: Demo) -> None:
    twin = demo.client.get("/api/ui/cluster").get_json()
    end_s, step = demo.end_ms / 1000, 1800
    for panel in twin["panels"]:
        if panel["id"] not in ("util", "power", "allocation", "memory"):
            continue
        expr = panel["query"].replace("$host_re", twin["variables"]["host_re"])
        q = {"query": expr, "start": str(end_s - WEEK_S), "end": str(end_s), "step": str(step)}
        result = demo.client.get("/api/v1/query_range", query_string=q).get_json()["data"]["result"]
        assert result, panel["id"]
        first = min(float(r["values"][0][0]) for r in result)
        assert first <= end_s - WEEK_S + step, panel["id"]


def test_the_live_demo_goes_on_from_the_history_without_a_reset(demo: Demo) -> None:
    """Every counter's first live value is at or above its last stored one, and close to it."""
    after = {
        (s.name, s.labels): (float(s.values[-1]), int(s.timestamps_ms[-1]))
        for s in demo.rt.store.select(
            [
                Matcher(
                    "__name__",
                    "=~",
                    "gpuwatch_usage_.*|gpuwatch_user_.*|gpuwatch_pcie_.*|DCGM_FI_DEV_TOTAL_ENERGY.*",
                )
            ],
            demo.end_ms - 1,
            demo.end_ms,
        )
    }
    assert {name for name, _ in after} >= {
        "gpuwatch_usage_allocated_gpu_seconds_total",
        "gpuwatch_user_gpu_seconds_total",
        "gpuwatch_pcie_tx_bytes_total",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    }
    for key, (value, t) in after.items():
        assert t == demo.end_ms
        last = demo.before[key]
        assert value >= last, key
        if key[0].endswith("seconds_total"):
            assert value - last <= 20 * 4, key  # the 16 s since the history's last tick, per GPU at most


def test_an_existing_store_or_the_setting_gets_no_history(tmp_path: Path) -> None:
    clock = FakeClock(START + 60)
    off = {"data_dir": str(tmp_path / "data"), "demo": True, "demo_gpus": 2, "demo_history": False}
    rt = build_runtime(load(None, {}, off), "lab-1", clock=clock)
    try:
        assert rt.store.stats()["samples"] == 0
        rt.jobs.run("sample")
    finally:
        rt.close()
    rt = build_runtime(load(None, {}, {**off, "demo_history": True}), "lab-1", clock=clock)
    try:  # a store with samples: nothing is mixed into it
        assert 0 < rt.store.stats()["samples"] < 1000
    finally:
        rt.close()
