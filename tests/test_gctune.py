"""The serving process's garbage-collector settings (gpuwatch/cli/gctune.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_tune_for_serving_freezes_start_up_objects_and_raises_thresholds() -> None:
    # In a child process: freezing and thresholds are process-wide, and pytest's own objects must not be frozen.
    code = (
        "import gc, json; from gpuwatch.cli.gctune import THRESHOLDS, tune_for_serving\n"
        "before = gc.get_threshold(); tune_for_serving({})\n"
        "print(json.dumps([before, gc.get_threshold(), list(THRESHOLDS), gc.get_freeze_count(), gc.isenabled()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    before, after, wanted, frozen, enabled = __import__("json").loads(out.stdout)
    assert before == [700, 10, 10] and after == wanted
    assert frozen > 1000, "the objects start-up built are no longer scanned"
    assert enabled, "collection stays on: cycles are still freed"


_CHURN = """
import json, resource, sys, threading
import numpy as np
from gpuwatch.cli.gctune import tune_malloc
import os
tuned = tune_malloc(os.environ) if sys.argv[1] == "tuned" else None
faults = []
def query_like():  # what a query does in a waitress worker: a few MB of arrays, allocated and freed
    for i in range(23):
        if i == 3:
            start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        arrays = [np.ones(262_144) for _ in range(5)]  # 2 MB each
        del arrays
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start)
worker = threading.Thread(target=query_like)
worker.start()
worker.join()
print(json.dumps([tuned, faults[0]]))
"""


def _churn(mode: str, env: dict[str, str] | None = None) -> tuple[bool | None, int]:
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True, timeout=60, env=env
    )
    tuned, faults = __import__("json").loads(out.stdout)
    return tuned, faults


def test_tune_malloc_keeps_a_threads_freed_arrays_for_its_next_query() -> None:
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only: other C libraries are left as they are")
    _, plain = _churn("plain")
    if plain < 1_000:
        pytest.skip(
            f"this machine's allocator already keeps the arrays ({plain} page faults): nothing to show"
        )
    tuned, faults = _churn("tuned")
    assert tuned is True
    assert faults < plain / 4, f"{faults} page faults tuned against {plain} untuned"


def test_tune_malloc_leaves_the_users_own_malloc_settings() -> None:
    import os

    tuned, _ = _churn("tuned", env={**os.environ, "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert tuned is False
