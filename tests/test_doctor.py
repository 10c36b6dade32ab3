"""`gpuwatch doctor`: on the simulated NVML, and on each scenario of the mock driver library through
the real nvidia-ml-py; its pure parts (the per-call summary, the container checks) on plain data."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuwatch.cli.doctor_calls import PER_GPU_CALLS, Outcome, summarize
from gpuwatch.cli.doctor_env import ContainerFacts, container_checks, read_container_facts
from tests.bindings import binding_dirs as all_bindings
from tests.conftest import GPUWATCH, ROOT, clean_env
from tests.nvmlmock import run
from tests.nvmlmock.fixtures import binding, binding_dirs, mock_lib

__all__ = ["binding_dirs", "mock_lib"]  # fixtures, used by name

DOCTOR = """
import contextlib, io, json
from tests.nvmlmock.control import MockDriver
from gpuwatch.cli.main import main
mock = MockDriver()
{setup}
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = main(["doctor", "--json", "--seconds", "0.5"])
print(json.dumps({{"rc": rc, "report": json.loads(buf.getvalue())}}))
"""


def doctor(libs: dict[str, Path], scenario: str, folder: Path | None, setup: str = "", variant: str = "current") -> tuple[int, dict[str, Any]]:  # fmt: skip
    got = run(DOCTOR.format(setup=setup), lib_dir=libs[variant], scenario=scenario, binding_dir=folder)
    return got["rc"], {c["name"]: c for c in got["report"]["checks"]}


def test_doctor_on_the_demo() -> None:
    proc = subprocess.run(
        [*GPUWATCH, "doctor", "--demo", "--seconds", "0.5"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(),
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:2] == ["ok", "binding"] and "simulated NVML" in lines[0]
    assert all(re.match(r"(ok|skip|warn|fail) +\S", line) for line in lines), proc.stdout
    assert not any(line.startswith("fail") for line in lines)
    assert any(line.startswith("ok    gpus") and "8 found" in line for line in lines)


@pytest.mark.parametrize("which", ["installed", "floor"])
def test_doctor_on_a_healthy_box(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    rc, checks = doctor(mock_lib, "healthy", binding(binding_dirs, which))
    assert rc == 0
    assert checks["gpus"]["status"] == "ok" and checks["gpus"]["detail"] == "8 found: NVIDIA H200"
    assert checks["driver"]["detail"] == "driver 570.133.20, CUDA 12.8, NVML 12.570.133.20"
    assert checks["nvmlDeviceGetFanSpeed"]["status"] == "skip"
    assert checks["nvmlDeviceGetPowerUsage"]["detail"] == "ok on 8/8 GPU(s)"
    for name in ("sampling", "memory", "energy", "gpm", "xid events"):
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["processes"]["data"]["pids"] == [4242, 4343, 4545]
    assert "24 bytes" in checks["processes"]["detail"]
    assert checks["nvidia-smi"]["status"] == "skip"


def test_doctor_on_a_consumer_card(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    """Unknown from the fan and the power limit is a warning, not a failure; no GPM there."""
    rc, checks = doctor(mock_lib, "consumer", binding(binding_dirs, "installed"))
    assert rc == 0
    for name in ("nvmlDeviceGetFanSpeed", "nvmlDeviceGetEnforcedPowerLimit"):
        assert checks[name]["status"] == "warn" and "NVMLError_Unknown" in checks[name]["detail"]
    assert checks["gpm"]["status"] == "skip" and checks["sampling"]["status"] == "ok"


def test_doctor_on_a_lost_gpu(mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]) -> None:
    rc, checks = doctor(mock_lib, "lost", binding(binding_dirs, "installed"), setup="mock.set_lost(1, True)")
    assert rc == 1
    assert checks["sampling"]["status"] == "fail" and "lost: GPU 1" in checks["sampling"]["detail"]


def test_doctor_on_a_gpu_it_may_not_open(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    rc, checks = doctor(mock_lib, "noperm", binding(binding_dirs, "installed"))
    assert rc == 1
    assert (
        checks["gpus"]["status"] == "fail"
        and "GPU 1 cannot be opened (NVMLError_NoPermission" in checks["gpus"]["detail"]
    )
    assert checks["nvmlDeviceGetPowerUsage"]["detail"] == "ok on 1/1 GPU(s) (120000)"


def test_doctor_on_a_mig_gpu(mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]) -> None:
    rc, checks = doctor(mock_lib, "mig", binding(binding_dirs, "installed"))
    assert rc == 0
    assert (
        checks["mig"]["detail"]
        == "GPU 0: GI 1 3g.40gb: 2 compute instance(s), GI 2 3g.40gb: 1 compute instance(s)"
    )
    assert checks["processes"]["data"]["pids"] == [5001, 5002, 5003]
    # the parent's list says NoPermission; gpuwatch reads each compute instance's instead
    assert checks["nvmlDeviceGetComputeRunningProcesses"]["status"] == "skip"


@pytest.mark.parametrize("which", ["installed", "floor"])
def test_doctor_on_a_535_54_driver(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    rc, checks = doctor(mock_lib, "r535_54", binding(binding_dirs, which), variant="r535_54")
    assert rc == 0
    assert checks["processes"]["data"]["pids"] == [100, 200, 300]
    assert "32 bytes a process" in checks["processes"]["detail"]


def test_doctor_where_a_profiler_holds_gpm(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    rc, checks = doctor(mock_lib, "gpm_off", binding(binding_dirs, "installed"))
    assert rc == 0 and checks["gpm"]["status"] == "skip"
    assert checks["nvmlGpmQueryDeviceSupport"]["status"] == "ok"


def test_doctor_names_the_fix_for_the_old_pynvml_package(tmp_path: Path) -> None:
    old = dict(all_bindings()).get("pynvml11")
    if old is None:
        pytest.skip("TEST_PYNVML11 is not set (pip install --target DIR pynvml==11.5.3)")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuwatch.cli.main", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(PYTHONPATH=f"{old}:{ROOT}"),
        cwd=tmp_path,
    )
    assert proc.returncode == 1, proc.stderr
    first = json.loads(proc.stdout)["checks"][0]
    assert first["status"] == "fail" and "pip uninstall pynvml" in first["detail"]


def test_doctor_tries_every_per_gpu_call_the_collector_makes() -> None:
    collect = ROOT / "gpuwatch" / "collect"
    used = set()
    for path in collect.glob("*.py"):
        used |= set(re.findall(r"\bnvml\.(nvmlDevice\w+|nvmlGpmQueryDeviceSupport)", path.read_text()))
    # asked of MIG devices, events and the event data, not of a GPU handle
    used -= {
        "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetGpuInstanceId",
        "nvmlDeviceGetComputeInstanceId", "nvmlDeviceRegisterEvents", "nvmlDeviceGetIndex",
        "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetFieldValues", "nvmlDeviceGetCount",
    }  # fmt: skip
    tried = {needs for _, needs, _ in PER_GPU_CALLS} | {name for name, _, _ in PER_GPU_CALLS}
    assert used - tried == set()


def test_a_call_summary_names_each_outcome_and_its_gpus() -> None:
    assert summarize([Outcome(0, "ok", "1"), Outcome(1, "ok", "2")]) == ("ok", "ok on 2/2 GPU(s)")
    assert summarize([Outcome(0, "unsupported", "x")]) == ("skip", "not supported on 1/1")
    status, detail = summarize(
        [
            Outcome(0, "error", "NVMLError_Unknown: Unknown Error"),
            Outcome(1, "ok", "5"),
            Outcome(2, "lost", "gone"),
        ]
    )
    assert status == "fail"
    assert detail == "ok on GPU 1; error on GPU 0 (NVMLError_Unknown: Unknown Error); lost on GPU 2 (gone)"


def test_container_checks_say_what_is_missing(tmp_path: Path) -> None:
    bare = ContainerFacts(in_container=True, nvidia_devices=(), pid1_name="tini")
    no_gpu = container_checks(bare, gpus_found=False, processes=[], proc_root=Path("/proc"))
    assert [(c.status, c.name) for c in no_gpu] == [("fail", "container --gpus")]
    assert "--gpus all" in no_gpu[0].detail
    (tmp_path / "42").mkdir()
    checks = container_checks(bare, gpus_found=True, processes=["42", "43"], proc_root=tmp_path)
    assert (
        checks[1].status == "warn"
        and "1 of 2 GPU processes" in checks[1].detail
        and "--pid=host" in checks[1].detail
    )
    host = container_checks(bare, gpus_found=True, processes=["42"], proc_root=tmp_path)
    assert host[1].status == "ok" and str(tmp_path) in host[1].detail
    quiet = container_checks(bare, gpus_found=True, processes=[], proc_root=Path("/proc"))
    assert quiet[1].status == "skip" and "pid 1 here is tini" in quiet[1].detail
    outside = ContainerFacts(in_container=False, nvidia_devices=(), pid1_name="systemd")
    assert [
        c.status for c in container_checks(outside, gpus_found=True, processes=[], proc_root=Path("/proc"))
    ] == ["ok"]


def test_container_facts_from_a_file_system(tmp_path: Path) -> None:
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/cgroup").write_text("0::/kubepods/besteffort/pod1/abc\n")
    (tmp_path / "proc/1/comm").write_text("gpuwatch\n")
    (tmp_path / "dev").mkdir()
    for name in ("nvidia0", "nvidiactl", "null"):
        (tmp_path / "dev" / name).write_text("")
    facts = read_container_facts(tmp_path)
    assert facts == ContainerFacts(True, ("nvidia0", "nvidiactl"), "gpuwatch")
    assert read_container_facts(tmp_path / "nothing") == ContainerFacts(False, (), "")


def test_doctor_on_an_h100_in_mig_mode(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    """GPM is read per GPU instance under MIG; the doctor counts those."""
    rc, checks = doctor(mock_lib, "mig_h100", binding(binding_dirs, "installed"))
    assert rc == 0
    assert checks["gpm"]["status"] == "ok" and "on 2 GPU(s) or instance(s)" in checks["gpm"]["detail"]
    assert checks["mig"]["detail"].startswith("GPU 0: GI 1 3g.40gb: 2 compute instance(s)")
