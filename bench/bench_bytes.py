"""Bytes a raw sample costs on disk: in chunks, in the 1-minute and 1-hour tiers and in the database
file after close; beside VictoriaMetrics on the same data; and the chunk index of a lab's year.

Usage: python bench/bench_bytes.py [--gpus 8] [--days 7] [--every 15] [--before DIR] [--victoria]
       [--index]

Data: bench/querydata.py's 12 dcgm-exporter metrics for `--gpus` GPUs every `--every` seconds (15) over
`--days` days plus its 2 inference models (178 series and 7.18 M samples at 8 GPUs x 7 days), written by
`Store.append_series`, compacted (closed days merged), tiers built, closed. Each build runs in a child
process; `--before DIR` builds with the gpuwatch source tree in DIR too (e.g. `git archive main | tar
-x -C DIR`) and prints both side by side with their ratios. `--victoria` imports the same samples into
VictoriaMetrics (`/usr/bin/victoria-metrics`, `/api/v1/import`), forces a flush and a merge, stops it
and counts its `data/` and `indexdb/`. `--index` puts the chunk rows of 5,600 series x 365 closed days
(and today's 2-hour windows) into the real chunk index, as day chunks and as 2-hour chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build(gpus: int, days: float, every_s: int, data: Path) -> dict[str, Any]:
    """Build the store in `data` with the gpuwatch on sys.path and measure it (run in a child)."""
    import duckdb
    import querydata

    from gpuwatch.core.clock import FakeClock
    from gpuwatch.core.model import make_labels
    from gpuwatch.store import Store
    from gpuwatch.store.tierrows import decode_points

    end_s = querydata.T0_MS / 1000 + days * 86_400
    store = Store.open(data, clock=FakeClock(end_s + 600), retention_s=3650 * 86_400)
    n = 0
    started = time.perf_counter()
    for s in querydata.generate(gpus, days, every_s * 1000):
        store.append_series(s.name, make_labels(s.labels), s.timestamps_ms, s.values)
        n += s.values.size
    store.flush()
    store.compact()
    build_s = time.perf_counter() - started
    store.build_tiers()
    store.close()
    db = data / "gpuwatch.duckdb"
    out: dict[str, Any] = {"samples": n, "build_s": round(build_s, 2), "file": db.stat().st_size / n}
    con = duckdb.connect(str(db), read_only=True)
    ts, vs, seqs, chunks = con.execute(
        "SELECT sum(octet_length(ts)), sum(octet_length(vs)), coalesce(sum(octet_length(seqs)), 0), count(*) "
        "FROM chunks"
    ).fetchone()
    out.update(
        chunks=(ts + vs + seqs) / n, chunk_ts=ts / n, chunk_vs=vs / n, chunk_seqs=seqs / n, chunk_rows=chunks
    )
    for table, key in (("tier_1m", "1m"), ("tier_1h", "1h")):
        size, points, rows = con.execute(
            f"SELECT sum(octet_length(data)), sum(n), count(*) FROM {table}"
        ).fetchone()
        out[f"tier_{key}"] = size / n
        out[f"point_{key}"] = size / points
        by_name = con.execute(
            f"SELECT s.name, sum(octet_length(t.data)) / sum(t.n) FROM {table} t JOIN series s USING (series_id) "
            "GROUP BY s.name ORDER BY s.name"
        ).fetchall()
        out[f"point_{key}_by_metric"] = {name: round(b, 2) for name, b in by_name}
        if key == "1m":
            blobs = con.execute(f"SELECT n, data FROM {table}").fetchall()
            started = time.perf_counter()
            for count, blob in blobs:
                decode_points(blob, count)
            out["decode_1m_ms_a_row"] = (time.perf_counter() - started) * 1000 / max(1, rows)
    con.close()
    # The same rows in a fresh file: what the file holds beyond its rows is space DuckDB kept.
    fresh = data / "fresh.duckdb"
    con = duckdb.connect(str(fresh))
    con.execute(f"ATTACH '{db}' AS old (READ_ONLY)")
    con.execute("COPY FROM DATABASE old TO fresh")
    con.execute("DETACH old")
    con.execute("CHECKPOINT")
    con.close()
    out["file_fresh"] = fresh.stat().st_size / n
    return out


def run_child(src: Path | None, gpus: int, days: float, every_s: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ)
        if src is not None:
            env["GPUWATCH_BENCH_SRC"] = str(src)
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                tmp,
                *f"--gpus {gpus} --days {days} --every {every_s}".split(),
            ],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        return json.loads(proc.stdout.strip().splitlines()[-1])


def victoria(gpus: int, days: float, every_s: int) -> dict[str, Any]:
    """Import the same samples into VictoriaMetrics and count its bytes."""
    import querydata
    import requests

    with tempfile.TemporaryDirectory() as tmp:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        path = Path(tmp) / "vm"
        proc = subprocess.Popen(
            [
                "/usr/bin/victoria-metrics",
                "-retentionPeriod=100y",
                f"-storageDataPath={path}",
                f"-httpListenAddr=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    if requests.get(f"{url}/health", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    time.sleep(0.1)
            n = 0
            for s in querydata.generate(gpus, days, every_s * 1000):
                line = json.dumps(
                    {
                        "metric": {"__name__": s.name, **s.labels},
                        "values": s.values.tolist(),
                        "timestamps": s.timestamps_ms.tolist(),
                    }
                )
                requests.post(f"{url}/api/v1/import", data=line, timeout=120).raise_for_status()
                n += s.values.size
            requests.get(f"{url}/internal/force_flush", timeout=120).raise_for_status()
            requests.get(f"{url}/internal/force_merge", timeout=600).raise_for_status()
            time.sleep(5)  # the merge runs in the background
            got = requests.get(
                f"{url}/api/v1/query",
                params={"query": "sum(count_over_time({__name__=~'.+'}[30d]))"},
                timeout=60,
            ).json()
        finally:
            proc.send_signal(signal.SIGINT)  # flushes what is in memory, as a clean stop does
            proc.wait(60)
        data, index = _dir_bytes(path / "data"), _dir_bytes(path / "indexdb")
        stored = got["data"]["result"][0]["value"][1] if got.get("data", {}).get("result") else "?"
        return {"samples": n, "stored": stored, "data": data / n, "with_indexdb": (data + index) / n}


def index_figures() -> dict[str, Any]:
    """The chunk index of 5,600 series x 365 closed days and today's 12 windows, both layouts."""
    import numpy as np

    from gpuwatch.store.chunkindex import ChunkIndex

    series, days, day, window = 5_600, 365, 86_400_000, 7_200_000
    out = {}
    for name, per_day in (("day chunks", 1), ("2-hour chunks", 12)):
        per_series = days * per_day + 12
        k = np.tile(np.arange(per_series, dtype=np.int64), series)
        t_min = np.where(k < days * per_day, k * (day // per_day), days * day + (k - days * per_day) * window)
        index = ChunkIndex(
            {
                "series_id": np.repeat(np.arange(series, dtype=np.int64), per_series),
                "t_min_ms": t_min,
                "t_max_ms": t_min + 1,
                "n": np.full(k.size, 5760 // per_day, np.int32),
                "seq": k,
                "h": k.astype(np.uint64),
            },
            1,
        )
        out[name] = {"entries": index.size, "MiB": round(index.nbytes / 2**20, 1)}
        del index, k, t_min
    return out


ROWS = [
    ("chunks", "chunks (ts + vs + seqs), B/raw sample", 3),
    ("chunk_ts", "  of which timestamps", 3),
    ("chunk_vs", "  of which values", 3),
    ("chunk_seqs", "  of which write seqs", 3),
    ("chunk_rows", "chunk rows", 0),
    ("tier_1m", "1m tier, B/raw sample", 3),
    ("tier_1h", "1h tier, B/raw sample", 3),
    ("point_1m", "1m tier, B/point", 2),
    ("point_1h", "1h tier, B/point", 2),
    ("file", "file after close, B/raw sample", 3),
    ("file_fresh", "same rows in a fresh file, B/raw sample", 3),
    ("decode_1m_ms_a_row", "1m row decode, ms", 3),
    ("build_s", "append + flush + compact, s", 2),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--every", type=int, default=15, help="seconds between samples (15 divisible by it)")
    ap.add_argument("--before", type=Path, help="a gpuwatch source tree to build 'before' with")
    ap.add_argument("--victoria", action="store_true")
    ap.add_argument("--index", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(build(args.gpus, args.days, args.every, Path(args.child) / "data")))
        return
    if args.index:
        for name, fig in index_figures().items():
            print(f"index, 5,600 series x 1 year, {name}: {fig['entries']:,} entries, {fig['MiB']} MiB")
        if not (args.before or args.victoria):
            return
    results = {}
    if args.before:
        results["before"] = run_child(args.before.resolve(), args.gpus, args.days, args.every)
    results["now"] = run_child(None, args.gpus, args.days, args.every)
    now = results["now"]
    print(
        f"data: {args.gpus} GPUs x {args.days} days at {args.every} s, {now['samples']:,} samples; load {os.getloadavg()}"
    )
    cols = list(results)
    print(f"{'':44}" + "".join(f"{c:>12}" for c in cols) + ("       ratio" if "before" in results else ""))
    for key, label, places in ROWS:
        vals = [results[c][key] for c in cols]
        line = f"{label:44}" + "".join(f"{v:>12,.{places}f}" for v in vals)
        if "before" in results and vals[0]:
            line += f"{vals[-1] / vals[0]:>12.2f}"
        print(line)
    for metric in ("DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"):
        vals = [results[c]["point_1m_by_metric"].get(metric, 0.0) for c in cols]
        print(f"{'  1m B/point, ' + metric[12:]:44}" + "".join(f"{v:>12.2f}" for v in vals))
    if args.victoria:
        vm = victoria(args.gpus, args.days, args.every)
        print(
            f"VictoriaMetrics: {vm['samples']:,} imported ({vm['stored']} counted back): "
            f"data/ {vm['data']:.3f} B/sample, with indexdb/ {vm['with_indexdb']:.3f}"
        )
    print(json.dumps(results, default=str), file=sys.stderr)


if __name__ == "__main__":
    src = os.environ.get("GPUWATCH_BENCH_SRC")
    sys.path.insert(0, src if src else str(HERE.parent))
    sys.path.insert(0, str(HERE))
    main()
