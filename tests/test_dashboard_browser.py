"""The dashboard in a real browser (Debian's Chromium) against one `gpuwatch serve --demo`."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import pytest

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
