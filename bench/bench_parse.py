"""Benchmark the exposition parser against prometheus_client's on a 5,000-line vLLM-style page.

Run on demand (not a test):  python bench/bench_parse.py [--repeat 15]

The page is rendered by the real prometheus_client from a vLLM V1-shaped registry (tests/data/vllm_like.py):
4 models x 4 engines, gauges, counters and 14 labelled histograms. Reported: best and median of
`--repeat` runs, for gpuwatch.promtext.parser.parse (fresh caches every run: the cold, first-scrape case),
a reused Parser (the steady scrape case), the OpenMetrics rendering of the same registry, and
prometheus_client.parser.text_string_to_metric_families (fully consumed).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "data"))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from vllm_like import vllm_page  # noqa: E402

from gpuwatch.promtext.parser import Parser, parse  # noqa: E402


def _times(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()  # warm imports and regex compilation
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()

    text = vllm_page()
    om = vllm_page(openmetrics=True)
    lines = text.count(b"\n")
    result = parse(text)
    assert not result.errors
    print(
        f"page: {lines} lines, {len(result.samples)} samples, {len(text) / 1000:.0f} KB; "
        f"Python {platform.python_version()}, prometheus_client {importlib.metadata.version('prometheus_client')}"
    )
    decoded = text.decode()
    warm = Parser()
    cases: list[tuple[str, Callable[[], object]]] = [
        ("gpuwatch parse (cold)", lambda: parse(text)),
        ("gpuwatch Parser (reused)", lambda: warm.parse(text)),
        ("gpuwatch parse OpenMetrics (cold)", lambda: parse(om)),
        ("prometheus_client text parser", lambda: [f for f in text_string_to_metric_families(decoded)]),
    ]
    print(f"{'parser':<36} {'best ms':>8} {'median ms':>10} {'lines/s':>12}")
    for name, fn in cases:
        ts = _times(fn, args.repeat if "prometheus" not in name else max(3, args.repeat // 3))
        best, med = min(ts), statistics.median(ts)
        print(f"{name:<36} {best * 1000:8.2f} {med * 1000:10.2f} {lines / best:12,.0f}")


if __name__ == "__main__":
    main()
