"""Run Prometheus's PromQL conformance files against gpuwatch's engine (spec: promql-testdata/HARNESS.md).

Usage: python -m tests.promql_harness [--tiers core,extended] [--markdown] [--jsonl FILE]
       [--strict-messages] [--check-range-mode] [--backend store|array] [--floor FILE] [FILE.test ...]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gpuwatch.clock import FakeClock
from gpuwatch.model import STALE_NAN, Matcher, SeriesData, is_stale, make_labels
from gpuwatch.query import Engine, Matrix, PromQLEvalError, PromQLParseError, Scalar, Unsupported, Vector

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = REPO.parent / "shared" / "promql-testdata"
FLOOR_FILE = Path(__file__).resolve().parent / "promql_floor.txt"
TIERS = ("core", "extended", "out")
CASE_TIMEOUT_S = 10.0


class HarnessFileError(Exception):
    """The file is not valid test DSL."""


# -- stores -----------------------------------------------------------------------------------------


class TestStore(Protocol):
    def append(self, labels: dict[str, str], t_ms: int, value: float) -> None: ...
    def prepare(self) -> None: ...
    def clear(self) -> None: ...
    def close(self) -> None: ...
    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]: ...


def _matches(labels: dict[str, str], m: Matcher) -> bool:
    value = labels.get(m.name, "")
    if m.op == "=":
        return value == m.value
    if m.op == "!=":
        return value != m.value
    hit = re.fullmatch(f"(?s:{m.value})", value) is not None
    return hit if m.op == "=~" else not hit


class ArrayStore:
    """A tiny in-memory store over numpy arrays (for comparing with the real store)."""

    def __init__(self) -> None:
        self._pending: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
        self._series: list[tuple[dict[str, str], np.ndarray, np.ndarray]] = []

    def append(self, labels: dict[str, str], t_ms: int, value: float) -> None:
        self._pending.setdefault(tuple(sorted(labels.items())), []).append((t_ms, value))

    def prepare(self) -> None:
        if not self._pending:
            return
        merged: dict[tuple[tuple[str, str], ...], dict[int, float]] = {}
        for labels, t, v in self._series:
            merged[tuple(sorted(labels.items()))] = dict(zip(t.tolist(), v.tolist(), strict=True))
        for key, samples in self._pending.items():
            merged.setdefault(key, {}).update(samples)
        self._pending = {}
        self._series = []
        for key, samples in merged.items():
            ts = sorted(samples)
            self._series.append(
                (
                    dict(key),
                    np.array(ts, dtype=np.int64),
                    np.array([samples[t] for t in ts], dtype=np.float64),
                )
            )

    def clear(self) -> None:
        self._pending = {}
        self._series = []

    def close(self) -> None:
        self.clear()

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        out = []
        for labels, t, v in self._series:
            if all(_matches(labels, m) for m in matchers):
                lo, hi = np.searchsorted(t, start_ms, "left"), np.searchsorted(t, end_ms, "right")
                if hi > lo:
                    out.append(
                        SeriesData(labels.get("__name__", ""), make_labels(labels), t[lo:hi], v[lo:hi])
                    )
        return out


class RealStore:
    """gpuwatch's DuckDB store, in memory; `clear` opens a fresh one."""

    def __init__(self) -> None:
        from gpuwatch.store import Store

        self._open = lambda: Store.open(None, clock=FakeClock(), flush_interval_s=3600.0)
        self._store = self._open()
        self._pending: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}

    def append(self, labels: dict[str, str], t_ms: int, value: float) -> None:
        self._pending.setdefault(tuple(sorted(labels.items())), []).append((t_ms, value))

    def prepare(self) -> None:
        if not self._pending:
            return
        for key, samples in self._pending.items():
            labels = dict(key)
            samples.sort(key=lambda s: s[0])
            t = np.array([s[0] for s in samples], dtype=np.int64)
            v = np.array([s[1] for s in samples], dtype=np.float64)
            self._store.append_series(labels.get("__name__", ""), make_labels(labels), t, v)
        self._pending = {}
        self._store.flush()

    def clear(self) -> None:
        self._store.close()
        self._store = self._open()
        self._pending = {}

    def close(self) -> None:
        self._store.close()

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return self._store.select(matchers, start_ms, end_ms)


