"""Save a screenshot of each dashboard page, light and dark, to docs/screenshots/ (1280x800 PNG).

    .venv/bin/python bench/screenshots.py [--out docs/screenshots] [--hours 6]

Records `--hours` of the demo's GPUs and simulated inference servers on a fake clock
(bench/dashboard_history.py), starts `gpuwatch serve
--demo` on that data dir, lets it run a little, then shows each page in Debian's Chromium
(/usr/bin/chromium) over the last 6 hours. The store holds the demo's data only, so every page shows
what `--demo` shows (its healthy lab with scheduled incidents), not benchmark data. Pages that answer
404 (not built yet) are skipped.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dashboard_history

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # fmt: skip
HOST = "gpu-demo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pages(hours: float) -> list[tuple[str, str]]:
    r = f"from=now-{int(hours)}h&to=now&refresh=off"
    return [
        ("cluster", f"/?{r}"),
        ("gpu", f"/gpus/{quote(HOST)}/0?{r}"),
        ("explore", f"/explore?expr={quote('avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)')}&{r}"),
        ("timeline", f"/timeline?{r}"),
        ("training", f"/training?{r}"),
        ("training-run", "/training/demo-llama-7b-sft?refresh=off"),  # the run's whole life
        ("inference", f"/inference?{r}"),
        ("inference-service", "/inference/demo-vllm?from=now-1h&to=now&refresh=off"),
        ("alerts", f"/alerts?{r}"),
        ("targets", f"/targets?{r}"),
        ("logs", f"/logs?{r}"),
    ]


SETTLED = """() => {
  const ps = Array.from(document.querySelectorAll('[data-panel]'));
  return ps.every(p => p.dataset.state && p.dataset.state !== 'loading');
}"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    ap.add_argument("--hours", type=float, default=6.0)
    # 90 s: the demo's warming-up GPU has loaded its model and left 0 % (GPUUtilizationLow pending)
    ap.add_argument("--warmup", type=float, default=90.0, help="seconds the live demo runs before the shots")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix=f"gpuwatch-shots-{os.getpid()}-") as tmp:
        data = Path(tmp) / "data"
        t0 = time.time()
        ticks = dashboard_history.record_local(data, HOST, args.hours, step_s=30.0)
        print(f"history: {ticks} ticks of 8 demo GPUs ({time.time() - t0:.0f} s)")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
        env.update(GPUWATCH_HOSTNAME=HOST, GPUWATCH_FLUSH_INTERVAL="1s", GPUWATCH_HOST_INTERVAL="5s")
        log = (Path(tmp) / "serve.log").open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuwatch.cli.main", "serve", "--demo", "--host", "127.0.0.1",
             "--port", str(port), "--data-dir", str(data)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(120):
                try:
                    if requests.get(base + "/-/health", timeout=2).ok:
                        break
                except requests.ConnectionError:
                    pass
                time.sleep(0.5)
            time.sleep(args.warmup)
            for _ in range(120):  # the inference pages need the demo's first recorded series
                found = requests.get(base + "/api/ui/inference", timeout=5).json()["data"]["services"]
                if any(x["job"] == "demo-vllm" and x["requests"] is not None for x in found):
                    break
                time.sleep(0.5)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
                for theme in ("light", "dark"):
                    ctx = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=theme)
                    page = ctx.new_page()
                    for name, path in pages(args.hours):
                        resp = page.goto(f"{base}{path}&theme={theme}")
                        if resp is None or resp.status == 404:
                            print(f"{name}: 404, skipped")
                            continue
                        page.wait_for_function(SETTLED, timeout=30_000)
                        page.wait_for_timeout(800)  # Plotly's transitions
                        target = out / f"{name}-{theme}.png"
                        page.screenshot(path=str(target))
                        print(f"{target.relative_to(ROOT) if target.is_relative_to(ROOT) else target}")
                    ctx.close()
                browser.close()
        finally:
            proc.terminate()
            proc.wait(30)
            log.close()


if __name__ == "__main__":
    main()
