"""Tail training log files: new lines, figures their regexes pull out, and counts of known failures.

One `LogTailer.poll(now_ms)` call a round reads what was appended to every configured file since the
last round (at most `max_bytes_per_round` a file, so one huge file cannot stall the rest) and returns
plain data; the caller stores it. Rotation (the path now names another inode) finishes the old file
first, then reads the new one from its start; truncation (the file is shorter than what was read)
starts again at 0; a line without its newline yet waits for the next round. The offset returned for
each file is the byte after its last complete line, so a tailer built with the offsets stored before
a restart reads nothing twice and skips nothing.

Lines read in one round are stamped one millisecond apart, ending at the read time, so figures from
a backlog (a file read from its start) keep their order and none overwrites another.
"""

from __future__ import annotations

import glob as globmod
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol

from gpuwatch.collect.logconfig import LogFileConfig
from gpuwatch.core.model import Batch, LogLine, LogOffset, MetricInfo, Sample, stable_labels

MAX_BYTES_PER_ROUND = 4 * 1024 * 1024
MAX_LINE_CHARS = 4096

DETECTORS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("cuda_oom", re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|CUDA error: out of memory")),
    (
        "nccl_error",
        re.compile(r"NCCL (WARN|ERROR)|Watchdog caught collective operation timeout|NCCL timeout"),
    ),
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
    ("nan_loss", re.compile(r"loss[:= ]+(nan|inf)", re.IGNORECASE)),
)

_LEVELS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("ERROR", re.compile(r"\b(ERROR|CRITICAL|FATAL)\b|Traceback \(most recent call last\)", re.IGNORECASE)),
    ("WARN", re.compile(r"\bWARN(ING)?\b", re.IGNORECASE)),
    ("INFO", re.compile(r"\bINFO\b", re.IGNORECASE)),
    ("DEBUG", re.compile(r"\bDEBUG\b", re.IGNORECASE)),
)

LOG_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "gpuwatch_log_events_total",
        "counter",
        "Log lines matching a known failure (cuda_oom, nccl_error, traceback, nan_loss) since start.",
        "",
        ("kind", "run", "file"),
    ),
    MetricInfo(
        "gpuwatch_log_lines_total", "counter", "Lines read from each tailed log file.", "", ("run", "file")
    ),
    MetricInfo(
        "gpuwatch_log_parse_errors_total",
        "counter",
        "Figures a log pattern matched that are not numbers (skipped).",
        "",
        ("run", "file"),
    ),
)


def detect_event(text: str) -> str | None:
    """Return the first known failure (DETECTORS' kind: cuda_oom, nccl_error, traceback, nan_loss) a
    line tells of, else None."""
    for kind, pattern in DETECTORS:
        if pattern.search(text):
            return kind
    return None


def guess_level(text: str) -> str:
    """Return ERROR, WARN, INFO or DEBUG as the line's words suggest, else ''."""
    for level, pattern in _LEVELS:
        if pattern.search(text):
            return level
    return ""


class FileSystem(Protocol):
    """What the tailer needs from the file system (tests may pass their own)."""

    def glob(self, pattern: str) -> list[str]:
        """Return the paths `pattern` names now (a plain path names itself)."""
        ...

    def stat(self, path: str) -> tuple[int, int] | None:
        """Return (inode, size) of `path`, or None if it does not exist."""
        ...

    def open(self, path: str) -> BinaryIO:
        """Open `path` for reading bytes; raise OSError if it cannot be."""
        ...


