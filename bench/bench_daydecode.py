"""Decode time of closed days' chunks, zlib against zstd: the same day chunks in both forms.

Usage: python bench/bench_daydecode.py [--gpus 8] [--days 7] [--rounds 7]

Data: bench/querydata.py's series (178 at 8 GPUs, 15 s), cut into one chunk a series and UTC day by
`chunking.encode_many` as the day merge writes them, twice: zlib (as before) and zstd level 15 (now).
Each round decodes every chunk with `decodemany.decode_chunks` (all at once, as reads and the chunk
cache do) and one by one with `codec.decode_times`/`decode_values`, zlib and zstd in turns (which goes
first alternates). Printed: bytes a sample and encode time of each form, each round's decode times, and
the median of the rounds' zstd/zlib ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # querydata; gpuwatch from the path or PYTHONPATH

import querydata

from gpuwatch.store.chunking import DAY_WINDOW_MS, ChunkRow, encode_many
from gpuwatch.store.codec import decode_times, decode_values
from gpuwatch.store.decodemany import decode_chunks


def all_at_once(rows: list[ChunkRow]) -> float:
    started = time.perf_counter()
    decode_chunks(np.array([r.n for r in rows], np.int64), [r.ts for r in rows], [r.vs for r in rows])
    return time.perf_counter() - started


def one_by_one(rows: list[ChunkRow]) -> float:
    started = time.perf_counter()
    for r in rows:
        decode_times(r.ts, r.n)
        decode_values(r.vs, r.n)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    series = querydata.generate(args.gpus, args.days)
    ids = np.concatenate([np.full(s.values.size, k, np.int64) for k, s in enumerate(series)])
    t = np.concatenate([s.timestamps_ms for s in series])
    v = np.concatenate([s.values for s in series])
    seqs = np.ones(t.size, np.int64)
    forms: dict[str, list[ChunkRow]] = {}
    for name, zstd in (("zlib", False), ("zstd", True)):
        started = time.perf_counter()
        forms[name] = encode_many(ids, t, v, seqs, None, DAY_WINDOW_MS, zstd)
        took = time.perf_counter() - started
        size = sum(len(r.ts) + len(r.vs) for r in forms[name])
        print(
            f"{name}: {len(forms[name]):,} day chunks, {size / t.size:.3f} B/sample, encoded in {took:.2f} s"
        )
    for name, rows in forms.items():  # both decode to the samples
        got_t, got_v = decode_chunks(
            np.array([r.n for r in rows]), [r.ts for r in rows], [r.vs for r in rows]
        )
        assert np.array_equal(got_t, t) and np.array_equal(got_v.view(np.int64), v.view(np.int64)), name
    ratios: dict[str, list[float]] = {"all at once": [], "one by one": []}
    print(f"{t.size:,} samples; decode times, s (zlib, zstd):")
    for k in range(args.rounds):
        line = []
        for label, fn in (("all at once", all_at_once), ("one by one", one_by_one)):
            took = {}
            for name in ("zlib", "zstd") if k % 2 == 0 else ("zstd", "zlib"):
                took[name] = fn(forms[name])
            ratios[label].append(took["zstd"] / took["zlib"])
            line.append(f"{label} {took['zlib']:.3f} {took['zstd']:.3f}")
        print(f"  round {k + 1}: " + ", ".join(line))
    for label, rs in ratios.items():
        print(
            f"zstd/zlib decode time, {label}: median {statistics.median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})"
        )


if __name__ == "__main__":
    main()
