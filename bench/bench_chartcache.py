"""What the decoded chunk cache holds for 1-hour charts over the day: a store on a simulated clock.

Usage: python bench/bench_chartcache.py [--series 64] [--start 01:45] [--hours 4.5] [--today]

Data: `--series` series sampled every second from `--start` (UTC) on a simulated clock, written 30 s
at a time; a compaction every 5 minutes (as `serve` does), which adds a chunk to the open 2-hour window
and merges a closed window into one chunk. After each write, one read of the last 65 minutes of every
series (a 1-hour chart and its lookback); with `--today`, another from midnight (the cluster page's
"Energy today" before its span reaches the tiers). Printed every 10 simulated minutes: the cache's
bytes then and its blocks, and the average over the 10 minutes in hours of samples a series
(16 bytes a sample). No wall-clock figure: what it measures does not depend on the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt

import numpy as np

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher, make_labels
from gpuwatch.store import Store

TICK_S = 30
COMPACT_MS = 300_000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--series", type=int, default=64)
    ap.add_argument("--start", default="01:45", help="UTC time of day the samples start (HH:MM)")
    ap.add_argument("--hours", type=float, default=4.5)
    ap.add_argument("--today", action="store_true", help="also read every series from midnight")
    args = ap.parse_args()
    hh, mm = (int(x) for x in args.start.split(":"))
    start_s = dt.datetime(2026, 12, 6, hh, mm, tzinfo=dt.timezone.utc).timestamp()
    clock = FakeClock(start_s)
    name = Matcher("__name__", "=", "u")
    midnight = int(start_s // 86_400 * 86_400 * 1000)
    one_hour = args.series * 16 * 3600
    with Store.open(None, clock=clock, chunk_cache_mb=400, flush_interval_s=3600, retention_s=0) as store:
        cache = store._chunks  # the store's own cache (no public view of its bytes but stats)
        assert cache is not None
        t_ms = int(start_s * 1000)
        end = t_ms + int(args.hours * 3_600_000)
        held: list[int] = []
        print("time   cache MB  blocks  10-min average, hours a series")
        while t_ms < end:
            ts = t_ms + np.arange(TICK_S, dtype=np.int64) * 1000
            for s in range(args.series):
                store.append_series("u", make_labels({"gpu": str(s)}), ts, np.sin(ts / 1e5 + s))
            t_ms += TICK_S * 1000
            clock.advance(TICK_S)
            store.flush()
            if (t_ms - int(start_s * 1000)) % COMPACT_MS == 0:
                store.compact()
            store.select([name], t_ms - 65 * 60_000, t_ms)
            if args.today:
                store.select([name], midnight, t_ms)
            held.append(cache.bytes)
            if t_ms % 600_000 == 0:
                when = dt.datetime.fromtimestamp(t_ms / 1000, dt.timezone.utc).strftime("%H:%M")
                mean_h = sum(held) / len(held) / one_hour
                print(f"{when}  {cache.bytes / 1e6:8.1f}  {len(cache._blocks):6d}  {mean_h:5.2f}", flush=True)
                held.clear()


if __name__ == "__main__":
    main()
