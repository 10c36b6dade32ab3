"""How many threads read samples from DuckDB at once, and the writer's compaction alone.

Reads and the writer share DuckDB's memory cap (`core.MEMORY_LIMIT_MB`), and a read holds its whole
result there until it is fetched. With 8 web workers reading at once under 50 dashboards, reads and
the writer's compaction (which sorts the whole head) failed with "Out of Memory" (bench/README.md,
"Soak"). So at most `readers` reads run at once, and a compaction or retention pass waits for those
in flight, then runs with none: reads wait about a second every few minutes instead of failing.

A turn covers one statement and the fetch of its result (`read.py`, `chunkcache.py`), not what a
read does in Python around it: chunks decoded or found in memory take none, so a warm page's
requests are not served in turns (bench/README.md, "Dashboard"). Within a turn a thread waits for
nothing but DuckDB, so a compaction waiting for the turns in flight never waits for itself. A thread
that waits for the writer (a flush, a compaction) while holding a turn would give it up meanwhile
(`paused`); the store's own reads never do.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext


class ReadGate:
    """At most `readers` holders of `reading()` at once; `alone()` waits for none and keeps new ones out."""

    def __init__(self, readers: int) -> None:
        self._readers = readers
        self._cond = threading.Condition()
        self._active = 0
        self._alone_wanted = 0
        self._alone = False
        self._held = threading.local()  # this thread's turns: reads may nest

    def _may_read(self) -> bool:
        return not self._alone and not self._alone_wanted and self._active < self._readers

    def _turns(self) -> int:
        return int(getattr(self._held, "n", 0))

    @contextmanager
    def reading(self) -> Iterator[None]:
        nested = self._turns() > 0  # a read inside a read (an index built for it) takes no second turn
        if not nested:
            with self._cond:
                self._cond.wait_for(self._may_read)
                self._active += 1
        self._held.n = self._turns() + 1
        try:
            yield
        finally:
            self._held.n = self._turns() - 1
            if not nested:
                with self._cond:
                    self._active -= 1
                    self._cond.notify_all()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Give up this thread's turn (if it has one) while it waits for the writer, then take it back."""
        turns = self._turns()
        if not turns:
            yield
            return
        with self._cond:
            self._active -= 1
            self._cond.notify_all()
        self._held.n = 0
        try:
            yield
        finally:
            with self._cond:
                self._cond.wait_for(self._may_read)
                self._active += 1
            self._held.n = turns

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self._cond:
            self._alone_wanted += 1
            self._cond.wait_for(lambda: self._active == 0 and not self._alone)
            self._alone_wanted -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()


def turn(gate: ReadGate | None) -> AbstractContextManager[None]:
    """One of `gate`'s turns (`reading()`), or nothing to wait for without a gate."""
    return nullcontext() if gate is None else gate.reading()
