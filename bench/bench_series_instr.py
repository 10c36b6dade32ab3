"""Instructions a new series costs in an import's parse and write, counted by callgrind (noise-free).

    .venv/bin/python bench/bench_series_instr.py [--series 100000 1000000]

Needs valgrind (Debian: `apt-get install valgrind`). For each N, a child builds the body of N new
series (bench_series.py's shape) and opens a store under `valgrind --tool=callgrind --instr-atstart=no`
with serve's GC settings; this process turns instrumentation on (`callgrind_control -i on`) for
`importer.prepare`, `importer.write` and a CHECKPOINT right after it, one dump each, and prints their
instructions per series. The checkpoint counts the compression that a smaller import leaves to the next
checkpoint and a big one does during its transaction (full row groups are written compressed).
A callgrind run is ~50x slower than the real one: 1,000,000 series take ~15 minutes.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("parse", "write", "checkpoint", "end")


def child(n: int, d: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.bench_series import T0_MS, body
    from gpuwatch.cli.gctune import tune_for_serving
    from gpuwatch.collect.importer import prepare, write
    from gpuwatch.core.clock import FakeClock
    from gpuwatch.store import Store

    def step(name: str) -> None:  # tell the driver, wait for its go
        (d / f"{name}.ready").touch()
        while not (d / f"{name}.go").exists():
            time.sleep(0.05)

    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp), clock=FakeClock(T0_MS / 1000), flush_interval_s=3600)
        tune_for_serving()
        text = body(n, 6)
        step("parse")
        prepared = prepare(text, now_ms=T0_MS)
        step("write")
        result = write(store, prepared)
        step("checkpoint")
        store._con.cursor().execute("CHECKPOINT")  # (bench only: what the next checkpoint would do)
        step("end")
        assert result.series == n, result
        store.close()


def measure(n: int) -> dict[str, int]:
    d = Path(tempfile.mkdtemp())
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={d}/out",
         sys.executable, __file__, "--child", str(n), str(d)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def control(*args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(proc.pid)], check=True, capture_output=True)

    for i, name in enumerate(STEPS):
        while not (d / f"{name}.ready").exists():
            if proc.poll() is not None:
                raise SystemExit(f"the child stopped before {name}")
            time.sleep(0.2)
        if i:
            control("-i", "off")
            control("-d", STEPS[i - 1])
        if name != "end":
            control("-z")
            control("-i", "on")
        (d / f"{name}.go").touch()
    proc.wait()
    counts = {}
    for f in d.glob("out.*"):
        text = f.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: dump (\w+)", text, re.M)
        totals = re.search(r"^totals: (\d+)", text, re.M)
        if trigger and totals:
            counts[trigger.group(1)] = int(totals.group(1))
    return counts


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]), Path(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--series", type=int, nargs="+", default=[100_000, 1_000_000])
    args = ap.parse_args()
    for n in args.series:
        c = measure(n)
        per = {k: v / n for k, v in c.items()}
        print(
            f"{n:>9,} new series: instructions a series: parse {per['parse']:,.0f}, write {per['write']:,.0f}, "
            f"both {per['parse'] + per['write']:,.0f}; checkpoint {per['checkpoint']:,.0f}, "
            f"all {per['parse'] + per['write'] + per['checkpoint']:,.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
