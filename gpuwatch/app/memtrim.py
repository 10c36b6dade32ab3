"""Give the allocator's free memory back to the system once a minute (the `trim` job).

Under dashboard load glibc's heap fills with free pieces between live ones: a request's arrays and
DuckDB's results come and go at every refresh, and glibc returns memory to the system only from the
top of its heap (`MALLOC_TRIM_THRESHOLD_`). Over an hour of 50 tabs its free part grew 3 -> 267 MB
(bench/README.md, "Soak"), which is most of what looked like unbounded growth. `malloc_trim(0)` also
hands back the whole pages inside those free pieces (glibc 2.8 on), which the next request faults in
again if it needs them. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Callable
from pathlib import Path

INTERVAL_S = 60.0


def _resident_bytes() -> int | None:
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


class Trimmer:
    """Calls glibc's `malloc_trim(0)` and counts the resident memory it gave back."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self.released_bytes = (
            0  # resident memory given back since start (gpuwatch_memory_trimmed_bytes_total)
        )
        self.runs = 0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def trim(self) -> None:
        """Give free heap pages back to the system now (the `trim` job)."""
        if self._trim is None:
            return
        before = _resident_bytes()
        self._trim(0)
        after = _resident_bytes()
        self.runs += 1
        if before is not None and after is not None and after < before:
            self.released_bytes += before - after
