"""Which local process listens on a TCP port, read from a `/proc` tree (Linux).

`/proc/net/tcp` and `/proc/net/tcp6` list every socket with its local address, state and inode; a
listening socket is state 0A. Each process's open sockets are `socket:[<inode>]` links in
`/proc/<pid>/fd/`. Joining the two names the PIDs serving a port without any configuration, which
the inference pages join with NVML's per-process table (`gpuwatch_process_gpu_memory_bytes{pid}`)
to find the GPUs an inference server runs on.

Another user's `/proc/<pid>/fd` cannot be read without privileges: such processes are skipped, so
an unprivileged gpuwatch finds only its own user's servers (run it as root, or as the server's user).
"""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

LISTEN = "0A"
MAX_PIDS = 65_536  # a bound on the /proc walk


def parse_listening_inodes(text: str, ports: Collection[int]) -> set[int]:
    """Return the inodes of sockets listening on one of `ports` in a `/proc/net/tcp{,6}` text."""
    out: set[int] = set()
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        _, _, port_hex = fields[1].rpartition(":")
        try:
            if int(port_hex, 16) not in ports:
                continue
            inode = int(fields[9])
        except ValueError:
            continue
        if inode > 0:
            out.add(inode)
    return out


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""


def listening_inodes(proc_root: Path, ports: Collection[int]) -> set[int]:
    """Return the inodes of the IPv4 and IPv6 sockets listening on one of `ports`."""
    found: set[int] = set()
    for name in ("tcp", "tcp6"):
        found |= parse_listening_inodes(_read(proc_root / "net" / name), ports)
    return found


def pids_holding(proc_root: Path, inodes: set[int]) -> list[int]:
    """Return the PIDs (sorted) with one of the socket `inodes` open; unreadable processes are skipped."""
    if not inodes:
        return []
    wanted = {f"socket:[{i}]" for i in inodes}
    out: list[int] = []
    try:
        entries = [e for e in os.listdir(proc_root) if e.isdigit()][:MAX_PIDS]
    except OSError:
        return []
    for entry in entries:
        fd_dir = proc_root / entry / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # exited, or another user's process
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            if target in wanted:
                out.append(int(entry))
                break
    return sorted(out)


def listening_pids(proc_root: Path, ports: Collection[int]) -> list[int]:
    """Return the PIDs of the processes listening on one of the TCP `ports` (IPv4 or IPv6), sorted.

    One pass over `/proc` for all of them: a service of 20 targets asked port by port walked every
    process's descriptors 20 times, ~0.4 s of CPU a page refresh (bench/README.md, "Soak")."""
    return pids_holding(proc_root, listening_inodes(proc_root, frozenset(ports)))


def parse_ppid(stat_text: str) -> int | None:
    """Return the parent PID in a `/proc/<pid>/stat` text (the name in parentheses may hold spaces)."""
    _, _, rest = stat_text.rpartition(")")
    fields = rest.split()
    if len(fields) >= 2 and fields[1].isdigit():
        return int(fields[1])
    return None


def with_descendants(proc_root: Path, pids: list[int]) -> list[int]:
    """Return `pids` and every process descended from them, sorted. An inference server's HTTP
    process is often not the one holding GPU memory (vLLM's engine core and SGLang's scheduler are
    child processes), so the GPUs of a port are those of its listener's whole process tree."""
    if not pids:
        return []
    children: dict[int, list[int]] = {}
    try:
        entries = [e for e in os.listdir(proc_root) if e.isdigit()][:MAX_PIDS]
    except OSError:
        return sorted(pids)
    for entry in entries:
        ppid = parse_ppid(_read(proc_root / entry / "stat"))
        if ppid is not None:
            children.setdefault(ppid, []).append(int(entry))
    seen = set(pids)
    todo = list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return sorted(seen)