# -- the DSL ----------------------------------------------------------------------------------------

_DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNITS = (365 * 86400_000, 7 * 86400_000, 86400_000, 3600_000, 60_000, 1000, 1)


def parse_duration(text: str) -> int:
    """Parse a Prometheus duration (`1h30m`, `10s53ms`, `0`) into milliseconds."""
    text = text.strip()
    if text == "0":
        return 0
    m = _DURATION.match(text)
    if not text or m is None or not any(m.groups()):
        raise HarnessFileError(f"bad duration {text!r}")
    return sum(int(g) * u for g, u in zip(m.groups(), _UNITS, strict=True) if g)


_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
}


def _unquote(text: str, i: int) -> tuple[str, int]:
    """Read a Go-quoted string starting at text[i]; return (value, index after it)."""
    quote = text[i]
    if quote == "`":
        end = text.index("`", i + 1)
        return text[i + 1 : end], end + 1
    out: list[str] = []
    j = i + 1
    while j < len(text):
        ch = text[j]
        if ch == quote:
            return "".join(out), j + 1
        if ch != "\\":
            out.append(ch)
            j += 1
            continue
        nxt = text[j + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            j += 2
        elif nxt == "x":
            out.append(chr(int(text[j + 2 : j + 4], 16)))
            j += 4
        elif nxt == "u":
            out.append(chr(int(text[j + 2 : j + 6], 16)))
            j += 6
        elif nxt == "U":
            out.append(chr(int(text[j + 2 : j + 10], 16)))
            j += 10
        elif nxt in "01234567":
            out.append(chr(int(text[j + 1 : j + 4], 8)))
            j += 4
        else:
            raise HarnessFileError(f"bad escape in {text!r}")
    raise HarnessFileError(f"unterminated string in {text!r}")


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:.]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_.]*")


def parse_series(line: str) -> tuple[dict[str, str], str, bool]:
    """Split `name{l="v"} values` into (labels incl. __name__, values text, has @st)."""
    labels: dict[str, str] = {}
    i = 0
    m = _NAME.match(line, i)
    if m:
        labels["__name__"] = m.group(0)
        i = m.end()
    if i < len(line) and line[i] == "{":
        i += 1
        while True:
            while i < len(line) and line[i] in " \t,":
                i += 1
            if i >= len(line):
                raise HarnessFileError(f"unterminated label set in {line!r}")
            if line[i] == "}":
                i += 1
                break
            if line[i] in "\"'`":
                name, i = _unquote(line, i)
            else:
                lm = _LABEL.match(line, i)
                if not lm:
                    raise HarnessFileError(f"bad label name in {line!r}")
                name, i = lm.group(0), lm.end()
            while line[i] == " ":
                i += 1
            if line[i] != "=":
                if "__name__" not in labels and not labels:  # a quoted metric name: {"name", l="v"}
                    labels["__name__"] = name
                    continue
                raise HarnessFileError(f"expected '=' in {line!r}")
            i += 1
            while line[i] == " ":
                i += 1
            value, i = _unquote(line, i)
            labels[name] = value
    elif not m:
        raise HarnessFileError(f"bad series {line!r}")
    has_st = line.startswith("@st", i)
    if has_st:
        i += 3
    return {k: v for k, v in labels.items() if v != ""}, line[i:].strip(), has_st


def parse_number(text: str) -> float:
    t = text.strip()
    low = t.lower()
    if low in ("inf", "+inf"):
        return math.inf
    if low == "-inf":
        return -math.inf
    if low in ("nan", "+nan", "-nan"):
        return math.nan
    try:
        return float(t)
    except ValueError:
        pass
    try:
        return float(int(t, 0))
    except ValueError:
        raise HarnessFileError(f"bad number {text!r}") from None


_NUM = r"[+-]?(?:[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?|[Ii]nf|NaN|nan)"
_SERIES_ITEM = re.compile(rf"^({_NUM})(?:([+-])({_NUM}))?x(\d+)$")
OMITTED = None  # a slot without a sample
HISTOGRAM = "histogram"  # a native histogram slot (not stored)


