"""Who used the GPUs: the demo lab on a fake clock, asked through the Usage page's JSON twin and
`gpuwatch report`, finds its users, its training run and the notebook's idle-but-held GPU with the
hours and kWh its own samples give; recorded Slurm and Kubernetes cgroups give the job and the pod."""

from __future__ import annotations

import json
import random
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from flask.testing import FlaskClient
from werkzeug.serving import make_server

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.cli.main import main
from gpuwatch.collect.processes import user_name
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher
from gpuwatch.demo.incidents import NOTEBOOK_GPU, TRAINING_GPUS, IncidentSchedule
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.demo.training import TRAINING_RUN, TrainingSim
from gpuwatch.query.usage import periods
from gpuwatch.web import create_app
from tests.browser import chart_points, wait_panels

START = 1_800_000_000.0  # 2027-01-15 08:00 UTC
TICK_S = 5  # GPUs sampled every 5 s of simulated time
SECONDS = 960  # past the notebook's idle 12:00-15:00
PRICE = 0.3
CGROUPS = Path(__file__).parent / "data" / "cgroup"
CID = "3f4e5d6c7b8a99001122334455667788aabbccddeeff00112233445566778899"
POD_UID = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
SLURM_GPU, POD_GPU = 3, 6  # the warming-up GPU runs in a Slurm job, the second inference GPU in a pod


@dataclass
class Lab:
    data_dir: Path
    client: FlaskClient
    url: str
    end_ms: int
    uuids: dict[int, str]
    samples: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]  # metric -> gpu -> (t_ms, values)
    run_first_ms: int  # the first gpuwatch_run_gpu_info sample of the demo's run
    runs_api: dict[str, Any]


