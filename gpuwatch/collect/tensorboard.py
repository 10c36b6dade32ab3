"""Watch TensorBoard run folders (`tensorboard_dirs`): scalars become `training_<tag>{run, job="training"}`.

Each round (the `tensorboard` job) finds every `*tfevents*` file under the configured folders (paths or
globs) and reads what was appended to it since the last round, at most `max_bytes_per_round` a file
and `max_bytes_per_poll` in all (a big backlog is read over several rounds; files read up to date
read nothing, so every file gets its turn).
The run is the event file's folder relative to the matched folder (`runs/exp1/events...` under `runs`
is run `exp1`; a file directly in the matched folder takes that folder's name), as TensorBoard names
runs. A tag becomes a metric name as the SDK makes a logged key one (`train/loss` -> `train_loss`), then
as a training push names it (`training_train_loss`; `loss`, `lr` and the other short names map as in
docs/training.md); every event with a scalar also writes `training_step` at its time.

Samples are stored at the event's wall time, never earlier than the file's previous event, and a new
step at least a millisecond after the previous step, so two steps logged in the same millisecond both
stay. Reading a file again from its start (an import, then the watcher) gives the same times.
Histograms, images, audio and other tensors are not stored but counted; text summaries become log lines
of the run (`/api/v1/logs`). A half-written last record is left for a later round; a record that fails
its checksum (or is not an Event) is skipped and counted. How far each file was read is stored with the
log offsets (path, inode, offset), so a restart goes on where it stopped: nothing read twice, nothing
skipped. A file whose inode changed, or that got shorter, is read again from its start.
"""

from __future__ import annotations

import functools
import glob as globmod
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuwatch.client import metric_name
from gpuwatch.collect.importer import PreparedSeries, group_samples
from gpuwatch.collect.logs import MAX_LINE_CHARS, guess_level
from gpuwatch.collect.push import TRAINING_JOB, training_name
from gpuwatch.collect.tfevents import FOOTER_BYTES, HEADER_BYTES, Codec
from gpuwatch.core.model import (
    Labels,
    LogLine,
    LogOffset,
    MetricInfo,
    RunRecord,
    RunUpdate,
    Sample,
    stable_labels,
)

MAX_BYTES_PER_ROUND = 4 * 1024 * 1024
MAX_BYTES_PER_POLL = 64 * 1024 * 1024
IDLE_FINISH_MS = 5 * 60 * 1000  # no new event this long: the run has ended (TensorBoard never says so)
EVENT_FILE_MARK = "tfevents"  # TensorBoard reads every file whose name contains it

TB_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "gpuwatch_tensorboard_records_total",
        "counter",
        "Records read from a run's TensorBoard event files since start.",
        "",
        ("run",),
    ),
    MetricInfo(
        "gpuwatch_tensorboard_records_skipped_total",
        "counter",
        "TensorBoard event records skipped since start: a checksum failed, or the data is not an event "
        "with a usable wall time.",
        "",
        ("run",),
    ),
    MetricInfo(
        "gpuwatch_tensorboard_values_ignored_total",
        "counter",
        "TensorBoard summary values not stored as samples (histogram, image, audio, other; text goes to "
        "the log lines).",
        "",
        ("run", "kind"),
    ),
)

Point = tuple[str, Labels, int, float]


@functools.lru_cache(maxsize=4096)  # a run logs the same few tags at every step
def tb_metric_name(tag: str) -> str:
    """Return the stored metric name of a TensorBoard tag (`train/loss` -> `training_train_loss`)."""
    return training_name(metric_name(tag))


