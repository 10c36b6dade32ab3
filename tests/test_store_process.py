"""The store across processes: the directory lock and surviving `kill -9`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import StoreInUse
from gpuwatch.core.model import Batch, Sample
from gpuwatch.store import Store

HOLD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gpuwatch.core.clock import SystemClock
    from gpuwatch.core.errors import StoreInUse
    from gpuwatch.store import Store
    try:
        s = Store.open(Path(sys.argv[1]), clock=SystemClock())
    except StoreInUse as exc:
        print(exc, flush=True)
        sys.exit(3)
    print("ready", flush=True)
    sys.stdin.read()
    s.close()
    """
)

WRITE_FOREVER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from gpuwatch.core.clock import SystemClock
    from gpuwatch.core.model import Batch, Sample
    from gpuwatch.store import Store
    s = Store.open(Path(sys.argv[1]), clock=SystemClock(), flush_interval_s=0.05, compact_rows=3000)
    k = 0
    while True:
        s.append(Batch(k * 1000, [Sample(f"m{i}", (("gpu", str(g)),), float(k)) for i in range(5) for g in range(8)]))
        if k % 25 == 24:
            s.flush()
            print(k, flush=True)
        k += 1
    """
)


def spawn(script: str, data_dir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, str(data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_second_open_in_same_process_is_refused(tmp_path: Path) -> None:
    with Store.open(tmp_path, clock=FakeClock()), pytest.raises(StoreInUse) as err:
        Store.open(tmp_path, clock=FakeClock(), read_only=True)
    assert str(err.value) == (
        f"data directory {tmp_path} is in use by a running gpuwatch (pid {os.getpid()}); stop it or use --url"
    )
    Store.open(tmp_path, clock=FakeClock()).close()  # released by close()


def test_lock_is_held_across_processes(tmp_path: Path) -> None:
    child = spawn(HOLD, tmp_path)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with pytest.raises(StoreInUse) as err:
            Store.open(tmp_path, clock=FakeClock())
        assert str(err.value) == (
            f"data directory {tmp_path} is in use by a running gpuwatch (pid {child.pid}); stop it or use --url"
        )
    finally:
        child.communicate("", timeout=30)
    assert child.returncode == 0
    with Store.open(tmp_path, clock=FakeClock()):
        other = spawn(HOLD, tmp_path)
        out, _ = other.communicate("", timeout=30)
        assert other.returncode == 3 and "is in use by a running gpuwatch" in out


def test_kill_9_loses_at_most_unflushed_data(tmp_path: Path) -> None:
    child = spawn(WRITE_FOREVER, tmp_path)
    assert child.stdout is not None
    last_flushed = -1
    try:
        while last_flushed < 400:  # several compactions (every 75 ticks) have happened by then
            line = child.stdout.readline()
            assert line, "writer child died"
            last_flushed = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=30)  # also closes the pipes
    assert child.returncode == -signal.SIGKILL
    with Store.open(tmp_path, clock=FakeClock()) as s:  # the stale LOCK file does not block
        got = s.select([], -(2**62), 2**62)
        assert len(got) == 40
        for series in got:
            n = series.timestamps_ms.size
            assert n > last_flushed  # everything flushed before the kill is there ...
            assert series.timestamps_ms.tolist() == [k * 1000 for k in range(n)]  # ... without holes
            assert series.values.tolist() == [float(k) for k in range(n)]
        s.append(Batch(10**9, [Sample("after", (), 1.0)]))  # and the store keeps working
        s.flush()
    with Store.open(tmp_path, clock=FakeClock(), read_only=True) as s:
        assert len(s.select([], -(2**62), 2**62)) == 41
