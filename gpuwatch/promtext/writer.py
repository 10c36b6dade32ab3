"""Write samples in the Prometheus text format 0.0.4, keeping names exactly as given."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from gpuwatch.core.model import Labels, MetricInfo, Sample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def format_value(value: float) -> str:
    """Format a float as Prometheus does (NaN, +Inf, -Inf, shortest round-trip repr)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def encode_text(text: str) -> bytes:
    """`text` as UTF-8, a lone surrogate (JSON's "\\udcff", kept in a label value) as U+FFFD: the text
    format is UTF-8, and one such value must not fail the whole exposition."""
    try:
        return text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode()


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_text(samples: Iterable[Sample], metadata: Mapping[str, MetricInfo]) -> str:
    """Return exposition text: samples grouped by metric name, HELP/TYPE where known."""
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        by_name.setdefault(s.name, []).append(s)
    lines: list[str] = []
    for name in sorted(by_name):
        info = metadata.get(name)
        if info is not None:
            lines.append(f"# HELP {name} {_escape_help(info.help)}")
            lines.append(f"# TYPE {name} {info.type if info.type != 'unknown' else 'untyped'}")
        for s in by_name[name]:
            if s.labels:
                inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in s.labels)
                lines.append(f"{name}{{{inner}}} {format_value(s.value)}")
            else:
                lines.append(f"{name} {format_value(s.value)}")
    return "\n".join(lines) + "\n" if lines else ""


def format_federate(series: Iterable[tuple[str, Labels, int, float]]) -> str:
    """Return what Prometheus's /federate writes: per metric name (sorted) a `# TYPE name untyped` line,
    then each series (sorted by labels) with its latest value and that sample's timestamp in ms."""
    by_name: dict[str, list[tuple[Labels, int, float]]] = {}
    for name, labels, t_ms, value in series:
        by_name.setdefault(name, []).append((labels, t_ms, value))
    lines: list[str] = []
    for name in sorted(by_name):
        lines.append(f"# TYPE {name} untyped")
        for labels, t_ms, value in sorted(by_name[name], key=_labels_key):
            if labels:
                inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels)
                lines.append(f"{name}{{{inner}}} {format_value(value)} {t_ms}")
            else:
                lines.append(f"{name} {format_value(value)} {t_ms}")
    return "\n".join(lines) + "\n" if lines else ""


def _labels_key(row: tuple[Labels, int, float]) -> Labels:
    return row[0]