def _tokens(values: str) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(values):
        if values[i].isspace():
            i += 1
            continue
        if values.startswith("{{", i):
            depth_end = values.index("}}", i) + 2
            j = depth_end
            while j < len(values) and not values[j].isspace():
                if values.startswith("{{", j):
                    j = values.index("}}", j) + 2
                else:
                    j += 1
            out.append(values[i:j])
            i = j
            continue
        j = i
        while j < len(values) and not values[j].isspace():
            j += 1
        out.append(values[i:j])
        i = j
    return out


def expand_values(values: str) -> list[Any]:
    """Expand `0+10x3 _ stale` into slots: floats, OMITTED, HISTOGRAM."""
    slots: list[Any] = []
    for tok in _tokens(values):
        if tok.startswith("{{"):
            m = re.search(r"x(\d+)$", tok)
            slots.extend([HISTOGRAM] * (int(m.group(1)) + 1 if m and tok.endswith(m.group(0)) else 1))
            continue
        if tok == "_":
            slots.append(OMITTED)
            continue
        if tok.startswith("_x"):
            slots.extend([OMITTED] * int(tok[2:]))
            continue
        if tok == "stale":
            slots.append(STALE_NAN)
            continue
        m = _SERIES_ITEM.match(tok)
        if not m:  # `x` is the repeat operator first; a lone token may be hex (0x1F)
            slots.append(parse_number(tok))
            continue
        v = parse_number(m.group(1))
        step = 0.0 if m.group(2) is None else parse_number(m.group(3)) * (1 if m.group(2) == "+" else -1)
        slots.append(v)
        for _ in range(int(m.group(4))):
            v += step
            slots.append(v)
    return slots


@dataclass
class Case:
    file: str
    line: int
    kind: str  # instant | range
    expr: str
    time_ms: int = 0
    start_ms: int = 0
    end_ms: int = 0
    step_ms: int = 0
    expect_fail: bool = False
    fail_msg: str | None = None
    fail_regex: str | None = None
    ordered: bool = False
    annotations: bool = False
    static_unsupported: str | None = None
    scalar: float | None = None
    series: list[tuple[dict[str, str], list[Any]]] = field(default_factory=list)
    loads: int = 0  # index of the last command before this eval, to replay loads


@dataclass
class Command:
    kind: str  # clear | load | eval
    line: int
    interval_ms: int = 0
    series: list[tuple[dict[str, str], list[Any]]] = field(default_factory=list)
    case: Case | None = None


_INSTANT = re.compile(r"^eval(?:_(fail|warn|ordered|info))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)$")
_RANGE = re.compile(r"^eval(?:_(fail|warn|info))?\s+range\s+from\s+(.+)\s+to\s+(.+)\s+step\s+(.+?)\s+(.+)$")
_LOAD = re.compile(r"^load(?:_(with_nhcb))?\s+(.+?)$")


def parse_file(path: Path) -> list[Command]:
    """Read a .test file into commands (HARNESS.md section 2)."""
    lines = []
    for raw in path.read_text().split("\n"):
        s = raw.strip()
        lines.append("" if s.startswith("#") else s)
    commands: list[Command] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        start = i
        body: list[str] = []
        i += 1
        word = line.split()[0].lower()
        if word == "clear":  # clear has no body: the next line is a command of its own
            commands.append(Command("clear", start + 1))
            continue
        while i < len(lines) and lines[i]:
            body.append(lines[i])
            i += 1
        if word.startswith("load"):
            m = _LOAD.match(line)
            if not m:
                raise HarnessFileError(f"line {start + 1}: bad load {line!r}")
            cmd = Command("load", start + 1, interval_ms=parse_duration(m.group(2)))
            defs: dict[tuple[tuple[str, str], ...], list[Any]] = {}
            for b in body:
                labels, values, has_st = parse_series(b)
                if has_st:
                    continue
                defs[tuple(sorted(labels.items()))] = expand_values(values)
            cmd.series = [(dict(k), v) for k, v in defs.items()]
            commands.append(cmd)
        elif word.startswith("eval"):
            commands.append(Command("eval", start + 1, case=_parse_eval(path.name, start + 1, line, body)))
        else:
            raise HarnessFileError(f"line {start + 1}: unknown command {line!r}")
    return commands


