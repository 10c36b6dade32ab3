"""What a container hides from gpuwatch, for `gpuwatch doctor`: the GPUs and the host's processes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.cli.doctor_calls import Check

_CONTAINER_MARKS = ("docker", "kubepods", "containerd", "libpod", "crio")
HOST_PROC_HINT = (
    "run with --pid=host, or mount the host's /proc (-v /proc:/host/proc:ro -e GPUWATCH_PROC_ROOT=/host/proc)"
)


@dataclass(frozen=True)
class ContainerFacts:
    """Read once from the file system (`read_container_facts`); plain data for the checks."""

    in_container: bool
    nvidia_devices: tuple[str, ...]  # /dev/nvidia* present
    pid1_name: str  # the comm of pid 1 in our /proc: systemd or init on a host (or with --pid=host)


def read_container_facts(root: Path = Path("/")) -> ContainerFacts:
    """Whether this process runs in a container, its NVIDIA device nodes, and who pid 1 is."""

    def text(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except OSError:
            return ""

    cgroup = text(root / "proc/1/cgroup")
    in_container = (
        (root / ".dockerenv").exists()
        or (root / "run/.containerenv").exists()
        or any(mark in cgroup for mark in _CONTAINER_MARKS)
    )
    try:
        devices = tuple(sorted(p.name for p in (root / "dev").glob("nvidia*")))
    except OSError:
        devices = ()
    return ContainerFacts(in_container, devices, text(root / "proc/1/comm").strip())


def container_checks(
    facts: ContainerFacts | None, *, gpus_found: bool, processes: Sequence[str], proc_root: Path
) -> list[Check]:
    """In a container: whether `--gpus all` and `--pid=host` (or a host /proc) are in effect."""
    if facts is None:
        return [Check("skip", "container", "not checked with simulated GPUs")]
    if not facts.in_container:
        return [Check("ok", "container", "not in a container", {"in_container": False})]
    data = {"in_container": True, "nvidia_devices": list(facts.nvidia_devices), "pid1": facts.pid1_name}
    checks = [
        Check(
            "ok",
            "container --gpus",
            f"in effect ({len(facts.nvidia_devices)} /dev/nvidia* device nodes)",
            data,
        )
        if gpus_found
        else Check(
            "fail",
            "container --gpus",
            "no GPU in this container: start it with --gpus all (the host needs the NVIDIA Container Toolkit)",
            data,
        )
    ]
    if not gpus_found:
        return checks
    host_proc = proc_root != Path("/proc")
    if processes:
        seen = [p for p in processes if (proc_root / p).is_dir()]
        if len(seen) == len(processes):
            how = f"the host's /proc at {proc_root}" if host_proc else "--pid=host"
            checks.append(Check("ok", "container --pid", f"GPU processes visible through {how}"))
        else:
            checks.append(
                Check(
                    "warn",
                    "container --pid",
                    f"{len(processes) - len(seen)} of {len(processes)} GPU processes are not in {proc_root}: "
                    f"they have no name, user or container; {HOST_PROC_HINT}",
                )
            )
    elif host_proc or facts.pid1_name in ("systemd", "init"):
        checks.append(Check("ok", "container --pid", "the host's processes are visible"))
    else:
        checks.append(
            Check(
                "skip",
                "container --pid",
                f"no GPU process now, so whether GPU processes are visible cannot be checked (pid 1 here is "
                f"{facts.pid1_name or 'unknown'}); without --pid=host they have no name, user or container",
            )
        )
    return checks
