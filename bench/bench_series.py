"""New series per second through import: N new series of one sample each, into a real store.

Usage: python bench/bench_series.py [--series 20000 100000] [--labels 6] [--profile]

Builds a Prometheus text body of N series `bench_new_series{pod="...",...}` (one sample each, a
timestamp), then times `gpuwatch.collect.importer.import_text` into a fresh DuckDB store in a temporary
directory: parse + group, the writer's series ids, and the flush (series rows, head rows). Prints
series/s and the process's RSS growth per series after the store is closed and again while open.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatch.clock import FakeClock  # noqa: E402
from gpuwatch.collect.importer import import_text  # noqa: E402
from gpuwatch.store import Store  # noqa: E402

T0_MS = 1_800_000_000_000


def body(n: int, labels: int, offset: int = 0) -> str:
    extra = ",".join(f'l{j}="value-{j}"' for j in range(labels - 2))
    return "".join(
        f'bench_new_series{{pod="pod-{offset + i:07d}",node="node-{(offset + i) % 97}",{extra}}} 1 {T0_MS}\n'
        for i in range(n)
    )


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run(n: int, labels: int, profile: bool) -> None:
    text = body(n, labels)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp), clock=FakeClock(T0_MS / 1000), flush_interval_s=3600)
        before = rss_mb()
        prof = cProfile.Profile() if profile else None
        t = time.perf_counter()
        if prof:
            prof.enable()
        result = import_text(store, text, now_ms=T0_MS)
        if prof:
            prof.disable()
        took = time.perf_counter() - t
        grown = rss_mb() - before
        # a second import of as many new series into the same store: flat per series, or not?
        t = time.perf_counter()
        import_text(store, body(n, labels, offset=n), now_ms=T0_MS)
        took2 = time.perf_counter() - t
        store.close()
    assert result.series == n, result
    print(
        f"{n:>8} series, {labels} labels: {took:6.2f} s = {n / took:>9,.0f} series/s; "
        f"next {n}: {took2:6.2f} s = {n / took2:>9,.0f}/s; RSS +{grown:.0f} MB ({grown * 1024 * 1024 / n:,.0f} B/series)"
    )
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(18)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--series", type=int, nargs="+", default=[20_000, 100_000])
    p.add_argument("--labels", type=int, default=6)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args()
    for n in args.series:
        run(n, args.labels, args.profile)


if __name__ == "__main__":
    main()
