"""What stays on glibc's heap after requests: the cluster page's queries in process, and DuckDB's joins.

    .venv/bin/python bench/bench_heap.py requests [--rounds 120] [--no-in-clause]
    .venv/bin/python bench/bench_heap.py joins [--joins 120000]
    .venv/bin/python bench/bench_heap.py in-list

`requests`: a runtime on a fake clock (16 simulated GPUs, 20 minutes of samples, 32 MB chunk cache),
then the cluster page's panel queries over those 20 minutes plus its JSON twin through the Flask app
(no socket), 260 requests a round, the same every round; after each round glibc's heap (`mallinfo2`) and
CPython's block count. `--moving`: a sample a second after each page's requests, the window following
the clock (through the 2-hour window's close and compaction past round 260). `--threads`: a page's
requests from that many threads at once. `--no-in-clause` turns off DuckDB's `in_clause` optimizer, which rewrites an IN
list of 6 or more constants into a join.
`joins`: DuckDB alone, an in-memory database, one hash join (2,000 x 64 rows) at a time; the heap every
5,000. `in-list`: a read of 8 to 2,432 of 36,000 series from a head table of 4.3 M rows, with the
`in_clause` optimizer on and off, in turns (median of 5 rounds of 5).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import gc
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.memprobe import MallInfo2  # noqa: E402

_libc = ctypes.CDLL("libc.so.6")
_libc.mallinfo2.restype = MallInfo2


def heap() -> str:
    m = _libc.mallinfo2()
    return f"heap {m.arena / 1e6:6.1f} MB, in use {m.uordblks / 1e6:6.1f}, free {m.fordblks / 1e6:6.1f}"


def requests(rounds: int, no_in_clause: bool, moving: bool, threads: int) -> None:
    from bench.soaktabs import builtin_vars, fill
    from gpuwatch.app.build import build_runtime
    from gpuwatch.app.config import load
    from gpuwatch.core.clock import FakeClock
    from gpuwatch.demo.nvml import FakeNvml
    from gpuwatch.web import create_app

    clock = FakeClock(1_790_000_000)
    nvml = FakeNvml(gpu_count=16, clock=clock, blocking_event_wait=False)
    settings = load(
        None,
        {},
        {"data_dir": tempfile.mkdtemp() + "/data", "demo": True, "demo_history": False, "chunk_cache_mb": 32},
    )
    rt = build_runtime(settings, "node-1", clock=clock, nvml=nvml)
    try:
        for i in range(1200):
            rt.jobs.run("sample")
            clock.advance(1)
            if i % 60 == 0:
                rt.store.flush()
        rt.store.flush()
        if no_in_clause:
            # a global setting: one cursor of the store sets it for all
            rt.store._cursor().execute("SET disabled_optimizers = 'in_clause'")
        app = create_app(rt)
        client = app.test_client()
        local = threading.local()

        def get(path: str, params: dict[str, object] | None = None) -> None:
            if not hasattr(local, "client"):
                local.client = app.test_client()
            local.client.get(path, query_string=params)

        pool = concurrent.futures.ThreadPoolExecutor(threads)
        twin = client.get("/api/ui/cluster").get_json()
        end_ms = clock.now_ms()
        values = {**twin["variables"], **builtin_vars(end_ms - 1_200_000, end_ms, 10)}
        queries = [fill(p["query"], values) for p in twin["panels"] if p.get("query")]
        end = end_ms / 1000
        print(f"{len(queries)} panel queries; start: {heap()}, python blocks {sys.getallocatedblocks():,}")
        n = 0
        for r in range(rounds):
            for _ in range(20):
                asked = [
                    ("/api/v1/query_range", {"query": q, "start": end - 1200, "end": end, "step": 10})
                    for q in queries
                ]
                for f in [
                    pool.submit(get, path, params) for path, params in [*asked, ("/api/ui/cluster", None)]
                ]:
                    f.result()
                n += len(queries) + 1
                if moving:  # a sample a second, the charts' window following it
                    rt.jobs.run("sample")
                    clock.advance(1)
                    rt.store.flush()
                    end = clock.now_ms() / 1000
            gc.collect()
            print(
                f"round {r:4d}, {n:7,} requests: {heap()}, python blocks {sys.getallocatedblocks():,}",
                flush=True,
            )
        pool.shutdown()
    finally:
        rt.close()


def joins(count: int) -> None:
    con = duckdb.connect()
    con.execute("SET threads = 1")
    sql = "SELECT count(*) FROM range(2000) a(x) JOIN range(64) b(y) ON a.x = b.y"
    print(f"duckdb {duckdb.__version__}; start: {heap()}")
    for k in range(1, count + 1):
        con.execute(sql).fetchall()
        if k % 5000 == 0:
            print(f"{k:8,} joins: {heap()}", flush=True)


def in_list() -> None:
    con = duckdb.connect(tempfile.mkdtemp() + "/x.duckdb")
    con.execute("SET memory_limit = '64MB'")
    con.execute("SET threads = 1")
    nser, ticks = 36_000, 120  # every series every 5 s, rows in time order as the writer flushes them
    con.execute("CREATE TABLE head (series_id INTEGER, t_ms BIGINT, v_bits BIGINT, seq BIGINT)")
    con.execute(
        f"INSERT INTO head SELECT (i % {nser})::INT, (i // {nser}) * 5000, i, i FROM range({nser * ticks}) t(i)"
    )
    con.execute("CHECKPOINT")
    rng = np.random.default_rng(1)
    cur = con.cursor()
    for n in (8, 64, 700, 2432):
        ids = ",".join(map(str, sorted(rng.choice(nser, n, replace=False).tolist())))
        sql = f"SELECT series_id, t_ms, v_bits, seq FROM head WHERE series_id IN ({ids}) AND t_ms >= $1 AND t_ms <= $2"
        took: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(5):
            for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                con.execute(
                    "SET disabled_optimizers = 'in_clause'" if mode == "off" else "RESET disabled_optimizers"
                )
                t = time.perf_counter()
                for _ in range(5):
                    cur.execute(sql, [0, 10**12]).fetchnumpy()
                took[mode].append((time.perf_counter() - t) / 5 * 1e3)
        on, off = statistics.median(took["on"]), statistics.median(took["off"])
        print(f"{n:5d} ids: in_clause on {on:7.1f} ms, off {off:7.1f} ms ({off / on:.1f}x)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("requests")
    r.add_argument("--rounds", type=int, default=120)
    r.add_argument("--no-in-clause", action="store_true")
    r.add_argument(
        "--moving", action="store_true", help="sample and move the charts' window every 13 requests"
    )
    r.add_argument(
        "--threads", type=int, default=1, help="a page's 13 requests from this many threads at once"
    )
    sub.add_parser("joins").add_argument("--joins", type=int, default=120_000)
    sub.add_parser("in-list")
    args = ap.parse_args()
    if args.what == "requests":
        requests(args.rounds, args.no_in_clause, args.moving, args.threads)
    elif args.what == "joins":
        joins(args.joins)
    else:
        in_list()


if __name__ == "__main__":
    main()
