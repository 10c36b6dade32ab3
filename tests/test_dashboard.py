"""The dashboard without a browser: panels' PromQL, node states, parse error positions, the Plotly
asset, the pages' JSON twins and their languages."""

from __future__ import annotations

import gzip
from pathlib import Path

import promql_parser as pp
import pytest
import yaml
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.query.limits import walk
from gpuwatch.query.parse import parse
from gpuwatch.web import create_app
from gpuwatch.web.dash import cluster, gpu, timeline
from gpuwatch.web.dash.assets import CACHE_CONTROL
from gpuwatch.web.dash.explore import locate_error
from gpuwatch.web.dash.panel import Panel, check_unique, fill
from gpuwatch.web.overview import GpuRow, NodeRow

RULES = Path(__file__).resolve().parent.parent / "gpuwatch" / "rules" / "builtin"
PAGES = {"cluster": cluster.PANELS, "gpu": gpu.PANELS, "timeline": timeline.PANELS}
SAMPLE_VARS = {
    "hostname": 'node-"1"',
    "host_re": r"node\-1",
    "gpu": "0",
    "__rate": "60s",
    "__interval": "15s",
    "__range": "3600s",
    "__today": "7200s",
}


def tick(runtime: Runtime, clock: FakeClock, n: int = 3) -> None:
    for _ in range(n):
        runtime.jobs.run("sample")
        clock.advance(1)
    runtime.store.flush()


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a `__name__` regex's alternatives too)."""
    names: set[str] = set()
    for node in walk(parse(expr).expr):
        if isinstance(node, pp.VectorSelector):
            if node.name:
                names.add(node.name)
            for m in node.matchers.matchers:
                if m.name == "__name__":
                    names.update(m.value.split("|"))
    return names


