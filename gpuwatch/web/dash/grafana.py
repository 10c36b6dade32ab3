"""The dashboard's pages as Grafana dashboards, written from the panel registry (`gpuwatch dashboards export`).

Four dashboards: the cluster, one GPU, a training run and an inference service. Each reads a
`${datasource}` Prometheus data source variable, so the same JSON works on VictoriaMetrics, Mimir,
Prometheus or a hub gpuwatch; the queries are the pages' own (dcgm-exporter's `DCGM_FI_*` names, the
`gpuwatch:inference_*` recording rules), their `$variables` become Grafana template variables fed by
`label_values(metric, label)`, and gpuwatch's range variables become Grafana's (`$__rate` ->
`$__rate_interval`; `$__today` -> `$__range` on a panel whose time is "today so far").

Which dashboards, from which panels and with which variables: grafanaspec.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from gpuwatch.web.dash.grafanaspec import DashboardSpec, Section, Variable, specs
from gpuwatch.web.dash.panel import Panel, Thresholds

# What Grafana 10.4 writes; later versions migrate it on load (checked against Grafana 10.4's
# dashboard model, the grafana-foundation-sdk's 10.4 build, in tests/test_grafana_export.py).
SCHEMA_VERSION = 39
DATASOURCE: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
TAGS = ("gpuwatch",)
# The page's default range; a 30 s refresh, not the page's 5 s: each Grafana viewer asks the shared
# store for every panel, where a page asks its own gpuwatch.
TIME = {"from": "now-1h", "to": "now"}
REFRESH = "30s"
ROW_PX = 30  # Grafana's grid row height; a panel's height in pixels -> gridPos.h
STAT_ROWS = 4  # a stat is a tile on the page, whatever its chart height

# Panel.unit -> Grafana unit id (`si:MHz`: Grafana's custom SI unit, values in MHz shown as MHz/GHz).
UNITS: Mapping[str, str] = {
    "percent": "percent",
    "bytes": "bytes",
    "mib": "mbytes",
    "watts": "watt",
    "joules": "joule",
    "kwh": "kwatth",
    "celsius": "celsius",
    "seconds": "s",
    "ratio": "percentunit",
    "hz": "hertz",
    "mhz": "si:MHz",
    "count": "short",
    "per_second": "cps",
    "bytes_per_second": "Bps",
    "none": "none",
}
# gpuwatch's range variables (static/js/gpuwatch.js builtinVars) -> Grafana's.
BUILTINS: Mapping[str, str] = {
    "__rate": "$__rate_interval",
    "__range": "$__range",
    "__interval": "$__interval",
    "__today": "$__range",  # with the panel's time set to "today so far" (timeFrom now/d)
}
_VAR = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


def grafana_unit(unit: str) -> str:
    """The Grafana unit id of a panel unit."""
    return UNITS[unit]


def grafana_query(query: str) -> str:
    """`query` with gpuwatch's range variables as Grafana's; page variables stay `$name`."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        return BUILTINS.get(name, m.group(0)) if name.startswith("__") else m.group(0)

    return _VAR.sub(sub, query)


def query_variables(query: str) -> set[str]:
    """The template variables (not Grafana's `$__` ones) a query names as `$name` or `${name}`."""
    return {v for v in _VAR.findall(query) if not v.startswith("__")}


# -- JSON ------------------------------------------------------------------------------------------


def _title(p: Panel, texts: Mapping[str, str]) -> str:
    return texts.get(p.title_key, p.title) if p.title_key else p.title


def _thresholds(t: Thresholds, base: str = "green") -> dict[str, Any]:
    """Grafana's steps: a base colour, then each level from the value up. Lower-is-worse levels
    (`above` False) run the other way: red below crit, orange up to warn, then the base."""
    if t.above:
        steps: list[dict[str, Any]] = [{"color": base, "value": None}]
        steps += [{"color": c, "value": v} for c, v in (("orange", t.warn), ("red", t.crit)) if v is not None]
    else:
        levels = [(c, v) for c, v in (("red", t.crit), ("orange", t.warn)) if v is not None]
        colors = [c for c, _ in levels] + [base]
        steps = [{"color": colors[0], "value": None}]
        steps += [{"color": colors[i + 1], "value": v} for i, (_, v) in enumerate(levels)]
    return {"mode": "absolute", "steps": steps}


def _target(p: Panel, *, instant: bool, fmt: str = "time_series") -> dict[str, Any]:
    target: dict[str, Any] = {
        "refId": "A",
        "datasource": DATASOURCE,
        "expr": grafana_query(p.query),
        "range": not instant,
        "instant": instant,
        "format": fmt,
        "editorMode": "code",
    }
    if p.legend:
        target["legendFormat"] = p.legend
    return target


