"""Benchmark one evaluation round of the whole built-in rule pack (target: at most 100 ms).

Run on demand (not a test):
    python bench/bench_rules.py [--gpus 64] [--targets 20] [--runs 10] [--hours 2] [--rounds 20] [--dir D]

Data (deterministic, written with `Store.append_series`, then the store is flushed and compacted):
- `--gpus` GPUs (8 a host) sampled every second, as gpuwatch samples them, for `--hours`: every series
  the pack reads (GPU_UTIL, FB_USED/TOTAL, GPU_TEMP, MEMORY_TEMP, ECC_DBE counter, PCIe replay counter,
  ROW_REMAP_FAILURE/PENDING, gpuwatch_gpu_lost, 5 gpuwatch_clock_throttled reasons, one process each)
  plus an XID counter on every 16th GPU and gpuwatch's own series;
- `--targets` inference targets scraped every 15 s: `up`, `vllm:num_preemptions_total`, and the
  raw vLLM series the built-in recording rules read when `inference-recording.yml` is in the pack
  (request counters and latency/TTFT histograms); without that file the seven
  `gpuwatch:inference_*` series are written directly as stand-ins;
- `--runs` training runs logging loss, grad norm, tokens/s every second, a checkpoint time every 10
  minutes, run-status gauges every 15 s and log-event counters every second.
Laid out as a running gpuwatch leaves its store (closed 2-hour windows merged into one chunk per
series, the current window in 5-minute chunks, the last minutes in the head); the data ends 53
minutes into a window.

One round is `RuleManager.evaluate_all()` over every built-in group (queries, alert state, ALERTS
samples appended): the round is timed `--rounds` times, after two warm-up rounds (timed apart: the first
after a start learns what the rules read, the second prefetches it as every later one does). Between rounds (outside the
timing) the clock moves on `--interval` seconds and every series gets its new samples of those seconds,
one batch and one flush a second, as in a running gpuwatch (`--still`: time stands still instead).
`--as-serve`: a round is serve's rules job (`RuleManager.run_due`), where each group runs only when its
own interval is due, so the 30 s inference quantile group runs every other 15 s round.
Prints the median and p90 of a round (wall time), the median CPU time of a round (`time.process_time`:
less noisy than wall time on a shared machine) and the ten most expensive rules.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Sample, make_labels
from gpuwatch.query import Engine, Vector
from gpuwatch.rules.load import builtin_files, load_builtin
from gpuwatch.rules.manager import RuleManager
from gpuwatch.rules.roundcache import RoundCache
from gpuwatch.store import Store

T_END_MS = 1_796_000_000_000


class BenchClock(FakeClock):
    """Wall time stands still at the end of the data; monotonic time is real, so durations are measured."""

    def monotonic(self) -> float:
        return time.monotonic()


WINDOW_MS = 2 * 3600 * 1000  # the store's chunk window (gpuwatch/store/chunking.py)
COMPACT_MS = 300_000  # a running gpuwatch moves its head into chunks every 5 minutes


def _series(out: list, name: str, labels: dict[str, str], ts: np.ndarray, values: np.ndarray) -> int:  # type: ignore[type-arg]
    out.append((name, make_labels(labels), ts, values))
    return len(ts)


def write_like_a_running_store(store: Store, series: list) -> None:  # type: ignore[type-arg]
    """Write as a long-running gpuwatch leaves its store: closed windows in one chunk per series, the
    current window in 5-minute chunks, the last minutes in the head (rows not yet compacted)."""
    window_start = T_END_MS - T_END_MS % WINDOW_MS
    for name, labels, t, v in series:
        old = t < window_start
        if old.any():
            store.append_series(name, labels, t[old], v[old])
    store.compact()
    cuts = list(range(window_start, T_END_MS + 1, COMPACT_MS))
    for k, lo in enumerate(cuts):
        hi = cuts[k + 1] if k + 1 < len(cuts) else T_END_MS + 1
        for name, labels, t, v in series:
            part = (t >= lo) & (t < hi)
            if part.any():
                store.append_series(name, labels, t[part], v[part])
        if k + 1 < len(cuts):
            store.compact()
    store.flush()


def load_data(
    target: Store, live: list, gpus: int, targets: int, runs: int, hours: float, has_recording: bool
) -> int:
    store: list = []  # type: ignore[type-arg]
    rng = np.random.default_rng(7)
    n = 0
    start = T_END_MS - int(hours * 3600_000)
    t1 = np.arange(start, T_END_MS + 1, 1000, dtype=np.int64)
    t15 = np.arange(start, T_END_MS + 1, 15_000, dtype=np.int64)
    ones, zeros = np.ones(len(t1)), np.zeros(len(t1))
    for i in range(gpus):
        host = f"node-{i // 8}"
        gl = {
            "gpu": str(i % 8),
            "UUID": f"GPU-{i:08x}-0000",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": host,
            "pci_bus_id": f"00000000:{i % 8 + 1:02x}:00.0",
        }
        util = np.clip(rng.normal(60 if i % 3 else 2, 10, len(t1)), 0, 100)
        n += _series(store, "DCGM_FI_DEV_GPU_UTIL", gl, t1, util)
        n += _series(store, "DCGM_FI_DEV_FB_USED", gl, t1, 20_000 + util * 500)
        n += _series(store, "DCGM_FI_DEV_FB_TOTAL", gl, t1, ones * 81_559)
        n += _series(store, "DCGM_FI_DEV_GPU_TEMP", gl, t1, 40 + util * 0.4)
        n += _series(store, "DCGM_FI_DEV_MEMORY_TEMP", gl, t1, 45 + util * 0.4)
        n += _series(store, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gl, t1, zeros)
        n += _series(store, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", gl, t1, zeros)
        n += _series(store, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gl, t1, zeros)
        n += _series(store, "DCGM_FI_DEV_ROW_REMAP_PENDING", gl, t1, zeros)
        n += _series(store, "gpuwatch_gpu_lost", gl, t1, zeros)
        for reason in (
            "sw_power_cap",
            "hw_slowdown",
            "sw_thermal_slowdown",
            "hw_thermal_slowdown",
            "hw_power_brake_slowdown",
        ):
            n += _series(store, "gpuwatch_clock_throttled", {**gl, "reason": reason}, t1, zeros)
        proc = {**gl, "pid": str(1000 + i), "process_name": "python3", "user": "alice", "container_id": ""}
        n += _series(store, "gpuwatch_process_gpu_memory_bytes", proc, t1, ones * 2**34)
        if i % 16 == 3:
            n += _series(store, "gpuwatch_xid_errors_total", {**gl, "xid": "13"}, t1, ones)
    for name, value in (
        ("gpuwatch_build_info", 1.0),
        ("gpuwatch_nvml_up", 1.0),
        ("gpuwatch_gpus", float(gpus)),
    ):
        n += _series(
            store, name, {"version": "bench"} if name == "gpuwatch_build_info" else {}, t1, ones * value
        )
    n += _series(store, "gpuwatch_store_write_errors_total", {}, t1, zeros)
    for job in ("sample", "host", "rules", "runs", "push", "retention"):
        n += _series(store, "gpuwatch_job_failures_total", {"task": job}, t1, zeros)
    for g in ("gpu", "health", "inference", "training"):
        n += _series(
            store,
            "gpuwatch_rule_evaluation_failures_total",
            {"rule_group": f"builtin;gpuwatch-{g}"},
            t1,
            zeros,
        )
    reqs = np.cumsum(rng.poisson(300, len(t15))).astype(float)
    for k in range(targets):
        tl = {"job": "vllm", "instance": f"10.0.{k // 10}.{k % 10}:8000"}
        ml = {**tl, "model_name": f"model-{k % 4}", "engine": "0"}
        n += _series(store, "up", tl, t15, np.ones(len(t15)))
        n += _series(store, "scrape_samples_scraped", tl, t15, np.ones(len(t15)) * 800)
        n += _series(store, "vllm:num_preemptions_total", ml, t15, np.zeros(len(t15)))
        if has_recording:
            n += _series(store, "vllm:num_requests_waiting", ml, t15, np.ones(len(t15)) * 3)
            n += _series(store, "vllm:num_requests_running", ml, t15, np.ones(len(t15)) * 40)
            n += _series(store, "vllm:kv_cache_usage_perc", ml, t15, np.ones(len(t15)) * 0.5)
            n += _series(store, "vllm:generation_tokens_total", ml, t15, reqs * 200)
            for reason in ("stop", "length", "abort", "error"):
                share = {"stop": 0.9, "length": 0.08, "abort": 0.015, "error": 0.005}[reason]
                n += _series(
                    store,
                    "vllm:request_success_total",
                    {**ml, "finished_reason": reason},
                    t15,
                    np.floor(reqs * share),
                )
            for hist, les in (
                (
                    "vllm:e2e_request_latency_seconds",
                    (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0),
                ),
                (
                    "vllm:time_to_first_token_seconds",
                    (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5),
                ),
            ):
                for j, le in enumerate((*les, float("inf"))):
                    frac = min(1.0, (j + 1) / len(les))
                    n += _series(
                        store,
                        f"{hist}_bucket",
                        {**ml, "le": "+Inf" if le == float("inf") else str(le)},
                        t15,
                        np.floor(reqs * frac),
                    )
                n += _series(store, f"{hist}_count", ml, t15, reqs)
                n += _series(store, f"{hist}_sum", ml, t15, reqs * 0.8)
        else:
            ml = {**tl, "model_name": f"model-{k % 4}", "engine": "vllm"}
            for name, value in (
                ("gpuwatch:inference_requests:rate1m", 20.0),
                ("gpuwatch:inference_latency_seconds:p99", 1.2),
                ("gpuwatch:inference_ttft_seconds:p99", 0.3),
                ("gpuwatch:inference_queue_length", 3.0),
                ("gpuwatch:inference_kv_cache_usage_ratio", 0.5),
                ("gpuwatch:inference_generation_tokens:rate1m", 4000.0),
                ("gpuwatch:inference_error_ratio", 0.002),
            ):
                n += _series(store, name, ml, t15, np.ones(len(t15)) * value)
    for r in range(runs):
        rl = {"run": f"run-{r}", "job": "training"}
        steps = np.arange(len(t1), dtype=float)
        n += _series(store, "training_step", rl, t1, steps)
        n += _series(
            store, "training_loss", rl, t1, 3.0 * np.exp(-steps / 5000) + rng.normal(0, 0.02, len(t1))
        )
        n += _series(store, "training_grad_norm", rl, t1, np.abs(rng.normal(1.0, 0.2, len(t1))))
        n += _series(
            store, "training_throughput_tokens_per_second", rl, t1, rng.normal(50_000, 1000, len(t1))
        )
        t600 = t1[::600]
        n += _series(store, "training_checkpoint_seconds", rl, t600, np.ones(len(t600)) * 40)
        n += _series(store, "gpuwatch_training_run_running", {"run": f"run-{r}"}, t15, np.ones(len(t15)))
        n += _series(
            store, "gpuwatch_training_run_last_seen_timestamp_seconds", {"run": f"run-{r}"}, t15, t15 / 1000
        )
        for kind in ("cuda_oom", "nccl_error", "traceback", "nan_loss"):
            n += _series(
                store,
                "gpuwatch_log_events_total",
                {"run": f"run-{r}", "file": f"/logs/run-{r}.log", "kind": kind},
                t1,
                zeros,
            )
    write_like_a_running_store(target, store)
    live.extend(store)
    return n


class LiveWriter:
    """Go on writing every series at its own cadence, as gpuwatch's sampler and scrapes do: one batch
    per second, one flush per second (the writer thread's rhythm), the head compacted every 5 minutes."""

    def __init__(self, store: Store, series: list) -> None:  # type: ignore[type-arg]
        self.store = store
        self.t_ms = T_END_MS
        self.series = []
        for name, labels, t, v in series:
            step = int(t[1] - t[0]) if len(t) > 1 else 1000
            counter = bool(len(v) > 1 and (np.diff(v) >= 0).all())
            # A counter goes on rising as it rose; a gauge repeats its history.
            ahead = np.diff(v) if counter else v
            self.series.append((name, labels, step, counter, ahead, [float(v[-1]), 0]))

    def advance(self, clock: BenchClock, seconds: int) -> None:
        for _ in range(seconds):
            self.t_ms += 1000
            clock.advance(1)
            batch = []
            for name, labels, step, counter, ahead, state in self.series:
                if self.t_ms % step:
                    continue
                k = state[1] % len(ahead)
                state[0] = state[0] + float(ahead[k]) if counter else float(ahead[k])
                state[1] += 1
                batch.append(Sample(name, labels, state[0]))
            self.store.append(Batch(self.t_ms, batch))
            self.store.flush()
            if self.t_ms % COMPACT_MS == 0:
                self.store.compact()


def _bits(result: object) -> object:
    if isinstance(result, Vector):
        return sorted((tuple(sorted(x.labels.items())), np.float64(x.value).tobytes()) for x in result)
    return repr(result)


def check_exact(m: RuleManager, cache: RoundCache, store: Store, now_ms: int) -> int:
    """Count the rules whose expression gives other bits through the round's cache than from the store."""
    cached, plain = Engine(cache), Engine(store)
    bad = 0
    for g in m.groups():
        for r in g.group.rules:
            a, b = _bits(cached.instant(r.expr, now_ms)), _bits(plain.instant(r.expr, now_ms))
            if a != b:
                print(f"MISMATCH {r.name}: {str(a)[:300]} != {str(b)[:300]}")
                bad += 1
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--targets", type=int, default=20)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--interval", type=int, default=15, help="seconds of new samples between rounds")
    ap.add_argument(
        "--still",
        action="store_true",
        help="no new samples between rounds (time stands still, as before 2026-11-30 15:00)",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="after each round, compare every rule's result with one read from the store directly",
    )
    ap.add_argument("--profile", type=Path, default=None, help="write a cProfile of the timed rounds here")
    ap.add_argument(
        "--no-cache", action="store_true", help="every rule reads the store itself (no RoundCache)"
    )
    ap.add_argument(
        "--as-serve",
        action="store_true",
        help="each round is the rules job of `gpuwatch serve` (`RuleManager.run_due`): a group runs when its "
        "interval is due (the 30 s quantile group every other 15 s round) instead of every group every round",
    )
    args = ap.parse_args()
    groups = load_builtin()
    has_recording = any(r.kind == "record" for g in groups for r in g.rules)
    n_alerts = sum(r.kind == "alert" for g in groups for r in g.rules)
    n_records = sum(r.kind == "record" for g in groups for r in g.rules)
    with tempfile.TemporaryDirectory(prefix="gpuwatch-bench-rules-", dir=args.dir) as tmp:
        clock = BenchClock(T_END_MS / 1000)
        store = Store.open(Path(tmp), clock=clock, retention_s=10 * 365 * 86400)
        try:
            t0 = time.monotonic()
            series: list = []  # type: ignore[type-arg]
            n = load_data(store, series, args.gpus, args.targets, args.runs, args.hours, has_recording)
            load_s = time.monotonic() - t0
            cache = RoundCache(store)  # as build_manager sets it up
            if args.no_cache:
                m = RuleManager(store, Engine(store).instant, clock, groups, default_interval_s=15)
            else:
                m = RuleManager(
                    store, Engine(cache).instant, clock, groups, default_interval_s=15, cache=cache
                )
            writer = LiveWriter(store, series)
            del series
            # Warm-up, as after a start: the first round learns what the rules read, the second
            # prefetches it (as every later round does): timed apart.
            warm = []
            evaluate = m.run_due if args.as_serve else m.evaluate_all
            for _ in range(2):
                t = time.monotonic()
                evaluate()
                warm.append(time.monotonic() - t)
                store.flush()
                if not args.still:
                    writer.advance(clock, args.interval)
            rounds, cpu, prefetch = [], [], []
            begin = cache.begin

            def timed_begin(now_ms: int) -> None:
                t = time.monotonic()
                begin(now_ms)
                prefetch.append(time.monotonic() - t)

            cache.begin = timed_begin  # type: ignore[method-assign]
            reads = cache.reads
            profile = cProfile.Profile() if args.profile else None
            mismatches = 0
            for _ in range(args.rounds):
                if profile is not None:
                    profile.enable()
                t, c = time.monotonic(), time.process_time()
                evaluate()
                rounds.append(time.monotonic() - t)
                cpu.append(time.process_time() - c)
                if profile is not None:
                    profile.disable()
                store.flush()  # the ALERTS samples of the round, outside the timing (the writer thread's work)
                if args.check:
                    mismatches += check_exact(m, cache, store, clock.now_ms())
                if not args.still:
                    writer.advance(clock, args.interval)
            reads = (cache.reads - reads) / args.rounds
            errors = [
                (r.name, s.last_error)
                for g in m.groups()
                for r, s in zip(g.group.rules, g.status, strict=True)
                if s.health != "ok"
            ]
            costs = sorted(
                (
                    (s.duration_s, r.name)
                    for g in m.groups()
                    for r, s in zip(g.group.rules, g.status, strict=True)
                ),
                reverse=True,
            )
            if profile is not None:
                profile.dump_stats(args.profile)
            firing = sorted({r.name for r, a in m.active_alerts()})
        finally:
            store.close()
    rounds.sort()
    p90 = rounds[min(len(rounds) - 1, int(0.9 * len(rounds)))]
    print(f"machine: {os.cpu_count()} CPU(s), Python {platform.python_version()}, {platform.machine()}")
    print(
        f"pack: {n_alerts} alert + {n_records} recording rules from {', '.join(p.name for p in builtin_files())}"
    )
    print(
        f"data: {args.gpus} GPUs, {args.targets} inference targets ({'raw vLLM series' if has_recording else 'stand-in gpuwatch:inference_* series'}), "
        f"{args.runs} training runs, {args.hours:g} h; {n / 1e6:.2f} M samples loaded in {load_s:.1f} s"
    )
    if not args.no_cache:
        print(
            f"store reads a round: {reads:.2f}; prefetch median {statistics.median(prefetch) * 1000:.1f} ms"
        )
    print(
        f"one round: median {statistics.median(rounds) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms over {args.rounds} rounds; "
        f"CPU time median {statistics.median(cpu) * 1000:.1f} ms (all threads of the process)"
    )
    print(f"warm-up rounds: {', '.join(f'{w * 1000:.0f} ms' for w in warm)}")
    print(
        "most expensive rules (last round): "
        + ", ".join(f"{name} {d * 1000:.1f} ms" for d, name in costs[:10])
    )
    print(f"active alerts: {', '.join(firing) or 'none'}")
    if args.check:
        print(f"exactness: {mismatches} rule results differ from reading the store directly")
    if errors:
        print(f"rule errors: {errors}")
        return 1
    if mismatches:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
