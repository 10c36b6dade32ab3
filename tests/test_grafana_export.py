"""`gpuwatch dashboards export`: the pages as Grafana dashboards, checked against Grafana's dashboard model
(tests/grafanamodel.py), against the panel registry they are written from, and end to end: a demo node
remote-writes into a real VictoriaMetrics, and every panel's query, its variables filled with values
that exist, answers there and on gpuwatch's own API."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuwatch.cli.main import main
from gpuwatch.web.dash import cluster, gpu, gpupanels, inference, inferencedata
from gpuwatch.web.dash.grafana import (
    BUILTINS,
    DATASOURCE,
    SCHEMA_VERSION,
    UNITS,
    _thresholds,
    dashboards,
    grafana_query,
    layout,
    query_variables,
)
from gpuwatch.web.dash.grafanaspec import DashboardSpec, Section, specs
from gpuwatch.web.dash.panel import UNITS as PANEL_UNITS
from gpuwatch.web.dash.panel import Panel, Thresholds
from tests.conftest import GPUWATCH, Server, clean_env, free_port, require_tool, wait_until

UIDS = ["gpuwatch-cluster", "gpuwatch-gpu", "gpuwatch-training-run", "gpuwatch-inference-service"]


@pytest.fixture(scope="module")
def grafanamodel() -> Any:
    """Grafana's dashboard model (grafana-foundation-sdk, in the test extra; it needs Python 3.11)."""
    return pytest.importorskip("tests.grafanamodel", reason="grafana-foundation-sdk is not installed")


@pytest.fixture(scope="module")
def exported() -> dict[str, dict[str, Any]]:
    return {d["uid"]: d for d in dashboards()}


def _charts(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in d["panels"] if p["type"] != "row"]


def _exprs(d: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in _charts(d) for t in p["targets"]]


@pytest.mark.parametrize("uid", UIDS)
def test_each_dashboard_is_valid_by_grafanas_dashboard_model(
    grafanamodel: Any, exported: dict[str, dict[str, Any]], uid: str
) -> None:
    assert grafanamodel.problems(exported[uid]) == []


def test_the_model_check_finds_what_grafana_would_not_take(
    grafanamodel: Any, exported: dict[str, dict[str, Any]]
) -> None:
    d = json.loads(json.dumps(exported["gpuwatch-cluster"]))
    chart = next(p for p in d["panels"] if p["type"] == "timeseries")
    chart["gridpos"] = chart.pop("gridPos")
    chart["fieldConfig"]["defaults"]["custom"]["drawStyle"] = "wiggle"
    chart["targets"][0]["format"] = "csv"
    d["templating"]["list"][1]["refresh"] = 7
    found = "\n".join(grafanamodel.problems(d))
    for part in ("gridpos: not a field", "'wiggle' is not a GraphDrawStyle", "'csv' is not a PromQueryFormat",
                 "7 is not a VariableRefresh"):  # fmt: skip
        assert part in found, found


def test_dashboards_carry_what_an_import_needs(exported: dict[str, dict[str, Any]]) -> None:
    assert list(exported) == UIDS
    titles = [d["title"] for d in exported.values()]
    assert titles == [
        "gpuwatch / Cluster",
        "gpuwatch / GPU",
        "gpuwatch / Training run",
        "gpuwatch / Inference service",
    ]
    for d in exported.values():
        assert d["schemaVersion"] == SCHEMA_VERSION and d["tags"] == ["gpuwatch"]
        assert d["time"] == {"from": "now-1h", "to": "now"} and d["refresh"]
        assert "id" not in d  # Grafana assigns it; an id from elsewhere would overwrite another dashboard
        first = d["templating"]["list"][0]
        assert (first["type"], first["name"], first["query"]) == ("datasource", "datasource", "prometheus")
        for p in d["panels"]:
            if p["type"] != "row":
                assert p["datasource"] == DATASOURCE
                assert all(t["datasource"] == DATASOURCE and t["refId"] for t in p["targets"])
        ids = [p["id"] for p in d["panels"]]
        assert len(set(ids)) == len(ids)
        titles = [p["title"] for p in d["panels"]]
        assert len(set(titles)) == len(titles), d["uid"]