_LEGEND = {"showLegend": True, "displayMode": "list", "placement": "bottom", "calcs": []}
_TOOLTIP = {"mode": "multi", "sort": "desc"}
_REDUCE = {"calcs": ["lastNotNull"], "fields": "", "values": False}


def _defaults(p: Panel, color: str) -> dict[str, Any]:
    d: dict[str, Any] = {
        "unit": grafana_unit(p.unit),
        "color": {"mode": color},
        "thresholds": _thresholds(p.thresholds),
    }
    if p.min is not None and not p.log_y:  # a log axis has no 0
        d["min"] = p.min
    if p.max is not None:
        d["max"] = p.max
    return d


def _timeseries(p: Panel) -> dict[str, Any]:
    custom: dict[str, Any] = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 20 if p.stacked else 0,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if p.stacked else "none", "group": "A"},
        "thresholdsStyle": {"mode": "dashed" if _has_levels(p.thresholds) else "off"},
        "scaleDistribution": {"type": "log", "log": 10} if p.log_y else {"type": "linear"},
    }
    return {
        "type": "timeseries",
        "targets": [_target(p, instant=False)],
        "fieldConfig": {"defaults": {**_defaults(p, "palette-classic"), "custom": custom}, "overrides": []},
        "options": {"legend": dict(_LEGEND), "tooltip": dict(_TOOLTIP)},
    }


def _has_levels(t: Thresholds) -> bool:
    return t.warn is not None or t.crit is not None


def _status_history(p: Panel) -> dict[str, Any]:
    """A page heatmap (one row per series over time, colour = value) is Grafana's status history."""
    return {
        "type": "status-history",
        "targets": [_target(p, instant=False)],
        "fieldConfig": {
            "defaults": {**_defaults(p, "continuous-BlYlRd"), "custom": {"fillOpacity": 80, "lineWidth": 0}},
            "overrides": [],
        },
        "options": {
            "showValue": "never",
            "rowHeight": 0.9,
            "colWidth": 0.9,
            "legend": {**_LEGEND, "showLegend": False},
            "tooltip": {"mode": "single", "sort": "none"},
        },
    }


def _bucket_heatmap(p: Panel) -> dict[str, Any]:
    """A distribution over `le` buckets: Grafana's heatmap of pre-bucketed series."""
    return {
        "type": "heatmap",
        "targets": [_target(p, instant=False, fmt="heatmap")],
        "fieldConfig": {"defaults": {"unit": grafana_unit(p.unit),
                                     "custom": {"hideFrom": {"legend": False, "tooltip": False, "viz": False}}},
                        "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "fill": "dark-orange", "scale": "exponential",
                      "exponent": 0.5, "steps": 64, "reverse": False},
            "yAxis": {"axisPlacement": "left", "unit": "s", "reverse": False},
            "rowsFrame": {"layout": "auto"},
            "legend": {"show": True},
            "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False},
            "cellValues": {"unit": grafana_unit(p.unit)},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
        },
    }  # fmt: skip


def _events(p: Panel) -> dict[str, Any]:
    """Markers where a series rises or leaves 0 become a state timeline: a band per value, so a new
    band is a rise; 0 is transparent."""
    return {
        "type": "state-timeline",
        "targets": [_target(p, instant=False)],
        "fieldConfig": {
            "defaults": {
                "unit": grafana_unit(p.unit),
                "color": {"mode": "thresholds"},
                "thresholds": {
                    "mode": "absolute",
                    "steps": [{"color": "transparent", "value": None}, {"color": "red", "value": 1}],
                },
                "custom": {"fillOpacity": 70, "lineWidth": 0},
            },
            "overrides": [],
        },
        "options": {
            "mergeValues": True,
            "showValue": "auto",
            "alignValue": "left",
            "rowHeight": 0.9,
            "legend": {**_LEGEND, "showLegend": False},
            "tooltip": {"mode": "single", "sort": "none"},
        },
    }


def _stat(p: Panel) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "stat",
        "targets": [_target(p, instant=True)],
        "fieldConfig": {"defaults": _defaults(p, "thresholds"), "overrides": []},
        "options": {
            "reduceOptions": dict(_REDUCE),
            "colorMode": "value" if _has_levels(p.thresholds) else "none",
            "graphMode": "none",
            "justifyMode": "auto",
            "textMode": "value_and_name" if p.legend else "value",
            "orientation": "auto",
        },
    }
    if "$__today" in p.query:
        out["timeFrom"] = "now/d"
    return out


