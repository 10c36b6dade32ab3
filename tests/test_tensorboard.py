"""TensorBoard event files written by the real tensorboardX and torch writers: read, watched as they grow, resumed
after a restart, imported; half-written and corrupt records; the optional libraries missing."""

from __future__ import annotations

import importlib
import os
import shutil
import signal
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from tensorboardX import SummaryWriter

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.cli.main import main
from gpuwatch.collect.importer import PreparedSeries, group_samples
from gpuwatch.collect.tensorboard import TensorBoardWatcher, read_for_import, tb_metric_name
from gpuwatch.collect.tfevents import HEADER_BYTES, load_codec
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.model import Labels, LogOffset, Matcher, RunRecord
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.store import Store
from tests.conftest import Server, clean_env, free_port, wait_until

T0 = 1_790_000_000.0  # the writers' wall time (seconds); the FakeClock runs a little later


@pytest.fixture(autouse=True)
def _no_user_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("GPUWATCH_"):
            monkeypatch.delenv(key)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0 + 3600)


def write_run(logdir: Path, steps: range, *, extras: bool = False) -> None:
    """Write `steps` of loss and lr with the real writer (wall time T0 + step), and optionally a
    histogram, a text and add_scalars' sub-runs."""
    # a writer names its file after the current second: two in one second need their own suffix
    with SummaryWriter(str(logdir), flush_secs=3600, filename_suffix=f".{steps.start}") as w:
        for s in steps:
            w.add_scalar("train/loss", 1.0 / (s + 1), s, walltime=T0 + s)
            w.add_scalar("lr", 0.1, s, walltime=T0 + s)
        if extras:
            s = steps[-1]
            w.add_histogram("weights", np.arange(10.0), s, walltime=T0 + s)
            w.add_text("notes", "ERROR diverged at the end", s, walltime=T0 + s)
            w.add_scalars("acc", {"top1": 0.5, "top5": 0.9}, s, walltime=T0 + s)


def event_files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if "tfevents" in p.name)


def poll_all(w: TensorBoardWatcher) -> dict[tuple[str, str], list[tuple[int, float]]]:
    got = w.poll(0)
    return {
        (s.name, dict(s.labels)["run"]): list(zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True))
        for s in got.series
    }


def counters(w: TensorBoardWatcher) -> dict[str, float]:
    out: dict[str, float] = {}
    for s in w.poll(0).counters:
        key = s.name + "".join(f",{k}={v}" for k, v in s.labels)
        out[key] = s.value
    return out


