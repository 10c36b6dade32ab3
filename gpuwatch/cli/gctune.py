"""Garbage-collector and allocator settings for the long-running `gpuwatch serve` process.

A serving process holds a few hundred thousand long-lived objects (series catalog, scrape and parser
caches, rules, the web app) and allocates ~10,000 short-lived tuples a second (samples). With
CPython's default thresholds (700, 10, 10) those survivors trigger a full collection every few
seconds, each scanning every object: measured in `bench/bench_scrape.py` (20 targets, 64 GPUs),
19 full collections in 130 s costing 2.6 s of CPU, 2% of a core, while finding ~1,400 objects in
cycles in all. So after start-up the objects built so far are frozen (never scanned again) and
young objects are collected less often; collection itself stays on, so cycles are still freed.

A query over a day of samples works on numpy arrays of 0.1-2 MB each, allocated and freed a few
dozen times per query in a waitress worker thread. glibc hands such blocks back to the kernel as
soon as 128 KB-32 MB (its adaptive thresholds) lie free at the top of a thread's heap, so the next
query faults every page in again: ~50,000 page faults for 20 rounds of five 2 MB arrays in a
thread (tests/test_gctune.py), and 20-30% of a dashboard query's time in `gpuwatch serve`
(bench/README.md, "Query"). `tune_malloc` keeps blocks under 16 MB in the heap and up to 16 MB free
at its top: the memory a query used is there for the next one, at most 16 MB per thread heap.
"""

from __future__ import annotations

import ctypes
import gc
import platform
from collections.abc import Mapping

THRESHOLDS = (10_000, 20, 20)  # a full collection about every 4 M allocations: cycles are freed

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
HEAP_KEEP_BYTES = 16 << 20
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")


def tune_for_serving(environ: Mapping[str, str]) -> None:
    """Freeze what start-up built, raise the collection thresholds and keep freed heap memory for
    the next query (call once, after start-up; `environ`: the process's environment)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    tune_malloc(environ)


def tune_malloc(environ: Mapping[str, str]) -> bool:
    """Set glibc's trim and mmap thresholds to HEAP_KEEP_BYTES; False where not done: another C
    library, or the user's own MALLOC_* or GLIBC_TUNABLES malloc settings in `environ` (the
    process's environment), which then stay."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in environ for name in _MALLOC_ENV) or "malloc" in environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, HEAP_KEEP_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, HEAP_KEEP_BYTES)
    )
