"""Compare an engine result with a case's expectations (HARNESS.md section 4)."""

from __future__ import annotations

import math
import sys
from typing import Any

from gpuwatch.core.model import is_stale
from gpuwatch.query import Matrix, Scalar, Vector
from tests.promqltest.reader import HISTOGRAM, OMITTED, Case

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
            if isinstance(w, HISTOGRAM) or not almost_equal(v, w):
                return f"series {dict(key)} at {t}: expected {w}, got {v}"
    for key in expected:
        if key not in got:
            return f"expected series {dict(key)} not found"
    return None