def produced_names(runtime: Runtime) -> set[str]:
    """What gpuwatch writes: its metadata (GPU, host, self, push families), recording rules, ALERTS, up."""
    names = set(runtime.metadata)
    for path in RULES.glob("*.yml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names.update(r["record"] for r in group["rules"] if "record" in r)
    return names | {"ALERTS", "ALERTS_FOR_STATE", "up", "scrape_duration_seconds", "scrape_samples_scraped"}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_panel_query_parses_and_names_only_metrics_gpuwatch_produces(
    runtime: Runtime, page: str
) -> None:
    known = produced_names(runtime)
    queries = [(p.id, q) for p in PAGES[page] for q in p.queries()]
    if page == "gpu":
        queries += [("health", gpu.HEALTH), ("xid_total", gpu.XID_TOTAL)]
    for pid, query in queries:
        filled = fill(query, SAMPLE_VARS)
        assert "$" not in filled, (pid, filled)
        unknown = metric_names(filled) - known
        assert not unknown, f"{page}/{pid} names metrics gpuwatch does not produce: {unknown}"


def test_fill_escapes_values_for_a_quoted_string() -> None:
    assert fill('x{h="$hostname",g="$gpu",o="$other"}', {"hostname": 'a"b\\c', "gpu": "1"}) == (
        'x{h="a\\"b\\\\c",g="1",o="$other"}'
    )
    assert metric_names(fill('up{h="$hostname"}', {"hostname": '"} or vector(1) or {"'})) == {"up"}


def test_panel_rejects_unknown_units_kinds_and_widths() -> None:
    with pytest.raises(ValueError, match="unit"):
        Panel("a", "A", "up", unit="furlongs")
    with pytest.raises(ValueError, match="kind"):
        Panel("a", "A", "up", kind="pie")
    with pytest.raises(ValueError, match="width"):
        Panel("a", "A", "up", width=13)
    assert Panel("a", "A", 'x{h="$hostname"}', failed_if='up{job="$job"} == 0').variables() == {
        "hostname",
        "job",
    }
    with pytest.raises(ValueError, match="timeseries"):
        Panel("a", "A", "up", kind="bars", marks="e")
    with pytest.raises(ValueError, match="not an events panel"):
        check_unique([Panel("a", "A", "up", marks="b"), Panel("b", "B", "up")])
    assert len(check_unique([Panel("a", "A", "up", marks="b"), Panel("b", "B", "up", kind="events")])) == 2


def _gpu(host: str, seen_ms: int, temp: float = 50.0, gpu: str = "0") -> GpuRow:
    return GpuRow(gpu, f"GPU-{host}-{gpu}", "H100", host, "", seen_ms, {"DCGM_FI_DEV_GPU_TEMP": temp})


def test_node_tiles_tell_ready_notready_and_unreachable() -> None:
    now = 1_000_000
    rows = [
        _gpu("a", now - 1000, 61, "0"),
        _gpu("a", now - 1000, 72, "1"),
        _gpu("b", now - 600_000),  # answers, but its GPU figures are 10 minutes old
        _gpu("c", now - 1000),
    ]
    nodes = [
        NodeRow("nodes", "b:9842", "0.1", 1, True, now, is_up=True),
        NodeRow("nodes", "c:9842", "0.1", 1, False, now, is_up=False),  # its scrape fails
        NodeRow("nodes", "d:9842", "0.1", 4, False, now, is_up=False),  # never sent a GPU figure
        NodeRow("nodes", "e:9842", "0.1", 2, False, now, is_up=True),  # answers, its sampler is stuck
    ]
    firing = [{"alertname": "GPUTemperatureHigh", "Hostname": "a"}, {"alertname": "X", "instance": "c:9842"}]
    tiles = {
        t.name: t
        for t in cluster.node_tiles(
            rows, nodes, firing, local_host="a", local_ok=True, now_ms=now, stale_ms=30_000
        )
    }
    assert {n: t.state for n, t in tiles.items()} == {
        "a": "Ready",
        "b": "NotReady",
        "c": "Unreachable",
        "d": "Unreachable",
        "e": "NotReady",
    }
    assert (tiles["a"].gpus, tiles["a"].hottest_gpu, tiles["a"].hottest_c, tiles["a"].firing) == (
        2,
        "1",
        72,
        1,
    )
    assert tiles["c"].firing == 1 and tiles["d"].gpus == 4


@pytest.mark.parametrize(
    ("expr", "position"),
    [
        ("up", None),
        ("sum(up) byy (job)", 8),
        ("foo bar", 4),
        ("up or x y", 8),
        ("sum(rate(x[5m])", 3),
        ('up{job="a"', 10),
        ("1 +", 3),
        ("rate(up)", 7),
    ],
)
def test_parse_errors_point_where_the_query_stops_making_sense(expr: str, position: int | None) -> None:
    found = locate_error(expr)
    if position is None:
        assert found is None
    else:
        assert (
            found is not None and found["error"].startswith("parse error") and found["position"] == position
        )


def test_plotly_is_served_locally_gzipped_and_cached_for_a_year(client: FlaskClient) -> None:
    page = client.get("/").get_data(as_text=True)
    (url,) = [part.split('"')[0] for part in page.split('<script src="')[1:] if "plotly" in part]
    assert url.startswith("/static/vendor/plotly-") and url.endswith(".min.js")
    plain = client.get(url)
    zipped = client.get(url, headers={"Accept-Encoding": "gzip, br"})
    assert plain.status_code == zipped.status_code == 200
    assert zipped.headers["Content-Encoding"] == "gzip" and "Content-Encoding" not in plain.headers
    assert zipped.headers["Cache-Control"] == plain.headers["Cache-Control"] == CACHE_CONTROL
    assert gzip.decompress(zipped.data) == plain.data and len(zipped.data) < len(plain.data) / 2
    assert b"Plotly" in plain.data[:5000] or b"plotly" in plain.data[:5000]
    assert client.get("/static/vendor/plotly-0.0.0.min.js").status_code == 404


def test_json_twins_hold_the_pages_panels_and_data(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    tick(runtime, clock)
    c = client.get("/api/ui/cluster").get_json()
    assert c["page"] == "cluster" and [p["id"] for p in c["panels"]] == [p.id for p in cluster.PANELS]
    assert len(c["data"]["gpus_seen"]) == 4 and c["data"]["tiles"][0]["state"] == "Ready"
    assert c["variables"] == {"hostname": "", "host_re": ".+"}
    one = client.get("/api/ui/cluster?hostname=node-1").get_json()
    assert one["variables"]["host_re"] == r"node\-1"
    g = client.get("/api/ui/gpus/node-1/2").get_json()
    assert g["data"]["info"]["gpu"] == "2" and g["variables"] == {"hostname": "node-1", "gpu": "2"}
    charts = {p["id"]: p["marks"] for p in g["panels"] if p["kind"] == "timeseries"}
    assert charts == dict.fromkeys(("util", "memory", "membw", "temp", "power", "clocks", "pcie"), "events")
    assert client.get("/api/ui/gpus/node-1/9").get_json()["data"]["info"] is None
    assert client.get("/gpus/node-1/9").status_code == 200  # the page says it has not seen that GPU
    e = client.get("/api/ui/explore?expr=sum(up)+byy+(job)").get_json()
    assert e["data"]["parse"]["position"] == 8 and e["variables"]["view"] == "graph"
    parsed = client.get("/api/ui/explore/parse?expr=up").get_json()
    assert parsed == {"status": "success", "data": {"valid": True}}
    assert [p["id"] for p in client.get("/api/ui/timeline").get_json()["panels"]] == [
        p.id for p in timeline.PANELS
    ]


def test_pages_follow_the_language_setting_and_lang_parameter(client: FlaskClient) -> None:
    en = client.get("/").get_data(as_text=True)
    assert ">Cluster</a>" in en and 'lang="en"' in en
    zh = client.get("/?lang=zh").get_data(as_text=True)
    assert ">集群</a>" in zh and 'lang="zh"' in zh
    titles = {p["id"]: p["title"] for p in client.get("/api/ui/cluster?lang=zh").get_json()["panels"]}
    assert titles["util"] == "GPU 利用率"
    assert client.get("/explore?lang=zh").status_code == 200


def test_every_page_has_the_nav_controls_and_a_csrf_meta(client: FlaskClient) -> None:
    for path in ("/", "/gpus/node-1/0", "/explore", "/timeline"):
        html = client.get(path).get_data(as_text=True)
        for needed in (
            'id="gw-range"',
            'id="gw-refresh"',
            'id="gw-theme"',
            'name="csrf-token"',
            'id="gw-panels"',
        ):
            assert needed in html, (path, needed)
        for nav in ("/training", "/inference", "/alerts", "/explore", "/targets", "/logs", "/timeline"):
            assert f'href="{nav}"' in html
    assert "scattergl" not in (Path(__file__).resolve().parent.parent / "static/js/gpuwatch.js").read_text()


def test_the_language_setting_chooses_the_ui_strings(tmp_path: Path, clock: FakeClock) -> None:
    settings = load(None, {}, {"data_dir": str(tmp_path / "zh"), "demo": True, "language": "zh"})
    rt = build_runtime(
        settings, "node-1", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock, blocking_event_wait=False)
    )
    try:
        client = create_app(rt).test_client()
        assert ">集群</a>" in client.get("/").get_data(as_text=True)
        assert ">Cluster</a>" in client.get("/?lang=en").get_data(as_text=True)
    finally:
        rt.close()


def test_a_hub_without_gpus_drawing_its_nodes_gpus_says_nothing_of_its_own(
    tmp_path: Path, clock: FakeClock
) -> None:
    """ "No NVIDIA GPU found; run --demo" is news on a node without GPUs, not on a hub whose page
    shows its nodes' GPUs."""
    hub = build_runtime(load(None, {}, {"data_dir": str(tmp_path / "hub")}), "hub", clock=clock,
                        nvml=FakeNvml.no_driver())  # fmt: skip
    node = build_runtime(load(None, {}, {"data_dir": str(tmp_path / "node")}), "node-2", clock=clock,
                         nvml=FakeNvml(gpu_count=2, clock=clock, blocking_event_wait=False))  # fmt: skip
    try:
        client = create_app(hub).test_client()
        alone = client.get("/api/ui/cluster").get_json()["data"]
        assert "no NVIDIA GPU found" in alone["gpu_problem"]
        assert 'id="gpu-problem"' in client.get("/").get_data(as_text=True)
        tick(node, clock)
        now = clock.now_ms()
        for s in node.store.select([Matcher("__name__", "=~", "DCGM_.*")], now - 60_000, now):
            hub.store.append_series(s.name, s.labels, s.timestamps_ms, s.values)
        hub.store.flush()
        with_nodes = client.get("/api/ui/cluster").get_json()["data"]
        assert with_nodes["gpu_problem"] is None
        assert {g["hostname"] for g in with_nodes["gpus_seen"]} == {"node-2"}
        assert 'id="gpu-problem"' not in client.get("/").get_data(as_text=True)
        assert "no NVIDIA GPU found" in client.get("/-/health").get_json()["gpu_problem"]  # still said there
    finally:
        node.close()
        hub.close()
