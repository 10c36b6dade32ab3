"""Time one PromQL range query in two source trees, taking turns, so both see the same VM spells.

Usage:
    python bench/bench_query.py --sets 24h --no-peers --runs 1 --keep --dir /tmp/q24   # the data, once
    python bench/bench_query_pair.py /tmp/q24/24h/gpuwatch 'QUERY' BEFORE_DIR AFTER_DIR [--rounds 5]
    python bench/bench_query_pair.py /tmp/q7/7d/gpuwatch 'QUERY' BEFORE_DIR AFTER_DIR --days 7 --step 60

Each round runs one child process per tree (in turn, the order swapped every round) with `PYTHONPATH=DIR`
and this interpreter. The child opens the store read-only, applies `gpuwatch serve`'s GC settings
(`gctune.tune_for_serving`) and times the query over the whole set (`--days`, 1: the 24 h set;
7: the 7 d set) at a step of `--step` seconds (15; the 7 d set is queried at 60): the median of --runs calls of `Engine.range` ("engine") and of the same query through the Flask app called as
WSGI, without a socket ("wsgi": parameters, engine, JSON). Printed: both trees' figures and their ratio
each round, then the medians of the rounds. This VM's speed moves by up to 2x from one minute to the next,
so only figures taken in turns like this are compared in bench/README.md. The children inherit the
environment: set the Dockerfile's MALLOC_* variables to measure with the Docker image's allocator settings
(older trees set the two thresholds in process where unset).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # querydata; gpuwatch comes from PYTHONPATH

from querydata import DAY_MS, T0_MS


def child(data: str, query: str, runs: int, days: float = 1.0, step_ms: int = 15_000) -> None:
    from types import SimpleNamespace
    from urllib.parse import urlencode

    from gpuwatch.app.config import load
    from gpuwatch.cli import gctune
    from gpuwatch.core.clock import SystemClock
    from gpuwatch.query import Engine
    from gpuwatch.store import Store
    from gpuwatch.web import create_app

    clock = SystemClock()
    store = Store.open(Path(data), clock=clock, read_only=True)
    settings = load(None, {}, {"data_dir": data})  # the defaults, as `gpuwatch serve` has them
    runtime = SimpleNamespace(store=store, queryable=store, clock=clock, settings=settings, access=None)
    try:  # the routes answer through the runtime's backend (trees before it read the store)
        from gpuwatch.query.backend import LocalBackend
    except ImportError:
        pass
    else:
        runtime.backend = LocalBackend(store, store, settings, clock.monotonic)
    app = create_app(runtime)
    try:
        gctune.tune_for_serving()
    except TypeError:  # trees whose tune_for_serving also set glibc's allocator from the environment
        gctune.tune_for_serving(os.environ)  # type: ignore[call-arg]
    start, end = T0_MS, T0_MS + int(days * DAY_MS)
    qs = urlencode({"query": query, "start": start / 1000, "end": end / 1000, "step": f"{step_ms // 1000}s"})

    def environ() -> dict[str, Any]:
        return {
            "REQUEST_METHOD": "GET",
            "PATH_INFO": "/api/v1/query_range",
            "QUERY_STRING": qs,
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "80",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(b""),
            "wsgi.errors": sys.stderr,
        }

    statuses: list[str] = []

    def wsgi() -> bytes:
        return b"".join(app(environ(), lambda status, headers, exc_info=None: statuses.append(status)))

    def engine() -> Any:
        return Engine(store).range(query, start, end, step_ms)

    def median_ms(fn: Any) -> float:
        for _ in range(10):
            fn()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000

    out = {"engine": median_ms(engine), "wsgi": median_ms(wsgi)}
    if any(not s.startswith("200") for s in statuses):
        raise SystemExit(f"the query failed: {statuses[-1]} {wsgi()[:300]!r}")
    print(json.dumps(out))


def main() -> None:
    if len(sys.argv) == 7 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="a gpuwatch data directory holding the set (bench_query.py --keep)")
    ap.add_argument("query")
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=200, help="timed calls per child and figure")
    ap.add_argument("--days", type=float, default=1.0, help="length of the set: 1 (24h) or 7 (7d)")
    ap.add_argument("--step", type=int, default=15, help="query step in seconds")
    args = ap.parse_args()
    trees = [args.before.resolve(), args.after.resolve()]
    got: dict[Path, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            proc = subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--child",
                    args.data,
                    args.query,
                    str(args.runs),
                    str(args.days),
                    str(args.step * 1000),
                ],
                env={**os.environ, "PYTHONPATH": str(tree)},
                capture_output=True,
                text=True,
            )
            if proc.returncode:
                sys.exit(
                    f"{tree}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
                )
            got[tree].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        a, b = got[trees[0]][-1], got[trees[1]][-1]
        print(
            f"round {r + 1}: engine {a['engine']:.3f} -> {b['engine']:.3f} ms ({b['engine'] / a['engine']:.2f}), "
            f"wsgi {a['wsgi']:.3f} -> {b['wsgi']:.3f} ms ({b['wsgi'] / a['wsgi']:.2f})",
            flush=True,
        )
    for tree in trees:
        e = statistics.median(x["engine"] for x in got[tree])
        w = statistics.median(x["wsgi"] for x in got[tree])
        print(f"{tree}: engine {e:.3f} ms, wsgi {w:.3f} ms (medians of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
