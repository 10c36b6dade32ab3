"""The serving process's garbage-collector settings (gpuwatch/cli/gctune.py)."""

from __future__ import annotations

import subprocess
import sys


def test_tune_for_serving_freezes_start_up_objects_and_raises_thresholds() -> None:
    # In a child process: freezing and thresholds are process-wide, and pytest's own objects must not be frozen.
    code = (
        "import gc, json; from gpuwatch.cli.gctune import THRESHOLDS, tune_for_serving\n"
        "before = gc.get_threshold(); tune_for_serving()\n"
        "print(json.dumps([before, gc.get_threshold(), list(THRESHOLDS), gc.get_freeze_count(), gc.isenabled()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    before, after, wanted, frozen, enabled = __import__("json").loads(out.stdout)
    assert before == [700, 10, 10] and after == wanted
    assert frozen > 1000, "the objects start-up built are no longer scanned"
    assert enabled, "collection stays on: cycles are still freed"
