"""A deployed gpuwatch: GPUs expected but absent, container host names, the host's /proc, the health probe,
and install.sh's lab: a hub that hands its nodes a token, nodes that push to it by remote write."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.cli.deploy import check_health, health_url, hostname_warning, in_container, unwritable_data_dir
from gpuwatch.cli.main import main
from gpuwatch.collect.processes import read_process_info
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.credentials import AccessFile
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.web import create_app
from tests.conftest import ROOT, Server, clean_env, free_port, wait_until
from tests.test_shipping import _tree, _written


@pytest.fixture
def no_gpu_runtime(tmp_path: Path, clock: FakeClock) -> Iterator[Runtime]:
    """A runtime meant for GPUs (the Docker image's GPUWATCH_EXPECT_GPUS=1) on a machine without any."""
    settings = load(None, {"GPUWATCH_EXPECT_GPUS": "1"}, {"data_dir": str(tmp_path / "data")})
    rt = build_runtime(settings, "node-1", clock=clock, nvml=FakeNvml.no_driver())
    yield rt
    rt.close()


def test_expected_gpus_missing_is_degraded_with_the_docker_hint(no_gpu_runtime: Runtime) -> None:
    resp = create_app(no_gpu_runtime).test_client().get("/-/health")
    assert resp.status_code == 503
    body = resp.get_json()
    assert body["status"] == "degraded" and body["gpus"] == 0
    assert "`--gpus all`" in body["problem"] and "NVIDIA Container Toolkit" in body["problem"]
    assert "--demo" not in body["problem"], "a GPU container must not suggest simulated GPUs"


def test_without_expect_gpus_no_gpu_stays_healthy(tmp_path: Path, clock: FakeClock) -> None:
    settings = load(None, {}, {"data_dir": str(tmp_path / "data")})
    rt = build_runtime(settings, "node-1", clock=clock, nvml=FakeNvml.no_driver())
    try:
        resp = create_app(rt).test_client().get("/-/health")
        assert resp.status_code == 200 and "gpuwatch serve --demo" in resp.get_json()["gpu_problem"]
    finally:
        rt.close()


def test_proc_root_setting_reaches_the_collectors(tmp_path: Path, clock: FakeClock) -> None:
    host_proc = tmp_path / "host-proc"  # as `-v /proc:/host/proc:ro` shows the host's processes
    nvml = FakeNvml(gpu_count=2, clock=clock, blocking_event_wait=False)
    nvml.write_proc_root(host_proc)
    (host_proc / "meminfo").write_text("MemTotal:       1024 kB\nMemAvailable:    512 kB\n")
    settings = load(None, {"GPUWATCH_PROC_ROOT": str(host_proc)}, {"data_dir": str(tmp_path / "data")})
    assert settings.proc_root == host_proc
    rt = build_runtime(settings, "node-1", clock=clock, nvml=nvml)
    try:
        assert rt.gpu is not None and rt.host is not None
        procs = [p for s in rt.gpu.snapshot() for p in s.processes]
        expected = {p.pid: read_process_info(host_proc, p.pid) for p in procs}
        assert procs and any(info.container_id for info in expected.values())
        assert [(p.user, p.container_id) for p in procs] == [
            (expected[p.pid].user, expected[p.pid].container_id) for p in procs
        ]
        mem = {s.name: s.value for s in rt.host.collect(clock.now_ms()).samples}
        assert mem["node_memory_MemTotal_bytes"] == 1024 * 1024
    finally:
        rt.close()


def test_container_detection(tmp_path: Path) -> None:
    assert not in_container(tmp_path)
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-2.scope\n")
    assert not in_container(tmp_path)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/system.slice/docker-" + "a" * 64 + ".scope\n")
    assert in_container(tmp_path)
    podman = tmp_path / "podman"
    (podman / "run").mkdir(parents=True)
    (podman / "run" / ".containerenv").write_text("")
    assert in_container(podman)
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / ".dockerenv").write_text("")
    assert in_container(docker)


def test_hostname_warning_only_for_a_container_id_host_name() -> None:
    warning = hostname_warning("", "3f2a9c1b7d4e", container=True)
    assert warning is not None and '--hostname "$(hostname)"' in warning and "3f2a9c1b7d4e" in warning
    assert hostname_warning("gpu-node-1", "3f2a9c1b7d4e", container=True) is None  # `hostname:` is set
    assert hostname_warning("", "gpu-node-1", container=True) is None
    assert hostname_warning("", "3f2a9c1b7d4e", container=False) is None  # a host that is named so


