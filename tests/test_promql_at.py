"""`@` times before 1970 (`x @ -60 offset -5m`): promql-parser panics reading them, so gpuwatch parses
stand-in times and moves each selector back; the answers are Prometheus's own (promtool's)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuwatch.query import Engine, to_prometheus_json
from tests.conftest import require_tool
from tests.promql_harness import ArrayStore

# x is 0, 1, ... 10 at 0, 60, ... 600 s; each query reads it at a time before 1970 moved by an offset.
CASES = [
    ("x @ -1", []),
    ("-x @ -60 offset -5m", [-4]),
    ("-x @ -0.5 offset -61s", [-1]),
    ("sum_over_time(x[2m] @ -1 offset -3m)", [3]),
    ("max_over_time(x[3m:1m] @ -120 offset -10m)", [8]),
    ("x @ -1e3 offset -1000s + x @ -60 offset -180s", [2]),
]


@pytest.mark.parametrize(("query", "want"), CASES)
def test_an_at_before_1970_reads_where_prometheus_reads(query: str, want: list[float]) -> None:
    store = ArrayStore()
    for i in range(11):
        store.append({"__name__": "x"}, i * 60_000, float(i))
    store.prepare()
    got = to_prometheus_json(Engine(store).instant(query, 600_000))["result"]
    assert [float(r["value"][1]) for r in got] == want


def test_the_expected_answers_are_promtools(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    (tmp_path / "rules.yml").write_text("groups: []\n")
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [{"series": "x", "values": "0+1x10"}],
            "promql_expr_test": [
                {"expr": q, "eval_time": "10m", "exp_samples": [{"labels": "{}", "value": v} for v in want]}
                for q, want in CASES
            ],
        }],
    }  # fmt: skip
    (tmp_path / "t.yml").write_text(json.dumps(tests))
    done = subprocess.run([promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
