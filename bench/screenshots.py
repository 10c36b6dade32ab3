"""Save a screenshot of each dashboard page, light and dark, to docs/screenshots/ (1280x800 PNG).

    .venv/bin/python bench/screenshots.py [--out docs/screenshots] [--warmup 300]

Starts `gpuwatch serve --demo` on a new data directory, as a newcomer does: it imports its week of
history (demo/history.py), then runs `--warmup` seconds live (the simulated vLLM and SGLang servers have
no history: their pages show the last minutes), then each page is shown in Debian's Chromium
(/usr/bin/chromium) over the range `pages` gives it. The store holds the demo's data only, so every page
shows what `--demo` shows (its healthy lab with scheduled incidents), not benchmark data. Pages that
answer 404 (not built yet) are skipped.
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

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]  # fmt: skip
HOST = "gpu-demo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pages(live_s: float) -> list[tuple[str, str]]:
    def r(span: str) -> str:
        return f"from=now-{span}&to=now&refresh=off"

    live = r(f"{max(1, int(live_s // 60))}m")  # what the simulated servers have: the minutes since the start
    return [
        ("cluster", f"/?{r('24h')}"),
        ("gpu", f"/gpus/{quote(HOST)}/0?{r('6h')}"),
        ("usage", f"/usage?{r('7d')}"),
        ("explore", f"/explore?expr={quote('avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)')}&{r('7d')}"),
        ("timeline", f"/timeline?{r('6h')}"),
        ("training", f"/training?{r('24h')}"),
        # its last 6 hours: its week has 1,500 checkpoints and restarts every 18 hours
        ("training-run", f"/training/demo-llama-7b-sft?{r('6h')}"),
        ("inference", f"/inference?{live}"),
        ("inference-service", f"/inference/demo-vllm?{live}"),
        ("alerts", f"/alerts?{r('24h')}"),
        ("targets", f"/targets?{r('1h')}"),
        ("logs", f"/logs?{live}"),
    ]


SETTLED = """() => {
  const ps = Array.from(document.querySelectorAll('[data-panel]'));
  return ps.every(p => p.dataset.state && p.dataset.state !== 'loading');
}"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "docs" / "screenshots"))
    # 5 minutes: the simulated servers' charts (no history) have some minutes to show
    ap.add_argument("--warmup", type=float, default=300.0, help="seconds the live demo runs before the shots")
    ap.add_argument("--only", nargs="+", metavar="PAGE", help="these pages only (names as the files')")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix=f"gpuwatch-shots-{os.getpid()}-") as tmp:
        data = Path(tmp) / "data"
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
        started = time.monotonic()
        try:
            for _ in range(240):  # the week's import comes first
                try:
                    if requests.get(base + "/-/health", timeout=2).ok:
                        break
                except requests.ConnectionError:
                    pass
                time.sleep(0.5)
            print(f"serving after {time.monotonic() - started:.0f} s; live for {args.warmup:.0f} s")
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
                    for name, path in pages(time.monotonic() - started):
                        if args.only and name not in args.only:
                            continue
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
