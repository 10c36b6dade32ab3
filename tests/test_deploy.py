"""A deployed gpuwatch: GPUs expected but absent, container host names, the host's /proc, the health probe."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.cli.deploy import check_health, health_url, hostname_warning, in_container, unwritable_data_dir
from gpuwatch.cli.main import main
from gpuwatch.collect.processes import read_process_info
from gpuwatch.core.clock import FakeClock
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.web import create_app
from tests.conftest import free_port


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
