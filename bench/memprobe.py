"""Runs a gpuwatch command with glibc's heap figures written every few seconds, for the soak.

    python bench/memprobe.py OUT.csv SECONDS -- serve --demo ...

A daemon thread appends one row to OUT.csv every SECONDS: time since start, glibc's `mallinfo2()`
(`arena`: the main heap's size, `uordblks`: allocated in it, `fordblks`: free in it, `hblkhd`: blocks
mapped apart) in MB, and CPython's allocated block count. Then `gpuwatch.cli.main` runs with the
remaining arguments in this process, so the figures are the server's own.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time


class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]  # fmt: skip


def main() -> None:
    out, every, sep, *rest = sys.argv[1:]
    if sep != "--":
        raise SystemExit("usage: memprobe.py OUT.csv SECONDS -- gpuwatch arguments")
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    t0 = time.monotonic()

    def probe() -> None:
        with open(out, "w", buffering=1) as f:
            f.write("t_s,heap_mb,heap_in_use_mb,heap_free_mb,mapped_mb,python_blocks\n")
            while True:
                m = libc.mallinfo2()
                mb = [round(v / 1e6, 1) for v in (m.arena, m.uordblks, m.fordblks, m.hblkhd)]
                f.write(f"{time.monotonic() - t0:.0f},{','.join(map(str, mb))},{sys.getallocatedblocks()}\n")
                time.sleep(float(every))

    threading.Thread(target=probe, name="memprobe", daemon=True).start()
    from gpuwatch.cli.main import main as gpuwatch_main

    sys.argv = ["gpuwatch", *rest]
    raise SystemExit(gpuwatch_main())


if __name__ == "__main__":
    main()