def _bars(p: Panel) -> dict[str, Any]:
    return {
        "type": "bargauge",
        "targets": [_target(p, instant=True)],
        "fieldConfig": {"defaults": _defaults(p, "thresholds"), "overrides": []},
        "options": {
            "reduceOptions": dict(_REDUCE),
            "displayMode": "basic",
            "orientation": "vertical",
            "showUnfilled": True,
            "valueMode": "color",
            "namePlacement": "auto",
            "sizing": "auto",
        },
    }


def _table(p: Panel) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "table",
        "targets": [_target(p, instant=True, fmt="table")],
        "fieldConfig": {"defaults": {"unit": grafana_unit(p.unit)}, "overrides": []},
        "options": {"showHeader": True, "cellHeight": "sm"},
    }
    if p.columns:  # the page's columns, in its order, then the value
        names = [*p.columns, "Value"]
        out["transformations"] = [
            {"id": "filterFieldsByName", "options": {"include": {"names": names}}},
            {"id": "organize", "options": {"indexByName": {n: i for i, n in enumerate(names)}}},
        ]
    return out


_KINDS = {
    "timeseries": _timeseries,
    "heatmap": _status_history,
    "bars": _bars,
    "stat": _stat,
    "table": _table,
    "events": _events,
}


def panel_json(p: Panel, panel_id: int, grid: Mapping[str, int], texts: Mapping[str, str]) -> dict[str, Any]:
    """One registry panel as a Grafana panel at `grid`."""
    # A heatmap whose rows are named by their `le` is a distribution's buckets, not one row per series.
    body = _bucket_heatmap(p) if p.kind == "heatmap" and p.legend == "{{le}}" else _KINDS[p.kind](p)
    out: dict[str, Any] = {
        "id": panel_id,
        "title": _title(p, texts),
        "datasource": DATASOURCE,
        "gridPos": dict(grid),
        **body,
    }
    if p.description:
        out["description"] = p.description
    return out


def grid_height(p: Panel) -> int:
    """A panel's height in Grafana grid rows."""
    return STAT_ROWS if p.kind == "stat" else max(3, round(p.height / ROW_PX))


def layout(sections: Iterable[Section], texts: Mapping[str, str]) -> list[dict[str, Any]]:
    """The sections' panels as the page lays them out (left to right on 12 columns, a new row when
    one is full; Grafana's 24 columns, so twice the width), with a row panel above each titled section."""
    out: list[dict[str, Any]] = []
    y = 0
    for section in sections:
        if section.title:
            out.append({"type": "row", "id": len(out) + 1, "title": section.title, "collapsed": False,
                        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []})  # fmt: skip
            y += 1
        x, row_h = 0, 0
        for p in section.panels:
            w, h = 2 * p.width, grid_height(p)
            if x + w > 24:
                x, y, row_h = 0, y + row_h, 0
            out.append(panel_json(p, len(out) + 1, {"x": x, "y": y, "w": w, "h": h}, texts))
            x, row_h = x + w, max(row_h, h)
        y += row_h
    return out


def variable_json(v: Variable) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "query",
        "name": v.name,
        "label": v.label,
        "datasource": DATASOURCE,
        "query": v.query(),
        "refresh": 2,  # on time range change: a node or run that appears shows up
        "sort": 7,  # natural order, ascending (gpu 2 before gpu 10)
        "regex": "",
        "hide": 0,
        "multi": v.is_multi,
        "includeAll": v.is_multi,
        "options": [],
    }
    if v.is_multi:
        out["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
        if v.all_value:
            out["allValue"] = v.all_value
    return out


DATASOURCE_VARIABLE: dict[str, Any] = {
    "type": "datasource",
    "name": "datasource",
    "label": "Data source",
    "query": "prometheus",
    "refresh": 1,
    "regex": "",
    "hide": 0,
    "multi": False,
    "includeAll": False,
    "options": [],
}


def dashboard_json(spec: DashboardSpec) -> dict[str, Any]:
    """One dashboard as Grafana's JSON model."""
    return {
        "uid": spec.uid,
        "title": spec.title,
        "description": spec.description,
        "tags": list(TAGS),
        "editable": True,
        "graphTooltip": 1,  # a shared crosshair, as the page's charts share one time axis
        "timezone": "browser",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "time": dict(TIME),
        "refresh": REFRESH,
        "links": [
            {
                "type": "dashboards",
                "title": "gpuwatch",
                "tags": list(TAGS),
                "asDropdown": True,
                "includeVars": False,
                "keepTime": True,
                "targetBlank": False,
                "icon": "external link",
                "tooltip": "",
                "url": "",
            }
        ],
        "templating": {"list": [DATASOURCE_VARIABLE, *(variable_json(v) for v in spec.variables)]},
        "panels": layout(spec.sections, spec.strings),
    }


def dashboards() -> list[dict[str, Any]]:
    """Every dashboard, in the navigation's order."""
    return [dashboard_json(s) for s in specs()]
