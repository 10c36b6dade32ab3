"""CPU of the scrape and store path in one process, without wake-ups: per scrape, per flush, per compaction.

Usage: python bench/bench_ingest.py [--targets 20] [--rounds 12] [--gpus 64] [--profile]

Starts bench/scrape_targets.py (N vLLM-sized prometheus_client servers on 127.0.0.1), then scrapes
every target `--rounds` times, one after another, with gpuwatch's own `Target` and `HttpFetcher`, and
measures each step's CPU time (`time.thread_time`): the fetch (HTTP and gzip), and the rest of
`Target.scrape` (parse, labels, staleness). The batches go to a real store in a temporary directory
whose clock (FakeClock) moves 5 s a round, so flushes happen when called: the CPU of each flush and of
one compaction of ~1 M head rows (the round's batches repeated, as `gpuwatch serve` reaches
`compact_rows` every two minutes) is measured the same way. Last, `GpuCollector.collect()` for
--gpus simulated GPUs. `--profile` prints cProfile's top functions for the scrapes and the compaction.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scrape_targets import running_targets  # noqa: E402
from gpuwatch.collect.fetch import FetchResult, HttpFetcher  # noqa: E402
from gpuwatch.collect.scrape import Target  # noqa: E402
from gpuwatch.collect.scrapeconfig import ScrapeConfig, StaticGroup  # noqa: E402
from gpuwatch.collect.targetspec import target_specs  # noqa: E402
from gpuwatch.core.clock import FakeClock, SystemClock  # noqa: E402
from gpuwatch.core.model import Batch  # noqa: E402
from gpuwatch.store.core import Store  # noqa: E402


def ms(seconds: float) -> str:
    return f"{1000 * seconds:.2f} ms"


def top(prof: cProfile.Profile, n: int = 25) -> None:
    pstats.Stats(prof).sort_stats("tottime").print_stats(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--compact-rows", type=int, default=1_000_000)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()

    with running_targets(args.targets) as ports:
        group = StaticGroup(tuple(f"127.0.0.1:{p}" for p in ports))
        specs = target_specs(ScrapeConfig(job_name="bench", static_configs=(group,)), (group,), 5.0)
        fetcher = HttpFetcher(SystemClock())
        clock = FakeClock()
        bodies: dict[object, FetchResult] = {}

        def fetch(spec, timeout_s):  # type: ignore[no-untyped-def]
            t0 = time.thread_time()
            result = fetcher(spec, timeout_s)
            fetch_cpu.append(time.thread_time() - t0)
            bodies[spec] = result
            return result

        targets = [Target(s, fetch, clock) for s in specs]
        with tempfile.TemporaryDirectory() as tmp:
            store = Store.open(Path(tmp) / "data", clock=clock, flush_interval_s=3600, compact_interval_s=1e9,
                               compact_rows=10**12)  # fmt: skip
            fetch_cpu: list[float] = []
            scrape_cpu: list[float] = []
            flush_cpu: list[float] = []
            prof = cProfile.Profile() if args.profile else None
            last_round: list[Batch] = []
            for r in range(args.rounds):
                last_round = []
                for t in targets:
                    if prof is not None and r >= 2:
                        prof.enable()
                    t0 = time.thread_time()
                    batches = t.scrape()
                    scrape_cpu.append(time.thread_time() - t0)
                    if prof is not None:
                        prof.disable()
                    for b in batches:
                        store.append(b)
                    last_round.extend(batches)
                    time.sleep(0.05)  # let the targets' server thread breathe; not measured
                clock.advance(5.0)
                t0 = time.process_time()
                store.flush()
                flush_cpu.append(time.process_time() - t0)
            warm = args.targets * 2
            fetches = fetch_cpu[warm:]
            rest = [s - f for s, f in zip(scrape_cpu[warm:], fetches, strict=True)]
            samples = sum(len(b.samples) for b in last_round) / args.targets
            print(
                f"targets={args.targets}, rounds={args.rounds} (first 2 not counted), {samples:.0f} samples/scrape"
            )
            print(f"scrape CPU median: fetch {ms(statistics.median(fetches))}, parse+labels+staleness "
                  f"{ms(statistics.median(rest))}, total {ms(statistics.median(scrape_cpu[warm:]))}")  # fmt: skip
            print(
                f"flush of one round ({args.targets} targets) median {ms(statistics.median(flush_cpu[2:]))} (process CPU)"
            )
            if prof is not None:
                top(prof)
            # Fill the head to --compact-rows with the last round's batches, then compact once.
            per_round = sum(len(b.samples) for b in last_round)
            while store._writer is not None and store._writer._head_rows < args.compact_rows:
                clock.advance(5.0)
                for b in last_round:
                    store.append(
                        Batch(b.timestamp_ms + (clock.now_ms() - last_round[0].timestamp_ms), b.samples)
                    )
                store.flush()
            head = store._writer._head_rows if store._writer is not None else 0
            t0 = time.process_time()
            prof = cProfile.Profile() if args.profile else None
            writer = store._writer
            if prof is not None and writer is not None:
                inner = writer.compact

                def profiled() -> None:  # runs on the writer thread
                    prof.runcall(inner)

                writer.compact = profiled  # type: ignore[method-assign]
            store.compact()
            print(f"compaction of {head} head rows ({per_round} samples a round): "
                  f"{ms(time.process_time() - t0)} (process CPU)")  # fmt: skip
            if prof is not None:
                top(prof)
            store.close()
    _sampler(args.gpus)


def _sampler(gpus: int) -> None:
    """CPU of `GpuCollector.collect()` for `gpus` simulated GPUs, one tick a simulated second."""
    from gpuwatch.collect.nvml import GpuCollector
    from gpuwatch.demo.nvml import FakeNvml

    clock = FakeClock()
    collector = GpuCollector(FakeNvml(gpu_count=gpus, clock=clock, seed=1), hostname="bench")
    collector.open()
    try:
        cpu, n = [], 0
        for _ in range(40):
            clock.advance(1.0)
            t0 = time.thread_time()
            n = len(collector.collect(clock.now_ms()).samples)
            cpu.append(time.thread_time() - t0)
        print(
            f"GpuCollector.collect, {gpus} simulated GPUs ({n} samples): median {ms(statistics.median(cpu[5:]))}"
        )
    finally:
        collector.close()


if __name__ == "__main__":
    main()
