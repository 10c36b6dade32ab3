"""The real `amtool` against `gpuwatch serve`: list alerts, add a silence, see the alert suppressed,
keep the silence across a restart, expire it; and `gpuwatch silence` doing the same over HTTP."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import GPUWATCH, clean_env, require_tool, wait_until

RULES = """
groups:
  - name: e2e
    interval: 1s
    rules:
      - alert: AlwaysOn
        expr: vector(1)
        labels: {severity: info}
        annotations: {summary: "always on"}
"""


def run(*argv: str) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{argv} exited {done.returncode}: {done.stderr}"
    return done.stdout


def rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:] if line.strip()]


@pytest.mark.slow
def test_amtool_queries_alerts_and_manages_silences(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    amtool = require_tool("amtool")
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    env = clean_env(
        GPUWATCH_FLUSH_INTERVAL="0.5s",
        GPUWATCH_RULE_FILES=str(rules),
        GPUWATCH_BUILTIN_RULES="false",
        GPUWATCH_DEMO_SOURCES="false",
        GPUWATCH_DEMO_GPUS="1",
    )
    srv = serve("--demo", env=env)

    def am(*argv: str) -> str:
        return run(amtool, f"--alertmanager.url={srv.url}", *argv)

    wait_until(lambda: "AlwaysOn" in am("alert", "query"), 20, f"AlwaysOn never fired; log:\n{srv.log}")
    (row,) = rows(am("alert", "query"))
    assert row[0] == "AlwaysOn" and row[-1] == "active" and "always on" in " ".join(row)

    sid = am("silence", "add", "alertname=AlwaysOn", "--comment=driver upgrade", "--author=ops").strip()
    assert len(sid) == 36
    (row,) = rows(am("silence", "query"))
    assert row[0] == sid and row[1] == 'alertname="AlwaysOn"' and "ops" in row
    assert rows(am("alert", "query")) == []  # amtool shows only active (unsilenced) alerts by default
    (row,) = rows(am("alert", "query", "--silenced"))
    assert row[0] == "AlwaysOn" and row[-1] == "suppressed"
    listed = run(*GPUWATCH, "silence", "list", "--url", srv.url)
    assert sid in listed and "driver upgrade" in listed

    assert srv.stop() == 0
    srv = serve("--demo", env=env)  # same data directory: the silence is still there
    assert am("silence", "query", "-q").split() == [sid]
    wait_until(lambda: "AlwaysOn" in am("alert", "query", "--silenced"), 20, f"no alert; log:\n{srv.log}")
    assert rows(am("alert", "query")) == []

    am("silence", "expire", sid)
    assert am("silence", "query", "-q").split() == []
    assert am("silence", "query", "--expired", "-q").split() == [sid]
    (row,) = rows(am("alert", "query"))
    assert row[0] == "AlwaysOn" and row[-1] == "active"

    am("alert", "add", "DiskFull", "instance=n1", "--annotation=summary=disk full")
    assert {r[0] for r in rows(am("alert", "query"))} == {"AlwaysOn", "DiskFull"}

    mine = run(*GPUWATCH, "silence", "add", "AlwaysOn", "-c", "again", "-a", "me", "--url", srv.url).strip()
    (row,) = [r for r in rows(am("alert", "query", "--silenced")) if r[0] == "AlwaysOn"]
    assert row[-1] == "suppressed"
    assert run(*GPUWATCH, "silence", "expire", mine, "--url", srv.url) == f"expired {mine}\n"
    assert "suppressed" not in am("alert", "query", "--silenced")
    assert srv.stop() == 0
