"""The hour after a UTC midnight: an hour's range that reaches into yesterday reads yesterday's day chunk.

    .venv/bin/python bench/bench_midnight.py [--series 64]

`--series` series of one gauge at 1 s for a whole UTC day and 30 minutes of the next, written by
`Store.append_series`, compacted, reopened; then the range query of the series over the last hour
(across midnight) and over today's 30 minutes (step 15 s), each twice: cold, then warm. Prints the
chunk rows yesterday is in (a series' day chunk, or its twelve 2-hour ones until 02:00: rewrite.py
`DAY_MERGE_AFTER_MS`), the time and this process's peak RSS before and after.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatch.core.clock import FakeClock  # noqa: E402
from gpuwatch.query.engine import Engine  # noqa: E402
from gpuwatch.store import Store  # noqa: E402

DAY_MS = 86_400_000


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, default=64)
    args = ap.parse_args()
    midnight = 1_790_208_000_000 // DAY_MS * DAY_MS
    end = midnight + 30 * 60_000
    clock = FakeClock(end / 1000)
    data = Path(tempfile.mkdtemp()) / "data"
    t = np.arange(midnight - DAY_MS, end, 1000, dtype=np.int64)
    rng = np.random.default_rng(1)
    with Store.open(data, clock=clock) as s:
        for g in range(args.series):
            s.append_series("util", (("gpu", str(g)),), t, np.round(rng.random(t.size) * 100, 0))
        s.flush()
        s.compact()
    with Store.open(data, clock=clock) as s:
        for _ in range(50):  # the day merge goes 16 MB of chunks a step
            s.compact()
        (rows,) = (
            s._cursor()
            .execute(
                "SELECT count(*) FROM chunks WHERE t_min_ms >= ? AND t_min_ms < ?",
                [midnight - DAY_MS, midnight],
            )
            .fetchone()
        )
        print(f"yesterday: {rows} chunk rows ({rows / args.series:g} a series)")
        engine = Engine(s)
        for label, start in (
            ("the last hour, across midnight", end - 3_600_000),
            ("today's 30 minutes", midnight),
        ):
            for kind in ("cold", "warm"):
                t0, before = time.perf_counter(), peak_mib()
                got = engine.range("util", start, end, 15_000)
                took = 1e3 * (time.perf_counter() - t0)
                print(
                    f"{label}, {kind}: {took:.0f} ms, {len(got)} series, peak RSS {before:.0f} -> {peak_mib():.0f} MiB"
                )


if __name__ == "__main__":
    main()
