"""kill -9 at seeded random moments of ingest, import, compaction, retention and rule evaluation: the
store opens again, what was stored before is intact, and nothing in it is corrupt.

tests/crashdriver.py runs gpuwatch's runtime through those phases in a loop and says on stdout when
each starts and how long it took last time; the test kills it a seeded random fraction (5-60 %: a
phase may run faster than last time) of that time into the phase it chose, then opens the store as
a restart would and checks:

- the marker series imported before the first kill, sample for sample;
- the always-firing alert's saved state (firing, the same `activeAt` since the first start);
- every sample of every series can be read (every chunk decodes) and each series' times ascend;
- each import is all or nothing (3,000 series of a name, or none);
- the store still writes: a compaction completes.

The data directory is kept from kill to kill, so each start also recovers from the kill before. CI
kills once per phase (5 kills, 10-25 s); CRASH_KILLS and CRASH_SEED run more on demand
(`CRASH_KILLS=100 pytest tests/test_crash_e2e.py`).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gpuwatch.core.clock import SystemClock
from gpuwatch.core.model import Matcher
from gpuwatch.store import Store
from tests.conftest import ROOT, clean_env
from tests.crashdriver import IMPORT_SERIES, MARKER_SAMPLES, marker_values

pytestmark = pytest.mark.slow

DRIVER = ROOT / "tests" / "crashdriver.py"
PHASES = ("ingest", "import", "compact", "retention", "rules")
RULES = """
groups:
  - name: crash
    rules:
      - alert: CrashMarker
        expr: vector(1)
        labels: {severity: info}
"""


def _kill_during(data: Path, rules: Path, phase: str, fraction: float) -> tuple[int, bool]:
    """Start the driver, kill -9 it `fraction` of `phase`'s last duration into its second run; return
    the alert's activeAt the driver reported and whether the phase was still running."""
    proc = subprocess.Popen(
        [sys.executable, str(DRIVER), str(data), str(rules)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
    )
    watchdog = threading.Timer(120, proc.kill)  # a driver that hangs fails the test, not the run
    watchdog.start()
    assert proc.stdout is not None
    active_at, seen, lines = -1, 0, []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("ready "):
                active_at = int(line.split()[1])
            elif line.startswith(f"phase {phase} "):
                seen += 1
                if seen == 2:  # the first run measured how long the phase takes
                    last_ms = int(line.split()[2])
                    time.sleep(fraction * last_ms / 1000)  # a moment inside the phase
                    proc.kill()
                    break
        proc.wait()
        rest = proc.stdout.read()
    finally:
        watchdog.cancel()
        proc.stdout.close()
    assert seen == 2, "the driver ended before the phase:\n" + "".join(lines) + (rest or "")
    return active_at, f"done {phase}" not in rest


def _check(data: Path, active_at: int) -> None:
    store = Store.open(data, clock=SystemClock())
    try:
        (marker,) = store.select([Matcher("__name__", "=", "crash_marker")], 0, 2**62)
        assert marker.timestamps_ms.size == MARKER_SAMPLES and marker.values.tolist() == marker_values()
        (alert,) = [a for a in store.alerts() if a.rule == "CrashMarker"]
        assert alert.state == "firing" and alert.active_at_ms == active_at, alert
        everything = store.select([Matcher("__name__", "=~", ".+")], 0, 2**62)  # decodes every chunk
        assert all(bool(np.all(np.diff(s.timestamps_ms) > 0)) for s in everything)
        imports = Counter(s.name for s in everything if s.name.startswith("crash_import_"))
        assert all(n == IMPORT_SERIES for n in imports.values()), imports
        # ... and no series row of an import without its samples (one transaction for both)
        rows = Counter(
            e.name for e in store._catalog.snapshot().by_id.values() if e.name.startswith("crash_import_")
        )
        assert rows == imports, (rows, imports)
        store.compact()
    finally:
        store.close()


def test_kill9_at_random_moments_leaves_the_store_whole(tmp_path: Path) -> None:
    kills = int(os.environ.get("CRASH_KILLS", str(len(PHASES))))
    rng = random.Random(int(os.environ.get("CRASH_SEED", "15")))
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    data = tmp_path / "data"
    first_active = None
    inside = Counter[str]()
    for k in range(kills):
        phase = PHASES[k % len(PHASES)]
        active_at, was_running = _kill_during(data, rules, phase, rng.uniform(0.05, 0.6))
        first_active = first_active or active_at
        assert active_at == first_active, "the alert's activeAt changed across restarts"
        inside[phase] += was_running
        _check(data, first_active)
    # Kills must land inside their phase (most do), or the test would not test what it says.
    assert sum(inside.values()) >= kills // 3, inside
    print(f"{kills} kills; inside the phase: {dict(inside)}")
