"""A gpuwatch runtime for tests/test_crash_e2e.py to kill -9 at a chosen moment.

`python tests/crashdriver.py DATA_DIR RULES_FILE` builds the runtime `gpuwatch serve --demo` builds
(real DuckDB file, simulated GPUs, the built-in rules and RULES_FILE) and runs its work in a loop,
one phase at a time, each announced on stdout before it starts (`phase NAME MS`, MS: how long it took
last time) and after it ends (`done NAME`):

- ingest: 20 ticks of the sample job plus 2,000 synthetic series, then a flush;
- import: an import as /api/v1/import/prometheus writes it (`write_columns`, in slices of 300 series)
  of 3,000 new one-sample series named for the round, with 100 bulk series 31 days old, while the
  sample job runs and flushes;
- compact: the head into chunks, closed windows merged;
- retention: the retention job (30 days), which deletes those old series;
- rules: every rule group evaluated, alert state saved; three rounds.

On a first start it imports a marker series (`crash_marker`, 50 samples an hour old) and evaluates the
rules once, so that RULES_FILE's always-firing alert is saved, and prints `ready ACTIVE_AT_MS`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.model import Batch, Matcher, Sample, SeriesColumns, make_labels

LOAD_SERIES = 2_000
IMPORT_SERIES = 3_000
OLD_SERIES = 100
MARKER_SAMPLES = 50
DAY_MS = 86_400_000


def say(line: str) -> None:
    print(line, flush=True)


def marker_values() -> list[float]:
    return [float(i * i) for i in range(MARKER_SAMPLES)]


def _ingest(rt: Runtime) -> None:
    labels = [make_labels({"i": str(i)}) for i in range(LOAD_SERIES)]
    for _ in range(20):
        rt.jobs.run("sample")
        now = rt.clock.now_ms()
        rt.store.append(Batch(now, [Sample("crash_load", lb, float(now % 1000)) for lb in labels]))
        time.sleep(0.001)  # distinct timestamps
    rt.store.flush()


def _import(rt: Runtime) -> None:
    now = rt.clock.now_ms()
    names = [f"crash_import_{now}"] * IMPORT_SERIES + ["crash_old"] * OLD_SERIES
    labels = [make_labels({"i": str(i)}) for i in range(IMPORT_SERIES)]
    labels += [make_labels({"i": str(i)}) for i in range(OLD_SERIES)]
    counts = np.array([1] * IMPORT_SERIES + [1100] * OLD_SERIES, np.int64)
    old_t = now - 31 * DAY_MS + np.arange(1100, dtype=np.int64) * 1000
    t = np.concatenate([np.full(IMPORT_SERIES, now, np.int64), np.tile(old_t, OLD_SERIES)])
    v = np.concatenate([np.arange(IMPORT_SERIES, dtype=np.float64), np.ones(1100 * OLD_SERIES)])
    columns = SeriesColumns(names, labels, np.concatenate([[0], np.cumsum(counts)]), t, v)
    failed: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            rt.store.write_columns(columns)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the phase
            failed.append(exc)
        finally:
            done.set()

    writing = threading.Thread(target=write)
    writing.start()
    while not done.is_set():  # GPU samples flushed while the import is written, a slice at a time
        rt.jobs.run("sample")
        rt.store.flush()
    writing.join()
    if failed:
        raise failed[0]


def _first_start(rt: Runtime) -> None:
    now = rt.clock.now_ms()
    t = now - 3_600_000 + np.arange(MARKER_SAMPLES, dtype=np.int64) * 1000
    rt.store.append_many([("crash_marker", (), t, np.array(marker_values()))])
    rt.store.flush()


def main(data_dir: str, rules_file: str) -> None:
    settings = load(
        None,
        {},
        {
            "data_dir": data_dir,
            "demo": True,
            "demo_gpus": 2,
            "demo_sources": False,
            "demo_history": False,
            "rule_files": [rules_file],
        },
    )
    rt = build_runtime(settings, "crash-node")
    assert rt.store._writer is not None
    rt.store._writer.import_slice_series = 300  # ordinary flushes between the import's slices
    assert rt.rules is not None
    rules = rt.rules
    if not rt.store.select([Matcher("__name__", "=", "crash_marker")], 0, 2**62):
        _first_start(rt)
        rules.evaluate_all()
        rt.store.flush()  # after the alert state the evaluation queued
    active = [a.active_at_ms for a in rt.store.alerts() if a.rule == "CrashMarker"]
    say(f"ready {active[0] if active else -1}")
    phases: dict[str, Callable[[], object]] = {
        "ingest": lambda: _ingest(rt),
        "import": lambda: _import(rt),
        "compact": rt.store.compact,
        "retention": rt.retention,
        "rules": lambda: [rules.evaluate_all() for _ in range(3)],
    }
    took: dict[str, int] = {}
    while True:
        for name, work in phases.items():
            say(f"phase {name} {took.get(name, 0)}")
            t0 = time.monotonic()
            work()
            took[name] = max(1, int((time.monotonic() - t0) * 1000))
            say(f"done {name}")


if __name__ == "__main__":
    main(sys.argv[1], str(Path(sys.argv[2])))
