"""Instant-vector functions: math, clamp, round, dates, labels, sorting."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from gpuwatch.core import regex
from gpuwatch.core.regex import Regex
from gpuwatch.query.errors import PromQLEvalError
from gpuwatch.query.frames import NAME, LabelSet, VectorFrame, drop_name, label_value, merge_same_labels


def _sgn(v: np.ndarray) -> np.ndarray:
    return np.where(v < 0, -1.0, np.where(v > 0, 1.0, v))


MATH: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs,
    "ceil": np.ceil,
    "floor": np.floor,
    "exp": np.exp,
    "sqrt": np.sqrt,
    "ln": np.log,
    "log2": np.log2,
    "log10": np.log10,
    "sgn": _sgn,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "tanh": np.tanh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "rad": np.radians,
    "deg": np.degrees,
}


def map_values(frame: VectorFrame, values: np.ndarray) -> VectorFrame:
    """Return `frame` with new values and `__name__` dropped (rows merged if they collide)."""
    out = VectorFrame([drop_name(ls) for ls in frame.labels], values, frame.present.copy())
    return merge_same_labels(out)


def apply_math(name: str, frame: VectorFrame) -> VectorFrame:
    with np.errstate(all="ignore"):
        return map_values(frame, MATH[name](frame.values))


def clamp(frame: VectorFrame, lo: np.ndarray, hi: np.ndarray) -> VectorFrame:
    with np.errstate(invalid="ignore"):
        values = np.maximum(lo, np.minimum(hi, frame.values))
        # Go's math.Max/Min propagate NaN like numpy's maximum/minimum do.
        out = map_values(frame, values)
        out.present &= ~(hi < lo)[None, :]
    return out


def round_values(frame: VectorFrame, to_nearest: np.ndarray) -> VectorFrame:
    with np.errstate(all="ignore"):
        inv = 1.0 / to_nearest
        return map_values(frame, np.floor(frame.values * inv + 0.5) / inv)


# Dates -------------------------------------------------------------------------------------

_DATE_PARTS = (
    "day_of_month",
    "day_of_week",
    "day_of_year",
    "days_in_month",
    "hour",
    "minute",
    "month",
    "year",
)


def date_part(name: str, seconds: np.ndarray) -> np.ndarray:
    """Return a calendar field (UTC) of Unix times in seconds, like Go's time package."""
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(seconds)
        secs = np.where(finite, np.trunc(np.nan_to_num(seconds)), 0).astype(np.int64)
    days = np.floor_divide(secs, 86400)
    day_secs = secs - days * 86400
    dt_days = days.astype("datetime64[D]")
    months = dt_days.astype("datetime64[M]")
    years = dt_days.astype("datetime64[Y]")
    if name == "hour":
        out = day_secs // 3600
    elif name == "minute":
        out = (day_secs // 60) % 60
    elif name == "day_of_week":
        out = (days + 4) % 7
    elif name == "day_of_month":
        out = (dt_days - months.astype("datetime64[D]")).astype(np.int64) + 1
    elif name == "day_of_year":
        out = (dt_days - years.astype("datetime64[D]")).astype(np.int64) + 1
    elif name == "month":
        out = months.astype(np.int64) % 12 + 1
    elif name == "year":
        out = years.astype(np.int64) + 1970
    elif name == "days_in_month":
        out = ((months + 1).astype("datetime64[D]") - months.astype("datetime64[D]")).astype(np.int64)
    else:
        raise ValueError(name)
    return np.where(finite, out.astype(np.float64), np.nan)


def is_date_function(name: str) -> bool:
    return name in _DATE_PARTS


# Labels ------------------------------------------------------------------------------------

_LABEL_NAME = re.compile(r"^[^\x00]+$")


def _set_label(labels: LabelSet, name: str, value: str) -> LabelSet:
    rest = [p for p in labels if p[0] != name]
    if value != "":
        rest.append((name, value))
    return tuple(sorted(rest))


def _compile_go_regex(pattern: str) -> Regex:
    try:
        return regex.compile_anchored(pattern)
    except regex.RegexError:
        raise PromQLEvalError(f"invalid regular expression in label_replace(): {pattern}") from None


def label_replace(frame: VectorFrame, dst: str, repl: str, src: str, pattern: str) -> VectorFrame:
    rx = _compile_go_regex(pattern)
    if not _LABEL_NAME.match(dst):
        raise PromQLEvalError(f"invalid destination label name in label_replace(): {dst}")
    labels: list[LabelSet] = []
    for ls in frame.labels:
        m = rx.search(label_value(ls, src))
        if m is None:
            labels.append(ls)
        else:
            labels.append(_set_label(ls, dst, regex.expand(repl, m)))
    return merge_same_labels(VectorFrame(labels, frame.values, frame.present))


def label_join(frame: VectorFrame, dst: str, sep: str, srcs: list[str]) -> VectorFrame:
    if not _LABEL_NAME.match(dst):
        raise PromQLEvalError(f"invalid destination label name in label_join(): {dst}")
    labels = [_set_label(ls, dst, sep.join(label_value(ls, s) for s in srcs)) for ls in frame.labels]
    return merge_same_labels(VectorFrame(labels, frame.values, frame.present))


# Sorting (meaningful for instant queries only) ---------------------------------------------


def sort_rows(frame: VectorFrame, descending: bool) -> VectorFrame:
    """Order rows by their value at the first step, NaN last."""
    if frame.steps != 1 or len(frame.labels) < 2:
        return frame
    v = frame.values[:, 0]
    nan = np.isnan(v)
    key = -v if descending else v
    order = np.lexsort((np.where(nan, 0.0, key), nan))
    return frame.take(order)


def _natural_key(text: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", text) if p != ""]


def sort_by_label(frame: VectorFrame, names: list[str], descending: bool) -> VectorFrame:
    order = sorted(
        range(len(frame.labels)),
        key=lambda i: ([_natural_key(label_value(frame.labels[i], n)) for n in names], frame.labels[i]),
        reverse=descending,
    )
    return frame.take(order)


def keeps_name(name: str) -> bool:
    """Tell whether a function keeps `__name__` on its result."""
    return name in {
        "last_over_time",
        "first_over_time",
        "sort",
        "sort_desc",
        "sort_by_label",
        "sort_by_label_desc",
    }


__all__ = ["NAME"]
