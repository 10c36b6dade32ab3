"""Run the cases of `.test` files through the engine and decide each one's outcome (HARNESS.md section 3)."""

from __future__ import annotations

import csv
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpuwatch.query import Engine, PromQLEvalError, PromQLParseError, Sample, Unsupported, Vector
from tests.promqltest.compare import almost_equal, compare_instant, compare_range
from tests.promqltest.reader import OMITTED, Case, HarnessFileError, parse_file
from tests.promqltest.stores import make_store

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "promql"
TIERS = ("core", "extended", "out")
CASE_TIMEOUT_S = 10.0


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
                        if v is not OMITTED:
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


def run_case(  # noqa: C901 - one branch per kind of expected result
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
    except Exception as exc:  # noqa: BLE001 - a crash of the engine counts as a failure, with its message
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
    if (
        check_range_mode
        and case.kind == "instant"
        and not case.ordered
        and not re.search(r"\b(start|end|range|step)\(\)", case.expr)
    ):
        diff = _range_mode(engine, case)
        if diff:
            out.flags.append("range_mode_failed")
            out.reason = f"range mode: {diff}"
    return out


def _range_mode(engine: Engine, case: Case) -> str | None:
    t = case.time_ms
    try:
        m = engine.range(case.expr, t - 60000, t + 60000, 60000)
    except Exception as exc:  # noqa: BLE001 - any failure of the engine is a failed case, with its message
        return f"{type(exc).__name__}: {exc}"
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
