"""The dashboard's panels as plain data: one frozen `Panel` per chart, table or figure.

A page lists its panels; the page template embeds them as JSON (`gw-panels`) and static/js/gpuwatch.js
draws them. Plain data on purpose: the same registry can later be written out as Grafana dashboards.

`query` is PromQL and may name page variables as `$name` (`$hostname`, `$gpu`, `$run`, `$job`, ...);
`fill(query, vars)` (here and in gpuwatch.js) replaces them with the page's values, escaped for a
PromQL double-quoted string.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

UNITS = frozenset(
    {"percent", "bytes", "mib", "watts", "joules", "kwh", "celsius", "seconds", "ratio", "hz", "mhz", "count",
     "per_second", "bytes_per_second", "none"}
)  # fmt: skip
KINDS = frozenset({"timeseries", "heatmap", "bars", "stat", "table", "events"})
_VAR = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True)
class Thresholds:
    """Values from which a figure is drawn as a warning or as critical (None: no such level).
    `above` False means lower is worse (e.g. free memory)."""

    warn: float | None = None
    crit: float | None = None
    above: bool = True


@dataclass(frozen=True)
class Panel:
    """One chart, table or figure on a page.

    id: unique on its page, used as the DOM id (`panel-<id>`) and in tests.
    title: English title; `title_key` names its translation in gpuwatch.web.dash.i18n (optional).
    query: PromQL; `$var` names are filled from the page's variables.
    unit: one of UNITS, used for axis ticks and hover text.
    kind: one of KINDS. `timeseries`: lines over time; `heatmap`: one row per series over time;
      `bars`: the latest value per series; `stat`: one big number (the first series' latest value);
      `table`: the latest value per series with its labels; `events`: markers at the times the
      series changes (counters rising, gauges leaving 0).
    legend: series name template, `{{label}}` filled from each series' labels (Prometheus style);
      empty: the series' labels.
    thresholds: warning/critical levels (drawn as lines, used to colour stats and bars).
    log_y: offer a log-scale y axis toggle. stacked: stack the series (timeseries).
    min/max: fixed y range ends (None: automatic).
    width: columns of the page's 12-column grid the panel spans on a wide screen (phones: all 12).
    height: chart height in pixels.
    unsupported_if: optional PromQL that has data when the thing the panel is about exists (e.g. the
      GPU reports anything at all): an empty result then reads "not available on this GPU", not "no data".
    failed_if: optional PromQL that has data while collection fails (e.g. `gpuwatch_nvml_up == 0`,
      `up{job="$job"} == 0`): an empty result then reads "collection failed"; with data, a badge says so.
    columns: label names a `table` shows, in order (empty: all labels).
    counter: `events`: besides rises, only a series that appears non-zero after the range's start is
      an event (an alert, a throttle onset, a first XID); without it any non-zero first value is one.
    empty: a string key for an empty result that is a real answer ("no process"), shown when the
      subject exists (`unsupported_if` has data, or is not set) instead of "not available".
    description: one-line help shown as the title's tooltip.
    min_interval: ask at most every this many seconds (0: every refresh tick; a chart asks at most
      once per step anyway), for a figure that is costly and moves slowly (energy since midnight).
    marks: the id of an `events` panel on the same page whose events a `timeseries` chart draws as
      vertical lines on its own time axis (that panel's answer, asked once for all of them).
    """

    id: str
    title: str
    query: str
    unit: str = "none"
    kind: str = "timeseries"
    legend: str = ""
    thresholds: Thresholds = field(default_factory=Thresholds)
    log_y: bool = False
    stacked: bool = False
    min: float | None = None
    max: float | None = None
    width: int = 6
    height: int = 240
    title_key: str = ""
    unsupported_if: str = ""
    failed_if: str = ""
    columns: tuple[str, ...] = ()
    counter: bool = False
    empty: str = ""
    min_interval: float = 0.0
    description: str = ""
    marks: str = ""

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"panel {self.id}: unknown unit {self.unit!r}")
        if self.kind not in KINDS:
            raise ValueError(f"panel {self.id}: unknown kind {self.kind!r}")
        if not 1 <= self.width <= 12:
            raise ValueError(f"panel {self.id}: width must be 1 to 12 columns")
        if self.marks and self.kind != "timeseries":
            raise ValueError(f"panel {self.id}: marks are drawn on timeseries charts only")

    def queries(self) -> tuple[str, ...]:
        """Every PromQL the panel runs (the main query first)."""
        return tuple(q for q in (self.query, self.unsupported_if, self.failed_if) if q)

    def variables(self) -> set[str]:
        """Names of the `$variables` the queries use."""
        return {v for q in self.queries() for v in _VAR.findall(q)}

    def to_json(self, title: str | None = None) -> dict[str, Any]:
        """The panel as the page's JSON (`title` replaces the English title, e.g. translated)."""
        d = asdict(self)
        if title is not None:
            d["title"] = title
        return d


def promql_string(value: str) -> str:
    """`value` escaped for the inside of a PromQL double-quoted string."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def fill(query: str, variables: Mapping[str, str]) -> str:
    """Replace `$name` in `query` with `variables[name]` (escaped for a quoted string); unknown
    names stay as written."""
    return _VAR.sub(
        lambda m: promql_string(variables[m.group(1)]) if m.group(1) in variables else m.group(0), query
    )


def panels_json(panels: Iterable[Panel], translate: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The panels as the page embeds them, titles translated where `translate` has their key."""
    out = []
    for p in panels:
        title = translate.get(p.title_key) if (translate and p.title_key) else None
        out.append(p.to_json(title))
    return out


def check_unique(panels: Iterable[Panel]) -> tuple[Panel, ...]:
    """Return the panels as a tuple; raise ValueError when two share an id, or when a panel's
    `marks` names no `events` panel among them."""
    kinds: dict[str, str] = {}
    out = tuple(panels)
    for p in out:
        if p.id in kinds:
            raise ValueError(f"two panels have the id {p.id!r}")
        kinds[p.id] = p.kind
    for p in out:
        if p.marks and kinds.get(p.marks) != "events":
            raise ValueError(f"panel {p.id}: marks {p.marks!r} is not an events panel of the page")
    return out
