"""Embedded DuckDB time-series store: `Store.open(...)`, then append, flush, select, close.

Layout (what is on disk, and why):

- live batches wait in memory (a deque the writer thread drains) until the next flush.
- `head`: every flush (default every 2 s) appends the buffered samples as plain rows
  (series_id, t_ms, v_bits, seq). Cheap to write, durable through DuckDB's WAL, small: it holds
  at most one compaction period (5 min or 1M rows).
- `chunks`: compaction moves the head into one row per series and 2-hour window, holding the
  timestamps as delta-of-delta (or, when perfectly regular, just the first time and the step) and
  the values as decimal-scaled deltas (or Gorilla-style XOR), byte-shuffled and zlib-compressed
  (`codec.py`); a query fetches all its chunks in one statement and decodes them in batches
  (`decodemany.py`). Compactions made during a window leave several
  small chunks per series; once the window has closed they are merged into one, and once the UTC
  day is over its windows into one chunk per series and day (`rewrite.py`), zstd-compressed rather
  than zlib as it is written once. Bulk
  `append_series` calls of >= 1024 samples skip the head and become chunks directly.

Measured (bench/bench_store.py, 64 GPUs x 25 dcgm metrics at 1 s, 2 vCPU, duckdb 2.0.1):
native columns (series_id INTEGER, t BIGINT, v DOUBLE) sorted by series and time took 1.79 bytes
a sample (16 GPUs x 6 h); these chunks take 0.67 bytes a
sample on disk after close (counters and power, which carry real entropy, ~1.5-1.8; integer
gauges ~0.2-0.5; constants ~0.01). Reading 24 h of one series (86,400 samples) from a 7-day store
decodes 13 chunks: ~7 ms median. DuckDB turns NaN into NULL on the way in, so values are stored as
their IEEE-754 bits (head) or bit-exactly by the codec: staleness markers, NaN and +-Inf round-trip.

DuckDB itself is capped at 64 MB of memory and one thread (an appliance shares its machine with
training jobs); the 64-GPU demo stays under 150 MB RSS.

Duplicates (same series and timestamp): the last write wins. Exception: when the same point is
written both by `append` and by `append_series` within one flush, either may win.
"""

from __future__ import annotations

from gpuwatch.store.appended import Appended, AppendedSeries, Lag, Watermark
from gpuwatch.store.core import Store

__all__ = ["Appended", "AppendedSeries", "Lag", "Store", "Watermark"]
