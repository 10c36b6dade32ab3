"""Prometheus remote write into a hub: gpuwatch's `POST /api/v1/write` beside VictoriaMetrics'.

Usage: python bench/bench_remote_write.py [--nodes 500] [--seconds 60] [--senders 4] [--batch 2000]
       [--rounds 1] [--only gpuwatch|victoria] [--settle 5] [--root DIR] [--base DIR]

Data, built before anything is timed: N nodes of 8 GPUs x 25 dcgm-exporter series (`DCGM_FI_DEV_*`,
`DCGM_FI_PROF_*`; labels gpu, UUID, modelName, Hostname, pci_bus_id, job, instance; 200 series a node),
one sample per series per second for S simulated seconds (500 nodes = 4,000 GPUs = 100,000 samples a
second of data), ending 2 minutes before the build. Requests as a node's Prometheus sends them: labels
sorted, one sample per `TimeSeries` message, `--batch` samples a request (Prometheus'
max_samples_per_send, 2,000: one node's 200 series over 10 s), snappy-compressed
(`gpuwatch.remote.wire`; the first request is checked against `encode_series`/`encode_request`).
Requests go out window by window: every node's first 10 s (every series new), then the next 10 s.

Each system in turn, the same requests, fresh each time (`--rounds 2`: gpuwatch, VictoriaMetrics, then
VictoriaMetrics, gpuwatch): `gpuwatch serve` on a fresh data directory with no GPUs (no NVML here; no
`GPUWATCH_*` settings but the data directory; loopback needs no token) or `victoria-metrics`
(`-storageDataPath` in a temporary directory), then `--senders` threads POST the requests to
/api/v1/write over keep-alive connections, each the next request as soon as its last is answered. Per
run: wall time from the first POST to the last answer, samples/s accepted, the server process's CPU
seconds (all threads, /proc/PID/stat) over the sending and after `--settle` more seconds (work left
behind: flushes, merges), CPU seconds per 100,000 samples, its RSS after, the first window (new series)
apart from the rest, every answer's status (anything but 2xx is counted and the first few printed),
and this process's own CPU (the senders share the machine's cores). Then the data is checked by
PromQL on both at the data's last second: `count(DCGM_FI_DEV_GPU_UTIL)` (N x 8), `count` of every DCGM
series (N x 200), and `sum(count_over_time(M[S s]))` of GPU_UTIL and summed over the 25 metrics
(N x 8 x S and N x 200 x S samples); VictoriaMetrics
after `/internal/force_flush`, asked with `nocache=1` at a time past its 30 s latency offset.
`--root DIR` runs another tree's gpuwatch; `--base DIR` runs a second tree's in turns with it instead of
VictoriaMetrics (two builds compared).
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatch.remote import wire  # noqa: E402

GPUS_PER_NODE = 8
MODEL = "NVIDIA H100 80GB HBM3"
TICK = os.sysconf("SC_CLK_TCK")
# name, kind, base, spread: what a dcgm-exporter of 25 fields reports for a busy H100
METRICS = [
    ("DCGM_FI_DEV_SM_CLOCK", "int", 1755, 225),
    ("DCGM_FI_DEV_MEM_CLOCK", "const", 2619, 0),
    ("DCGM_FI_DEV_MEMORY_TEMP", "int", 45, 10),
    ("DCGM_FI_DEV_GPU_TEMP", "int", 55, 15),
    ("DCGM_FI_DEV_POWER_USAGE", "float3", 450, 250),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy", 0, 0),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "const", 0, 0),
    ("DCGM_FI_DEV_GPU_UTIL", "int", 70, 30),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "int", 30, 25),
    ("DCGM_FI_DEV_ENC_UTIL", "const", 0, 0),
    ("DCGM_FI_DEV_DEC_UTIL", "const", 0, 0),
    ("DCGM_FI_DEV_XID_ERRORS", "const", 0, 0),
    ("DCGM_FI_DEV_FB_FREE", "int", 20000, 15000),
    ("DCGM_FI_DEV_FB_USED", "int", 60000, 15000),
    ("DCGM_FI_DEV_FB_RESERVED", "const", 553, 0),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "int", 1_000_000, 900_000),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "const", 0, 0),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "const", 0, 0),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "const", 0, 0),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "const", 0, 0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "ratio", 0.7, 0.3),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "ratio", 0.4, 0.3),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "ratio", 0.5, 0.3),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "int", 50_000_000, 40_000_000),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "int", 80_000_000, 60_000_000),
]
SERIES_PER_NODE = GPUS_PER_NODE * len(METRICS)


def _varint(n: int) -> bytes:
    out = bytearray()
    wire._put_varint(out, n)
    return bytes(out)


def node_labels(node: int) -> list[list[tuple[str, str]]]:
    """The label pairs of one node's 200 series, sorted by name as Prometheus sends them."""
    host = f"gpu-node-{node:04d}"
    out = []
    for gpu in range(GPUS_PER_NODE):
        uuid = f"GPU-{node:08x}-{gpu:04x}-4{node % 4096:03x}-8{gpu:03x}-{node * 8 + gpu:012x}"
        common = {
            "Hostname": host,
            "UUID": uuid,
            "gpu": str(gpu),
            "instance": f"{host}:9400",
            "job": "dcgm-exporter",
            "modelName": MODEL,
            "pci_bus_id": f"00000000:{0x18 + 0x10 * gpu:02X}:00.0",
        }
        for name, *_ in METRICS:
            out.append(sorted({**common, "__name__": name}.items()))
    return out


