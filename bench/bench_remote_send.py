"""A node's remote-write sender: its CPU at a steady rate, and how fast it catches up after an outage.

Usage: python bench/bench_remote_send.py cpu [--series 10000] [--warmup 30] [--seconds 90] [--rounds 3]
       python bench/bench_remote_send.py catchup [--series 2000] [--backlog 600] [--rounds 2]
           [--receivers gpuwatch,victoria] [--keep DIR]
       (both: [--root DIR], the gpuwatch tree to run)

The node is `gpuwatch serve` (no GPUs, no `GPUWATCH_*` settings but `hostname`) scraping, every second,
one page of `--series` dcgm-exporter series served from this process by prometheus_client (the 25
`DCGM_FI_*` names and 7 labels of bench_remote_write.py, 200 series a simulated GPU host, values moved
once a second): `--series` samples a second, plus the scrape's own 5 and the host figures. Its
`remote_write` has gpuwatch's defaults (`max_samples_per_send` 2,000, `batch_send_deadline` 5 s).

`cpu`: in turns (off, on, then on, off, ...), a fresh node with and without a `remote_write` to one
VictoriaMetrics started first; after `--warmup` s, the node's CPU seconds (all threads,
/proc/PID/stat) and the samples it sent (`samplesSent` of /api/ui/targets) over `--seconds`. Per round:
CPU % of one core off and on, and the difference per 10,000 samples a second sent.

`catchup`: a backlog is built once: the node runs `--backlog` s with its one destination refusing
connections (a port nothing listens on), then is stopped (SIGTERM); `--keep DIR` keeps it there and
reuses it in later runs. Each run, receivers in turns (a fresh `gpuwatch serve` as the hub, or a fresh
`victoria-metrics`), the node is started on a copy of that data directory with the destination (same
name, so the same watermark) pointing at the receiver, and polled every 0.5 s: from its start until
the newest sample the receiver took is one stored after the restart (the backlog is delivered: samples
go in write order) and until it is under 10 s old (caught up, the scrapes meanwhile included);
samples/s delivered, and the node's and the receiver's CPU over it. Then the receiver's count of the
backlog's DCGM samples against the node's (`sum(count_over_time(...))` at the backlog's end).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry, Gauge, start_http_server  # noqa: E402

from bench.bench_remote_write import (  # noqa: E402
    METRICS,
    SERIES_PER_NODE,
    cpu_s,
    free_port,
    node_labels,
    node_values,
    query,
    rss_mb,
    start,
    wait_http,
)

HOSTNAME = "bench-node"


# -- the scraped page ----------------------------------------------------------------------------------


class Page:
    """`series` dcgm-exporter series on a prometheus_client page of this process, moved every second."""

    def __init__(self, series: int, seed: int = 1) -> None:
        self.registry = CollectorRegistry()
        names = [name for name, *_ in METRICS]
        label_names = [k for k, _ in node_labels(0)[0] if k != "__name__"]
        gauges = {n: Gauge(n, n, label_names, registry=self.registry) for n in names}
        rng = np.random.default_rng(seed)
        self.children = []
        cols = []
        for node in range((series + SERIES_PER_NODE - 1) // SERIES_PER_NODE):
            for pairs in node_labels(node):
                labels = dict(pairs)
                name = labels.pop("__name__")
                self.children.append(gauges[name].labels(**labels))
            cols.append(node_values(rng, 120))
        self.children = self.children[:series]
        self.values = np.concatenate(cols, axis=1)[:, :series]  # 120 s of values, replayed
        self._stop = threading.Event()
        server, _ = start_http_server(0, addr="127.0.0.1", registry=self.registry)
        self.port = server.server_port
        self.tick(0)
        threading.Thread(target=self._run, daemon=True).start()

    def tick(self, k: int) -> None:
        for child, v in zip(self.children, self.values[k % len(self.values)].tolist(), strict=True):
            child.set(v)

    def _run(self) -> None:
        k = 1
        while not self._stop.wait(1.0):
            self.tick(k)
            k += 1


# -- the node ------------------------------------------------------------------------------------------


def node_config(path: Path, page_port: int, write_url: str | None) -> None:
    lines = [
        "scrape_configs:",
        "  - job_name: dcgm",
        "    scrape_interval: 1s",
        f"    static_configs: [{{targets: ['127.0.0.1:{page_port}']}}]",
    ]
    if write_url:
        lines += ["remote_write:", f"  - url: {write_url}", "    name: dest"]
    path.write_text("\n".join(lines) + "\n")


def start_node(data_dir: Path, config: Path, root: Path) -> tuple[subprocess.Popen[Any], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    env.update(PYTHONPATH=str(root), GPUWATCH_HOSTNAME=HOSTNAME)
    port = free_port()
    cmd = [sys.executable, "-m", "gpuwatch.cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--data-dir", str(data_dir), "--config", str(config)]  # fmt: skip
    with (data_dir.parent / "node.log").open("a") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=log)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/-/health", proc)
    return proc, url


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def dest_state(url: str) -> dict[str, Any]:
    r = requests.get(url + "/api/ui/targets", timeout=30)
    r.raise_for_status()
    return r.json()["data"]["remote_write"][0]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def span(xs: list[float], fmt: str = "{:.1f}") -> str:
    return fmt.format(min(xs)) if len(xs) == 1 else f"{fmt.format(min(xs))}-{fmt.format(max(xs))}"


# -- cpu: the sender's cost at a steady rate -----------------------------------------------------------


def cpu_run(page: Page, write_url: str | None, warmup: float, seconds: float, root: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "node.yml"
        node_config(config, page.port, write_url)
        proc, url = start_node(Path(tmp) / "data", config, root)
        try:
            time.sleep(warmup)
            sent0 = dest_state(url)["samplesSent"] if write_url else 0
            c0, t0 = cpu_s(proc.pid), time.monotonic()
            time.sleep(seconds)
            c1, t1 = cpu_s(proc.pid), time.monotonic()
            state = dest_state(url) if write_url else {"samplesSent": 0, "lastError": ""}
            scraped = query("gpuwatch", int(url.rsplit(":", 1)[1]), "scrape_samples_scraped", time.time())
            rss = rss_mb(proc.pid)
        finally:
            stop(proc)
    out = dict(cpu=100 * (c1 - c0) / (t1 - t0), sent=(state["samplesSent"] - sent0) / (t1 - t0), rss=rss)
    print(
        f"  remote_write {'on ' if write_url else 'off'}: CPU {out['cpu']:.1f} % of a core, "
        f"sent {out['sent']:,.0f} samples/s, scraped {scraped} a scrape, RSS {rss:.0f} MB"
        + (f", last error {state['lastError']!r}" if state["lastError"] else "")
        + f"; load {load()}",
        flush=True,
    )
    return out


def cpu_main(args: argparse.Namespace) -> None:
    page = Page(args.series)
    print(f"{args.series:,} series a scrape, 1 s; {os.cpu_count()} CPUs, load {load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        vm_port = free_port()
        vm = start("victoria", tmp, vm_port, args.root)
        write_url = f"http://127.0.0.1:{vm_port}/api/v1/write"
        per_10k, diffs = [], []
        try:
            for k in range(args.rounds):
                runs = {}
                for on in (False, True) if k % 2 == 0 else (True, False):
                    runs[on] = cpu_run(page, write_url if on else None, args.warmup, args.seconds, args.root)
                diff = runs[True]["cpu"] - runs[False]["cpu"]
                diffs.append(diff)
                per_10k.append(diff / (runs[True]["sent"] / 10_000))
                print(
                    f"round {k + 1}: on - off = {diff:.1f} % of a core at {runs[True]['sent']:,.0f} samples/s "
                    f"= {per_10k[-1]:.1f} % per 10,000 samples/s",
                    flush=True,
                )
        finally:
            vm.terminate()
            vm.wait(60)
    print(f"sender: {span(diffs)} % of a core; {span(per_10k)} % per 10,000 samples/s", flush=True)


# -- catchup: delivering a backlog --------------------------------------------------------------------


@dataclass
class Backlog:
    data_dir: Path
    start_s: float  # wall time of the node's start and stop while the destination was down
    end_s: float


def build_backlog(page: Page, keep: Path, seconds: float, root: Path) -> Backlog:
    mark = keep / "backlog.txt"
    if mark.exists():
        start_s, end_s = (float(x) for x in mark.read_text().split())
        print(f"backlog: reusing {keep} ({end_s - start_s:.0f} s, built {time.time() - end_s:.0f} s ago)")
        return Backlog(keep / "data", start_s, end_s)
    keep.mkdir(parents=True, exist_ok=True)
    config = keep / "node.yml"
    node_config(config, page.port, f"http://127.0.0.1:{free_port()}/api/v1/write")  # nothing listens
    proc, url = start_node(keep / "data", config, root)
    start_s = time.time()
    print(f"backlog: {seconds:.0f} s of scrapes, the destination down ...", flush=True)
    try:
        time.sleep(seconds)
        state = dest_state(url)
    finally:
        stop(proc)
    end_s = time.time()
    mark.write_text(f"{start_s} {end_s}\n")
    print(f"backlog: built; the destination's last error {state['lastError']!r}", flush=True)
    return Backlog(keep / "data", start_s, end_s)


def dcgm_samples(system: str, port: int, backlog: Backlog) -> str:
    """The DCGM samples stored within the backlog's time, summed over the 25 names."""
    at, window = backlog.end_s - 1, f"[{int(backlog.end_s - backlog.start_s)}s]"
    counts = [
        query(system, port, f'sum(count_over_time({m}{{job="dcgm"}}{window}))', at) for m, *_ in METRICS
    ]
    try:
        return f"{sum(int(float(c)) for c in counts):,}"
    except ValueError:
        return " / ".join(counts)


