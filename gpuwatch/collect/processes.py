"""Who a GPU process is: its name, user, container and scheduler job, read from a `/proc` tree.

NVML reports driver-side (host) PIDs. Inside a container, run gpuwatch with `--pid=host`, or mount
the host's `/proc` (for example at `/host/proc`) and set `proc_root`, or names, users and containers
stay empty.
"""

from __future__ import annotations

import pwd
import re
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.collect.attribution import NONE, Attribution, parse_cgroup, read_pod_names

# A 64-hex container id as docker, containerd, cri-o, podman and kubepods put it in cgroup paths:
# `/docker/<id>`, `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
# `libpod-<id>.scope`, `/kubepods/burstable/pod<uid>/<id>`, `...:cri-containerd:<id>`.
_CONTAINER_ID = re.compile(r"(?<![0-9a-f])([0-9a-f]{64})(?![0-9a-f])")


@dataclass(frozen=True)
class ProcessInfo:
    """What /proc says about one PID; empty strings where it could not tell."""

    name: str
    user: str
    container_id: str
    attribution: Attribution = NONE  # the Slurm job or Kubernetes pod it runs in


def parse_container_id(cgroup_text: str) -> str:
    """Return the container id in a `/proc/<pid>/cgroup` text, or "" for a host process."""
    found = ""
    for line in cgroup_text.splitlines():
        # hierarchy-ID:controllers:path; the path may itself contain ':' (cri-containerd on systemd).
        path = line.split(":", 2)[-1]
        ids = _CONTAINER_ID.findall(path)
        if ids:
            found = ids[-1]
            if line.startswith("0::"):  # the cgroup v2 line is authoritative
                return found
    return found


def parse_uid(status_text: str) -> int | None:
    """Return the real uid from a `/proc/<pid>/status` text."""
    for line in status_text.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            if len(fields) > 1 and fields[1].isdigit():
                return int(fields[1])
    return None


def user_name(uid: int) -> str:
    """Return the login name of `uid`, or the uid as text when it has no passwd entry."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # the process exited, or /proc is not ours to read
        return None


def read_process_info(proc_root: Path, pid: int) -> ProcessInfo:
    """Read name, user, container id and scheduler job of `pid` under `proc_root` (the host's root
    is taken to be its parent: `/` for `/proc`, `/host` for `/host/proc`), tolerating the PID vanishing."""
    base = proc_root / str(pid)
    comm = _read(base / "comm")
    status = _read(base / "status")
    cgroup = _read(base / "cgroup")
    uid = parse_uid(status) if status is not None else None
    container_id = parse_container_id(cgroup) if cgroup is not None else ""
    job = parse_cgroup(cgroup) if cgroup is not None else NONE
    if uid is None:
        uid = job.slurm_uid
    return ProcessInfo(
        name=comm.strip() if comm is not None else "",
        user=user_name(uid) if uid is not None else "",
        container_id=container_id,
        attribution=read_pod_names(proc_root.parent, container_id, job),
    )