def node_values(rng: np.random.Generator, seconds: int) -> np.ndarray:
    """(seconds, 200) float64: each series' samples, GPU-major as `node_labels`."""
    cols = []
    for _gpu in range(GPUS_PER_NODE):
        power = None
        for _name, kind, base, spread in METRICS:
            if kind == "const":
                col = np.full(seconds, float(base))
            elif kind == "energy":
                watts = power if power is not None else np.full(seconds, 450.0)
                start = float(rng.integers(10**9, 10**11))
                col = start + np.cumsum(np.round(watts * 1000))
            else:
                walk = np.cumsum(rng.normal(0, spread / 10, seconds)) + rng.uniform(-spread, spread) / 2
                col = np.clip(base + walk, max(0, base - spread), base + spread)
                if kind == "int":
                    col = np.round(col)
                elif kind == "float3":
                    col = np.round(col, 3)
                    power = col
                else:
                    col = np.round(col, 4)
            cols.append(col)
    return np.stack(cols, axis=1).astype("<f8")


@dataclass
class Requests:
    bodies: list[bytes]  # snappy-compressed, in sending order
    window_of: list[int]  # each request's window (0: every series new)
    samples_per_request: list[int]
    first_ms: int
    last_ms: int
    nodes: int
    seconds: int
    raw_bytes: int = 0
    build_s: float = 0.0