def test_unwritable_data_dir_is_one_line_with_the_fix(tmp_path: Path) -> None:
    assert unwritable_data_dir(tmp_path / "new" / "data") is None and (tmp_path / "new" / "data").is_dir()
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = unwritable_data_dir(blocker / "data")  # its parent is a file: mkdir fails for root too
    assert line is not None and line.startswith(f"cannot write the data directory {blocker / 'data'} (uid ")
    assert f"fix: mkdir -p {blocker / 'data'} && chown " in line and "--data-dir" in line


def test_health_url_and_check(tmp_path: Path) -> None:
    assert health_url(load(None, {}, {"port": "9000"})) == "http://127.0.0.1:9000/-/health"
    assert health_url(load(None, {}, {"host": "::"})) == "http://[::1]:9842/-/health"
    assert health_url(load(None, {}, {"host": "10.0.0.5"})) == "http://10.0.0.5:9842/-/health"
    url = f"http://127.0.0.1:{free_port()}/-/health"
    healthy, line = check_health(url, timeout_s=2)
    assert not healthy and line.startswith(f"no answer from {url}")


def test_health_command_exit_codes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["health", "--url", f"http://127.0.0.1:{free_port()}/-/health"]) == 1
    assert capsys.readouterr().err.startswith("gpuwatch: no answer from ")
    bad = tmp_path / "bad.yml"
    bad.write_text("port: nope\n")
    assert main(["health", "--config", str(bad)]) == 1  # Docker reserves exit 2 in a HEALTHCHECK
    assert "config error" in capsys.readouterr().err


def test_serve_refuses_a_data_dir_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["serve", "--data-dir", str(blocker / "data"), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"gpuwatch: cannot write the data directory {blocker / 'data'}"
    )
    assert "internal error" not in err


# -- install.sh's lab -------------------------------------------------------------------------------


def _install(*args: str, script: Path = ROOT / "install.sh") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
        stdin=subprocess.DEVNULL,
    )


def _prefix(root: Path) -> Path:
    """A prefix whose venv install.sh keeps: its pip upgrade is a no-op, its gpuwatch this checkout's
    (so `gpuwatch token` runs for real, without building or installing anything)."""
    bin_dir = root / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "gpuwatch").write_text(
        f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m gpuwatch.cli.main "$@"\n'
    )
    for program in bin_dir.iterdir():
        program.chmod(0o755)
    return root


def _hub(tmp_path: Path, port: int) -> tuple[Path, str, str]:
    """Install a pushed-to hub; return its prefix, the node command it printed last, and the token."""
    hub = _prefix(tmp_path / "hub")
    args = ["--yes", "--no-service", "--prefix", str(hub), "--data-dir", str(tmp_path / "hub-data")]
    proc = _install(*args, "--host", "127.0.0.1", "--port", str(port), "--hub")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    command = proc.stdout.splitlines()[-1]
    found = re.fullmatch(
        rf"\./install\.sh --node http://127\.0\.0\.1:{port} --hub-token (gwt_[\w-]+)", command
    )
    assert found is not None, proc.stdout
    return hub, command, found.group(1)


def test_install_sh_hub_prints_the_node_command_with_one_token(tmp_path: Path) -> None:
    hub, command, token = _hub(tmp_path, 9900)
    made = AccessFile(tmp_path / "hub-data").check_token(token)
    assert made is not None and (made.name, made.role) == ("nodes", "machine")
    kept = hub / "nodes-token"
    assert kept.read_text() == token + "\n" and kept.stat().st_mode & 0o777 == 0o600
    # Again: the same token, still one 'nodes', the same files.
    before = _tree(tmp_path)
    again = _install("--yes", "--no-service", "--prefix", str(hub), "--hub")
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == command, again.stdout + again.stderr
    assert "Reusing the machine token 'nodes'" in again.stdout
    assert [t.name for t in AccessFile(tmp_path / "hub-data").tokens()] == ["nodes"]
    assert _tree(tmp_path) == before
    # A 'nodes' token whose secret is not kept: no new token, the way to make one.
    kept.unlink()
    lost = _install("--yes", "--no-service", "--prefix", str(hub), "--hub")
    assert lost.returncode == 0, lost.stderr
    assert "token revoke nodes" in lost.stdout and lost.stdout.splitlines()[-1].endswith(
        "--hub-token <TOKEN>"
    )
    assert len(AccessFile(tmp_path / "hub-data").tokens()) == 1

    dry = _install("--dry-run", "--no-service", "--prefix", str(tmp_path / "new"), "--hub")
    assert dry.returncode == 0, dry.stderr
    hostname = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
    assert "token create nodes --role machine" in dry.stdout
    assert dry.stdout.splitlines()[-2:] == [
        f"./install.sh --node http://{hostname}:9842 --hub-token <the token made above>",
        "Dry run: nothing was changed.",
    ]
    assert "scrape_configs" not in _written(dry.stdout, "gpuwatch.yml")  # the nodes push
    assert not (tmp_path / "new").exists()


