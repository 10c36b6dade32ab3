"""Every built-in panel and rule query, and the comparison of two backends' answers to them
(tests/test_remote_backend_e2e.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuwatch.query.backend import QueryBackend
from gpuwatch.query.values import Matrix, Result, Scalar, String, Vector
from gpuwatch.rules.load import load_builtin
from gpuwatch.web.dash import grafanaspec, inference, inferencedata, timeline
from gpuwatch.web.dash.gpupanels import gpu_panels
from gpuwatch.web.dash.panel import fill

GPU_MATCHERS = 'Hostname="$hostname",gpu="$gpu"'


@dataclass(frozen=True)
class Query:
    """One query as a page or a rule asks it: where it comes from, its text (with `$variables`)."""

    key: str
    text: str
    is_rule: bool = False


def registry_queries() -> list[Query]:
    """Every query of the panel registry (the four dashboards' panels, the timeline's, each inference
    engine's service charts and tiles) and of the built-in rules, each text once."""
    seen: dict[str, Query] = {}

    def add(key: str, text: str, is_rule: bool = False) -> None:
        seen.setdefault(text, Query(key, text, is_rule))

    for spec in grafanaspec.specs():
        for p in spec.panels():
            for i, q in enumerate(p.queries()):
                add(f"{spec.uid}/{p.id}/{i}", q)
        for v in spec.variables:
            add(f"{spec.uid}/variable/{v.name}", v.selector)
    for p in (*timeline.PANELS, *gpu_panels(GPU_MATCHERS)):
        for i, q in enumerate(p.queries()):
            add(f"page/{p.id}/{i}", q)
    for engine in ("vllm", "sglang"):
        for p in inference.service_panels(engine, "$job", GPU_MATCHERS):
            for i, q in enumerate(p.queries()):
                add(f"inference-{engine}/{p.id}/{i}", q)
        for tile in inferencedata.TILES:
            expr = inferencedata.expr_for(engine, tile.id, "$job")
            if expr:
                add(f"inference-{engine}/tile/{tile.id}", expr)
    add("inference/services", inferencedata.SERVICES)
    for group in load_builtin():
        for rule in group.rules:
            add(f"rule/{group.name}/{rule.name}", rule.expr, is_rule=True)
    return list(seen.values())


def filled(query: Query, variables: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    """(key, text) of `query` with its variables filled; `$job` once per inference engine's job."""
    jobs = ("vllm", "sglang") if "$job" in query.text else ("",)
    for job in jobs:
        text = fill(query.text, {**variables, "job": job})
        yield (f"{query.key}[{job}]" if job else query.key), text


Normal = dict[tuple[tuple[str, str], ...], Any]


def normal(result: Result) -> Normal:
    """A result as label set -> value (instant) or -> (times, values) (range); a scalar is the one
    series without labels (VictoriaMetrics answers scalars as such a vector)."""
    if isinstance(result, Scalar):
        return {(): result.value}
    if isinstance(result, String):
        return {(("string", result.value),): 0.0}
    if isinstance(result, Vector):
        return {tuple(sorted(s.labels.items())): s.value for s in result}
    assert isinstance(result, Matrix)
    return {tuple(sorted(s.labels.items())): (s.timestamps_ms, s.values) for s in result}


def _close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def difference(ours: Normal, theirs: Normal) -> str:
    """'' where the two answers are the same (values within 1e-6 relative), else what differs."""
    if set(ours) != set(theirs):
        only_ours = sorted(set(ours) - set(theirs))[:2]
        only_theirs = sorted(set(theirs) - set(ours))[:2]
        return (
            f"series differ: only here {only_ours}, only there {only_theirs} ({len(ours)} vs {len(theirs)})"
        )
    for key, a in ours.items():
        b = theirs[key]
        if isinstance(a, tuple):
            if not np.array_equal(a[0], b[0]):
                extra = sorted(set(a[0].tolist()) ^ set(b[0].tolist()))[:3]
                return f"{dict(key)}: times differ ({len(a[0])} vs {len(b[0])} points, e.g. {extra})"
            bad = [
                i
                for i, (x, y) in enumerate(zip(a[1].tolist(), b[1].tolist(), strict=True))
                if not _close(x, y)
            ]
            if bad:
                i = bad[0]
                return f"{dict(key)}: {len(bad)} values differ, first at {int(a[0][i])}: {a[1][i]!r} vs {b[1][i]!r}"
        elif not _close(a, b):
            return f"{dict(key)}: {a!r} vs {b!r}"
    return ""


@dataclass(frozen=True)
class Asked:
    """One query asked of two backends: the key, the text, what differs ('' none), and whether ours
    had data."""

    key: str
    text: str
    difference: str
    has_data: bool


def ask_both(
    ours: QueryBackend,
    theirs: QueryBackend,
    queries: list[Query],
    variables: Mapping[str, str],
    times_ms: list[int],
    ranges: list[tuple[int, int, int]],
    rule_times_ms: list[int],
) -> list[Asked]:
    """Each panel query at each of `times_ms` (instant) and over each (start, end, step) (range), each
    rule query at each of `rule_times_ms`, by both."""
    out = []
    for q in queries:
        for key, text in filled(q, variables):
            for t in rule_times_ms if q.is_rule else times_ms:
                a, b = normal(ours.instant(text, t)), normal(theirs.instant(text, t))
                out.append(Asked(f"{key}@{t}", text, difference(a, b), bool(a)))
            if q.is_rule:
                continue  # a rule is evaluated at one time
            for start, end, step in ranges:
                a, b = (
                    normal(ours.range(text, start, end, step)),
                    normal(theirs.range(text, start, end, step)),
                )
                out.append(Asked(f"{key}@{start}:{end}:{step}", text, difference(a, b), bool(a)))
    return out
