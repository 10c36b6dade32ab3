"""Start-up checks for a deployed gpuwatch (a container, a service) and the `gpuwatch health` probe.

Each check returns one line for the user, or None when all is well; `main.py` decides how to say it.
"""

from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from gpuwatch.app.config import Settings

# Docker's default host name: the first 12 hex digits of the container id.
_CONTAINER_ID_HOSTNAME = re.compile(r"[0-9a-f]{12}")
_CGROUP_MARKS = ("docker", "kubepods", "containerd", "libpod", "crio", "lxc")


def in_container(root: Path = Path("/")) -> bool:
    """Return whether this process runs in a container: Docker's /.dockerenv, Podman's
    /run/.containerenv, or a container runtime in our own cgroup path (not PID 1's: --pid=host)."""
    if (root / ".dockerenv").exists() or (root / "run" / ".containerenv").exists():
        return True
    try:
        cgroup = (root / "proc" / "self" / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(mark in cgroup for mark in _CGROUP_MARKS)


def hostname_warning(configured: str, actual: str, container: bool) -> str | None:
    """Return a warning when the Hostname label would be a container id (Docker without --hostname)."""
    if configured or not container or not _CONTAINER_ID_HOSTNAME.fullmatch(actual):
        return None
    return (
        f"the host name {actual} looks like a container id, so every re-created container starts new "
        'series under a new Hostname: pass `--hostname "$(hostname)"` to docker run, or set `hostname`'
    )


def unwritable_data_dir(data_dir: Path) -> str | None:
    """Return one line naming `data_dir`, our uid and the fix when gpuwatch cannot write there
    (creating it when missing), or None when it can."""
    uid = os.getuid()
    existed = data_dir.is_dir()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=data_dir, prefix=".gpuwatch-write-check-"):
            pass
        for entry in data_dir.iterdir():  # a store left by another user (an image that ran as root)
            if entry.is_file() and not os.access(entry, os.R_OK | os.W_OK):
                raise PermissionError(13, f"{entry.name} is not ours to write")
    except OSError as e:
        if e.errno == errno.EROFS:
            fix = "mount it read-write"
        elif existed:
            fix = f"chown -R {uid} {data_dir} (as root)"
        else:
            fix = f"mkdir -p {data_dir} && chown {uid} {data_dir} (as root)"
        return (
            f"cannot write the data directory {data_dir} (uid {uid}): {e.strerror or e}; "
            f"fix: {fix}, or pass --data-dir DIR"
        )
    return None


def health_url(settings: Settings) -> str:
    """Return the /-/health URL of the gpuwatch these settings describe, reached on this machine."""
    host = settings.host
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "[::1]"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.port}/-/health"


def check_health(url: str, timeout_s: float = 8.0) -> tuple[bool, str]:
    """GET `url`; return (healthy, one line): healthy only on HTTP 200 with status ok. Health answers
    within ~0.1 s even under 50 dashboards on 2 cores (bench/README.md, "Soak"); the wait leaves room
    for a host whose cores are taken by other work (the Dockerfile allows 10 s)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read()
            code = resp.status
    except urllib.error.HTTPError as e:
        body, code = e.read(), e.code
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return False, f"no answer from {url}: {reason}"
    try:
        status = json.loads(body)
    except ValueError:
        return False, f"{url} answered HTTP {code} without JSON"
    if not isinstance(status, dict):
        return False, f"{url} answered HTTP {code} without a status"
    state = str(status.get("status", "unknown"))
    problem = status.get("problem")
    line = f"{state}: {problem}" if problem else f"{state} ({status.get('gpus', 0)} GPU(s))"
    return code == 200 and state == "ok", line