def find_event_files(pattern: str) -> list[tuple[str, str]]:
    """Return (event file, run) for every event file under the folders `pattern` (a path or glob) names."""
    expanded = os.path.expanduser(pattern)
    roots = sorted(globmod.glob(expanded)) if globmod.has_magic(expanded) else [expanded]
    out: list[tuple[str, str]] = []
    for root in roots:
        if os.path.isfile(root):
            parent = os.path.dirname(os.path.abspath(root))
            out.append((root, os.path.basename(parent) or parent))
            continue
        base = os.path.basename(os.path.abspath(root)) or root
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            rel = os.path.relpath(dirpath, root)
            run = base if rel == "." else rel.replace(os.sep, "/")
            out.extend(
                (os.path.join(dirpath, name), run) for name in sorted(filenames) if EVENT_FILE_MARK in name
            )
    return out


@dataclass
class EventFile:
    """One event file being read: where the next record starts, and what it has given so far."""

    path: str
    run: str
    inode: int = 0
    offset: int = 0
    resyncing: bool = False
    last_ms: int = 0
    last_step: int | None = None
    records: int = 0
    skipped: int = 0
    ignored: dict[str, int] = field(default_factory=dict)

    @property
    def labels(self) -> Labels:
        return stable_labels({"run": self.run, "job": TRAINING_JOB})


class Decoded(NamedTuple):
    """What one read of an event file gave: samples, text lines and the newest (time, step)."""

    points: list[Point]
    lines: list[LogLine]
    first_ms: int | None
    latest: tuple[int, float] | None


def read_file(codec: Codec, f: EventFile, max_bytes: int) -> Decoded | None:
    """Read and decode what follows `f.offset` (at most `max_bytes`, or one whole record); None if the
    file cannot be read now. Moves `f.offset` past every complete record."""
    try:
        with open(f.path, "rb") as handle:
            handle.seek(f.offset)
            buf = handle.read(max_bytes)
            scan = codec.split(buf, resyncing=f.resyncing)
            if scan.end == 0 and not scan.resyncing and len(buf) == max_bytes >= HEADER_BYTES:
                length = int.from_bytes(buf[:8], "little")  # one record longer than a round's bytes
                buf += handle.read(HEADER_BYTES + length + FOOTER_BYTES - len(buf))
                scan = codec.split(buf)
    except OSError:
        return None
    f.offset += scan.end
    f.resyncing = scan.resyncing
    f.skipped += scan.skipped
    return _decode(codec, f, scan.records)


def _decode(codec: Codec, f: EventFile, records: Iterable[bytes]) -> Decoded:
    points: list[Point] = []
    lines: list[LogLine] = []
    first_ms: int | None = None
    latest: tuple[int, float] | None = None
    labels = f.labels
    for data in records:
        f.records += 1
        event = codec.decode(data)
        if event is None or not 0 <= event.wall_time < 1e11:  # not an Event, or no usable time (NaN too)
            f.skipped += 1
            continue
        if not event.values:
            continue  # the file-version event, graphs, session logs
        wall_ms = int(round(event.wall_time * 1000))
        t = max(wall_ms, f.last_ms if event.step == f.last_step else f.last_ms + 1)
        f.last_ms, f.last_step = t, event.step
        scalars = 0
        for v in event.values:
            if v.kind == "scalar":
                points.append((tb_metric_name(v.tag), labels, t, v.value))
                scalars += 1
            elif v.kind == "text":
                text = f"{v.tag}: {v.text}"
                lines.append(LogLine(t, f.path, f.run, guess_level(text), text[:MAX_LINE_CHARS]))
            else:
                f.ignored[v.kind] = f.ignored.get(v.kind, 0) + 1
        if scalars:
            points.append(("training_step", labels, t, float(event.step)))  # last: the step field wins
            first_ms = t if first_ms is None else min(first_ms, t)
            if latest is None or t >= latest[0]:
                latest = (t, float(event.step))
    return Decoded(points, lines, first_ms, latest)