def test_install_sh_node_pushes_to_the_hub_once(tmp_path: Path) -> None:
    _, _, token = _hub(tmp_path, 9900)
    token_file = tmp_path / "given-token"
    token_file.write_text(token + "\n")
    node = _prefix(tmp_path / "node")
    args = ["--yes", "--no-service", "--prefix", str(node), "--data-dir", str(tmp_path / "node-data")]
    first = _install(*args, "--node", "http://127.0.0.1:9900/", "--hub-token-file", str(token_file))
    assert first.returncode == 0, first.stdout + first.stderr
    assert "sends every sample it stores to the hub" in first.stdout
    assert "token create hub" not in first.stdout and "scrape_configs" not in first.stdout  # no pull
    saved = node / "hub-token"
    assert saved.read_text() == token + "\n" and saved.stat().st_mode & 0o777 == 0o600
    (dest,) = load(node / "gpuwatch.yml").remote_write
    assert (dest.url, dest.name) == ("http://127.0.0.1:9900/api/v1/write", "hub")
    assert dest.auth is not None and (dest.auth.kind, dest.auth.secret_file) == ("Bearer", str(saved))

    installed = _tree(node)
    again = _install(*args, "--node", "http://127.0.0.1:9900", "--hub-token", token)
    assert again.returncode == 0 and "sends to the hub already" in again.stdout, again.stdout + again.stderr
    assert _tree(node) == installed, "a second run changed the node's files"
    assert (node / "gpuwatch.yml").read_text().count("/api/v1/write") == 1

    # A gpuwatch.yml without the block (and without a last newline) gets it appended; one that has a
    # remote_write block of its own is left alone, and the entry to add is printed.
    (node / "gpuwatch.yml").write_text(f"data_dir: '{tmp_path / 'node-data'}'\nport: 9843")
    appended = _install(*args, "--node", "http://127.0.0.1:9900", "--hub-token", token)
    assert appended.returncode == 0, appended.stderr
    settings = load(node / "gpuwatch.yml")
    assert settings.port == 9843 and [d.url for d in settings.remote_write] == [dest.url]
    assert settings.remote_write[0].queue.live_first  # a hub takes older samples: new ones go first
    own = "remote_write:\n  - url: http://victoria:8428/api/v1/write\n"
    (node / "gpuwatch.yml").write_text(own)
    kept = _install(*args, "--node", "http://127.0.0.1:9900", "--hub-token", token)
    assert kept.returncode == 0 and (node / "gpuwatch.yml").read_text() == own, kept.stderr
    entry = kept.stdout.split("add this entry to it, then restart gpuwatch:\n", 1)[1]
    assert entry.startswith(
        "  - url: http://127.0.0.1:9900/api/v1/write\n    name: hub\n"
        f"    authorization: {{credentials_file: {saved}}}\n"
    )
    assert token not in first.stdout + again.stdout + kept.stdout, "the token is printed"


