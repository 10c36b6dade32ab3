"""The demo trainer's text log, read back through the real log tailer and through the runtime's `logs` job."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.collect.logs import LogTailer
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import make_labels
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.demo.training import TRAINING_LOG_JOB, TRAINING_RUN, TrainingSim, training_log_file
from gpuwatch.query import Engine, Vector

T0 = 1_800_000_000.0


class Recorder:
    """A transport for the SDK that answers 200 and keeps the points sent."""

    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def __call__(self, method: str, url: str, body: Any, timeout: float) -> int:
        with self.lock:
            if isinstance(body, list):
                self.points.extend(body)
        return 200


def trainer(tmp_path: Path, clock: FakeClock, sent: Recorder, **kw: Any) -> TrainingSim:
    return TrainingSim(
        "http://gpuwatch.invalid",
        random.Random(7),
        clock,
        total_steps=300,
        checkpoint_every=100,
        checkpoint_ticks=1,
        log_path=tmp_path / "logs" / "train.log",
        transport=sent,
        **kw,
    )


def test_trainer_log_lines_and_figures_match_what_the_sdk_sent(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    sent = Recorder()
    sim = trainer(tmp_path, clock, sent)
    sim.text_log.max_bytes = 8_000  # type: ignore[union-attr]  # rotate a few times on the way
    tailer = LogTailer([training_log_file(tmp_path / "logs" / "train.log")])
    lines, losses = [], []
    try:
        for _ in range(310):  # 300 steps, 2 checkpoint ticks, then a new run's first steps
            clock.advance(1)
            sim.tick()
            got = tailer.poll(clock.now_ms())
            lines += got.lines
            for batch in got.batches:
                losses += [s.value for s in batch.samples if s.name == "training_loss"]
                for s in batch.samples:
                    if s.name.startswith("training_"):
                        assert s.labels == make_labels({"run": TRAINING_RUN, "job": TRAINING_LOG_JOB})
    finally:
        sim.close()
        tailer.close()
    assert (tmp_path / "logs" / "train.log.1").exists(), "the log was rotated"
    texts = [line.text for line in lines]
    steps = [t for t in texts if " - trainer - step " in t]
    assert len(steps) == 308 and "step 1/300 | loss " in steps[0], "no line lost across rotations"
    assert {line.run for line in lines} == {TRAINING_RUN}
    assert texts[0].endswith(" - INFO - trainer - ***** Running training *****")
    assert texts[0].startswith("2027-01-15 08:00:01,000")  # the injected clock's time, UTC
    assert sum("Saving model checkpoint to" in t for t in texts) == 2
    assert sum("Training completed." in t for t in texts) == 1
    levels = {line.level for line in lines}
    assert levels == {"INFO", "WARN"}, "gradient clipping is logged as a warning now and then"
    sdk = [p["metrics"]["loss"] for p in sent.points if "loss" in p["metrics"]]
    assert losses == [round(v, 4) for v in sdk]  # the same run, as printed with 4 decimals


def test_demo_runtime_tails_its_trainer_log(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    settings = load(None, {}, {"data_dir": str(tmp_path / "d"), "demo": True})
    rt = build_runtime(settings, "h", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
    try:
        assert rt.demo is not None and rt.demo.training is not None and rt.logs is not None
        rt.demo.training.options["transport"] = Recorder()
        for _ in range(30):
            clock.advance(1)
            rt.demo.training.tick()
            rt.jobs.run("logs")
        rt.store.flush()
        result = Engine(rt.store).instant(f'training_loss{{job="{TRAINING_LOG_JOB}"}}', clock.now_ms())
        assert isinstance(result, Vector) and [dict(s.labels)["run"] for s in result] == [TRAINING_RUN]
        assert (tmp_path / "d" / "demo-logs" / "train.log").exists()
        assert not settings.log_files, "the demo's log is not a user setting"
    finally:
        rt.close()
