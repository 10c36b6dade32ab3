"""Real-browser test helpers: Debian's Chromium driven by Playwright, against ONE `gpuwatch serve --demo`
for the whole session (fixtures `demo_server`, `browser` and `page` in conftest.py).

Playwright's own browser download is not used: tests launch /usr/bin/chromium. Without it (or without
the playwright package) they skip, except in CI (REQUIRE_TEST_TOOLS=1; `.ci/run` installs `chromium`),
where they fail.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 800}


def require_chromium() -> str:
    """The Chromium path; skips (fails in CI) when it or Playwright is missing."""
    missing = None
    if not Path(CHROMIUM).exists():
        missing = f"{CHROMIUM} is not installed (apt-get install chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "playwright is not installed (pip install -e '.[test]')"
    if missing:
        if os.environ.get("REQUIRE_TEST_TOOLS") == "1":
            pytest.fail(missing)
        pytest.skip(missing)
    return CHROMIUM


@dataclass
class Console:
    """What a page wrote to its console, and its uncaught errors."""

    messages: list[tuple[str, str]] = field(default_factory=list)

    @property
    def errors(self) -> list[str]:
        return [text for kind, text in self.messages if kind in ("error", "pageerror")]


def watch_console(page: Any) -> Console:
    console = Console()
    page.on("console", lambda m: console.messages.append((m.type, m.text)))
    page.on("pageerror", lambda e: console.messages.append(("pageerror", str(e))))
    return console


# Every panel has left "loading" (JS: each [data-panel] has a data-state other than loading).
PANELS_SETTLED = """() => {
  const ps = Array.from(document.querySelectorAll('[data-panel]'));
  return ps.length > 0 && ps.every(p => p.dataset.state && p.dataset.state !== 'loading');
}"""


def panel_states(page: Any) -> dict[str, str]:
    """{panel id: state} of every panel on the page (`data`, `nodata`, `unsupported`, `failed`, ...)."""
    return dict(
        page.evaluate(
            "() => Array.from(document.querySelectorAll('[data-panel]')).map(p => [p.dataset.panel, p.dataset.state || ''])"
        )
    )


def wait_panels(page: Any, timeout_ms: int = 15_000) -> dict[str, str]:
    """Wait until every panel has drawn (or shown why not); return their states."""
    page.wait_for_function(PANELS_SETTLED, timeout=timeout_ms)
    return panel_states(page)


def chart_points(page: Any, panel_id: str) -> int:
    """How many values the panel's Plotly chart holds (0: no chart)."""
    return int(
        page.evaluate(
            """(id) => {
      const el = document.querySelector('#panel-' + id + ' .js-plotly-plot');
      if (!el || !el.data) return 0;
      let n = 0;
      for (const t of el.data) {
        const v = t.type === 'heatmap' ? [].concat(...(t.z || [])) : (t.y || []);
        n += v.filter(x => x !== null && x !== undefined && !Number.isNaN(x)).length;
      }
      return n;
    }""",
            panel_id,
        )
    )
