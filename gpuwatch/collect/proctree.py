"""A process and its descendants, read from a `/proc` tree (`/proc/<pid>/stat`'s parent pid).

A training run's SDK knows its own pid; the GPUs may be held by its children (DataLoader workers,
`mp.spawn` DDP workers) or, under torchrun, by its siblings (the launcher's children).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path


def parse_ppid(stat_text: str) -> int | None:
    """Return the parent pid in a `/proc/<pid>/stat` text (`pid (comm) state ppid ...`; comm may hold
    spaces and parentheses, so the fields are counted after the last `)`)."""
    rest = stat_text[stat_text.rfind(")") + 1 :].split()
    if len(rest) < 2 or not rest[1].isdigit():
        return None
    return int(rest[1])


def parent_map(proc_root: Path = Path("/proc")) -> dict[int, int]:
    """Return pid -> parent pid for every process under `proc_root` (vanished ones are skipped)."""
    parents: dict[int, int] = {}
    try:
        entries = list(proc_root.iterdir())
    except OSError:
        return parents
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text(encoding="utf-8", errors="replace")
        except OSError:  # exited since the listing, or not ours to read
            continue
        ppid = parse_ppid(text)
        if ppid is not None:
            parents[int(entry.name)] = ppid
    return parents


def with_descendants(roots: Iterable[int], parents: dict[int, int]) -> set[int]:
    """Return `roots` and every process below them in `parents` (pid -> parent pid)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [r for r in roots if r > 0]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found