def counter_samples(files: Iterable[EventFile]) -> list[Sample]:
    """Return the records, skipped and ignored counters, summed per run."""
    records: dict[str, int] = {}
    skipped: dict[str, int] = {}
    ignored: dict[tuple[str, str], int] = {}
    for f in files:
        records[f.run] = records.get(f.run, 0) + f.records
        skipped[f.run] = skipped.get(f.run, 0) + f.skipped
        for kind, n in f.ignored.items():
            ignored[(f.run, kind)] = ignored.get((f.run, kind), 0) + n
    out: list[Sample] = []
    for run in sorted(records):
        who = stable_labels({"run": run})
        out.append(Sample("gpuwatch_tensorboard_records_total", who, float(records[run])))
        out.append(Sample("gpuwatch_tensorboard_records_skipped_total", who, float(skipped[run])))
    for (run, kind), n in sorted(ignored.items()):
        labels = stable_labels({"run": run, "kind": kind})
        out.append(Sample("gpuwatch_tensorboard_values_ignored_total", labels, float(n)))
    return out


class TbRound(NamedTuple):
    """What one round read: series to append, counters, text lines and offsets to store, run sightings."""

    series: list[PreparedSeries]
    counters: list[Sample]
    lines: list[LogLine]
    offsets: list[LogOffset]
    runs: list[RunUpdate]


@dataclass
class _RunState:
    newest_ms: int
    step: float | None
    running: bool


def run_updates(run: str, first_ms: int, newest_ms: int, step: float) -> list[RunUpdate]:
    """Return the updates that record a run read from its first event to its newest: (re)started at
    the first, seen at the newest with its step."""
    return [RunUpdate(run, "init", first_ms), RunUpdate(run, "seen", newest_ms, last_step=step)]


class TensorBoardWatcher:
    """Read the event files under `patterns`; `offsets` and `runs` are those stored by an earlier run.

    TensorBoard writes no end-of-run record, so a run whose newest event is `idle_finish_ms` (5 minutes)
    old is recorded as finished (ok) at that event, and started again when a new event arrives: a run
    that ended is not left `running` for the stall alert (which waits 10 minutes) to report.
    """

    def __init__(
        self,
        patterns: Sequence[str],
        codec: Codec,
        *,
        offsets: Iterable[LogOffset] = (),
        runs: Iterable[RunRecord] = (),
        max_bytes_per_round: int = MAX_BYTES_PER_ROUND,
        max_bytes_per_poll: int = MAX_BYTES_PER_POLL,
        idle_finish_ms: int = IDLE_FINISH_MS,
    ) -> None:
        self._patterns = tuple(patterns)
        self._codec = codec
        self._stored = {o.path: o for o in offsets}
        self._cap = max_bytes_per_round
        self._poll_cap = max_bytes_per_poll
        self._files: dict[str, EventFile] = {}
        self._idle_ms = idle_finish_ms
        self._left_running = {r.name: r for r in runs if r.status == "running"}  # by an earlier gpuwatch
        self._runs: dict[str, _RunState] = {}

    def poll(self, now_ms: int) -> TbRound:
        """Read what is new in every event file (the 'tensorboard' job calls this)."""
        for pattern in self._patterns:
            for path, run in find_event_files(pattern):
                if path not in self._files:
                    self._files[path] = self._track(path, run)
        points: list[Point] = []
        lines: list[LogLine] = []
        offsets: list[LogOffset] = []
        seen: dict[str, tuple[int, int, float]] = {}  # run -> first ms, newest ms, its step
        budget = self._poll_cap
        for f in self._files.values():
            if budget <= 0:
                break  # the rest next round
            before = (f.inode, f.offset)
            got = self._read(f)
            budget -= f.offset - before[1] if f.inode == before[0] else f.offset
            if (f.inode, f.offset) != before:
                offsets.append(LogOffset(f.path, f.inode, f.offset))
            if got is None:
                continue
            points.extend(got.points)
            lines.extend(got.lines)
            _note_seen(seen, f.run, got)
        series = group_samples(points, [], now_ms=now_ms)
        runs = self._run_updates(seen, now_ms)
        return TbRound(series, counter_samples(self._files.values()), lines, offsets, runs)

    def _run_updates(self, seen: dict[str, tuple[int, int, float]], now_ms: int) -> list[RunUpdate]:
        out: list[RunUpdate] = []
        for run, (first, newest, step) in sorted(seen.items()):
            state = self._runs.get(run)
            if state is None or not state.running:
                out.extend(run_updates(run, first, newest, step))
            else:
                out.append(RunUpdate(run, "seen", newest, last_step=step))
            if state is None or newest >= state.newest_ms:
                self._runs[run] = _RunState(newest, step, True)
            else:
                state.running = True
        for f in self._files.values():  # runs an earlier gpuwatch left running, with nothing new since
            left = self._left_running.pop(f.run, None)
            if left is not None and f.run not in self._runs:
                self._runs[f.run] = _RunState(left.last_seen_ms or 0, left.last_step, True)
        for run, state in sorted(self._runs.items()):
            if state.running and now_ms - state.newest_ms > self._idle_ms:
                out.append(RunUpdate(run, "finish", state.newest_ms, status="ok", last_step=state.step))
                state.running = False
        return out

    def _track(self, path: str, run: str) -> EventFile:
        f = EventFile(path, run)
        stored = self._stored.get(path)
        try:
            st = os.stat(path)
        except OSError:
            return f
        f.inode = st.st_ino
        if stored is not None and stored.inode == st.st_ino and stored.offset <= st.st_size:
            f.offset = stored.offset
        return f

    def _read(self, f: EventFile) -> Decoded | None:
        try:
            st = os.stat(f.path)
        except OSError:
            return None  # gone for now
        if st.st_ino != f.inode or st.st_size < f.offset:  # replaced or truncated: read it from the start
            f.inode, f.offset, f.resyncing, f.last_ms, f.last_step = st.st_ino, 0, False, 0, None
        if st.st_size == f.offset:
            return None
        return read_file(self._codec, f, self._cap)


