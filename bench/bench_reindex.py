"""Time the first read after a compaction: the chunk index rebuilt, the cache's gone chunks forgotten.

Usage:
    python bench/bench_query.py --sets 7d --no-peers --runs 1 --keep --dir /tmp/q7   # the data, once
    python bench/bench_reindex.py /tmp/q7/7d/gpuwatch [--rounds 6]
    PYTHONPATH=OTHER_TREE python bench/bench_reindex.py ...   # another tree's gpuwatch

Works on a copy of the store (opening it writable upgrades its schema). Fills the chunk cache with a day
of three GPU metrics (192 series), then for each round writes a sample, compacts, reads the day again
(the cache stays warm), writes and compacts once more, and times one small read right after (it pays
for the rebuild) and one after that. Printed: both times per round, the cached chunks and the chunks
stored.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # querydata; gpuwatch from the path or PYTHONPATH

from querydata import DAY_MS, T0_MS

from gpuwatch.core.clock import SystemClock
from gpuwatch.core.model import Matcher, make_labels
from gpuwatch.store import Store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="a gpuwatch data directory holding the 7d set (bench_query.py --keep)")
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuwatch-reindex-") as tmp:
        work = Path(tmp) / "store"
        shutil.copytree(args.data, work, ignore=shutil.ignore_patterns("LOCK"))
        t0 = time.perf_counter()
        store = Store.open(work, clock=SystemClock(), chunk_cache_mb=128)
        print(f"open (and any schema upgrade): {time.perf_counter() - t0:.2f} s")
        end = T0_MS + 7 * DAY_MS
        day = [Matcher("__name__", "=~", "DCGM_FI_DEV_GPU_UTIL|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_POWER_USAGE")]
        small = [Matcher("__name__", "=", "DCGM_FI_DEV_GPU_TEMP"), Matcher("gpu", "=", "0")]
        labels = make_labels({"gpu": "0", "Hostname": "node00"})
        first, then = [], []
        try:
            store.select(day, end - DAY_MS, end)
            for i in range(args.rounds):
                for k in (0, 1):
                    t = np.array([end + 1000 * (2 * i + k + 1)], np.int64)
                    store.append_series("DCGM_FI_DEV_GPU_TEMP", labels, t, np.array([50.0]))
                    store.compact()
                    if k == 0:
                        store.select(day, end - DAY_MS, end)
                for times in (first, then):
                    a = time.perf_counter()
                    store.select(small, end - 3_600_000, end + 60_000)
                    times.append((time.perf_counter() - a) * 1000)
            cache = store._chunks
            cached = len(cache._where) if cache is not None else 0
            stored = store._cursor().execute("SELECT count(*) FROM chunks").fetchone()
        finally:
            store.close()
    print("first read after a compaction, ms: " + " ".join(f"{x:.1f}" for x in first))
    print("the read after it, ms:             " + " ".join(f"{x:.2f}" for x in then))
    print(f"chunks cached {cached:,}, stored {stored[0] if stored else 0:,}")


if __name__ == "__main__":
    main()