def _parse_eval(file: str, lineno: int, header: str, body: list[str]) -> Case:
    m = _INSTANT.match(header)
    if m:
        suffix = m.group(1)
        case = Case(file, lineno, "instant", m.group(3), time_ms=parse_duration(m.group(2) or "0"))
    else:
        m = _RANGE.match(header)
        if not m:
            raise HarnessFileError(f"line {lineno}: bad eval {header!r}")
        suffix = m.group(1)
        case = Case(file, lineno, "range", m.group(5))
        case.start_ms, case.end_ms = parse_duration(m.group(2)), parse_duration(m.group(3))
        case.step_ms = parse_duration(m.group(4))
        if case.end_ms < case.start_ms:
            raise HarnessFileError(f"line {lineno}: end before start")
    if suffix == "fail":
        case.expect_fail = True
    elif suffix == "ordered":
        case.ordered = True
    elif suffix in ("warn", "info"):
        case.annotations = True
    for b in body:
        words = b.split(" ")
        if words[0] == "expect":
            rest = b[len("expect") :].strip()
            if rest.startswith("fail"):
                case.expect_fail = True
                tail = rest[4:].strip()
                if tail.startswith("msg:"):
                    case.fail_msg = tail[4:].strip()
                elif tail.startswith("regex:"):
                    case.fail_regex = tail[6:].strip()
            elif rest.startswith("ordered"):
                case.ordered = True
            elif rest.startswith(("warn", "info", "no_warn", "no_info")):
                case.annotations = True
            elif rest.startswith("range vector"):
                case.static_unsupported = "instant query returning a range vector"
            elif rest.startswith("string"):
                case.static_unsupported = "instant query returning a string"
            else:
                raise HarnessFileError(f"line {lineno}: unknown expectation {b!r}")
            continue
        if words[0] == "expected_fail_message":
            case.fail_msg = b[len(words[0]) :].strip()
            break
        if words[0] == "expected_fail_regexp":
            case.fail_regex = b[len(words[0]) :].strip()
            break
        if "{{" in b:
            case.static_unsupported = "native histogram result"
        try:
            case.scalar = parse_number(b)
            break
        except HarnessFileError:
            pass
        labels, values, _ = parse_series(b)
        case.series.append((labels, expand_values(values)))
    return case


# -- comparing --------------------------------------------------------------------------------------

_MIN_NORMAL = 2.2250738585072014e-308


def almost_equal(a: float, b: float, eps: float = 1e-6) -> bool:
    """Prometheus's almost.Equal, with stale markers equal only to each other."""
    if is_stale(a) or is_stale(b):
        return is_stale(a) and is_stale(b)
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    diff = abs(a - b)
    if a == 0 or b == 0 or abs(a) + abs(b) < _MIN_NORMAL:
        return diff < eps * _MIN_NORMAL
    return diff / min(abs(a) + abs(b), sys.float_info.max) < eps


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if v != ""))


def compare_instant(case: Case, result: Any) -> str | None:
    if case.scalar is not None:
        if not isinstance(result, Scalar):
            return f"expected scalar, got {type(result).__name__}"
        if not almost_equal(result.value, case.scalar):
            return f"expected scalar {case.scalar}, got {result.value}"
        return None
    if not isinstance(result, Vector):
        return f"expected vector, got {type(result).__name__}"
    expected: dict[tuple[tuple[str, str], ...], tuple[int, float]] = {}
    for pos, (labels, slots) in enumerate(case.series):
        if len(slots) != 1:
            return f"test definition error: instant series {labels} needs exactly one value"
        expected[_key(labels)] = (pos, slots[0])
    seen = set()
    for idx, s in enumerate(result.samples):
        key = _key(s.labels)
        if key not in expected:
            return f"unexpected metric {dict(key)} in result, value {s.value}"
        pos, want = expected[key]
        seen.add(key)
        if case.ordered and pos != idx:
            return f"expected metric {dict(key)} at position {pos}, got position {idx}"
        if want is None or not almost_equal(s.value, want):
            return f"expected {want} for {dict(key)}, got {s.value}"
    missing = [dict(k) for k in expected if k not in seen]
    if missing:
        return f"expected metric {missing[0]} not found"
    return None


