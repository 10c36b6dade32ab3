"""What a parse gives (`ParseResult`): the samples in input order, each family's HELP/TYPE/UNIT, every
invalid line as a `ParseIssue`, and the OpenMetrics exemplars kept."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from gpuwatch.core.model import Labels

# (metric name, labels sorted by name, timestamp in ms or None, value)
ParsedSample = tuple[str, Labels, "int | None", float]


class ParseIssue(NamedTuple):
    """One invalid line: 1-based line number (0: not one line's fault), what is wrong, the line (truncated)."""

    line_no: int
    message: str
    line: str

    def __str__(self) -> str:
        return f"line {self.line_no}: {self.message}" if self.line_no else self.message


@dataclass(frozen=True)
class FamilyMeta:
    """HELP/TYPE/UNIT of one metric family; type `unknown` also stands for text's `untyped`."""

    name: str
    type: str = "unknown"
    help: str = ""
    unit: str = ""


class Exemplar(NamedTuple):
    """An OpenMetrics exemplar, attached to the sample at `sample_index` in `ParseResult.samples`."""

    sample_index: int
    labels: Labels
    value: float
    timestamp_ms: int | None


@dataclass
class ParseResult:
    """Samples in input order, metadata per family, and every invalid line."""

    samples: list[ParsedSample]
    metadata: dict[str, FamilyMeta]
    errors: list[ParseIssue]
    is_openmetrics: bool
    lines: int
    exemplars: list[Exemplar] = field(default_factory=list)
    # Text format: for each sample, the raw text of its series (the line up to the space before the
    # value) where the line had only a series and a value, else None; the same text always names
    # the same series, so a scraper can key its own caches on it (empty for OpenMetrics).
    keys: list[str | None] = field(default_factory=list)

    def series(self) -> dict[tuple[str, Labels], tuple[list[int | None], list[float]]]:
        """Group the samples per series: (name, labels) -> (timestamps, values) in input order."""
        out: dict[tuple[str, Labels], tuple[list[int | None], list[float]]] = {}
        for name, labels, ts, value in self.samples:
            key = (name, labels)
            entry = out.get(key)
            if entry is None:
                entry = out[key] = ([], [])
            entry[0].append(ts)
            entry[1].append(value)
        return out