def build(nodes: int, seconds: int, batch: int, seed: int = 1) -> Requests:
    """Every node's requests, window by window, compressed."""
    t0 = time.perf_counter()
    per_window = max(1, batch // SERIES_PER_NODE)  # seconds of one node a request
    end_s = int(time.time()) - 120
    first_ms = (end_s - seconds + 1) * 1000
    stamp = [_varint(first_ms + 1000 * s) for s in range(seconds)]
    assert all(len(x) == len(stamp[0]) for x in stamp)
    rng = np.random.default_rng(seed)
    windows = range(0, seconds, per_window)
    by_node: list[list[tuple[bytes, int]]] = []
    raw = 0
    for node in range(nodes):
        heads = [wire.encode_series(pairs, [], []) for pairs in node_labels(node)]
        values = node_values(rng, seconds).tobytes()
        step = 8 * SERIES_PER_NODE
        sample_tail = [b"\x10" + stamp[s] for s in range(seconds)]
        sample_len = 1 + 8 + len(sample_tail[0])
        prefix = [
            b"\x0a" + _varint(len(h) + 2 + sample_len) + h + b"\x12" + bytes([sample_len]) + b"\x09"
            for h in heads
        ]
        reqs = []
        for w in windows:
            parts = []
            for s in range(w, min(w + per_window, seconds)):
                row, tail = s * step, sample_tail[s]
                parts += [p + values[row + 8 * i : row + 8 * i + 8] + tail for i, p in enumerate(prefix)]
            body = b"".join(parts)
            if node == 0 and w == 0:  # the same bytes as the wire module's writer
                check = wire.encode_request(
                    wire.encode_series(
                        pairs, [first_ms + 1000 * s], [struct.unpack_from("<d", values, s * step + 8 * i)[0]]
                    )
                    for s in range(min(per_window, seconds))
                    for i, pairs in enumerate(node_labels(0))
                )
                assert body == check, "the request differs from wire.encode_request's"
            raw += len(body)
            reqs.append((wire.compress(body), len(parts)))
        by_node.append(reqs)
    bodies, window_of, counts = [], [], []
    for k in range(len(windows)):
        for node in range(nodes):
            body, n = by_node[node][k]
            bodies.append(body)
            window_of.append(k)
            counts.append(n)
    return Requests(
        bodies, window_of, counts, first_ms, (end_s) * 1000, nodes, seconds, raw, time.perf_counter() - t0
    )


# -- the servers --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime: fields 14 and 15


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_http(url: str, proc: subprocess.Popen[Any], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args[0]} exited with {proc.returncode}")
        try:
            if requests.get(url, timeout=2).status_code in (200, 503):
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer within {timeout_s:.0f} s")


def start(system: str, tmp: str, port: int, root: Path) -> subprocess.Popen[Any]:
    """The server on a fresh directory under `tmp`, answering; its stderr in `tmp`/log."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    if system in ("gpuwatch", "base"):
        env["PYTHONPATH"] = str(root)
        args = ["serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", f"{tmp}/gw"]
        cmd, health = [sys.executable, "-m", "gpuwatch.cli.main", *args], "/-/health"
    else:
        cmd = ["victoria-metrics", f"-storageDataPath={tmp}/vm", f"-httpListenAddr=127.0.0.1:{port}",
               "-retentionPeriod=10y", "-loggerLevel=ERROR"]  # fmt: skip
        health = "/health"
    with open(f"{tmp}/log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.DEVNULL, stderr=log)
    wait_http(f"http://127.0.0.1:{port}{health}", proc)
    return proc


# -- sending ------------------------------------------------------------------------------------------


@dataclass
class Sent:
    wall_s: float = 0.0
    first_window_s: float = 0.0  # until every request of window 0 was answered
    cpu_first_window: float = 0.0
    rss_first_window: float = 0.0
    statuses: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def send(reqs: Requests, port: int, senders: int, pid: int) -> Sent:
    out = Sent()
    lock = threading.Lock()
    nxt = [0]
    first_left = [reqs.window_of.count(0)]
    t0 = time.perf_counter()

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(reqs.bodies):
                break
            try:
                conn.request("POST", "/api/v1/write", body=reqs.bodies[i], headers=wire.HEADERS)
                resp = conn.getresponse()
                text = resp.read()
                status = resp.status
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
                status, text = 0, repr(exc).encode()
            with lock:
                out.statuses[status] = out.statuses.get(status, 0) + 1
                if not 200 <= status < 300 and len(out.errors) < 5:
                    out.errors.append(f"request {i}: HTTP {status} {text[:300]!r}")
                if reqs.window_of[i] == 0:
                    first_left[0] -= 1
                    if first_left[0] == 0:
                        out.first_window_s = time.perf_counter() - t0
                        out.cpu_first_window = cpu_s(pid)
                        out.rss_first_window = rss_mb(pid)
        conn.close()

    threads = [threading.Thread(target=worker) for _ in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out.wall_s = time.perf_counter() - t0
    return out


def query(system: str, port: int, expr: str, at_s: float) -> str:
    params: dict[str, Any] = {"query": expr, "time": f"{at_s:.3f}"}
    if system == "victoria":
        params["nocache"] = "1"
    r = requests.get(f"http://127.0.0.1:{port}/api/v1/query", params=params, timeout=600)
    try:
        result = r.json()["data"]["result"]
        return result[0]["value"][1] if result else "no result"
    except (ValueError, KeyError, IndexError):
        return f"HTTP {r.status_code} {r.text[:200]}"


def run(system: str, reqs: Requests, senders: int, settle: float, root: Path) -> dict[str, Any]:
    samples = sum(reqs.samples_per_request)
    first = sum(n for n, w in zip(reqs.samples_per_request, reqs.window_of, strict=True) if w == 0)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start(system, tmp, port, root)
        try:
            time.sleep(2)  # started and settled
            rss0 = rss_mb(proc.pid)
            c0, own0 = cpu_s(proc.pid), time.process_time()
            sent = send(reqs, port, senders, proc.pid)
            c1, own1 = cpu_s(proc.pid), time.process_time()
            rss1 = rss_mb(proc.pid)
            time.sleep(settle)
            c2, rss2 = cpu_s(proc.pid), rss_mb(proc.pid)
            if system == "victoria":
                requests.get(f"http://127.0.0.1:{port}/internal/force_flush", timeout=600).raise_for_status()
            at = reqs.last_ms / 1000
            span = f"[{reqs.seconds}s]"
            t_q = time.perf_counter()
            counts = [
                query(system, port, "count(DCGM_FI_DEV_GPU_UTIL)", at),
                query(system, port, f"sum(count_over_time(DCGM_FI_DEV_GPU_UTIL{span}))", at),
                query(system, port, 'count({__name__=~"DCGM_.+"})', at),
            ]
            per_metric = [query(system, port, f"sum(count_over_time({m}{span}))", at) for m, *_ in METRICS]
            try:
                counts.append(f"{sum(int(float(c)) for c in per_metric):,}")
            except ValueError:
                counts.append(" / ".join(per_metric))
            q_s = time.perf_counter() - t_q
            alive = proc.poll() is None
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log = Path(f"{tmp}/log").read_text(errors="replace")
    rest_s = sent.wall_s - sent.first_window_s
    out = dict(
        system=system, samples=samples, wall_s=sent.wall_s, rate=samples / sent.wall_s,
        cpu_send=c1 - c0, cpu_settled=c2 - c0, first_s=sent.first_window_s,
        first_rate=first / sent.first_window_s if sent.first_window_s else 0.0,
        first_cpu=sent.cpu_first_window - c0, rest_rate=(samples - first) / rest_s if rest_s > 0 else 0.0,
        rest_cpu=c1 - sent.cpu_first_window, rss0=rss0, rss_first=sent.rss_first_window, rss1=rss1, rss2=rss2, own_cpu=own1 - own0,
        statuses=sent.statuses, errors=sent.errors, counts=counts, query_s=q_s, alive=alive,
    )  # fmt: skip
    per = 1e5 / samples
    ok = sum(n for s, n in sent.statuses.items() if 200 <= s < 300)
    print(
        f"{system:>9}: {samples:,} samples in {sent.wall_s:.1f} s = {out['rate']:,.0f} samples/s; "
        f"CPU {out['cpu_send']:.1f} s ({out['cpu_send'] * per:.3f} s per 100,000 samples; "
        f"{out['cpu_settled']:.1f} s with {settle:.0f} s after); RSS {rss0:.0f} -> {sent.rss_first_window:.0f} (first window) -> {rss1:.0f} MB "
        f"({rss2:.0f} after); the senders' CPU {out['own_cpu']:.1f} s",
        flush=True,
    )
    print(
        f"           first window (every series new): {out['first_s']:.1f} s = {out['first_rate']:,.0f}/s, "
        f"CPU {out['first_cpu']:.1f} s; the rest {out['rest_rate']:,.0f}/s, CPU {out['rest_cpu']:.1f} s "
        f"({out['rest_cpu'] * 1e5 / max(1, samples - first):.3f} s per 100,000)",
        flush=True,
    )
    print(
        f"           answers {dict(sorted(sent.statuses.items()))} ({ok}/{len(reqs.bodies)} 2xx); "
        f"count(GPU_UTIL) {counts[0]} (sent {reqs.nodes * GPUS_PER_NODE}), its samples {counts[1]} "
        f"(sent {reqs.nodes * GPUS_PER_NODE * reqs.seconds}); DCGM series {counts[2]} "
        f"(sent {reqs.nodes * SERIES_PER_NODE}), their samples {counts[3]} (sent {samples:,}); "
        f"queries {q_s:.1f} s" + ("" if alive else "; THE SERVER EXITED"),
        flush=True,
    )
    for e in sent.errors:
        print(f"           {e}", flush=True)
    for line in log.splitlines():
        if any(w in line for w in ("ERROR", "Traceback", "CRITICAL")) or (
            system == "gpuwatch" and "WARNING" in line and "NVML" not in line
        ):
            print(f"           log: {line[:300]}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--nodes", type=int, default=500, help="nodes of 8 GPUs x 25 series (500: 100,000 series)")
    p.add_argument("--seconds", type=int, default=60, help="simulated seconds of data, one sample a second")
    p.add_argument(
        "--senders", type=int, default=4, help="concurrent connections, each one request at a time"
    )
    p.add_argument("--batch", type=int, default=2000, help="samples a request (whole seconds of a node)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each system, in turns")
    p.add_argument("--only", choices=["gpuwatch", "victoria"], help="one system")
    p.add_argument(
        "--settle", type=float, default=5.0, help="seconds after the last answer, CPU still counted"
    )
    p.add_argument("--root", type=Path, default=ROOT, help="the gpuwatch tree to measure")
    p.add_argument("--base", type=Path, help="another gpuwatch tree, run in turns with --root (no VM)")
    args = p.parse_args()

    def load() -> str:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())

    reqs = build(args.nodes, args.seconds, args.batch)
    n = sum(reqs.samples_per_request)
    compressed = sum(len(b) for b in reqs.bodies)
    print(
        f"{args.nodes} nodes x {SERIES_PER_NODE} series x {args.seconds} s = {n:,} samples "
        f"({n / args.seconds:,.0f} a simulated second) in {len(reqs.bodies):,} requests of {args.batch}: "
        f"{reqs.raw_bytes / n:.0f} B a sample raw, {compressed / n:.1f} compressed "
        f"({compressed / 2**20:.0f} MiB); built in {reqs.build_s:.1f} s; {os.cpu_count()} CPUs, load {load()}",
        flush=True,
    )
    systems = [args.only] if args.only else ["gpuwatch", "base" if args.base else "victoria"]
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for k in range(args.rounds):
        for system in systems if k % 2 == 0 else systems[::-1]:
            root = args.base if system == "base" else args.root
            results[system].append(run(system, reqs, args.senders, args.settle, root.resolve()))
            print(f"           load {load()}", flush=True)
    if len(systems) == 2:
        gw, vm = results[systems[0]], results[systems[1]]
        for i, (a, b) in enumerate(zip(gw, vm, strict=True)):
            print(
                f"round {i + 1}, gpuwatch / {'base' if args.base else 'VictoriaMetrics'}: samples/s {a['rate'] / b['rate']:.2f}x, "
                f"CPU {a['cpu_send'] / b['cpu_send']:.2f}x ({a['cpu_settled'] / b['cpu_settled']:.2f}x with "
                f"{args.settle:.0f} s after), RSS {a['rss1'] / b['rss1']:.2f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
