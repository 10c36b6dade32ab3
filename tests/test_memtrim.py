"""The `trim` job gives glibc's free heap pages back to the system (app/memtrim.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.app.memtrim import Trimmer
from gpuwatch.app.runtime import Runtime

ROOT = Path(__file__).resolve().parent.parent

# A heap with free pieces between live ones, as a dashboard's requests leave it: 40,000 arrays of 8 KB
# (under the 16 MB mmap threshold the Docker image sets, so from glibc's heap), 7 in 8 freed.
FRAGMENT = """
import json, numpy as np
from gpuwatch.app.memtrim import Trimmer, _resident_bytes
arrays = [np.ones(1000) for _ in range(40_000)]
keep = arrays[::8]
del arrays
freed = _resident_bytes()
t = Trimmer()
t.trim()
print(json.dumps({"before": freed, "after": _resident_bytes(), "released": t.released_bytes}))
"""


@pytest.mark.skipif(not Trimmer().available, reason="not glibc: malloc_trim does not exist")
def test_trim_gives_back_the_free_pieces_inside_the_heap() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "MALLOC_ARENA_MAX": "1",
        "MALLOC_MMAP_THRESHOLD_": "16777216",
        "MALLOC_TRIM_THRESHOLD_": "16777216",
    }
    out = subprocess.run(
        [sys.executable, "-c", FRAGMENT], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    got = json.loads(out.stdout)
    freed = 40_000 * 7 // 8 * 8_000  # ~280 MB of arrays freed, but held by glibc until trimmed
    assert got["before"] - got["after"] > freed // 2
    assert abs(got["released"] - (got["before"] - got["after"])) < 2**20  # counted as it went


def test_serve_trims_every_minute_and_counts_it(runtime: Runtime, client: FlaskClient) -> None:
    assert runtime.jobs.interval("trim") == 60.0
    runtime.jobs.run("trim")
    runtime.jobs.run("sample")
    text = client.get("/metrics").get_data(as_text=True)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    if runtime.trimmer.available:
        assert runtime.trimmer.runs == 1
        assert fams["gpuwatch_memory_trimmed_bytes"].type == "counter"
        assert fams["gpuwatch_memory_trimmed_bytes"].samples[0].value == runtime.trimmer.released_bytes
    else:
        assert "gpuwatch_memory_trimmed_bytes" not in fams
