"""The appliance's tables besides samples, as `Store` methods: tailed log lines, training runs, alerts,
silences and notifications (their SQL is in logs.py, runs.py, alerts.py, silences.py, notify.py).

Writes go through the store's writer thread and wait for it; reads run on the calling thread's own
cursor. A DuckDB error becomes a one-line StoreError saying what could not be stored or read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import duckdb

from gpuwatch.core.errors import StoreError, one_line
from gpuwatch.core.model import LogLine, LogOffset, RunRecord, RunUpdate, SilenceRecord
from gpuwatch.store import alerthistory as history_table
from gpuwatch.store import alerts as alerts_table
from gpuwatch.store import logs as logs_table
from gpuwatch.store import notify as notify_table
from gpuwatch.store import runs as runs_table
from gpuwatch.store import silences as silences_table
from gpuwatch.store.writer import Writer

T = TypeVar("T")


class SideTables:
    """Mixed into `Store`, which provides the writer, the cursors and the closed flag."""

    _closed: bool

    def _need_writer(self) -> Writer:
        raise NotImplementedError

    def _ask(self, fn: Callable[[], Any]) -> Any:
        raise NotImplementedError

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        raise NotImplementedError

    def _write_table(self, fn: Callable[[duckdb.DuckDBPyConnection], Any], what: str) -> None:
        """Run `fn(writer cursor)` on the writer thread and wait; `what` completes "cannot ..."."""
        writer = self._need_writer()
        try:
            self._ask(lambda: fn(writer._cur))
        except duckdb.Error as exc:
            raise StoreError(f"cannot {what}: {exc}") from None

    def _read_table(self, fn: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        if self._closed:
            raise StoreError("the store is closed")
        try:
            return fn(self._cursor())
        except duckdb.Error as exc:
            raise StoreError(f"store read failed: {one_line(exc)}") from None

    # -- log lines and runs ---------------------------------------------------------------------------

    def append_log_lines(self, lines: Sequence[LogLine], offsets: Sequence[LogOffset]) -> None:
        """Store tailed log lines and the file offsets after them, atomically; waits for the writer."""
        self._write_table(lambda cur: logs_table.write(cur, lines, offsets), "store log lines")

    def log_offsets(self) -> list[LogOffset]:
        """Return how far each tailed log file was read, as stored with its lines."""
        return self._read_table(logs_table.read_offsets)

    def log_lines(
        self,
        *,
        run: str | None = None,
        text: str | None = None,
        level: str | None = None,
        start_ms: int | None = None,
        end_ms: int | None = None,
        limit: int = 200,
    ) -> list[LogLine]:
        """Return stored log lines matching every given filter, newest first."""
        return self._read_table(
            lambda cur: logs_table.read_lines(
                cur, run=run, text=text, level=level, start_ms=start_ms, end_ms=end_ms, limit=limit
            )
        )

    def upsert_run(self, update: RunUpdate) -> None:
        """Record a training run's start, finish or latest step; waits for the writer."""
        self._write_table(lambda cur: runs_table.upsert(cur, update), f"record run {update.name!r}")

    def runs(self) -> list[RunRecord]:
        """Return the metadata of every training run, the most recently started first."""
        return self._read_table(runs_table.read_all)

    # -- alerts and silences --------------------------------------------------------------------------

    def save_alerts(self, group_key: str, alerts: Sequence[alerts_table.StoredAlert]) -> None:
        """Replace the stored alerts of one rule group; waits for the writer."""
        self._write_table(
            lambda cur: alerts_table.replace_group(cur, group_key, alerts),
            f"store the alerts of rule group {group_key!r}",
        )

    def save_alerts_soon(self, group_key: str, alerts: Sequence[alerts_table.StoredAlert]) -> Future[Any]:
        """Queue `save_alerts` without waiting; the future holds its outcome (a StoreError on failure)."""
        writer = self._need_writer()
        if self._closed:
            raise StoreError("the store is closed")
        fut: Future[Any] = Future()
        writer.queue.put(("call", lambda: alerts_table.replace_group(writer._cur, group_key, alerts), fut))
        return fut

    def alerts(self) -> list[alerts_table.StoredAlert]:
        """Return the stored alerts of every rule group."""
        return self._read_table(alerts_table.read_all)

    def save_alert_history_soon(self, rows: Sequence[history_table.StoredTransition]) -> Future[Any]:
        """Queue alert transitions for the history table without waiting; the future holds the outcome."""
        writer = self._need_writer()
        if self._closed:
            raise StoreError("the store is closed")
        fut: Future[Any] = Future()
        writer.queue.put(("call", lambda: history_table.append(writer._cur, rows), fut))
        return fut

    def alert_history(self, limit: int) -> list[history_table.StoredTransition]:
        """Return the newest `limit` stored alert transitions, oldest first."""
        return self._read_table(lambda cur: history_table.read_latest(cur, limit))

    def save_silences(self, silences: Sequence[SilenceRecord]) -> None:
        """Write silences (new or changed) in one transaction; waits for the writer."""
        self._write_table(lambda cur: silences_table.upsert(cur, silences), "store silences")

    def delete_silences(self, ids: Sequence[str]) -> None:
        """Delete the silences with these ids; waits for the writer."""
        self._write_table(lambda cur: silences_table.delete(cur, ids), "delete silences")

    def silences(self) -> list[SilenceRecord]:
        """Return every stored silence."""
        return self._read_table(silences_table.read_all)

    # -- notifications --------------------------------------------------------------------------------

    def enqueue_notifications(
        self, items: Sequence[notify_table.NewNotification], states: Sequence[notify_table.NotifyEntry]
    ) -> None:
        """Queue notifications with the notification state they imply, atomically; waits for the writer."""
        self._write_table(lambda cur: notify_table.enqueue(cur, items, states), "store notifications")

    def retry_notification(self, id_: int, attempts: int, next_ms: int, error: str) -> None:
        """Record a failed delivery attempt of a queued notification and when to try again."""
        self._write_table(
            lambda cur: notify_table.retry_later(cur, id_, attempts, next_ms, error), "store notifications"
        )

    def finish_notification(self, delivery: notify_table.Delivery) -> None:
        """Take a notification off the queue and write how it ended to the delivery log."""
        self._write_table(lambda cur: notify_table.finish(cur, delivery), "store notifications")

    def prune_notifications(self, log_before_ms: int, state_before_ms: int) -> None:
        """Delete old delivery log rows and notification states."""
        self._write_table(
            lambda cur: notify_table.prune(cur, log_before_ms, state_before_ms), "store notifications"
        )

    def queued_notifications(self) -> list[notify_table.QueuedNotification]:
        """Return the notifications waiting to be delivered, oldest first."""
        return list(self._read_table(notify_table.queued))

    def notify_states(self) -> list[notify_table.NotifyEntry]:
        """Return what each alert group last notified each receiver."""
        return list(self._read_table(notify_table.states))

    def notification_log(
        self, *, receiver: str | None = None, limit: int = 200
    ) -> list[notify_table.Delivery]:
        """Return the delivery log, newest first."""
        return list(self._read_table(lambda cur: notify_table.log_rows(cur, receiver=receiver, limit=limit)))
