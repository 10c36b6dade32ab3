"""Port -> PID discovery from /proc: a fake tree, and a real socket found in the real /proc."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

from gpuwatch.collect.listeners import listening_pids, parse_listening_inodes, with_descendants

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _row(n: int, local: str, state: str, inode: int) -> str:
    return (
        f"   {n}: {local} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000  1000 0 {inode} 1 "
        "0000000000000000 100 0 0 10 0\n"
    )


def _fake_proc(root: Path) -> None:
    (root / "net").mkdir(parents=True)
    # port 8000 = 0x1F40 listening (inode 111); an established connection from 8000 (inode 222)
    (root / "net" / "tcp").write_text(
        HEADER
        + _row(0, "0100007F:1F40", "0A", 111)
        + _row(1, "0100007F:1F40", "01", 222)
        + _row(2, "00000000:0BB8", "0A", 333)  # port 3000
    )
    (root / "net" / "tcp6").write_text(HEADER + _row(0, "00000000000000000000000000000000:1F40", "0A", 444))
    for pid, targets in {
        10: ["socket:[111]", "/dev/null"],
        20: ["socket:[222]"],  # only a connection on the port: not a listener
        30: ["pipe:[5]", "socket:[444]"],  # the IPv6 listener
        40: ["socket:[333]"],
    }.items():
        fd = root / str(pid) / "fd"
        fd.mkdir(parents=True)
        for i, target in enumerate(targets):
            os.symlink(target, fd / str(i))
    for pid, ppid in {10: 1, 20: 1, 30: 1, 40: 1, 11: 10, 12: 11, 13: 40}.items():
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "stat").write_text(f"{pid} (python3 -m vllm (x)) S {ppid} {pid} {pid} 0 -1\n")
    (root / "50").mkdir()  # a process whose fd/ cannot be read (gone, or another user's)
    (root / "self").mkdir()


def test_fake_proc_tree_names_the_listeners_of_a_port(tmp_path: Path) -> None:
    _fake_proc(tmp_path)
    assert listening_pids(tmp_path, [8000]) == [10, 30]
    assert listening_pids(tmp_path, [3000]) == [40]
    assert listening_pids(tmp_path, [9999]) == []
    assert listening_pids(tmp_path, [8000, 3000, 9999]) == [10, 30, 40]  # a service's many targets at once


def test_a_listeners_children_count_as_the_server(tmp_path: Path) -> None:
    _fake_proc(tmp_path)
    # vLLM's engine core (11) and its worker (12) under the API server (10); 13 belongs to port 3000
    assert with_descendants(tmp_path, listening_pids(tmp_path, [8000])) == [10, 11, 12, 30]
    assert with_descendants(tmp_path, []) == []


def test_a_missing_proc_tree_finds_nothing(tmp_path: Path) -> None:
    assert listening_pids(tmp_path / "absent", [8000]) == []


def test_malformed_lines_are_skipped() -> None:
    text = HEADER + "garbage\n" + _row(0, "0100007F:ZZZZ", "0A", 1) + _row(1, "0100007F:1F40", "0A", 7)
    assert parse_listening_inodes(text, [8000]) == {7}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_a_real_listening_socket_is_found_in_the_real_proc() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert os.getpid() in listening_pids(Path("/proc"), [port])
        assert os.getpid() in with_descendants(Path("/proc"), [os.getppid()])
    assert os.getpid() not in listening_pids(Path("/proc"), [port])