@dataclass(frozen=True)
class TbImport:
    """Every event file under a folder (or one file), read whole for `gpuwatch import`."""

    files: int
    points: list[Point]
    records: int
    skipped: int
    ignored: dict[str, int]  # kind -> values not stored (text too: an import stores no log lines)
    runs: dict[str, tuple[int, int, float]]  # run -> first ms, newest ms, its step


def read_for_import(codec: Codec, target: str, *, chunk_bytes: int = 64 * 1024 * 1024) -> TbImport:
    """Read every event file `target` (a folder, as `tensorboard_dirs` names one, or a file) holds."""
    points: list[Point] = []
    files: list[EventFile] = []
    runs: dict[str, tuple[int, int, float]] = {}
    for path, run in find_event_files(target):
        f = EventFile(path, run)
        files.append(f)
        while True:
            before = f.offset
            got = read_file(codec, f, chunk_bytes)
            if got is None:
                break
            points.extend(got.points)
            if got.lines:
                f.ignored["text"] = f.ignored.get("text", 0) + len(got.lines)
            _note_seen(runs, run, got)
            if f.offset == before:
                break  # the end, or a half-written last record
    ignored: dict[str, int] = {}
    for f in files:
        for kind, n in f.ignored.items():
            ignored[kind] = ignored.get(kind, 0) + n
    return TbImport(
        len(files), points, sum(f.records for f in files), sum(f.skipped for f in files), ignored, runs
    )


def _note_seen(seen: dict[str, tuple[int, int, float]], run: str, got: Decoded) -> None:
    """Fold one read's first time and newest (time, step) into `seen[run]`."""
    if got.latest is None or got.first_ms is None:
        return
    old = seen.get(run)
    if old is None:
        seen[run] = (got.first_ms, got.latest[0], got.latest[1])
        return
    newest = got.latest if got.latest[0] >= old[1] else (old[1], old[2])
    seen[run] = (min(old[0], got.first_ms), newest[0], newest[1])