class OsFileSystem:
    """The real file system."""

    def glob(self, pattern: str) -> list[str]:
        pattern = os.path.expanduser(pattern)
        if globmod.has_magic(pattern):
            return sorted(p for p in globmod.glob(pattern) if os.path.isfile(p))
        return [pattern]

    def stat(self, path: str) -> tuple[int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_ino, st.st_size

    def open(self, path: str) -> BinaryIO:
        return open(path, "rb")  # kept open across rounds, so a rotated file can be finished


class LogRound(NamedTuple):
    """What one round read: lines to store, offsets to store with them, and samples."""

    lines: list[LogLine]
    offsets: list[LogOffset]
    batches: list[Batch]


@dataclass
class _Source:
    run: str
    job: str
    patterns: tuple[re.Pattern[str], ...]


@dataclass
class _File:
    path: str
    source: _Source
    handle: BinaryIO
    inode: int
    pos: int
    pending: bytes = b""
    reported: int | None = None
    lines: int = 0
    parse_errors: int = 0
    events: dict[str, int] = field(default_factory=dict)

    @property
    def committed(self) -> int:
        return self.pos - len(self.pending)


class LogTailer:
    """Tail the files `configs` name; `offsets` are those stored by an earlier run (path -> offset)."""

    def __init__(
        self,
        configs: Sequence[LogFileConfig],
        *,
        offsets: Iterable[LogOffset] = (),
        fs: FileSystem | None = None,
        max_bytes_per_round: int = MAX_BYTES_PER_ROUND,
        max_line_chars: int = MAX_LINE_CHARS,
    ) -> None:
        self._configs = [
            (c, _Source(c.run, c.job, tuple(re.compile(p) for p in c.patterns))) for c in configs
        ]
        self._stored: Mapping[str, LogOffset] = {o.path: o for o in offsets}
        self._fs = fs or OsFileSystem()
        self._cap = max_bytes_per_round
        self._max_chars = max_line_chars
        self._files: dict[str, _File] = {}
        self._rounds = 0
        self._last_ms = 0

    def poll(self, now_ms: int) -> LogRound:
        """Read what is new in every file and return it (the 'logs' job calls this every second)."""
        raw: list[tuple[_File, str]] = []
        for config, source in self._configs:
            for path in self._fs.glob(config.path):
                if path not in self._files:
                    self._track(path, config, source)
        for f in self._files.values():
            raw.extend((f, text) for text in self._read(f))
        self._rounds += 1
        lines, batches = self._process(raw, now_ms)
        offsets = []
        for f in self._files.values():
            if f.reported != f.committed:
                offsets.append(LogOffset(f.path, f.inode, f.committed))
                f.reported = f.committed
        batches.append(Batch(now_ms, self._counters()))
        return LogRound(lines, offsets, batches)

    def close(self) -> None:
        """Close every open file."""
        for f in self._files.values():
            f.handle.close()
        self._files.clear()

    # -- reading ------------------------------------------------------------------------------------
    def _track(self, path: str, config: LogFileConfig, source: _Source) -> None:
        st = self._fs.stat(path)
        if st is None:
            return
        inode, size = st
        stored = self._stored.get(path)
        if stored is not None and stored.inode == inode:
            start = stored.offset if stored.offset <= size else 0  # truncated while we were away
        elif stored is not None:
            start = 0  # rotated while we were away: the new file is all new
        elif self._rounds == 0 and not config.from_beginning:
            start = size  # history present at start-up is skipped; files that appear later are new
        else:
            start = 0
        try:
            handle = self._fs.open(path)
            handle.seek(start)
        except OSError:
            return
        run = source.run or Path(path).stem
        self._files[path] = _File(path, _Source(run, source.job, source.patterns), handle, inode, start)

    def _read(self, f: _File) -> list[str]:
        out: list[str] = []
        for _ in range(3):  # the old file's rest, then a rotated or truncated file's start
            try:
                data = f.handle.read(self._cap)
            except OSError:
                data = b""
            f.pos += len(data)
            out.extend(self._split(f, data))
            if len(data) >= self._cap:
                return out  # more next round
            st = self._fs.stat(f.path)
            if st is None:
                return out  # gone for now; a new file under the path is a rotation
            inode, size = st
            if inode != f.inode:
                if f.pending:
                    out.append(self._decode(f.pending))
                    f.pending = b""
                try:
                    handle = self._fs.open(f.path)
                except OSError:
                    return out
                f.handle.close()
                f.handle, f.inode, f.pos, f.reported = handle, inode, 0, None
            elif size < f.pos:
                f.handle.seek(0)
                f.pos, f.pending = 0, b""
            else:
                return out
        return out

    def _split(self, f: _File, data: bytes) -> list[str]:
        if not data:
            return []
        buf = f.pending + data
        parts = buf.split(b"\n")
        f.pending = parts.pop()
        if len(f.pending) >= self._cap:  # a "line" this long is a binary file; do not hold it forever
            parts.append(f.pending)
            f.pending = b""
        return [self._decode(p) for p in parts]

    def _decode(self, raw: bytes) -> str:
        return raw.decode("utf-8", errors="replace").rstrip("\r")

    # -- extraction ---------------------------------------------------------------------------------
    def _process(self, raw: list[tuple[_File, str]], now_ms: int) -> tuple[list[LogLine], list[Batch]]:
        kept = [(f, text) for f, text in raw if text.strip()]
        base = max(now_ms - len(kept) + 1, self._last_ms + 1)
        lines: list[LogLine] = []
        batches: list[Batch] = []
        for i, (f, text) in enumerate(kept):
            t_ms = base + i
            self._last_ms = t_ms
            f.lines += 1
            for kind, pattern in DETECTORS:
                if pattern.search(text):
                    f.events[kind] = f.events.get(kind, 0) + 1
            samples = self._figures(f, text)
            if samples:
                batches.append(Batch(t_ms, samples))
            lines.append(LogLine(t_ms, f.path, f.source.run, guess_level(text), text[: self._max_chars]))
        return lines, batches

    def _figures(self, f: _File, text: str) -> list[Sample]:
        out: list[Sample] = []
        labels = stable_labels({"run": f.source.run, "job": f.source.job})
        for pattern in f.source.patterns:
            m = pattern.search(text)
            if m is None:
                continue
            for group, value in m.groupdict().items():
                if value is None:
                    continue
                try:
                    number = float(value)
                except ValueError:
                    f.parse_errors += 1
                    continue
                out.append(Sample(f"training_{group}", labels, number))
        return out

    def _counters(self) -> list[Sample]:
        out: list[Sample] = []
        for f in self._files.values():
            who = {"run": f.source.run, "file": f.path}
            out.append(Sample("gpuwatch_log_lines_total", stable_labels(who), float(f.lines)))
            out.append(Sample("gpuwatch_log_parse_errors_total", stable_labels(who), float(f.parse_errors)))
            for kind, n in sorted(f.events.items()):
                out.append(
                    Sample("gpuwatch_log_events_total", stable_labels({"kind": kind, **who}), float(n))
                )
        return out