def _cells(p: dict[str, Any]) -> set[tuple[int, int]]:
    g = p["gridPos"]
    return {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}


@pytest.mark.parametrize("uid", UIDS)
def test_panels_do_not_overlap_and_fit_the_grid(exported: dict[str, dict[str, Any]], uid: str) -> None:
    taken: dict[tuple[int, int], int] = {}
    for p in exported[uid]["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] >= 1, p["title"]
        for cell in _cells(p):
            assert cell not in taken, f"{p['title']} overlaps panel {taken[cell]}"
            taken[cell] = p["id"]


def test_the_layout_is_the_pages_twelve_columns_doubled() -> None:
    row = [Panel(f"p{i}", "t", "up", width=w) for i, w in enumerate((4, 4, 4, 6, 6, 12))]
    grid = [p["gridPos"] for p in layout([Section("", tuple(row))], {})]
    assert [(g["x"], g["y"], g["w"]) for g in grid] == [
        (0, 0, 8), (8, 0, 8), (16, 0, 8), (0, 8, 12), (12, 8, 12), (0, 16, 24)
    ]  # fmt: skip
    assert {g["h"] for g in grid} == {8}  # 240 px in rows of 30 px


def _by_title(spec: DashboardSpec, d: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in _charts(d):
        out.setdefault(p["title"], []).extend(t["expr"] for t in p["targets"])
    return out


def test_every_registry_panel_is_there_with_its_query(exported: dict[str, dict[str, Any]]) -> None:
    by_uid = {s.uid: s for s in specs()}
    for uid, registry in (("gpuwatch-cluster", cluster.PANELS), ("gpuwatch-gpu", gpu.PANELS)):
        exprs = _exprs(exported[uid])
        for p in registry:
            assert grafana_query(p.query) in exprs, p.id
    # A run's and a service's GPU panels, with the GPUs chosen by variables.
    for uid, with_events in (("gpuwatch-training-run", True), ("gpuwatch-inference-service", False)):
        exprs = _exprs(exported[uid])
        for p in gpupanels.gpu_panels('Hostname=~"$hostname", gpu=~"$gpu"', with_events=with_events):
            assert p.query in exprs, p.id
    # Each engine's charts and tiles are inside the merged expressions.
    merged = " ".join(_exprs(exported["gpuwatch-inference-service"]))
    for engine in inferencedata.ENGINES:
        for p in inference.service_panels(engine, "$job", None):
            assert p.query in merged, (engine, p.id)
        for tile in inferencedata.TILES:
            expr = inferencedata.expr_for(engine, tile.id, "$job")
            assert expr is None or expr in merged, (engine, tile.id)
    # Every panel of every spec is written once, under its English title.
    for uid, d in exported.items():
        spec = by_uid[uid]
        assert len(_charts(d)) == len(spec.panels())
        titles = _by_title(spec, d)
        for p in spec.panels():
            assert spec.strings.get(p.title_key, p.title) in titles, p.id


def test_titles_are_the_english_texts_of_their_keys(exported: dict[str, dict[str, Any]]) -> None:
    titles = {p["title"] for p in _charts(exported["gpuwatch-cluster"])}
    assert (
        "Idle but held (a process, ~0 % utilization for 10 min)" in titles
    )  # cluster.idle_held, not the id's
    assert "Temperature (GPU, memory)" in {p["title"] for p in _charts(exported["gpuwatch-gpu"])}


def test_every_variable_a_query_names_is_defined_before_use(exported: dict[str, dict[str, Any]]) -> None:
    for uid, d in exported.items():
        names: list[str] = []
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                assert re.fullmatch(r"label_values\(.+, [A-Za-z_]\w*\)", v["query"]), v["query"]
                assert query_variables(v["query"]) <= set(names), (uid, v["name"])  # chained in order
                assert v["datasource"] == DATASOURCE
            names.append(v["name"])
        for expr in _exprs(d):
            assert query_variables(expr) <= set(names), (uid, expr)
            # gpuwatch's own range variables are all Grafana's now
            assert not re.search(r"\$__(rate|today)\b", expr), expr


def test_regex_matchers_take_multi_value_variables_and_equality_single_ones(
    exported: dict[str, dict[str, Any]],
) -> None:
    """Grafana writes a multi-value variable as a regex alternation, right only after `=~`."""
    for d in exported.values():
        multi = {v["name"] for v in d["templating"]["list"] if v.get("multi")}
        for expr in _exprs(d):
            for op, name in re.findall(r'(=~|!~|!=|=)\s*"\$(\w+)"', expr):
                assert (name in multi) == (op == "=~"), (d["uid"], op, name, expr)


def test_range_variables_are_grafanas() -> None:
    assert grafana_query("rate(x[$__rate])") == "rate(x[$__rate_interval])"
    assert grafana_query('increase(x{h="$hostname"}[$__today])') == 'increase(x{h="$hostname"}[$__range])'
    assert set(BUILTINS) == {
        "__rate",
        "__range",
        "__today",
        "__interval",
    }  # static/js/gpuwatch.js builtinVars


def test_energy_today_is_asked_over_today_so_far(exported: dict[str, dict[str, Any]]) -> None:
    (energy,) = [p for p in _charts(exported["gpuwatch-cluster"]) if p["title"] == "Energy today"]
    assert energy["timeFrom"] == "now/d" and energy["targets"][0]["instant"] is True
    assert "[$__range]" in energy["targets"][0]["expr"]


def test_every_unit_maps_to_a_grafana_unit(grafanamodel: Any, exported: dict[str, dict[str, Any]]) -> None:
    assert set(UNITS) == set(PANEL_UNITS)
    for unit, grafana in UNITS.items():
        # `si:<prefix><unit>` is Grafana's custom SI unit (getValueFormat in @grafana/data).
        assert grafana in grafanamodel.UNIT_IDS or re.fullmatch(r"si:[kMG]Hz", grafana), unit
    assert (UNITS["mhz"], UNITS["ratio"], UNITS["mib"], UNITS["bytes_per_second"]) == (
        "si:MHz", "percentunit", "mbytes", "Bps"
    )  # fmt: skip
    for uid, spec in {s.uid: s for s in specs()}.items():
        units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in _charts(exported[uid])}
        for p in spec.panels():
            assert units[spec.strings.get(p.title_key, p.title)] == UNITS[p.unit], p.id


def test_thresholds_become_steps_and_lower_is_worse_runs_the_other_way() -> None:
    assert _thresholds(Thresholds(80, 85))["steps"] == [
        {"color": "green", "value": None}, {"color": "orange", "value": 80}, {"color": "red", "value": 85}
    ]  # fmt: skip
    assert _thresholds(Thresholds(5e9, 1e9, above=False))["steps"] == [
        {"color": "red", "value": None}, {"color": "orange", "value": 1e9}, {"color": "green", "value": 5e9}
    ]  # fmt: skip
    assert _thresholds(Thresholds())["steps"] == [{"color": "green", "value": None}]


def test_kinds_map_to_grafana_panel_types(exported: dict[str, dict[str, Any]]) -> None:
    def panel(uid: str, title: str) -> dict[str, Any]:
        (found,) = [p for p in _charts(exported[uid]) if p["title"] == title]
        return found

    assert panel("gpuwatch-cluster", "GPU utilization")["type"] == "status-history"
    assert panel("gpuwatch-cluster", "Memory used per GPU")["type"] == "bargauge"
    stat = panel("gpuwatch-cluster", "GPUs")
    assert stat["type"] == "stat" and stat["targets"][0]["instant"]
    table = panel("gpuwatch-gpu", "Processes now")
    assert table["type"] == "table" and table["targets"][0]["format"] == "table"
    assert table["transformations"][0]["options"]["include"]["names"] == [*gpu.PANELS[8].columns, "Value"]
    assert panel("gpuwatch-gpu", "XID, ECC, throttle and alert events")["type"] == "state-timeline"
    latency = panel("gpuwatch-inference-service", "Request latency distribution (end to end)")
    assert latency["type"] == "heatmap" and latency["targets"][0]["format"] == "heatmap"
    ttft = panel("gpuwatch-inference-service", "Time to first token")["fieldConfig"]["defaults"]
    assert ttft["custom"]["scaleDistribution"] == {"type": "log", "log": 10} and "min" not in ttft
    temp = panel("gpuwatch-gpu", "Temperature (GPU, memory)")
    assert temp["targets"][0]["legendFormat"] == "{{__name__}}"
    assert [s["value"] for s in temp["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 80, 85]
    assert temp["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"] == {"mode": "dashed"}


# -- the command --------------------------------------------------------------------------------------


def test_export_writes_one_file_per_dashboard_into_the_current_directory(tmp_path: Path) -> None:
    out = subprocess.run(
        [*GPUWATCH, "dashboards", "export"],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{u}.json" for u in UIDS)
    written = json.loads((tmp_path / "gpuwatch-gpu.json").read_text())
    assert written == json.loads(json.dumps(next(d for d in dashboards() if d["uid"] == "gpuwatch-gpu")))
    assert out.stderr.count("\n") == 1 and "4 Grafana dashboards written" in out.stderr


def test_export_into_a_directory_and_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "grafana"
    assert main(["dashboards", "export", "-o", str(target)]) == 0
    assert len(list(target.glob("gpuwatch-*.json"))) == 4
    capsys.readouterr()
    assert main(["dashboards", "export", "-o", "-"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [d["uid"] for d in listed] == UIDS


@pytest.mark.parametrize("where", ["file", "missing/parent"])
def test_export_into_a_bad_directory_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    (tmp_path / "file").write_text("")
    target = tmp_path / where
    assert main(["dashboards", "export", "-o", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuwatch: cannot write dashboards into {target}: ") and err.count("\n") == 1
    assert not (tmp_path / "missing").exists()


# -- end to end: VictoriaMetrics and gpuwatch answer every panel ---------------------------------------

NODE = "node-a"
# Both stores are asked at one time this far back: what gpuwatch had then has reached VictoriaMetrics.
LAG_S = 3.0
# Values chosen where the first listed one would leave a panel empty for a reason of the demo's.
PREFER = {"job": "demo-vllm"}  # SGLang exposes no finish reasons
# Panels the demo leaves empty while the test runs: they must agree (empty on both, or data on both).
EMPTY_IN_THE_DEMO = {
    "gpuwatch-cluster": {"Idle but held (a process, ~0 % utilization for 10 min)"},  # every demo GPU is busy
    "gpuwatch-training-run": {
        "Eval loss",  # the demo's trainer logs no eval loss
        "Checkpoint durations",  # its first checkpoint is at step 300 (5 minutes)
        "XID errors",  # the incident schedule's first XID comes later
    },
}


def grafana_value(value: str, *, multi: bool) -> str:
    """`value` as Grafana's Prometheus data source writes a chosen variable value into a query
    (prometheusRegularEscape, or prometheusSpecialRegexEscape for a multi-value variable)."""
    if not multi:
        return value.replace("\\", "\\\\").replace("'", "\\\\'")
    return re.sub(r"[$^*{}\[\]+?.()|]", lambda m: "\\\\" + m.group(0), value.replace("\\", "\\\\\\\\"))


def fill(expr: str, values: dict[str, str]) -> str:
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "10m").replace("$__interval", "15s")
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        r = requests.get(f"{self.url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"}, timeout=20)
        body = r.json()
        assert body.get("status") == "success", (self.url, expr, body)
        return list(body["data"]["result"])

    def label_values(self, label: str, selector: str) -> list[str]:
        r = requests.get(f"{self.url}/api/v1/label/{label}/values", params={"match[]": selector}, timeout=20)
        body = r.json()
        assert body.get("status") == "success", (self.url, selector, body)
        return sorted(body["data"])


def choose_values(d: dict[str, Any], gw: Api, vm: Api) -> dict[str, str]:
    """A value for each variable, as a Grafana user would pick it, from the label values both list."""
    values: dict[str, str] = {}
    for v in d["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"])
        assert m, v["query"]
        selector = fill(m.group(1), values)
        theirs, ours = vm.label_values(m.group(2), selector), gw.label_values(m.group(2), selector)
        assert theirs == ours and ours, (d["uid"], v["name"], selector, theirs, ours)
        chosen = PREFER[v["name"]] if PREFER.get(v["name"]) in ours else ours[0]
        values[v["name"]] = grafana_value(chosen, multi=bool(v.get("multi")))
    return values


def node_config(tmp_path: Path, vm: str) -> Path:
    """A demo node writing to `vm`, scraping its simulated servers every second, with the built-in
    rules as a rule file whose inference group runs every 2 s instead of 30 s (the recording rules the
    inference tiles read would otherwise take half a minute to appear)."""
    from gpuwatch.app.build import configured_rule_groups
    from gpuwatch.app.config import load
    from gpuwatch.rules.pack import export_text

    rules = export_text(configured_rule_groups(load(None, {})))
    assert "interval: 30s" in rules
    (tmp_path / "rules.yml").write_text(rules.replace("interval: 30s", "interval: 2s"))
    path = tmp_path / "node.yml"
    path.write_text(
        "sample_interval: 1s\nscrape_interval: 1s\nevaluation_interval: 5s\nbuiltin_rules: false\n"
        f"rule_files: [{tmp_path / 'rules.yml'}]\nremote_write:\n  - url: {vm}/api/v1/write\n"
        "    queue_config: {batch_send_deadline: 500ms, min_backoff: 100ms, max_backoff: 1s}\n"
    )
    return path


@pytest.fixture
def victoriametrics(tmp_path: Path) -> Iterator[str]:
    vm_bin = require_tool("victoria-metrics")
    port = free_port()
    proc = subprocess.Popen(
        [vm_bin, f"-storageDataPath={tmp_path / 'vm'}", f"-httpListenAddr=127.0.0.1:{port}",
         "-search.latencyOffset=1s"],  # 30 s by default: the newest samples hidden from queries
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return requests.get(f"{url}/health", timeout=2).status_code == 200
            except requests.RequestException:
                return False

        wait_until(up, 20, "VictoriaMetrics did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.slow
def test_every_panel_answers_on_victoriametrics_and_on_gpuwatch(tmp_path: Path, victoriametrics: str) -> None:
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOSTNAME=NODE, GPUWATCH_DEMO_GPUS="2",
                    GPUWATCH_HOST_INTERVAL="1s")  # fmt: skip
    (tmp_path / "node").mkdir()
    node = Server(["--demo", "--config", str(node_config(tmp_path, victoriametrics))], tmp_path / "node" / "data",
                  free_port(), env)  # fmt: skip
    node.start()
    try:
        gw, vm = Api(node.url), Api(victoriametrics)
        found = {d["uid"]: d for d in dashboards()}

        def answers(api: Api, d: dict[str, Any], values: dict[str, str], at: float) -> dict[str, bool]:
            return {p["title"]: all(api.query(fill(t["expr"], values), at) for t in p["targets"])
                    for p in _charts(d)}  # fmt: skip

        waiting: list[object] = []

        def ready() -> bool:  # every panel the demo fills has data on VictoriaMetrics
            requests.get(f"{victoriametrics}/internal/force_flush", timeout=10)
            try:
                for uid, d in found.items():
                    got = answers(vm, d, choose_values(d, gw, vm), time.time() - LAG_S)
                    waiting[:] = [
                        (uid, t)
                        for t, ok in got.items()
                        if not ok and t not in EMPTY_IN_THE_DEMO.get(uid, ())
                    ]
                    if waiting:
                        return False
            except AssertionError as e:  # a variable with no value yet (or not yet on both)
                waiting[:] = [e]
                return False
            return True

        try:
            wait_until(ready, 45, "panels without data on VictoriaMetrics", 1.0)
        except AssertionError:
            raise AssertionError(f"still waiting for {waiting}; node log:\n{node.log[-3000:]}") from None
        requests.get(f"{victoriametrics}/internal/force_flush", timeout=10)
        at = time.time() - LAG_S
        for uid, d in found.items():
            values = choose_values(d, gw, vm)
            theirs, ours = answers(vm, d, values, at), answers(gw, d, values, at)
            empty = EMPTY_IN_THE_DEMO.get(uid, set())
            assert {t for t, ok in ours.items() if not ok} <= empty, (uid, values, ours)
            assert theirs == ours, (
                uid,
                values,
                {t: (theirs[t], ours[t]) for t in ours if theirs[t] != ours[t]},
            )
    finally:
        node.stop(signal.SIGKILL)