def _recorded_cgroups(data_dir: Path, nvml: FakeNvml) -> None:
    """Put two of the demo's processes in recorded cgroups: a Slurm job (v1) and a pod whose name
    containerd's bundle gives (v2, systemd driver), under the demo's /proc and host root."""
    proc = data_dir / "demo-proc"
    (proc / str(nvml.workload.pid_of(SLURM_GPU)) / "cgroup").write_text((CGROUPS / "slurm-v1").read_text())
    (proc / str(nvml.workload.pid_of(POD_GPU)) / "cgroup").write_text(
        (CGROUPS / "k8s-v2-systemd").read_text()
    )
    bundle = data_dir / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}/config.json"
    bundle.parent.mkdir(parents=True)
    notes = {"io.kubernetes.cri.sandbox-name": "vllm-7b-0", "io.kubernetes.cri.sandbox-namespace": "serving"}
    bundle.write_text(json.dumps({"annotations": notes}))


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    """16 minutes of the demo lab (8 GPUs, its incidents, its training run through the SDK), sampled
    every 5 s, with the runs job every 15 s; then served on 127.0.0.1 for `gpuwatch report --url`."""
    data_dir = tmp_path_factory.mktemp("usage") / "data"
    clock = FakeClock(START)
    settings = load(None, {}, {"data_dir": str(data_dir), "demo": True, "demo_sources": False,
                               "energy_price_per_kwh": PRICE, "sample_interval": TICK_S})  # fmt: skip
    schedule = IncidentSchedule(START, 8)
    nvml = FakeNvml(gpu_count=8, clock=clock, hostname="lab-1", incidents=schedule, blocking_event_wait=False)
    rt = build_runtime(settings, "lab-1", clock=clock, nvml=nvml)
    _recorded_cgroups(data_dir, nvml)
    web = create_app(rt).test_client()

    def transport(method: str, url: str, body: Any, timeout: float) -> int:
        return int(web.open(url.removeprefix("http://gpuwatch.test"), method=method, json=body).status_code)

    training = TrainingSim("http://gpuwatch.test", random.Random(3), clock, total_steps=50_000, incidents=schedule,
                           transport=transport, gpus=[str(i) for i in TRAINING_GPUS], report_process=False)  # fmt: skip
    server = make_server("127.0.0.1", 0, create_app(rt), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    try:
        assert rt.gpu is not None
        for t in range(TICK_S, SECONDS + 1, TICK_S):
            for _ in range(TICK_S):
                clock.advance(1)
                training.tick()
            rt.jobs.run("sample")
            if t % 15 == 0:
                assert training.run is not None and training.run.flush(5)
                rt.store.flush()
                rt.jobs.run("runs")
        rt.store.flush()
        end_ms = clock.now_ms()

        def series(name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
            found = rt.store.select([Matcher("__name__", "=", name)], 0, end_ms)
            return {s.label_dict()["gpu"]: (s.timestamps_ms, s.values) for s in found}

        info = rt.store.select(
            [Matcher("__name__", "=", "gpuwatch_run_gpu_info"), Matcher("run", "=", TRAINING_RUN)], 0, end_ms
        )
        runs_api = {r["run"]: r for r in web.get("/api/v1/runs").get_json()["data"]}
        thread.start()
        yield Lab(
            data_dir,
            web,
            f"http://127.0.0.1:{server.server_port}",
            end_ms,
            {g.index: g.uuid for g in rt.gpu.gpus},
            {n: series(n) for n in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")}
            | {"process": series("gpuwatch_process_gpu_memory_bytes")},
            min(int(s.timestamps_ms[0]) for s in info),
            runs_api,
        )
    finally:
        server.shutdown()
        training.close()
        rt.close()


def held_seconds(lab: Lab, gpu: int, idle: bool | None = None, after_ms: int = 0) -> float:
    """What the samples say: the seconds between consecutive samples of `gpu` that end with a process
    on it (and its utilization under 5 % for `idle`, at least 5 % for not `idle`)."""
    t, util = lab.samples["DCGM_FI_DEV_GPU_UTIL"][str(gpu)]
    held = set(lab.samples["process"].get(str(gpu), (np.array([]), None))[0].tolist())
    total = 0.0
    for k in range(1, len(t)):
        if int(t[k]) in held and int(t[k]) > after_ms and (idle is None or (util[k] < 5) == idle):
            total += (t[k] - t[k - 1]) / 1000
    return total


def energy_kwh(lab: Lab, gpu: int, after_ms: int = 0) -> float:
    """The increase of `gpu`'s energy counter over the samples after `after_ms` (and the one before)."""
    t, mj = lab.samples["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][str(gpu)]
    first = max(0, int(np.searchsorted(t, after_ms, side="right")) - 1)
    return float(mj[-1] - mj[first]) / 3.6e9


def twin(lab: Lab, by: str, **extra: str) -> dict[str, Any]:
    q = {"start": str(START), "end": str(lab.end_ms / 1000), "by": by, **extra}
    r = lab.client.get("/api/ui/usage", query_string=q)
    assert r.status_code == 200, r.get_json()
    return r.get_json()["data"]["report"]


def rows_by(report: dict[str, Any], label: str) -> dict[str, dict[str, Any]]:
    return {r["group"][label]: r for r in report["rows"]}


def test_the_week_s_users_hours_and_kwh_match_the_samples(lab: Lab) -> None:
    report = twin(lab, "user")
    users = rows_by(report, "user")
    trainer, notebook, server = user_name(1000), user_name(1001), user_name(0)
    assert set(users) == {trainer, notebook, server}
    # the notebook's GPU: held all along, idle but held for its 3 minutes, and top of the idle list
    assert held_seconds(lab, NOTEBOOK_GPU, idle=True) == 180.0
    assert report["rows"][0]["group"] == {"user": notebook}
    nb = users[notebook]
    assert nb["idle_held_gpu_hours"] * 3600 == pytest.approx(180.0, rel=0.02)
    assert nb["allocated_gpu_hours"] * 3600 == pytest.approx(held_seconds(lab, NOTEBOOK_GPU), rel=0.01)
    assert nb["busy_gpu_hours"] + nb["idle_held_gpu_hours"] == pytest.approx(nb["allocated_gpu_hours"])
    # the inference GPUs' user: their hours and their energy counters' increase
    serving = [1, 6]
    assert users[server]["allocated_gpu_hours"] * 3600 == pytest.approx(
        sum(held_seconds(lab, g) for g in serving), rel=0.01
    )
    assert users[server]["idle_held_gpu_hours"] == 0
    assert users[server]["energy_kwh"] == pytest.approx(sum(energy_kwh(lab, g) for g in serving), rel=0.01)
    assert users[server]["cost"] == pytest.approx(users[server]["energy_kwh"] * PRICE)
    # the trainer: four training GPUs and the warming-up one (its process from 20 s on, idle 25 s)
    mine = [*TRAINING_GPUS, 3]
    assert users[trainer]["allocated_gpu_hours"] * 3600 == pytest.approx(
        sum(held_seconds(lab, g) for g in mine), rel=0.01
    )
    assert users[trainer]["idle_held_gpu_hours"] * 3600 == pytest.approx(
        sum(held_seconds(lab, g, idle=True) for g in mine), abs=TICK_S
    )
    # every GPU was allocated: the lab's rate is 1, its hours those of 8 GPUs
    total = report["total"]
    assert total["gpu_hours"] * 3600 == pytest.approx(8 * SECONDS, rel=0.01)
    assert total["allocation_rate"] == pytest.approx(
        sum(held_seconds(lab, g) for g in range(8)) / (8 * SECONDS), rel=0.01
    )
    assert total["energy_kwh"] == pytest.approx(sum(r["energy_kwh"] for r in report["rows"]))
    assert report["queries"]["idle_held_gpu_hours"] == (
        "sum by (user) (increase(gpuwatch_usage_idle_held_gpu_seconds_total[$__range]))"
    )


def test_the_demo_run_holds_its_gpus_from_when_they_are_mapped(lab: Lab) -> None:
    run = rows_by(twin(lab, "run"), "run")[TRAINING_RUN]
    after = lab.run_first_ms
    held = sum(held_seconds(lab, g, after_ms=after) for g in TRAINING_GPUS)
    assert held > 3 * SECONDS  # four GPUs for most of the 16 minutes
    assert run["allocated_gpu_hours"] * 3600 == pytest.approx(held, rel=0.01)
    kwh = sum(energy_kwh(lab, g, after_ms=after) for g in TRAINING_GPUS)
    assert run["energy_kwh"] == pytest.approx(kwh, rel=0.02)
    # /api/v1/runs sums the same counters over the run's life (to 30 s before now, and 20 s either side)
    assert run["energy_kwh"] == pytest.approx(lab.runs_api[TRAINING_RUN]["energy_kwh"], rel=0.06)


def test_recorded_slurm_and_kubernetes_cgroups_group_by_job_and_pod(lab: Lab) -> None:
    jobs = {(r["group"]["slurm_job"], r["group"]["user"]): r for r in twin(lab, "job")["rows"]}
    job = jobs[("4242", user_name(1000))]
    assert job["allocated_gpu_hours"] * 3600 == pytest.approx(held_seconds(lab, SLURM_GPU), rel=0.01)
    assert {k for k, _ in jobs} == {"4242", ""}  # everything else runs outside Slurm
    pods = {
        (r["group"]["namespace"], r["group"]["pod"], r["group"]["pod_uid"]): r
        for r in twin(lab, "pod")["rows"]
    }
    pod = pods[("serving", "vllm-7b-0", POD_UID)]
    assert pod["allocated_gpu_hours"] * 3600 == pytest.approx(held_seconds(lab, POD_GPU), rel=0.01)
    assert pod["energy_kwh"] == pytest.approx(energy_kwh(lab, POD_GPU), rel=0.01)
    # the demo's training pods: their uids (no runtime bundle to name them), one per training GPU
    assert len([k for k in pods if k[:2] == ("", "") and k[2]]) == len(TRAINING_GPUS)


def test_hosts_carry_their_allocation_rate(lab: Lab) -> None:
    (host,) = twin(lab, "host")["rows"]
    assert host["group"] == {"Hostname": "lab-1"}
    assert host["gpu_hours"] * 3600 == pytest.approx(8 * SECONDS, rel=0.01)
    assert 0.95 < host["allocation_rate"] <= 1.0  # the warming-up GPU has no process for 20 s


def test_a_day_split_gives_the_same_figures_as_the_whole_range(lab: Lab) -> None:
    whole = rows_by(twin(lab, "user"), "user")
    split = twin(lab, "user", every="day")
    assert len(split["periods"]) == 1 and split["every"] == "day"  # 16 minutes of one UTC day
    for r in split["rows"]:
        assert r["allocated_gpu_hours"] == pytest.approx(whole[r["group"]["user"]]["allocated_gpu_hours"])


def test_periods_follow_utc_days_iso_weeks_and_months() -> None:
    day = 86_400_000
    t0 = 1_767_225_600_000  # 2026-01-01 00:00 UTC, a Thursday
    assert periods(t0 + 3_600_000, t0 + 2 * day + 5, "day") == [
        (t0 + 3_600_000, t0 + day),
        (t0 + day, t0 + 2 * day),
        (t0 + 2 * day, t0 + 2 * day + 5),
    ]
    assert [b for _, b in periods(t0, t0 + 10 * day, "week")] == [
        t0 + 4 * day,
        t0 + 10 * day,
    ]  # Monday the 5th
    assert [b for _, b in periods(t0, t0 + 40 * day, "month")] == [t0 + 31 * day, t0 + 40 * day]


def test_bad_parameters_are_400_with_one_line(lab: Lab) -> None:
    for q, words in [
        ({"by": "team"}, 'invalid parameter "by"'),
        ({"every": "hour"}, 'invalid parameter "every"'),
        ({"start": "yesterday"}, 'invalid parameter "start"'),
        ({"start": "1800000100", "end": "1800000000"}, "end must be after start"),
    ]:
        r = lab.client.get("/api/ui/usage", query_string=q)
        assert r.status_code == 400 and words in r.get_json()["error"], (q, r.get_json())


def test_gpuwatch_report_gives_the_pages_numbers(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the running server (--url): the table, JSON, CSV and Parquet; pandas reads the files."""
    page = rows_by(twin(lab, "user"), "user")
    span = ["--start", str(START), "--end", str(lab.end_ms / 1000), "--url", lab.url]
    assert main(["report", *span, "--format", "json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert rows_by(got, "user") == page
    assert main(["report", *span]) == 0
    table = capsys.readouterr().out
    notebook = user_name(1001)
    lines = table.splitlines()
    assert lines[0].startswith("GPU usage by user, 2027-01-15T08:00:00")
    assert lines[2].split()[:5] == ["user", "allocated_h", "busy_h", "idle_held_h", "idle_%"]
    assert lines[3].split()[0] == notebook  # top idle-but-held first
    total = got["total"]
    assert lines[-1].startswith(f"lab: {total['gpu_hours']:.2f} GPU-hours, allocated ")
    assert lines[-1].endswith(f"{total['cost']:.2f} EUR")
    csv, parquet = tmp_path / "usage.csv", tmp_path / "usage.parquet"
    assert main(["report", *span, "-o", str(csv)]) == 0
    assert main(["report", *span, "--by", "run", "--every", "day", "-o", str(parquet)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {parquet}: 2 rows"
    df = pd.read_csv(csv, parse_dates=["period_start", "period_end"])
    assert list(df.columns[:3]) == ["period_start", "period_end", "user"]
    assert df.set_index("user")["energy_kwh"].to_dict() == pytest.approx(
        {u: r["energy_kwh"] for u, r in page.items()}
    )
    runs = pd.read_parquet(parquet)
    run = runs[runs["run"] == TRAINING_RUN].iloc[0]
    assert run["allocated_gpu_hours"] == pytest.approx(
        rows_by(twin(lab, "run"), "run")[TRAINING_RUN]["allocated_gpu_hours"]
    )
    assert str(run["period_start"].tz) == "UTC"


def test_gpuwatch_report_reads_a_stopped_data_directory(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same report from a copy of the data directory (the lab's gpuwatch still holds its own)."""
    copy = tmp_path / "data"
    shutil.copytree(lab.data_dir, copy, ignore=shutil.ignore_patterns("LOCK"))
    span = ["--start", str(START), "--end", str(lab.end_ms / 1000)]
    assert main(["report", *span, "--data-dir", str(copy), "--format", "json"]) == 0
    got = rows_by(json.loads(capsys.readouterr().out), "user")
    page = rows_by(twin(lab, "user"), "user")
    assert got.keys() == page.keys()
    for user, r in page.items():
        assert got[user]["allocated_gpu_hours"] == pytest.approx(r["allocated_gpu_hours"])
        assert got[user]["energy_kwh"] == pytest.approx(r["energy_kwh"])


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--format", "parquet"], "a parquet report needs -o FILE.parquet"),
        (["--end", "now-8d"], "--end must be after --start"),
        (["--start", "whenever"], "cannot parse"),
        (["--url", "http://127.0.0.1:1"], "cannot reach http://127.0.0.1:1"),
    ],
)
def test_report_errors_are_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    assert main(["report", *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


@pytest.mark.slow
def test_the_usage_page_in_a_browser(lab: Lab, page: Any, tmp_path: Path) -> None:
    """Debian's Chromium on the lab's week: tiles, the busy and idle-held bars, the table top
    idle-but-held first, the charts over time; a split per day adds the period; no console error."""
    view = f"from={int(START * 1000)}&to={lab.end_ms}&refresh=off"
    page.goto(f"{lab.url}/usage?{view}")
    states = wait_panels(page, 20_000)
    assert states == {"usage_bars": "data", "held_by": "data", "idle_by": "data", "allocation": "data"}
    assert page.get_attribute("a[data-nav='usage']", "aria-current") == "page"
    rows = page.locator("#usage-body tr")
    assert rows.count() == 3
    assert rows.nth(0).locator("td.group").inner_text() == user_name(1001)  # the idle-held notebook first
    assert rows.nth(0).locator("td.gw-idle").count() == 1
    report = twin(lab, "user")
    idle = page.locator("#tile-idle_held .value").inner_text()
    assert idle == f"{report['total']['idle_held_gpu_hours']:.2f} h"
    assert chart_points(page, "usage_bars") >= 6 and chart_points(page, "allocation") > 0
    page.screenshot(path=str(tmp_path / "usage.png"), full_page=True)
    assert page.evaluate(
        "() => document.querySelector('#tile-cost').getBoundingClientRect().top"
    ) == page.evaluate(
        "() => document.querySelector('#tile-gpu_hours').getBoundingClientRect().top"
    )  # the six tiles on one row at 1280 px
    page.select_option("#usage-every", "day")
    page.wait_for_url("**every=day**")
    page.locator("#usage-head th", has_text="Period").wait_for()
    page.select_option("#usage-by", "pod")
    page.wait_for_url("**by=pod**")
    page.locator("#usage-body td.group", has_text="serving/vllm-7b-0").wait_for()
    assert page.console.errors == []
