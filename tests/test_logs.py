"""The log tailer over real files in tmp_path: reading, rotation, truncation, partial lines, detectors."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.app.config import load
from gpuwatch.collect.logconfig import LogFileConfig, parse_log_files
from gpuwatch.collect.logs import LogRound, LogTailer, guess_level
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.model import LogOffset

T0 = 1_790_000_000_000
PATTERNS = (r"step (?P<step>\d+).*loss[:=] ?(?P<loss>[0-9.eE+-]+)", r"lr[:=] ?(?P<learning_rate>[0-9.eE+-]+)")


def texts(r: LogRound) -> list[str]:
    return [x.text for x in r.lines]


def figures(r: LogRound, name: str) -> list[tuple[int, float]]:
    return [(b.timestamp_ms, s.value) for b in r.batches for s in b.samples if s.name == name]


def counter(r: LogRound, name: str, **labels: str) -> float | None:
    for b in r.batches:
        for s in b.samples:
            if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items()):
                return s.value
    return None


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as f:
        f.write(data)


_OPEN: list[LogTailer] = []


@pytest.fixture(autouse=True)
def _close_tailers() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def track(t: LogTailer) -> LogTailer:
    _OPEN.append(t)
    return t


def tailer(path: Path | str, **kw: object) -> LogTailer:
    cfg = LogFileConfig(str(path), patterns=PATTERNS, **kw)  # type: ignore[arg-type]
    return track(LogTailer([cfg]))


def test_first_read_from_beginning(tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    log.write_text("step 1 loss: 2.5\nstep 2 loss: 2.25 lr=3e-4\n")
    r = tailer(log).poll(T0)
    assert texts(r) == ["step 1 loss: 2.5", "step 2 loss: 2.25 lr=3e-4"]
    assert [x.run for x in r.lines] == ["llama", "llama"]
    assert figures(r, "training_loss") == [(T0 - 1, 2.5), (T0, 2.25)]
    assert figures(r, "training_step") == [(T0 - 1, 1.0), (T0, 2.0)]
    assert figures(r, "training_learning_rate") == [(T0, 3e-4)]
    assert r.offsets == [LogOffset(str(log), os.stat(log).st_ino, log.stat().st_size)]
    labels = next(s.labels for b in r.batches for s in b.samples if s.name == "training_loss")
    assert labels == (("run", "llama"),)


def test_from_beginning_false_skips_history_only(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("old line\n")
    t = track(LogTailer([LogFileConfig(str(tmp_path / "*.log"), run="r", from_beginning=False, job="train")]))
    assert texts(t.poll(T0)) == []
    append(log, b"new line\n")
    (tmp_path / "b.log").write_text("later file\n")  # appeared after start: all of it is new
    r = t.poll(T0 + 1000)
    assert sorted(texts(r)) == ["later file", "new line"]
    assert {x.run for x in r.lines} == {"r"}


def test_glob_is_evaluated_every_round(tmp_path: Path) -> None:
    t = track(LogTailer([LogFileConfig(str(tmp_path / "*.log"))]))
    assert texts(t.poll(T0)) == []
    (tmp_path / "x.log").write_text("hello\n")
    (tmp_path / "x.txt").write_text("not matched\n")
    assert texts(t.poll(T0 + 1000)) == ["hello"]


def test_rotation_finishes_old_file_then_reads_new(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("one\n")
    t = tailer(log)
    assert texts(t.poll(T0)) == ["one"]
    append(log, b"two\nthree-partial")
    log.rename(tmp_path / "train.log.1")
    log.write_text("four\n")
    r = t.poll(T0 + 1000)
    assert texts(r) == ["two", "three-partial", "four"]
    assert r.offsets == [LogOffset(str(log), os.stat(log).st_ino, 5)]
    append(log, b"five\n")
    assert texts(t.poll(T0 + 2000)) == ["five"]


def test_truncation_restarts_at_zero(tmp_path: Path) -> None:
    log = tmp_path / "t.log"
    log.write_text("a long first line\nsecond\n")
    t = tailer(log)
    assert len(texts(t.poll(T0))) == 2
    log.write_text("x\n")  # truncated in place (same inode), shorter than what was read
    assert texts(t.poll(T0 + 1000)) == ["x"]


def test_partial_line_waits_for_its_newline(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    log.write_bytes(b"step 7 loss: 1.")
    t = tailer(log)
    r = t.poll(T0)
    assert texts(r) == [] and r.offsets[0].offset == 0
    append(log, b"5\r\n")
    r = t.poll(T0 + 1000)
    assert texts(r) == ["step 7 loss: 1.5"]
    assert figures(r, "training_loss") == [(T0 + 1000, 1.5)]
    assert r.offsets[0].offset == log.stat().st_size


def test_non_utf8_bytes_are_replaced(tmp_path: Path) -> None:
    log = tmp_path / "b.log"
    log.write_bytes(b"caf\xe9 \xff\xfe ok\n")
    assert texts(tailer(log).poll(T0)) == ["caf\ufffd \ufffd\ufffd ok"]


def test_resume_from_stored_offset(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    log.write_text("a\nb\npart")
    first = tailer(log)
    r = first.poll(T0)
    assert texts(r) == ["a", "b"]
    first.close()
    append(log, b"ial\nc\n")
    second = track(LogTailer([LogFileConfig(str(log))], offsets=r.offsets))
    assert texts(second.poll(T0 + 1000)) == ["partial", "c"]
    # Rotated while stopped: the new file is read from its start.
    second.close()
    log.rename(tmp_path / "r.log.1")
    log.write_text("new\n")
    third = track(LogTailer([LogFileConfig(str(log))], offsets=r.offsets))
    assert texts(third.poll(T0 + 2000)) == ["new"]


def test_read_cap_per_round(tmp_path: Path) -> None:
    log = tmp_path / "big.log"
    log.write_bytes(b"".join(b"line %03d\n" % i for i in range(100)))
    t = track(LogTailer([LogFileConfig(str(log))], max_bytes_per_round=90))
    seen: list[str] = []
    for i in range(20):
        seen += texts(t.poll(T0 + i * 1000))
    assert seen == [f"line {i:03d}" for i in range(100)]


def test_long_lines_are_truncated_and_levels_guessed(tmp_path: Path) -> None:
    log = tmp_path / "l.log"
    log.write_text("x" * 10_000 + "\n2026 WARNING low disk\n")
    r = tailer(log).poll(T0)
    assert len(r.lines[0].text) == 4096
    assert r.lines[1].level == "WARN"
    assert guess_level("[ERROR] boom") == "ERROR"
    assert guess_level("INFO step 3") == "INFO"
    assert guess_level("DEBUG x") == "DEBUG"
    assert guess_level("step 3 loss 1.0") == ""


def test_unparsable_numbers_are_skipped_and_counted(tmp_path: Path) -> None:
    log = tmp_path / "u.log"
    log.write_text("step 3 loss: 1.2.3\nstep 4 loss: 0.5\n")
    r = tailer(log).poll(T0)
    assert [v for _, v in figures(r, "training_loss")] == [0.5]
    assert counter(r, "gpuwatch_log_parse_errors_total") == 1.0
    assert counter(r, "gpuwatch_log_lines_total") == 2.0


def test_detectors_count_and_keep_emitting(tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    log.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n"
        "Traceback (most recent call last):\n"
        "[rank0]: Watchdog caught collective operation timeout\n"
        "NCCL WARN something\n"
        "step 9 Loss = NaN\n"
        "step 10 loss: inf\n"
    )
    t = tailer(log)
    r = t.poll(T0)
    f = str(log)
    assert counter(r, "gpuwatch_log_events_total", kind="cuda_oom", file=f, run="d") == 1.0
    assert counter(r, "gpuwatch_log_events_total", kind="traceback", file=f) == 1.0
    assert counter(r, "gpuwatch_log_events_total", kind="nccl_error", file=f) == 2.0
    assert counter(r, "gpuwatch_log_events_total", kind="nan_loss", file=f) == 2.0
    assert r.lines[1].level == "ERROR"
    quiet = t.poll(T0 + 1000)
    assert texts(quiet) == [] and quiet.offsets == []
    assert counter(quiet, "gpuwatch_log_events_total", kind="cuda_oom") == 1.0
    assert [b.timestamp_ms for b in quiet.batches] == [T0 + 1000]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            [{"path": "/x.log", "patterns": ["(?P<loss>"]}],
            "config error: log_files[0].patterns[0]: invalid regex: ",
        ),
        (
            [{"path": "/x", "patterns": ["a", "(?P<bad"]}],
            "config error: log_files[0].patterns[0]: has no named",
        ),
        (
            [{"path": "/x", "patterns": [r"(?P<a>\d)", "("]}],
            "config error: log_files[0].patterns[1]: invalid regex",
        ),
        ([{"run": "x"}], "config error: log_files[0].path: missing"),
        (
            [{"path": "/x", "from_beginning": "sometimes"}],
            "config error: log_files[0].from_beginning: expected",
        ),
        ([{"path": "/x", "colour": "red"}], "config error: log_files[0].colour: unknown key"),
        ({"path": "/x"}, "config error: log_files: expected a list"),
        ([{"path": "/x"}, 3], "config error: log_files[1]: expected a mapping"),
    ],
)
def test_bad_config(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_log_files(raw)
    assert str(e.value).startswith(message)
    assert "\n" not in str(e.value)


def test_config_from_yaml_file(tmp_path: Path) -> None:
    cfg = tmp_path / "gpuwatch.yml"
    cfg.write_text(
        "log_files:\n"
        "  - path: /data/runs/llama-sft/*.log\n"
        "    run: llama-sft\n"
        r"    patterns: ['step (?P<step>\d+).*loss[:=] ?(?P<loss>[0-9.eE+-]+)']" + "\n"
        "  - /var/log/train.log\n"
    )
    s = load(cfg, {})
    assert s.log_files == (
        LogFileConfig(
            "/data/runs/llama-sft/*.log",
            "llama-sft",
            (r"step (?P<step>\d+).*loss[:=] ?(?P<loss>[0-9.eE+-]+)",),
        ),
        LogFileConfig("/var/log/train.log"),
    )
    assert s.public()["log_files"][0]["run"] == "llama-sft"
    env = load(None, {"GPUWATCH_LOG_FILES": "[{path: /a.log, from_beginning: false}]"})
    assert env.log_files == (LogFileConfig("/a.log", from_beginning=False),)
    with pytest.raises(ConfigError, match=r"^config error: log_files\[0\]\.patterns\[0\]: invalid regex"):
        load(None, {"GPUWATCH_LOG_FILES": "[{path: /a.log, patterns: ['(?P<x>']}]"})