def compare_range(case: Case, result: Any) -> str | None:
    if not isinstance(result, Matrix):
        return f"expected matrix, got {type(result).__name__}"
    keys = [_key(s.labels) for s in result.series]
    if keys != sorted(keys):
        return "result matrix is not sorted by labels"
    expected: dict[tuple[tuple[str, str], ...], list[tuple[int, float]]] = {}
    for labels, slots in case.series:
        points = []
        for i, v in enumerate(slots):
            t = case.start_ms + i * case.step_ms
            if t > case.end_ms:
                return "test definition error: more slots than steps"
            if v is not OMITTED:
                points.append((t, v))
        if points:
            expected[_key(labels)] = points
    got = {k: s for k, s in zip(keys, result.series, strict=True)}
    for key, s in got.items():
        if key not in expected:
            return f"unexpected series {dict(key)}"
        want = expected[key]
        ts = s.timestamps_ms.tolist()
        if ts != [t for t, _ in want]:
            return f"series {dict(key)}: timestamps {ts} != expected {[t for t, _ in want]}"
        for (t, w), v in zip(want, s.values.tolist(), strict=True):
            if w is HISTOGRAM or not almost_equal(v, w):
                return f"series {dict(key)} at {t}: expected {w}, got {v}"
    for key in expected:
        if key not in got:
            return f"expected series {dict(key)} not found"
    return None


# -- running ----------------------------------------------------------------------------------------


@dataclass
class Outcome:
    file: str
    line: int
    kind: str
    tier: str
    outcome: str  # passed | failed | unsupported | skipped | error
    reason: str = ""
    flags: list[str] = field(default_factory=list)
    duration_ms: float = 0.0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


@dataclass
class CaseInfo:
    kind: str
    tier: str
    reasons: str
    expr: str


def load_cases_tsv(path: Path) -> dict[tuple[str, int], CaseInfo]:
    out = {}
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE):
            out[(row["file"], int(row["line"]))] = CaseInfo(
                row["kind"], row["tier"], row["reasons"], row["expr"]
            )
    return out


class DriftError(Exception):
    """The harness's case list differs from cases.tsv."""


def make_store(backend: str) -> TestStore:
    return RealStore() if backend == "store" else ArrayStore()


def run_file(
    path: Path,
    info: dict[tuple[str, int], CaseInfo],
    tiers: set[str],
    *,
    backend: str = "store",
    strict_messages: bool = False,
    check_range_mode: bool = False,
) -> list[Outcome]:
    """Run every eval case of one file, in order, against a fresh store."""
    try:
        commands = parse_file(path)
    except (HarnessFileError, ValueError, IndexError) as exc:
        return [
            Outcome(f, ln, ci.kind, ci.tier, "error", f"file error: {exc}")
            for (f, ln), ci in info.items()
            if f == path.name
        ]
    for cmd in commands:
        if cmd.case is None:
            continue
        ci = info.get((path.name, cmd.case.line))
        if ci is None or ci.kind != cmd.case.kind or ci.expr.strip() != cmd.case.expr.strip():
            raise DriftError(f"{path.name}:{cmd.case.line}: case differs from cases.tsv")
    store = make_store(backend)
    engine = Engine(store, lookback_ms=300_000, timeout_s=CASE_TIMEOUT_S, subquery_step_ms=60_000)
    outcomes: list[Outcome] = []
    try:
        for cmd in commands:
            if cmd.kind == "clear":
                store.clear()
            elif cmd.kind == "load":
                for labels, slots in cmd.series:
                    for i, v in enumerate(slots):
                        if v is not OMITTED and v is not HISTOGRAM:
                            store.append(labels, i * cmd.interval_ms, v)
            else:
                assert cmd.case is not None
                ci = info[(path.name, cmd.case.line)]
                if ci.tier not in tiers:
                    outcomes.append(Outcome(path.name, cmd.case.line, ci.kind, ci.tier, "skipped"))
                    continue
                store.prepare()
                outcomes.append(run_case(engine, cmd.case, ci, strict_messages, check_range_mode))
    finally:
        store.close()
    return outcomes


def _static_unsupported(case: Case, ci: CaseInfo) -> str | None:
    if case.static_unsupported:
        return case.static_unsupported
    for word in ("native-histogram", "NHCB", "start-timestamp"):
        if word in ci.reasons:
            return f"needs {word} data"
    return None


