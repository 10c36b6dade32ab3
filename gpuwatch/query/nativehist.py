"""A minimal native-histogram sample: enough to carry one through a query honestly.

gpuwatch evaluates floats. A native histogram sample is kept as one of these objects (its
float value is NaN), so that series presence (`count`, `group`, `absent`, `count_over_time`,
lookback) and the functions that drop mixed windows (`rate`, `increase`, `delta`,
`sum_over_time`, `avg_over_time`) behave as in Prometheus, and `count_values` can write its
text form. Every other operation that meets one fails with `NativeHistogramUnsupported`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpuwatch.query.errors import Unsupported

CUSTOM_BUCKETS_SCHEMA = -53


class NativeHistogramUnsupported(Unsupported):
    """A query met a native histogram sample in an operation gpuwatch evaluates on floats only."""

    def __init__(self, what: str) -> None:
        super().__init__(f"native histograms ({what})")
        self.args = (f"native histograms are not supported: {what}",)

    def __str__(self) -> str:
        return str(self.args[0])


def go_float(value: float) -> str:
    """Format `value` as Go's `%g`/`%v` does for a float64: shortest digits, exponent form
    when the decimal exponent is below -4 or at least 6 (`1e+06`, `1.5e-05`)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    digits = repr(abs(value))
    # Shortest round-trip digits and decimal exponent, from repr.
    if "e" in digits:
        m, _, e = digits.partition("e")
        exp = int(e)
        ds = m.replace(".", "").lstrip("0")
        ds = ds.rstrip("0") or "0"
    else:
        int_part, _, frac = digits.partition(".")
        frac = frac.rstrip("0")
        raw = (int_part + frac).lstrip("0")
        ds = raw.rstrip("0") or "0"
        if int_part.strip("0"):
            exp = len(int_part.lstrip("0")) - 1
        else:
            exp = -(len(frac) - len(frac.lstrip("0"))) - 1
    sign = "-" if value < 0 else ""
    if exp < -4 or exp >= 6:
        body = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{sign}{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{ds}"
    if len(ds) <= exp + 1:
        return f"{sign}{ds}{'0' * (exp + 1 - len(ds))}"
    return f"{sign}{ds[: exp + 1]}.{ds[exp + 1 :]}"


def _bound(index: int, schema: int) -> float:
    """Upper bound of exponential bucket `index` (Prometheus's getBound for schema <= 0)."""
    if schema > 0:
        raise NativeHistogramUnsupported(f"bucket bounds of schema {schema}")
    return math.ldexp(1.0, index << -schema)


@dataclass
class NativeHistogram:
    """A float native histogram: absolute bucket counts by bucket index."""

    schema: int = 0
    count: float = 0.0
    sum: float = 0.0
    zero_threshold: float = 0.0
    zero_count: float = 0.0
    positive: dict[int, float] = field(default_factory=dict)
    negative: dict[int, float] = field(default_factory=dict)
    custom_values: tuple[float, ...] = ()
    counter_reset_hint: str = "unknown"

    def text(self) -> str:
        """The text Prometheus's `FloatHistogram.String()` gives (count_values' label value)."""
        if self.schema == CUSTOM_BUCKETS_SCHEMA or self.schema > 0:
            raise NativeHistogramUnsupported(f"the text form of a schema {self.schema} histogram")
        parts = [f"{{count:{go_float(self.count)}, sum:{go_float(self.sum)}"]
        for idx in sorted(self.negative, reverse=True):
            c = self.negative[idx]
            if c != 0:
                lo, hi = _bound(idx - 1, self.schema), _bound(idx, self.schema)
                parts.append(f"[{go_float(-hi)},{go_float(-lo)}):{go_float(c)}")
        if self.zero_count != 0:
            z = self.zero_threshold
            parts.append(f"[{go_float(-z)},{go_float(z)}]:{go_float(self.zero_count)}")
        for idx in sorted(self.positive):
            c = self.positive[idx]
            if c != 0:
                lo, hi = _bound(idx - 1, self.schema), _bound(idx, self.schema)
                parts.append(f"({go_float(lo)},{go_float(hi)}]:{go_float(c)}")
        return ", ".join(parts) + "}"


__all__ = ["NativeHistogram", "NativeHistogramUnsupported", "go_float"]
