"""Garbage-collector settings for the long-running `gpuwatch serve` process.

A serving process holds a few hundred thousand long-lived objects (series catalog, scrape and parser
caches, rules, the web app) and allocates ~10,000 short-lived tuples a second (samples). With
CPython's default thresholds (700, 10, 10) those survivors trigger a full collection every few
seconds, each scanning every object: measured in `bench/bench_scrape.py` (20 targets, 64 GPUs),
19 full collections in 130 s costing 2.6 s of CPU, 2% of a core, while finding ~1,400 objects in
cycles in all. So after start-up the objects built so far are frozen (never scanned again) and
young objects are collected less often; collection itself stays on, so cycles are still freed.

(glibc's allocator is set in the environment, not here: the Dockerfile and install.sh's service set
MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_; README, "Storage".)
"""

from __future__ import annotations

import gc

THRESHOLDS = (10_000, 20, 20)  # a full collection about every 4 M allocations: cycles are freed


def tune_for_serving() -> None:
    """Freeze what start-up built and raise the collection thresholds (call once, after start-up)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
