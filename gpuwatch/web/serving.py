"""The waitress server `gpuwatch serve` runs: its settings and a dispatcher that keeps one thread hot.

waitress hands each request from its socket loop to a pool of worker threads. Its own dispatcher
wakes the thread that has been idle longest (one `Condition`, woken in FIFO order), so a client
that sends one request after another is served by each of the 8 threads in turn, each with cold
caches; on the 2-vCPU test machine that cost 1-2 ms a query over a single worker. `LifoDispatcher`
wakes the thread that went idle last instead: sequential requests stay on one thread, concurrent
ones still spread over all of them.
"""

from __future__ import annotations

import threading
from typing import Any

from waitress.server import create_server
from waitress.task import ThreadedTaskDispatcher
from waitress.wasyncore import close_all

THREADS = 8


class LifoDispatcher(ThreadedTaskDispatcher):  # type: ignore[misc]
    """waitress's `ThreadedTaskDispatcher`, waking the most recently idle worker first."""

    def __init__(self) -> None:
        super().__init__()
        self._idle: list[threading.Condition] = []  # one per waiting worker, the latest last

    def handler_thread(self, thread_no: int) -> None:
        wake = threading.Condition(self.lock)
        while True:
            with self.lock:
                while not self.queue and self.stop_count == 0:
                    self.active_count -= 1
                    self._idle.append(wake)
                    wake.wait()  # whoever notifies `wake` has taken it off `_idle`
                    self.active_count += 1
                if self.stop_count > 0:
                    self.active_count -= 1
                    self.stop_count -= 1
                    self.threads.discard(thread_no)
                    self.thread_exit_cv.notify()
                    break
                task = self.queue.popleft()
            try:
                task.service()
            except BaseException:
                self.logger.exception("Exception when servicing %r", task)

    def _wake_all(self) -> None:
        with self.lock:
            while self._idle:
                self._idle.pop().notify()

    def set_thread_count(self, count: int) -> None:
        super().set_thread_count(count)
        if self.stop_count:
            self._wake_all()  # idle workers must see stop_count

    def add_task(self, task: Any) -> None:
        with self.lock:
            self.queue.append(task)
            if self._idle:
                self._idle.pop().notify()
            queue_size = len(self.queue)
            idle_threads = len(self.threads) - self.stop_count - self.active_count
            if queue_size > idle_threads:
                self.queue_logger.warning("Task queue depth is %d", queue_size - idle_threads)


_INTERNALS = (
    "lock",
    "queue",
    "threads",
    "stop_count",
    "active_count",
    "thread_exit_cv",
    "logger",
    "queue_logger",
)


def _dispatcher() -> ThreadedTaskDispatcher:
    """A LifoDispatcher where waitress's dispatcher has the parts it builds on, else waitress's own (a
    waitress whose internals changed still serves, only without the hot thread)."""
    plain = ThreadedTaskDispatcher()
    if all(hasattr(plain, name) for name in _INTERNALS) and callable(getattr(plain, "handler_thread", None)):
        return LifoDispatcher()
    return plain


def make_server(app: Any, host: str, port: int) -> Any:
    """The waitress server for `app` on host:port, as `gpuwatch serve` runs it (not yet running)."""
    dispatcher = _dispatcher()
    dispatcher.set_thread_count(THREADS)
    sockets: dict[int, Any] = {}  # waitress's socket map: the trigger it opens first, then the listener
    try:
        return create_server(
            app,
            map=sockets,
            host=host,
            port=port,
            threads=THREADS,
            ident="gpuwatch",
            asyncore_loop_timeout=5,  # waitress wakes its loop by a trigger; no need to poll each second
            _dispatcher=dispatcher,
        )
    except BaseException:  # a port in use: close what waitress opened before it failed
        dispatcher.shutdown(timeout=1)
        close_all(sockets)
        raise
