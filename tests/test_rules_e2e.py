"""`gpuwatch serve` with a rule file: rules evaluate, SIGHUP reloads, a bad file keeps the old rules."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.conftest import clean_env, wait_until

RULES = """
groups:
  - name: e2e
    interval: 1s
    rules:
      - record: node:gpu_util:avg
        expr: avg(DCGM_FI_DEV_GPU_UTIL)
      - alert: AnyGPU
        expr: DCGM_FI_DEV_GPU_UTIL >= 0
        annotations: {summary: "GPU {{ $labels.gpu }}"}
"""


def test_serve_evaluates_rules_and_reloads_on_sighup(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.5s", GPUWATCH_RULE_FILES=str(rules))
    srv = serve("--demo", env=env)

    def firing() -> bool:
        alerts = srv.get("/api/v1/alerts").json()["data"]["alerts"]
        return any(a["labels"]["alertname"] == "AnyGPU" and a["state"] == "firing" for a in alerts)

    def recorded() -> list[object]:
        return srv.get("/api/v1/query", params={"query": "node:gpu_util:avg"}).json()["data"]["result"]

    wait_until(firing, 20, f"AnyGPU did not fire; log:\n{srv.log}")
    # The group's recorded samples are written at the end of its round, just after the alert's state.
    wait_until(lambda: len(recorded()) == 1, 10, f"node:gpu_util:avg was not recorded; log:\n{srv.log}")

    rules.write_text("groups: [{name: e2e, rules: [{alert: B, expr: 'up =='}]}]")
    assert srv.proc is not None
    srv.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "keeping the previous rules" in srv.log, 10, f"no reload error logged:\n{srv.log}")
    names = [r["name"] for g in srv.get("/api/v1/rules").json()["data"]["groups"] for r in g["rules"]]
    assert "AnyGPU" in names

    rules.write_text("groups: [{name: other, rules: [{record: 'x:one', expr: vector(1)}]}]")
    srv.proc.send_signal(signal.SIGHUP)

    def reloaded() -> bool:
        groups = srv.get("/api/v1/rules").json()["data"]["groups"]
        mine = [g["name"] for g in groups if g["file"] != "builtin"]
        return mine == ["other"] and "gpuwatch-gpu" in [g["name"] for g in groups]

    wait_until(reloaded, 10, f"SIGHUP did not reload the rules; log:\n{srv.log}")
    assert srv.stop() == 0