def run_case(
    engine: Engine, case: Case, ci: CaseInfo, strict_messages: bool, check_range_mode: bool
) -> Outcome:
    out = Outcome(case.file, case.line, case.kind, ci.tier, "passed")
    if case.annotations:
        out.flags.append("annotations_unchecked")
    why = _static_unsupported(case, ci)
    if why:
        out.outcome, out.reason = "unsupported", why
        return out
    started = time.perf_counter()
    try:
        if case.kind == "instant":
            result: Any = engine.instant(case.expr, case.time_ms)
        else:
            result = engine.range(case.expr, case.start_ms, case.end_ms, case.step_ms)
        error: BaseException | None = None
    except Unsupported as exc:
        result, error = None, exc
    except (PromQLParseError, PromQLEvalError) as exc:
        result, error = None, exc
    except Exception as exc:  # a crash of the engine counts as a failure, with its message
        result, error = None, exc
    out.duration_ms = round((time.perf_counter() - started) * 1000, 3)
    if out.duration_ms > CASE_TIMEOUT_S * 1000:
        out.outcome, out.reason = "failed", "timeout"
        return out
    if isinstance(error, Unsupported):
        out.outcome, out.reason = "unsupported", str(error)
        return out
    if case.expect_fail:
        if isinstance(error, (PromQLParseError, PromQLEvalError)):
            text = str(error)
            ok = True
            if case.fail_msg is not None and text != case.fail_msg:
                ok = False
            if case.fail_regex is not None and re.search(case.fail_regex, text) is None:
                ok = False
            if not ok:
                out.flags.append("message_mismatch")
                if strict_messages:
                    out.outcome, out.reason = "failed", f"error message {text!r} does not match"
            return out
        if error is not None:
            out.outcome, out.reason = "failed", f"crash: {type(error).__name__}: {error}"
            return out
        out.outcome, out.reason = "failed", "expected error, got result"
        return out
    if error is not None:
        out.outcome, out.reason = "failed", f"{type(error).__name__}: {error}"
        return out
    diff = compare_instant(case, result) if case.kind == "instant" else compare_range(case, result)
    if diff:
        out.outcome, out.reason = "failed", diff
        return out
    if check_range_mode and case.kind == "instant" and not case.ordered:
        if not re.search(r"\b(start|end|range|step)\(\)", case.expr):
            diff = _range_mode(engine, case)
            if diff:
                out.flags.append("range_mode_failed")
                out.reason = f"range mode: {diff}"
    return out


def _range_mode(engine: Engine, case: Case) -> str | None:
    t = case.time_ms
    try:
        m = engine.range(case.expr, t - 60000, t + 60000, 60000)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    from gpuwatch.query import Sample

    samples = []
    for s in m.series:
        hit = np.flatnonzero(s.timestamps_ms == t)
        if len(hit):
            samples.append(Sample(s.labels, t, float(s.values[hit[0]])))
    if case.scalar is not None:
        if len(samples) != 1 or not almost_equal(samples[0].value, case.scalar):
            return "scalar mismatch"
        return None
    return compare_instant(
        Case(case.file, case.line, "instant", case.expr, series=case.series), Vector(samples)
    )


# -- reporting --------------------------------------------------------------------------------------


def tally(outcomes: Iterable[Outcome]) -> dict[tuple[str, str], dict[str, int]]:
    """Count outcomes per (file, tier)."""
    table: dict[tuple[str, str], dict[str, int]] = {}
    for o in outcomes:
        row = table.setdefault(
            (o.file, o.tier), {"passed": 0, "failed": 0, "unsupported": 0, "skipped": 0, "error": 0}
        )
        row[o.outcome] += 1
    return table


def passed_per_tier(outcomes: Iterable[Outcome]) -> dict[str, int]:
    out = dict.fromkeys(TIERS, 0)
    for o in outcomes:
        if o.outcome == "passed":
            out[o.tier] += 1
    return out


def totals_per_tier(info: dict[tuple[str, int], CaseInfo]) -> dict[str, int]:
    out = dict.fromkeys(TIERS, 0)
    for ci in info.values():
        out[ci.tier] += 1
    return out