def catchup_run(system: str, page: Page, backlog: Backlog, root: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        rx_port = free_port()
        rx = start(system, tmp, rx_port, root)
        shutil.copytree(backlog.data_dir, Path(tmp) / "node" / "data")
        config = Path(tmp) / "node" / "node.yml"
        node_config(config, page.port, f"http://127.0.0.1:{rx_port}/api/v1/write")
        rc0 = cpu_s(rx.pid)
        t_start = time.time()
        node, url = start_node(Path(tmp) / "node" / "data", config, root)
        try:
            nc0 = cpu_s(node.pid)
            first = delivered = live = 0.0
            pending0 = 0
            sent_at: dict[str, float] = {}
            while not live:
                time.sleep(0.5)
                now = time.time()
                st = dest_state(url)
                if st["samplesSent"] and not first:
                    first = now
                pending0 = max(pending0, st["samplesPending"])
                if st["highestSentTimestamp"] >= t_start and not delivered:
                    delivered, sent_at["delivered"] = now, st["samplesSent"]
                    nc_delivered, rc_delivered = cpu_s(node.pid), cpu_s(rx.pid)
                if delivered and now - st["highestSentTimestamp"] < 10:
                    live, sent_at["live"] = now, st["samplesSent"]
                if now - t_start > 3600:
                    raise SystemExit(f"not caught up in an hour: {st}")
            sent, err = st["samplesSent"], st["lastError"]
            # What the receiver has of the backlog's DCGM samples, against the node's own store.
            if system == "victoria":
                requests.get(f"http://127.0.0.1:{rx_port}/internal/force_flush", timeout=600)
            theirs = dcgm_samples(system, rx_port, backlog)
            mine = dcgm_samples("gpuwatch", int(url.rsplit(":", 1)[1]), backlog)
        finally:
            stop(node)
            rx.terminate()
            rx.wait(60)
    took = delivered - t_start
    out = dict(
        delivered_s=took,
        live_s=live - t_start,
        rate=sent_at["delivered"] / (delivered - first),
        node_cpu=100 * (nc_delivered - nc0) / took,
        rx_cpu=100 * (rc_delivered - rc0) / took,
    )
    print(
        f"  {system:>9}: backlog delivered {took:.1f} s after the node's start (first 2xx at "
        f"{first - t_start:.1f} s), {sent_at['delivered']:,} samples = {out['rate']:,.0f} samples/s; "
        f"caught up (newest sent < 10 s old) at {out['live_s']:.1f} s; CPU over the backlog: node "
        f"{out['node_cpu']:.0f} %, receiver {out['rx_cpu']:.0f} % of a core; pending seen at most "
        f"{pending0:,}; sent {sent:,} in all; backlog DCGM samples: receiver {theirs}, node {mine}"
        + (f"; last error {err!r}" if err else "")
        + f"; load {load()}",
        flush=True,
    )
    return out


def catchup_main(args: argparse.Namespace) -> None:
    page = Page(args.series)
    print(f"{args.series:,} series a scrape, 1 s; {os.cpu_count()} CPUs, load {load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        backlog = build_backlog(page, args.keep or Path(tmp) / "backlog", args.backlog, args.root)
        systems = args.receivers.split(",")
        results: dict[str, list[dict[str, float]]] = {s: [] for s in systems}
        for k in range(args.rounds):
            for system in systems if k % 2 == 0 else systems[::-1]:
                results[system].append(catchup_run(system, page, backlog, args.root))
    for system, runs in results.items():
        print(
            f"{system}: {span([r['rate'] for r in runs], '{:,.0f}')} samples/s; backlog delivered in "
            f"{span([r['delivered_s'] for r in runs])} s, caught up in {span([r['live_s'] for r in runs])} s",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--root", type=Path, default=ROOT, help="the gpuwatch tree to run")
    sub = p.add_subparsers(dest="mode", required=True)
    c = sub.add_parser("cpu", help="the sender's CPU at a steady rate: remote_write on against off")
    c.add_argument("--series", type=int, default=10_000, help="series scraped each second")
    c.add_argument("--warmup", type=float, default=30.0, help="seconds before measuring")
    c.add_argument("--seconds", type=float, default=90.0, help="seconds measured")
    c.add_argument("--rounds", type=int, default=3, help="pairs of runs, in turns")
    u = sub.add_parser("catchup", help="delivering a backlog to a receiver that came back")
    u.add_argument("--series", type=int, default=2_000, help="series scraped each second")
    u.add_argument("--backlog", type=float, default=600.0, help="seconds of outage to build")
    u.add_argument("--rounds", type=int, default=2, help="runs of each receiver, in turns")
    u.add_argument("--receivers", default="gpuwatch,victoria", help="gpuwatch, victoria or both")
    u.add_argument("--keep", type=Path, help="keep the backlog here, and reuse it if it is there")
    args = p.parse_args()
    args.root = args.root.resolve()
    cpu_main(args) if args.mode == "cpu" else catchup_main(args)


if __name__ == "__main__":
    main()
