"""Keep one process per data directory with an exclusive `flock` on `LOCK`."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from gpuwatch.core.errors import StoreInUse


class DirLock:
    """An exclusive lock on a data directory, naming the holder's pid in the file."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "LOCK"
        self._fd: int | None = None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise StoreInUse(
                f"data directory {data_dir} is in use by a running gpuwatch (pid {holder}); "
                "stop it or use --url"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    def release(self) -> None:
        """Drop the lock; the file stays, holding a stale pid that nobody trusts."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