def require_module(name: str) -> ModuleType:
    """torch (with tensorboard) is installed by .ci/run, not the test extra: skip without it, but fail
    in CI."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if os.environ.get("REQUIRE_TEST_TOOLS") == "1":
            pytest.fail(f"{name} is not installed (.ci/run installs it)")
        pytest.skip(f"{name} is not installed")


def test_tags_become_metric_names_as_the_sdk_makes_them() -> None:
    assert tb_metric_name("train/loss") == "training_train_loss"
    assert tb_metric_name("loss") == "training_loss"
    assert tb_metric_name("lr") == "training_learning_rate"
    assert tb_metric_name("Loss/eval (top-1)") == "training_Loss_eval__top_1_"
    assert tb_metric_name("1st") == "training__1st"
    assert tb_metric_name("training_loss") == "training_loss"


def test_scalars_histograms_text_and_sub_runs(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "exp1", range(3), extras=True)
    w = TensorBoardWatcher([str(tmp_path / "runs")], load_codec())
    got = w.poll(0)
    series = {(s.name, dict(s.labels)["run"]): s for s in got.series}
    loss = series[("training_train_loss", "exp1")]
    assert dict(loss.labels) == {"run": "exp1", "job": "training"}
    assert loss.timestamps_ms.tolist() == [int(T0 * 1000) + 1000 * s for s in range(3)]
    assert loss.values.tolist() == pytest.approx([1.0, 0.5, 1 / 3])
    assert series[("training_learning_rate", "exp1")].values.tolist() == pytest.approx([0.1] * 3)
    assert series[("training_step", "exp1")].values.tolist() == [0.0, 1.0, 2.0]
    # add_scalars writes one folder a key: TensorBoard's runs exp1/acc/top1 and exp1/acc/top5
    assert series[("training_acc", "exp1/acc/top1")].values.tolist() == [0.5]
    assert series[("training_acc", "exp1/acc/top5")].values.tolist() == pytest.approx([0.9])
    assert [(x.run, x.level, x.text) for x in got.lines] == [
        ("exp1", "ERROR", "notes/text_summary: ERROR diverged at the end")
    ]
    c = {(s.name, s.labels): s.value for s in got.counters}
    assert c[("gpuwatch_tensorboard_values_ignored_total", (("kind", "histogram"), ("run", "exp1")))] == 1
    assert c[("gpuwatch_tensorboard_records_skipped_total", (("run", "exp1"),))] == 0
    # 1 file-version event + 6 scalars + histogram + text
    assert c[("gpuwatch_tensorboard_records_total", (("run", "exp1"),))] == 9
    assert {(u.name, u.time_ms, u.last_step) for u in got.runs} >= {
        ("exp1", int(T0 * 1000), None),
        ("exp1", int(T0 * 1000) + 2000, 2.0),
    }
    assert w.poll(0).series == []  # nothing new


def test_torch_writer_old_and_new_style_scalars(tmp_path: Path) -> None:
    torch = require_module("torch")
    TorchWriter = require_module("torch.utils.tensorboard").SummaryWriter

    with TorchWriter(str(tmp_path / "runs" / "llama"), flush_secs=3600) as w:
        w.add_scalar("Loss/train", torch.tensor(2.5), 0, walltime=T0)  # simple_value
        w.add_scalar("Loss/train", 2.0, 1, walltime=T0 + 1, new_style=True)  # a tensor, plugin "scalars"
        w.add_scalar("grad_norm", 0.75, 1, walltime=T0 + 1, new_style=True)
        w.add_histogram("w", torch.arange(10.0), 1, walltime=T0 + 1)
        w.add_text("config", "lr=3e-4", 0, walltime=T0)
    got = TensorBoardWatcher([str(tmp_path / "runs")], load_codec()).poll(0)
    series = {s.name: s.values.tolist() for s in got.series}
    assert series == {
        "training_Loss_train": [2.5, 2.0],
        "training_grad_norm": [0.75],
        "training_step": [0.0, 1.0],
    }
    assert [x.text for x in got.lines] == ["config/text_summary: lr=3e-4"]
    c = {(s.name, s.labels): s.value for s in got.counters}
    assert c[("gpuwatch_tensorboard_values_ignored_total", (("kind", "histogram"), ("run", "llama")))] == 1


def test_a_run_silent_for_5_minutes_is_finished_and_started_again_by_new_events(tmp_path: Path) -> None:
    ms = int(T0 * 1000)
    write_run(tmp_path / "runs" / "r", range(3))  # newest event at T0 + 2 s
    w = TensorBoardWatcher([str(tmp_path / "runs")], load_codec())

    def updates(now_ms: int) -> list[tuple[str, int, float | None]]:
        return [(u.action, u.time_ms, u.last_step) for u in w.poll(now_ms).runs]

    assert updates(ms + 60_000) == [("init", ms, None), ("seen", ms + 2000, 2.0)]
    assert updates(ms + 2000 + 300_000) == []  # 5 minutes: not yet
    assert updates(ms + 2000 + 300_001) == [("finish", ms + 2000, 2.0)]
    assert updates(ms + 3_600_000) == []
    write_run(tmp_path / "runs" / "r", range(3, 4))  # the run goes on (step 3 at T0 + 3 s)
    assert updates(ms + 3_600_000) == [
        ("init", ms + 3000, None),
        ("seen", ms + 3000, 3.0),
        ("finish", ms + 3000, 3.0),
    ]
    # a gpuwatch that stopped while the run was running finishes it once its files stay quiet
    offsets = [LogOffset(str(f), f.stat().st_ino, f.stat().st_size) for f in event_files(tmp_path / "runs")]
    left = RunRecord("r", "running", ms, None, None, None, None, None, 3.0, ms + 3000)
    w = TensorBoardWatcher([str(tmp_path / "runs")], load_codec(), offsets=offsets, runs=[left])
    assert updates(ms + 3000 + 60_000) == []
    assert updates(ms + 3000 + 400_000) == [("finish", ms + 3000, 3.0)]


def test_two_steps_in_one_millisecond_both_stay(tmp_path: Path) -> None:
    with SummaryWriter(str(tmp_path / "r"), flush_secs=3600) as w:
        for s in range(3):
            w.add_scalar("loss", float(s), s, walltime=T0)
    got = poll_all(TensorBoardWatcher([str(tmp_path)], load_codec()))
    ms = int(T0 * 1000)
    assert got[("training_loss", "r")] == [(ms, 0.0), (ms + 1, 1.0), (ms + 2, 2.0)]


def test_half_written_last_record_is_waited_for(tmp_path: Path) -> None:
    write_run(tmp_path / "src", range(4))
    (src,) = event_files(tmp_path / "src")
    data = src.read_bytes()
    whole = poll_all(TensorBoardWatcher([str(tmp_path / "src")], load_codec()))
    watched = tmp_path / "runs" / "r"
    watched.mkdir(parents=True)
    dst = watched / src.name
    cut = len(data) - 7  # inside the last record
    dst.write_bytes(data[:cut])
    w = TensorBoardWatcher([str(tmp_path / "runs")], load_codec())
    first = poll_all(w)
    assert [v for _, v in first[("training_step", "r")]] == [0.0, 1.0, 2.0, 3.0]
    assert len(first[("training_learning_rate", "r")]) == 3  # step 3's lr is the half-written record
    assert poll_all(w) == {}
    with dst.open("ab") as f:
        f.write(data[cut:])
    second = poll_all(w)
    assert second == {
        ("training_learning_rate", "r"): whole[("training_learning_rate", "src")][-1:],
        ("training_step", "r"): whole[("training_step", "src")][-1:],
    }
    assert counters(w)["gpuwatch_tensorboard_records_skipped_total,run=r"] == 0


def test_corrupt_records_are_skipped_and_counted(tmp_path: Path) -> None:
    write_run(tmp_path / "src", range(6))
    (src,) = event_files(tmp_path / "src")
    data = bytearray(src.read_bytes())
    # record offsets: walk the framing
    offsets, p = [], 0
    while p < len(data):
        offsets.append(p)
        p += HEADER_BYTES + int.from_bytes(data[p : p + 8], "little") + 4
    # records: the file version, then loss and lr of each step
    data[offsets[4] + HEADER_BYTES + 2] ^= 0x40  # a byte of record 4's data (step 1's lr)
    data[offsets[6] + 1] ^= 0x01  # record 6's length (step 2's lr): its header fails
    d = tmp_path / "runs" / "r"
    d.mkdir(parents=True)
    (d / src.name).write_bytes(bytes(data))
    w = TensorBoardWatcher([str(tmp_path / "runs")], load_codec())
    got = poll_all(w)
    assert [v for _, v in got[("training_step", "r")]] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert len(got[("training_train_loss", "r")]) == 6
    assert len(got[("training_learning_rate", "r")]) == 4  # steps 1 and 2 lost their lr
    c = counters(w)
    assert c["gpuwatch_tensorboard_records_skipped_total,run=r"] == 2
    assert c["gpuwatch_tensorboard_records_total,run=r"] == 1 + 12 - 2


def test_events_without_a_usable_wall_time_are_skipped_and_counted(tmp_path: Path) -> None:
    with SummaryWriter(str(tmp_path / "r"), flush_secs=3600) as w:
        w.add_scalar("loss", 1.0, 0, walltime=float("nan"))
        w.add_scalar("loss", 2.0, 1, walltime=1e12)
        w.add_scalar("loss", 3.0, 2, walltime=T0)
    w = TensorBoardWatcher([str(tmp_path)], load_codec())
    assert poll_all(w)[("training_loss", "r")] == [(int(T0 * 1000), 3.0)]
    assert counters(w)["gpuwatch_tensorboard_records_skipped_total,run=r"] == 2


def test_a_backlog_is_read_over_several_rounds(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "a", range(3))
    write_run(tmp_path / "runs" / "b", range(3))
    # rounds smaller than one record still read a whole record; the poll's budget stops after one file
    w = TensorBoardWatcher(
        [str(tmp_path / "runs")], load_codec(), max_bytes_per_round=20, max_bytes_per_poll=1
    )
    rounds = [poll_all(w) for _ in range(14)]
    assert [sorted({run for _, run in r}) for r in rounds if r][:2] == [["a"], ["a"]]
    steps = {
        run: [
            v
            for r in rounds
            for (name, rn), pts in r.items()
            if name == "training_step" and rn == run
            for _, v in pts
        ]
        for run in "ab"
    }
    assert steps == {"a": [0.0, 0.0, 1.0, 1.0, 2.0, 2.0], "b": [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]}
    assert poll_all(w) == {}


def test_a_file_that_is_replaced_is_read_again(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "r", range(2))
    w = TensorBoardWatcher([str(tmp_path / "runs")], load_codec())
    assert len(poll_all(w)[("training_step", "r")]) == 2
    (f,) = event_files(tmp_path / "runs")
    data = f.read_bytes()
    f.unlink()
    f.write_bytes(data[: len(data) // 2])  # a new inode, shorter
    assert ("training_step", "r") in poll_all(w)


# -- through the runtime: the job, the store, restarts --------------------------------------------------


def open_runtime(tmp_path: Path, clock: FakeClock, **extra: object) -> Runtime:
    overrides: dict[str, object] = {"data_dir": str(tmp_path / "data"), "demo": True, "demo_sources": False}
    overrides.update(extra)
    settings = load(None, {}, overrides)
    nvml = FakeNvml(gpu_count=1, clock=clock, blocking_event_wait=False)
    return build_runtime(settings, "node-1", clock=clock, nvml=nvml)


def stored(store: Store, name: str, run: str) -> list[tuple[int, float]]:
    found = store.select(
        [Matcher("__name__", "=", name), Matcher("run", "=", run)], 0, int((T0 + 10**6) * 1000)
    )
    assert len(found) <= 1
    if not found:
        return []
    return list(zip(found[0].timestamps_ms.tolist(), found[0].values.tolist(), strict=True))


def test_watched_folder_grows_and_survives_a_restart_without_duplicates(
    tmp_path: Path, clock: FakeClock
) -> None:
    runs = tmp_path / "runs"
    tb = {"tensorboard_dirs": [str(runs)]}
    rt = open_runtime(tmp_path, clock, **tb)
    try:
        assert "tensorboard" in rt.jobs.names()
        write_run(runs / "exp1", range(3))
        assert rt.jobs.run("tensorboard")
        rt.store.flush()
        assert [v for _, v in stored(rt.store, "training_step", "exp1")] == [0.0, 1.0, 2.0]
        write_run(runs / "exp2", range(2))  # a new run while watched
        clock.advance(5)
        rt.jobs.run("tensorboard")
        rt.store.flush()
        assert [v for _, v in stored(rt.store, "training_step", "exp2")] == [0.0, 1.0]
        runs_listed = {r.name: r for r in rt.store.runs()}
        assert runs_listed["exp1"].last_step == 2.0 and runs_listed["exp1"].start_ms == int(T0 * 1000)
    finally:
        rt.close()
    # the trainer goes on (its writer appends to a new file, as a resumed run does) while we are down
    write_run(runs / "exp1", range(3, 5))
    clock.advance(60)
    rt = open_runtime(tmp_path, clock, **tb)
    try:
        rt.jobs.run("tensorboard")
        clock.advance(5)
        rt.jobs.run("tensorboard")
        rt.store.flush()
        steps = stored(rt.store, "training_step", "exp1")
        assert [v for _, v in steps] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert len({t for t, _ in steps}) == 5
        loss = stored(rt.store, "training_train_loss", "exp1")
        assert [v for _, v in loss] == pytest.approx([1.0, 1 / 2, 1 / 3, 1 / 4, 1 / 5])
        assert [v for _, v in stored(rt.store, "training_step", "exp2")] == [0.0, 1.0]
        (records,) = rt.store.select(
            [Matcher("__name__", "=", "gpuwatch_tensorboard_records_total"), Matcher("run", "=", "exp1")],
            clock.now_ms() - 1,
            clock.now_ms(),
        )
        assert records.values.tolist() == [5.0]  # since this start: the new file only
        exp1 = {r.name: r for r in rt.store.runs()}["exp1"]
        # its newest event is an hour old: finished at it, so the stall alert has nothing to report
        assert (exp1.status, exp1.last_step, exp1.end_ms) == ("ok", 4.0, int(T0 * 1000) + 4000)
        assert exp1.start_ms == int(T0 * 1000)
    finally:
        rt.close()


def test_import_folder_then_watch_it_stores_each_sample_once(
    tmp_path: Path, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = tmp_path / "runs"
    write_run(runs / "exp1", range(3), extras=True)
    data = str(tmp_path / "data")
    assert main(["import", str(runs), "--data-dir", data]) == 0
    out = capsys.readouterr().out
    assert out == (
        f"imported 13 samples in 7 series from {runs} (3 event file(s); 13 records; "
        "values not stored: 1 histogram, 1 text)\n"
    )
    rt = open_runtime(tmp_path, clock, tensorboard_dirs=[str(runs)])
    try:
        assert {(r.name, r.status) for r in rt.store.runs()} == {
            ("exp1", "ok"),
            ("exp1/acc/top1", "ok"),
            ("exp1/acc/top5", "ok"),
        }
        before = stored(rt.store, "training_train_loss", "exp1")
        rt.jobs.run("tensorboard")
        rt.store.flush()
        assert stored(rt.store, "training_train_loss", "exp1") == before
        assert len(stored(rt.store, "training_step", "exp1")) == 3
    finally:
        rt.close()


def test_import_one_event_file_and_bad_targets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path / "exp9", range(2))
    (f,) = event_files(tmp_path / "exp9")
    renamed = tmp_path / "exp9" / "trace.bin"  # found by its content, not its name
    shutil.copy(f, renamed)
    data = str(tmp_path / "data")
    assert main(["import", str(renamed), "--data-dir", data]) == 0
    assert capsys.readouterr().out.startswith(
        f"imported 6 samples in 3 series from {renamed} (1 event file(s)"
    )
    (tmp_path / "empty").mkdir()
    assert main(["import", str(tmp_path / "empty"), "--data-dir", data]) == 1
    assert capsys.readouterr().err == (
        f"gpuwatch: {tmp_path / 'empty'}: no TensorBoard event files (names containing 'tfevents')\n"
    )
    assert main(["import", str(tmp_path / "gone.tfevents"), "--data-dir", data]) == 2
    assert (
        capsys.readouterr().err
        == f"gpuwatch: cannot read {tmp_path / 'gone.tfevents'}: no such file or folder\n"
    )


def test_url_import_bodies_keep_within_the_push_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from gpuwatch.cli import tbimport

    with SummaryWriter(str(tmp_path / "wide"), flush_secs=3600) as w:
        for i in range(2500):  # one step of 2,500 tags, all in one millisecond
            w.add_scalar(f"layer{i}/grad_norm", float(i), 7, walltime=T0)
        for s in range(1, 50):
            w.add_scalar("loss", 1.0 / s, 7 + s, walltime=T0 + s)
    ev = tbimport.prepare_events(str(tmp_path / "wide"), now_ms=0, limits=load(None, {}, {}).label_limits)
    monkeypatch.setattr(tbimport, "POST_BYTES", 20_000)
    monkeypatch.setattr(tbimport, "POST_OBJECTS", 10)
    bodies = tbimport._bodies(tbimport.push_objects(ev))
    sent = [obj for b in bodies for obj in json.loads(b)]
    sizes = [(len(b), len(json.loads(b))) for b in bodies]
    assert all(n <= 10 and (size <= 20_000 or n == 1) for size, n in sizes), sizes  # one big object alone
    assert max(len(o["metrics"]) for o in sent) == 1000
    got = {(name, o["time"]): v for o in sent for name, v in o["metrics"].items()}
    want = {
        (s.name, t / 1000): v
        for s in ev.prepared.series
        if s.name != "training_step"
        for t, v in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True)
    }
    assert got == want and len(got) == 2500 + 49
    assert sorted({(o["time"], o["step"]) for o in sent})[:2] == [(T0, 7), (T0 + 1, 8)]


def test_read_for_import_matches_the_watcher(tmp_path: Path) -> None:
    write_run(tmp_path / "runs" / "a", range(5), extras=True)
    codec = load_codec()
    imported = read_for_import(codec, str(tmp_path / "runs"))
    watched = TensorBoardWatcher([str(tmp_path / "runs")], codec).poll(0)

    def flat(series: list[PreparedSeries]) -> list[tuple[str, Labels, int, float]]:
        return sorted(
            (s.name, s.labels, t, v)
            for s in series
            for t, v in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True)
        )

    assert flat(group_samples(imported.points, [], now_ms=0)) == flat(watched.series)


def test_missing_libraries_are_one_line(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "google_crc32c", None)  # as if not installed: importing it fails
    with pytest.raises(ConfigError) as e:
        open_runtime(tmp_path, clock, tensorboard_dirs=[str(tmp_path)])
    assert str(e.value) == (
        "config error: tensorboard_dirs is set, but reading TensorBoard event files needs tensorboardX "
        "and google-crc32c: pip install 'gpuwatch[tensorboard]'"
    )
    monkeypatch.setenv("GPUWATCH_TENSORBOARD_DIRS", str(tmp_path))
    argv = [
        "serve",
        "--demo",
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--data-dir",
        str(tmp_path / "d1"),
    ]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"gpuwatch: {e.value}\n"
    assert not list((tmp_path / "d1").rglob("*.duckdb")), "the demo wrote its week before the config error"
    monkeypatch.delenv("GPUWATCH_TENSORBOARD_DIRS")
    (tmp_path / "runs").mkdir()
    assert main(["import", str(tmp_path / "runs"), "--data-dir", str(tmp_path / "d2")]) == 2
    assert capsys.readouterr().err == (
        "gpuwatch: reading TensorBoard event files needs tensorboardX and google-crc32c: "
        "pip install 'gpuwatch[tensorboard]'\n"
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("runs/a,runs/b", ("runs/a", "runs/b")),
        (["~/runs/*"], ("~/runs/*",)),
    ],
)
def test_tensorboard_dirs_setting(raw: object, expected: tuple[str, ...]) -> None:
    assert load(None, {}, {"tensorboard_dirs": raw}).tensorboard_dirs == expected


def test_tensorboard_dirs_bad_value_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"tensorboard_dirs: expected a list of folders or globs"):
        load(None, {}, {"tensorboard_dirs": [3]})


@pytest.mark.slow
def test_served_folder_is_read_while_it_grows_and_after_a_crash_and_import_through_url(
    serve, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    runs = tmp_path / "runs"
    env = clean_env(
        GPUWATCH_FLUSH_INTERVAL="0.5s",
        GPUWATCH_TENSORBOARD_DIRS=str(runs),
        GPUWATCH_TENSORBOARD_INTERVAL="1s",
        GPUWATCH_DEMO_SOURCES="false",
    )

    def steps(srv: Server) -> float:
        resp = srv.get("/api/v1/query", params={"query": 'count_over_time(training_step{run="sft"}[1h])'})
        result = resp.json()["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0

    # torch's writer, whose flush() waits for its queue (tensorboardX's only flushes the file)
    writer = require_module("torch.utils.tensorboard").SummaryWriter(str(runs / "sft"), flush_secs=3600)
    for s in range(3):
        writer.add_scalar("loss", 1.0 / (s + 1), s)
    writer.flush()
    srv = serve("--demo", env=env)
    wait_until(lambda: steps(srv) == 3, 20, "the first 3 steps were not read")
    for s in range(3, 5):  # the writer goes on while watched
        writer.add_scalar("loss", 1.0 / (s + 1), s)
    writer.flush()
    wait_until(lambda: steps(srv) == 5, 20, "the steps written while watched were not read")
    srv.stop(signal.SIGKILL)  # a crash: the offsets are never stored ahead of the samples
    for s in range(5, 7):  # and while gpuwatch is down
        writer.add_scalar("loss", 1.0 / (s + 1), s)
    writer.close()
    srv = serve("--demo", env=env)
    wait_until(lambda: steps(srv) == 7, 20, f"not 7 steps after the restart: {steps(srv)}")
    runs_listed = {r["run"]: r for r in srv.get("/api/v1/runs").json()["data"]}
    assert (runs_listed["sft"]["status"], runs_listed["sft"]["last_step"]) == ("running", 6.0)
    resp = srv.get("/api/v1/query", params={"query": "gpuwatch_tensorboard_records_skipped_total"})
    assert [r["value"][1] for r in resp.json()["data"]["result"]] == ["0"]

    # gpuwatch import --url: the same samples as a local import, and the runs recorded
    other = tmp_path / "other"
    write_run(other / "exp1", range(3), extras=True)
    assert main(["import", str(other), "--url", srv.url]) == 0
    assert capsys.readouterr().out.startswith(
        f"imported 13 samples in 7 series from {other} (3 event file(s)"
    )
    resp = srv.get(
        "/api/v1/query_range",
        params={"query": 'training_train_loss{run="exp1"}', "start": T0, "end": T0 + 2, "step": 1},
    )
    (only,) = resp.json()["data"]["result"]
    assert only["metric"] == {"__name__": "training_train_loss", "run": "exp1", "job": "training"}
    assert [float(v) for _, v in only["values"]] == pytest.approx([1.0, 0.5, 1 / 3])
    listed = {r["run"]: r for r in srv.get("/api/v1/runs").json()["data"]}
    assert {"exp1", "exp1/acc/top1", "exp1/acc/top5"} <= set(listed)
    assert (listed["exp1"]["status"], listed["exp1"]["start"], listed["exp1"]["end"]) == ("ok", T0, T0 + 2)