def test_install_sh_node_dry_run_help_and_the_service_user(tmp_path: Path) -> None:
    before = _tree(tmp_path)
    node = ["--node", "http://hub:9842", "--hub-token", "gwt_abc"]
    dry = _install("--dry-run", "--no-service", "--prefix", str(tmp_path / "p"), *node)
    assert dry.returncode == 0, dry.stderr
    config = _written(dry.stdout, "gpuwatch.yml")
    assert "remote_write:" in config and "  - url: http://hub:9842/api/v1/write\n" in config
    assert f"+ write {tmp_path}/p/hub-token (mode 0600)" in dry.stdout and "gwt_abc" not in dry.stdout
    assert _tree(tmp_path) == before
    # Without a token: how to get one from the hub, and the pull alternative after it.
    pull = _install("--dry-run", "--no-service", "--prefix", str(tmp_path / "p"), "--node", "http://hub:9842")
    assert pull.returncode == 0, pull.stderr
    push_at = pull.stdout.index("  ./install.sh --node http://hub:9842 --hub-token TOKEN\n")
    assert "./install.sh --hub prints the command" in pull.stdout
    assert push_at < pull.stdout.index("Or have the hub pull from this node") < pull.stdout.index("/federate")
    usage = _install("--help").stdout
    assert "--hub-token TOKEN" in usage and "--hub-token-file FILE" in usage and "  --hub  " in usage
    # Where systemd runs, the token file is the service user's (a copy of install.sh that sees a fake
    # /run/systemd/system, as in tests/test_shipping.py).
    fake_systemd = tmp_path / "run-systemd-system"
    fake_systemd.mkdir()
    script = tmp_path / "checkout" / "install.sh"
    script.parent.mkdir()
    script.write_text((ROOT / "install.sh").read_text().replace("/run/systemd/system", str(fake_systemd)))
    (script.parent / "pyproject.toml").write_text("")
    proc = _install("--dry-run", "--prefix", str(tmp_path / "opt"), *node, script=script)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    chown = lines.index(f"+ chown gpuwatch: {tmp_path}/opt/hub-token")
    useradd = next(i for i, line in enumerate(lines) if line.startswith("+ useradd "))
    assert useradd < chown < lines.index("+ systemctl restart gpuwatch")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--hub-token", "gwt_x"], "--hub-token and --hub-token-file go with --node HUB_URL"),
        (["--hub", "--node", "http://hub:9842"], "--hub and --node exclude each other: a machine is the hub or a node"),
        (["--hub", ""], "--hub got an empty node list: give host[:port],... or nothing (the nodes push)"),
        (["--node"], "--node needs a value (see --help)"),
        (["--node", "http://hub:9842", "--hub-token"], "--hub-token needs a value (see --help)"),
        (["--node", "http://hub:9842", "--hub-token", ""], "--hub-token is empty"),
        (["--node", "hub:9842", "--hub-token", "gwt_x"], "--node needs the hub's URL (http://HOST:PORT), got 'hub:9842'"),
        (["--node", "http://", "--hub-token", "gwt_x"], "--node needs the hub's URL (http://HOST:PORT), got 'http://'"),
        (["--node", "http://hub:9842", "--hub-token", "gwt x;y"],
         "--hub-token: not a token (letters, digits and _.~+/=- only; gwt_... from ./install.sh --hub)"),
        (["--node", "http://hub:9842", "--hub-token", "gwt_x", "--hub-token-file", "/etc/hostname"],
         "--hub-token and --hub-token-file exclude each other"),
        (["--node", "http://hub:9842", "--hub-token-file", "{missing}"], "--hub-token-file: cannot read {missing}"),
        (["--node", "http://hub:9842", "--hub-token-file", "{empty}"], "--hub-token-file: {empty} holds no token"),
    ],
)  # fmt: skip
def test_install_sh_lab_argument_errors_are_one_line(tmp_path: Path, args: list[str], error: str) -> None:
    (tmp_path / "empty").write_text("\n")
    paths = {"missing": str(tmp_path / "missing"), "empty": str(tmp_path / "empty")}
    args = [a.format(**paths) for a in args]
    proc = _install("--dry-run", "--prefix", str(tmp_path / "p"), *args)
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"install.sh: {error.format(**paths)}\n")


@pytest.mark.slow
def test_install_sh_lab_a_node_pushes_with_the_printed_token(tmp_path: Path) -> None:
    """The printed command, run: the node's samples reach a hub that trusts nobody without a token."""
    port = free_port()
    _, _, token = _hub(tmp_path, port)
    node = _prefix(tmp_path / "node")
    args = ["--yes", "--no-service", "--prefix", str(node), "--data-dir", str(tmp_path / "node-data")]
    proc = _install(*args, "--node", f"http://127.0.0.1:{port}", "--hub-token", token)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_TRUST_LOOPBACK="false", GPUWATCH_HOSTNAME="hub")
    hub = Server(["--config", str(tmp_path / "hub" / "gpuwatch.yml")], tmp_path / "hub-data", port, env)
    node_env = clean_env(GPUWATCH_FLUSH_INTERVAL="0.2s", GPUWATCH_HOSTNAME="pushing-node")
    node_args = ["--demo", "--config", str(node / "gpuwatch.yml")]
    pushing = Server(node_args, tmp_path / "node-data", free_port(), node_env)
    started: list[Server] = []
    try:
        started.append(hub.start())
        assert requests.post(f"{hub.url}/api/v1/write", data=b"", timeout=10).status_code == 401
        started.append(pushing.start())

        def arrived() -> bool:
            r = hub.get("/api/v1/query", params={"query": 'count({Hostname="pushing-node"})'})
            return r.status_code == 200 and bool(r.json()["data"]["result"])

        wait_until(arrived, 60, f"nothing reached the hub; node log:\n{pushing.log}\nhub log:\n{hub.log}")
    finally:
        for server in reversed(started):
            server.stop(signal.SIGTERM)
