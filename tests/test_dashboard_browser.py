"""The dashboard in a real browser (Debian's Chromium) against one `gpuwatch serve --demo`."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, quote, urlparse

import pytest
import requests

from tests.browser import chart_points, wait_panels

pytestmark = pytest.mark.slow
LIVE = "from=now-5m&to=now&refresh=off"


def query_params(url: str) -> dict[str, str]:
    return {k: v[0] for k, v in parse_qs(urlparse(url).query).items()}


def test_cluster_page_draws_every_panel_without_console_errors(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{demo_server.url}/?{LIVE}")
    states = wait_panels(page)
    # The demo has no idle-but-held GPU for 10 minutes yet: that table says "no data", not zero.
    assert states.pop("idle_held") in ("data", "nodata")
    assert set(states.values()) == {"data"}, repr(states)
    for chart in ("util", "memory", "power", "net", "disk"):
        assert chart_points(page, chart) > 0, chart
    assert page.locator("#panel-gpus .gw-stat").inner_text() == "8"
    assert page.locator("a.gw-tile[data-state='Ready']").count() == 1
    assert page.console.errors == []


def hostname(srv) -> str:  # type: ignore[no-untyped-def]
    return str(srv.get("/api/overview").json()["hostname"])


def test_gpu_page_health_and_charts(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    host = hostname(demo_server)
    page.goto(f"{demo_server.url}/gpus/{host}/0?{LIVE}")
    states = wait_panels(page)
    assert set(states.values()) <= {"data", "empty"}, repr(states)
    for chart in ("util", "memory", "membw", "temp", "power", "clocks", "pcie"):
        assert states[chart] == "data" and chart_points(page, chart) > 0, chart
    page.wait_for_function("() => document.querySelectorAll('[data-health][data-state]').length === 5")
    health = page.eval_on_selector_all(
        "[data-health]", "els => els.map(e => [e.dataset.health, e.dataset.state])"
    )
    assert all(state == "data" for _, state in health), health  # the demo GPUs report every health field
    # Charts of several metrics name them in words, not DCGM names.
    names = page.evaluate(
        """() => Object.fromEntries(['memory', 'temp', 'power'].map(id => [id, document.querySelector(
             '#panel-' + id + ' .js-plotly-plot').data.filter(d => d.name !== 'events').map(d => d.name).sort()]))"""
    )
    assert names == {"memory": ["total", "used"], "temp": ["GPU", "memory"], "power": ["limit", "power"]}, (
        names
    )
    assert page.locator("[data-health='ecc'] .value").inner_text() == "0 / 0"
    # A container id is shown as `docker ps` shows it, the whole id on hover.
    cell = page.locator("#panel-processes td[title]").first
    short, full = cell.inner_text(), cell.get_attribute("title")
    assert len(short) == 12 and len(full) == 64 and full.startswith(short)
    assert page.console.errors == []


def test_explore_graph_table_completion_and_parse_error(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{demo_server.url}/explore?expr=DCGM_FI_DEV_GPU_UTIL&{LIVE}")
    page.wait_for_function("() => document.getElementById('panel-explore').dataset.state === 'data'")
    assert chart_points(page, "explore") > 0
    assert "step 1 s · 8 series" in page.locator("#info").inner_text()

    page.check("input[name=view][value=table]")
    page.wait_for_selector("#result-table")
    assert page.locator("#result-table tbody tr").count() == 8
    assert query_params(page.url)["view"] == "table"

    box = page.locator("#expr")
    box.fill("")
    box.type("DCGM_FI_DEV_GP")
    page.wait_for_selector("#complete li[data-value='DCGM_FI_DEV_GPU_UTIL']")
    box.fill("sum(up) byy (job)")
    box.press("Enter")
    page.wait_for_selector("#parse-error[data-position='8']")
    assert 'unexpected identifier "byy"' in page.locator("#parse-error").inner_text()
    assert query_params(page.url)["expr"] == "sum(up) byy (job)"
    assert page.console.errors == []


def test_timeline_puts_events_on_one_axis(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{demo_server.url}/timeline?from=now-5m&to=now&refresh=1s")
    # The demo's alerts turn pending at the first rule evaluation: events arrive within seconds.
    page.wait_for_function(
        "() => document.getElementById('panel-timeline').dataset.state === 'data'", timeout=30_000
    )
    assert chart_points(page, "timeline") > 0
    assert page.locator("#sources tr[data-source]").count() == len(page.evaluate("gw.panels"))
    assert page.console.errors == []


def test_range_refresh_and_theme_live_in_the_url(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    page.emulate_media(color_scheme="light")
    page.goto(f"{demo_server.url}/?{LIVE}")
    wait_panels(page)
    assert page.evaluate("gw.theme()") == "light"
    page.select_option("#gw-range", "15m")
    page.wait_for_function("() => location.search.includes('from=now-15m')")
    page.select_option("#gw-refresh", "30s")
    page.wait_for_function("() => location.search.includes('refresh=30s')")
    page.click("#gw-theme")
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    params = query_params(page.url)
    assert (params["from"], params["to"], params["refresh"], params["theme"]) == (
        "now-15m",
        "now",
        "30s",
        "dark",
    )

    page.reload()  # the URL alone brings the view back
    wait_panels(page)
    assert page.input_value("#gw-range") == "15m" and page.input_value("#gw-refresh") == "30s"
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    r = page.evaluate("gw.range()")
    assert abs((r["end"] - r["start"]) - 15 * 60_000) < 1000
    page.goto(f"{demo_server.url}/explore")  # no theme in the URL: the remembered choice
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    page.evaluate("localStorage.clear()")
    page.emulate_media(color_scheme="dark")
    page.goto(f"{demo_server.url}/timeline")  # nothing remembered: the system's
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    page.emulate_media(color_scheme="light")
    page.reload()
    assert page.evaluate("document.documentElement.dataset.theme") == "light"
    assert page.console.errors == []


def test_dark_charts_draw_grid_lines_in_the_themes_colour(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    # Plotly's default grid is near white: over a heatmap's empty cells it drew white lines in dark mode.
    page.goto(f"{demo_server.url}/?{LIVE}&theme=dark")
    wait_panels(page)
    assert page.locator("#panel-util .heatmaplayer").count() > 0
    strokes = page.evaluate(
        """() => {
              const probe = document.createElement('div');
              probe.style.color = getComputedStyle(document.documentElement).getPropertyValue('--grid');
              document.body.appendChild(probe);
              const grid = getComputedStyle(probe).color.replace(/ /g, '');
              const seen = new Set();
              document.querySelectorAll('.gridlayer path').forEach(p => seen.add(p.style.stroke.replace(/ /g, '')));
              return { grid: grid, seen: [...seen] };
            }"""
    )
    assert strokes["seen"] and set(strokes["seen"]) == {strokes["grid"]}, strokes
    assert page.console.errors == []


def test_auto_refresh_asks_again_and_zoom_pauses_it(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    host = hostname(demo_server)
    page.goto(f"{demo_server.url}/gpus/{host}/0?from=now-5m&to=now&refresh=1s")
    wait_panels(page)
    with page.expect_request(lambda r: "/api/v1/query_range" in r.url, timeout=5000):
        pass  # a refresh tick asks again within a second or so
    chart = page.locator("#panel-util .nsewdrag").first
    box = chart.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.5, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.7, y, steps=5)
    page.mouse.move(box["x"] + box["width"] * 0.9, y, steps=5)
    page.mouse.up()
    page.wait_for_function("() => /from=\\d+/.test(location.search)")
    params = query_params(page.url)
    assert params["refresh"] == "off" and int(params["to"]) > int(params["from"])
    span = int(params["to"]) - int(params["from"])
    assert 30_000 < span < 120_000  # 40 % of a 5-minute chart
    assert page.locator("#gw-zoomed").is_visible()
    assert page.input_value("#gw-range") == "custom"
    assert page.console.errors == []


def test_drill_down_keeps_the_range(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{demo_server.url}/?from=now-15m&to=now&refresh=30s")
    wait_panels(page)
    page.locator("a.gpu-link").first.click()
    page.wait_for_url("**/gpus/**")
    params = query_params(page.url)
    assert (params["from"], params["to"], params["refresh"]) == ("now-15m", "now", "30s")
    page.go_back()
    page.locator("a.gw-tile").first.click()
    page.wait_for_url("**hostname=**")
    assert query_params(page.url)["from"] == "now-15m"
    page.locator("a[data-nav='timeline']").click()
    page.wait_for_url("**/timeline**")
    assert query_params(page.url)["from"] == "now-15m"
    assert page.console.errors == []


def test_figures_are_pure_functions_of_query_rows(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{demo_server.url}/explore")
    got = page.evaluate(
        """() => {
      const rows = [
        {metric: {Hostname: 'b', gpu: '10'}, values: [[100, '1'], [110, '2'], [140, '5']]},
        {metric: {Hostname: '<i>a</i>', gpu: '2'}, values: [[100, '7']]},
      ];
      const p = {id: 'x', kind: 'heatmap', unit: 'percent', legend: '{{Hostname}}/{{gpu}}', height: 200, thresholds: {}};
      const h = gw.figures.heatmap(rows, p, {step: 10, qstart: 100000, qend: 140000});
      const t = gw.figures.timeseries(rows.slice(0, 1), Object.assign({}, p, {kind: 'timeseries'}), {step: 10});
      const b = gw.figures.bars(rows, Object.assign({}, p, {thresholds: {warn: 4, crit: 6}}), {colors: {accent: 'g', warn: 'y', crit: 'r', grid: '#ccc', fg: '#000'}});
      const e = gw.figures.events([{metric: {x: '1'}, values: [[100, '0'], [110, '0'], [120, '3'], [130, '3'], [140, '4']]}],
                                  {id: 'e', kind: 'events', unit: 'count', counter: true, legend: ''}, {step: 10, qstart: 100000});
      const evp = {id: 'events', kind: 'events', unit: 'count', counter: true, legend: '{{__name__}} {{xid}}{{reason}}'};
      const marks = gw.eventList([
        {metric: {__name__: 'gpuwatch_xid_errors_total', xid: '<b>79</b>'}, values: [[120, '1'], [130, '1']]},
        {metric: {__name__: 'gpuwatch_clock_throttled', reason: 'sw_thermal'}, values: [[100, '0'], [110, '1'], [120, '0']]},
        {metric: {__name__: 'gpuwatch_clock_throttled', reason: 'sw_power_cap'}, values: [[100, '0'], [130, '1']]},
      ], evp, {step: 10, qstart: 100000});
      const colors = {accent: 'g', warn: 'y', crit: 'r', grid: '#ccc', fg: '#000', muted: '#999'};
      const tm = gw.figures.timeseries(rows.slice(0, 1), Object.assign({}, p, {kind: 'timeseries', thresholds: {warn: 4}}),
                                       {step: 10, marks: marks, colors: colors});
      const lines = tm.layout.shapes.filter(s => s.yref === 'paper');
      const trace = tm.data.find(d => d.name === 'events');
      return {hy: h.data[0].y, hz: h.data[0].z, ty: t.data[0].y, by: b.data[0].y, bc: b.data[0].marker.color, bx: b.data[0].x,
              ecount: e.count, steps: [gw.stepFor(0, 3600e3, 600), gw.stepFor(0, 7 * 86400e3, 1200), gw.stepFor(0, 30 * 86400e3, 100000)],
              scatter: [h, t, b, e, tm].some(f => f.data.some(d => d.type === 'scattergl')),
              marks: marks.map(m => [m.t, m.kind, m.name]),
              lines: lines.map(s => [s.x0, s.x0 === s.x1, s.line.color]),
              lineTimes: lines.map(s => s.x0), at: [gw.localTime(110000), gw.localTime(120000)],
              thresholds: tm.layout.shapes.filter(s => s.yref === 'y').length,
              trace: {axis: trace.yaxis, text: trace.text, y: trace.y, legend: trace.showlegend, colors: trace.marker.color},
              axis2: tm.layout.yaxis2, plain: t.data.length};
    }"""
    )
    assert got["hy"] == ["&lt;i&gt;a&lt;/i&gt;/2", "b/10"]  # sorted, escaped for Plotly
    assert got["hz"] == [[7, None, None, None, None], [1, 2, None, None, 5]]
    assert got["ty"] == [1, 2, None, 5]  # a gap of missing steps breaks the line
    assert got["by"] == [7, 5] and got["bc"] == ["r", "y"] and got["bx"] == ["&lt;i&gt;a&lt;/i&gt;/2", "b/10"]
    assert got["ecount"] == 2  # two rises; the series was there from the start
    assert got["steps"] == [15, 1800, 1800]  # 300 points on 600 px; at most 1,500 points
    assert got["scatter"] is False
    # events as marks on a time chart: a dashed line each on the chart's own x axis, full height
    # (paper y), with a hoverable marker on a hidden axis; names escaped for Plotly
    assert got["marks"] == [
        [120000, "xid", "XID <b>79</b>"],  # appeared after the range start; metric names in words
        [110000, "throttle", "throttled sw_thermal"],
        [130000, "power_cap", "throttled sw_power_cap"],  # listed, not marked (below)
    ]
    assert got["lineTimes"] == got["at"][::-1] and [c for *_, c in got["lines"]] == ["r", "y"]
    assert all(vertical for _, vertical, _ in got["lines"]) and got["thresholds"] == 1
    assert got["trace"] == {
        "axis": "y2",
        "text": ["XID &lt;b&gt;79&lt;/b&gt;", "throttled sw_thermal"],
        "y": [1, 1],
        "legend": False,
        "colors": ["r", "y"],
    }
    assert got["axis2"]["overlaying"] == "y" and got["axis2"]["visible"] is False
    assert got["plain"] == 1  # no marks given: no extra trace


XSS = "<img src=x onerror=window.__xss=1>"


def test_label_values_stay_text(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    """Runs last: it adds a GPU (pushed) to the shared demo server."""
    page.goto(f"{demo_server.url}/?from=now-5m&to=now&refresh=1s")
    wait_panels(page)
    body = f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{XSS}",gpu="0",UUID="GPU-xss"}} 50\n'
    assert requests.put(f"{demo_server.url}/metrics/job/xss", data=body, timeout=10).status_code in (200, 202)
    # The open page's refresh brings the new node's tile (built in JS) and heatmap row.
    tile = page.locator(f"a.gw-tile[data-host='{XSS}'] .name")
    tile.wait_for(timeout=20_000)
    assert tile.inner_text() == XSS
    ticks = "Array.from(document.querySelectorAll('#panel-util .ytick text')).map(t => t.textContent)"
    page.wait_for_function(f"() => {ticks}.includes({XSS + '/0'!r})", timeout=20_000)
    page.goto(
        f"{demo_server.url}/explore?expr=DCGM_FI_DEV_GPU_UTIL%7BUUID%3D%22GPU-xss%22%7D&view=table&{LIVE}"
    )
    page.wait_for_selector("#result-table")
    assert XSS in page.locator("#result-table").inner_text()
    page.goto(f"{demo_server.url}/gpus/{quote(XSS, safe='')}/0?{LIVE}")
    wait_panels(page)
    assert XSS in page.locator("#gpu-host").inner_text()
    assert page.evaluate("window.__xss") is None
    assert page.console.errors == []


def test_gpu_charts_mark_the_events_on_their_time_axis(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    """Runs last: it adds a GPU (pushed) with an XID to the shared demo server."""
    host = "marks-node"
    body = (
        f'DCGM_FI_DEV_GPU_UTIL{{Hostname="{host}",gpu="0",UUID="GPU-marks"}} 40\n'
        f'DCGM_FI_DEV_POWER_USAGE{{Hostname="{host}",gpu="0",UUID="GPU-marks"}} 300\n'
        f'gpuwatch_xid_errors_total{{Hostname="{host}",gpu="0",UUID="GPU-marks",xid="79"}} 1\n'
    )
    assert requests.put(f"{demo_server.url}/metrics/job/marks", data=body, timeout=10).status_code in (
        200,
        202,
    )
    page.goto(f"{demo_server.url}/gpus/{host}/0?{LIVE}")
    states = wait_panels(page)
    assert states["util"] == states["power"] == states["events"] == "data", states
    marks = """id => {
      const el = document.querySelector('#panel-' + id + ' .gw-chart');
      const f = el && el.gwFigure;
      const t = f && f.data.find(d => d.name === 'events');
      return t ? {text: t.text, lines: f.layout.shapes.filter(s => s.yref === 'paper' && s.x0 === s.x1).length} : null;
    }"""
    for chart in ("util", "power"):  # every chart with data shows the XID where the events chart has it
        page.wait_for_function(f"() => ({marks})({chart!r}) !== null", timeout=20_000)
        got = page.evaluate(marks, chart)
        # the XID, and the alert it fires where the rules ran before the page drew (a 15 s evaluation)
        assert "XID 79" in got["text"] and set(got["text"]) <= {
            "XID 79",
            "alert 79GPUXidErrorCritical firing",
        }, got
        assert got["lines"] == len(got["text"]), (chart, got)
        # drawn: a marker point in the chart's SVG besides the line's
        assert page.locator(f"#panel-{chart} .scatterlayer .trace .point").count() >= 1
    assert page.console.errors == []


def answer_busy(route) -> None:  # type: ignore[no-untyped-def]
    """Answer a request as gpuwatch does past its query turns (web/admission.py)."""
    route.fulfill(
        status=503,
        headers={"Retry-After": "1"},
        content_type="application/json",
        body='{"status":"error","errorType":"unavailable","error":"too many concurrent queries (test)"}',
    )


def test_explore_asks_a_busy_query_again_without_a_refresh(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    """Explore with auto-refresh off: a query answered busy (503 `unavailable`) twice is asked again
    within seconds and then drawn, in both the graph and the table view; never shown as an error."""
    asked: list[str] = []

    def first_two_busy(route) -> None:  # type: ignore[no-untyped-def]
        asked.append(route.request.url)
        if len(asked) <= 2:
            answer_busy(route)
        else:
            route.continue_()

    for view, path in (("", "query_range"), ("&view=table", "query?")):
        asked.clear()
        page.route(f"**/api/v1/{path}*", first_two_busy)
        page.goto(f"{demo_server.url}/explore?expr=DCGM_FI_DEV_GPU_UTIL{view}&{LIVE}")
        page.wait_for_function(
            "() => document.getElementById('panel-explore').dataset.state === 'data'", timeout=15_000
        )
        assert len(asked) >= 3, asked  # busy, busy, answered: with no refresh of the page's own
        page.unroute(f"**/api/v1/{path}*")
    assert page.locator("#result-table tbody tr").count() > 0
    assert [e for e in page.console.errors if "503" not in e] == []


def test_a_busy_server_is_asked_again_next_refresh_not_shown_as_an_error(demo_server, page) -> None:  # type: ignore[no-untyped-def]
    """A 503 `unavailable` (too many queries at once: web/admission.py) is "busy": the panel keeps what it
    shows and asks again at the next refresh. Over 6 hours a chart asks once its 120 s step; here every
    query is answered busy twice and still every panel draws within the wait."""
    busy: dict[str, int] = {}
    asked: dict[str, int] = {}

    def first_two_busy(route) -> None:  # type: ignore[no-untyped-def]
        # One key a panel: "energy today" asks over a window that grows by a second each tick.
        key = re.sub(r"\[\d+s\]", "[_]", query_params(route.request.url).get("query", ""))
        asked[key] = asked.get(key, 0) + 1
        if busy.get(key, 0) < 2:
            busy[key] = busy.get(key, 0) + 1
            answer_busy(route)
        else:
            route.continue_()

    page.route("**/api/v1/query*", first_two_busy)
    page.goto(f"{demo_server.url}/?from=now-6h&to=now&refresh=1s")
    states = wait_panels(page, timeout_ms=60_000)
    assert states.pop("idle_held") in ("data", "nodata")
    assert set(states.values()) == {"data"}, repr(states)  # never "error"
    charts = [page.get_attribute(f"#panel-{p}", "data-query") for p in ("util", "power")]
    assert all(asked.get(q or "", 0) >= 3 for q in charts), (charts, asked)  # busy, busy, answered
    refused = [e for e in page.console.errors if "503" not in e]  # the browser logs each 503 it got
    assert refused == []