def format_table(outcomes: list[Outcome], markdown: bool = False) -> str:
    """Per-file table: passed/failed/unsupported/skipped for each tier."""
    files = sorted({o.file for o in outcomes})
    table = tally(outcomes)
    header = (
        ["file"] + [f"{t} {c}" for t in ("core", "extended") for c in ("pass", "fail", "unsup")] + ["skipped"]
    )
    rows = []
    grand = [0] * (len(header) - 1)
    for f in files:
        cells = []
        for t in ("core", "extended"):
            r = table.get((f, t), {})
            cells += [r.get("passed", 0), r.get("failed", 0) + r.get("error", 0), r.get("unsupported", 0)]
        cells.append(sum(table.get((f, t), {}).get("skipped", 0) for t in TIERS))
        grand = [a + b for a, b in zip(grand, cells, strict=True)]
        rows.append([f, *map(str, cells)])
    rows.append(["**total**" if markdown else "total", *map(str, grand)])
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def fmt(r: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )

    return "\n".join([fmt(header), *(fmt(r) for r in rows)])


def closing_line(outcomes: list[Outcome]) -> str:
    passed = sum(o.outcome == "passed" for o in outcomes)
    failed = sum(o.outcome in ("failed", "error") for o in outcomes)
    skipped = sum(o.outcome in ("unsupported", "skipped") for o in outcomes)
    return f"{passed} passed, {failed} failed, {skipped} skipped"


def read_floor(path: Path = FLOOR_FILE) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = int(v)
    return out


def run_all(
    data_dir: Path = DATA_DIR,
    tiers: Sequence[str] = ("core", "extended"),
    files: Sequence[str] = (),
    **kwargs: Any,
) -> tuple[list[Outcome], dict[tuple[str, int], CaseInfo]]:
    info = load_cases_tsv(data_dir / "cases.tsv")
    names = sorted({f for f, _ in info}) if not files else [Path(f).name for f in files]
    outcomes: list[Outcome] = []
    for name in names:
        outcomes += run_file(data_dir / name, info, set(tiers), **kwargs)
    return outcomes, info


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--data", type=Path, default=DATA_DIR)
    ap.add_argument("--tiers", default="core,extended", help="comma list of core,extended,out or 'all'")
    ap.add_argument("--backend", choices=("store", "array"), default="store")
    ap.add_argument("--strict-messages", action="store_true")
    ap.add_argument("--check-range-mode", action="store_true")
    ap.add_argument("--jsonl", type=Path, help="write one JSON line per case here ('-' for stdout)")
    ap.add_argument("--markdown", action="store_true", help="print the per-file table as Markdown")
    ap.add_argument("--failures", action="store_true", help="print failed cases with their reason")
    ap.add_argument("--floor", type=Path, default=FLOOR_FILE)
    args = ap.parse_args(argv)
    tiers = TIERS if args.tiers == "all" else tuple(t.strip() for t in args.tiers.split(","))
    try:
        outcomes, info = run_all(
            args.data,
            tiers,
            args.files,
            backend=args.backend,
            strict_messages=args.strict_messages,
            check_range_mode=args.check_range_mode,
        )
    except DriftError as exc:
        print(f"drift: {exc}", file=sys.stderr)
        return 2
    if args.jsonl:
        text = "\n".join(o.to_json() for o in outcomes) + "\n"
        if str(args.jsonl) == "-":
            sys.stdout.write(text)
        else:
            args.jsonl.write_text(text)
    if args.failures:
        for o in outcomes:
            if o.outcome in ("failed", "error") or (o.outcome == "unsupported" and o.tier != "out"):
                print(f"{o.outcome:11} {o.tier:8} {o.file}:{o.line}: {o.reason}")
    print(format_table(outcomes, markdown=args.markdown))
    totals = totals_per_tier(info)
    passed = passed_per_tier(outcomes)
    print("per tier: " + ", ".join(f"{t} {passed[t]}/{totals[t]}" for t in tiers))
    print(closing_line(outcomes))
    floor = read_floor(args.floor) if args.floor.exists() else {}
    core_failed = any(o.tier == "core" and o.outcome in ("failed", "error") for o in outcomes)
    below = any(passed.get(t, 0) < n for t, n in floor.items() if t in tiers)
    return 1 if core_failed or below else 0


if __name__ == "__main__":
    sys.exit(main())
