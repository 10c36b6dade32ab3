"""Benchmark `Silences.muted_by`, which the notifier calls for every alert in every round.

Run on demand (not a test):  python bench/bench_silences.py [--silences 50] [--alerts 1000] [--repeat 7]

Silences: a realistic mix, a third `alertname="..."` equality, a third `alertname` plus a `gpu=~"[0-3]"`
regex, a third `Hostname=~"node-(1|2)"` plus `severity!="critical"`; as many again already expired
(so they cost a time check only). Alerts: label sets of 8 labels like the built-in GPU rules'.
Reported: the time for one call (best and median round of `--alerts` calls) and the matches found.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatch.core.clock import FakeClock  # noqa: E402
from gpuwatch.notify.matchers import parse_matcher  # noqa: E402
from gpuwatch.notify.silences import Silence, Silences  # noqa: E402
from gpuwatch.store import Store  # noqa: E402

NAMES = ["GPUTemperatureHigh", "GPUMemoryHigh", "GPUUtilizationLow", "GPUECCError", "TrainingStalled"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--silences", type=int, default=50)
    p.add_argument("--alerts", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    clock = FakeClock(1_800_000_000)
    with Store.open(None, clock=clock) as store:
        sils = Silences(store, clock)
        now = clock.now_ms()
        for i in range(2 * args.silences):
            kind = i % 3
            texts = [
                [f"alertname={NAMES[i % len(NAMES)]}"],
                [f"alertname={NAMES[i % len(NAMES)]}", 'gpu=~"[0-3]"'],
                [f'Hostname=~"node-({i % 7}|{i % 5})"', 'severity!="critical"'],
            ][kind]
            end = now + 3600_000 if i < args.silences else now + 60_000  # the second half expires
            sils.set(Silence("", tuple(parse_matcher(t) for t in texts), now, end, "bench", "bench"))
        clock.advance(120)
        now = clock.now_ms()
        alerts = [
            {
                "alertname": NAMES[i % len(NAMES)],
                "gpu": str(i % 8),
                "Hostname": f"node-{i % 16}",
                "UUID": f"GPU-{i:08x}-0000-0000-0000-000000000000",
                "modelName": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": f"00000000:{i % 256:02X}:00.0",
                "severity": "critical" if i % 4 == 0 else "warning",
                "instance": f"node-{i % 16}:9842",
            }
            for i in range(args.alerts)
        ]
        rounds = []
        matched = 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            matched = sum(1 for a in alerts if sils.muted_by(a, now))
            rounds.append((time.perf_counter() - t0) / len(alerts))
    print(f"python {platform.python_version()}, {args.silences} active + {args.silences} expired silences")
    print(f"{args.alerts} alerts a round, {matched} muted")
    print(
        f"muted_by: best {min(rounds) * 1e6:.1f} us, median {statistics.median(rounds) * 1e6:.1f} us a call"
    )


if __name__ == "__main__":
    main()
