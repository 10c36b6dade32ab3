"""The writer's side of an import (staged.py), as `Writer` methods: queued from any thread, then taken a
step at a time on the writer thread between its ordinary flushes, on a cursor of its own: its series
counted against the limits, its transaction begun, a slice written, and the commit, after which its new
series are published (the id map, the catalogue, each series' newest sample). A database error rolls it
back and refuses it; the writer goes on.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
from collections.abc import Callable
from concurrent.futures import Future
from queue import Queue
from typing import Any

import duckdb
import numpy as np

from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import StoreError, one_line
from gpuwatch.core.model import SeriesColumns, SeriesLimits
from gpuwatch.store import rewrite, sqlrows
from gpuwatch.store.catalog import Catalog
from gpuwatch.store.chunkindex import Generation
from gpuwatch.store.headindex import HeadIndex
from gpuwatch.store.latest import Latest
from gpuwatch.store.seriesids import SeriesIds
from gpuwatch.store.staged import ImportSlice, StagedImport


class ImportSteps:
    """Mixed into `Writer`, which provides its queue, cursors, id map, catalogue and what reads keep in
    memory, and takes `_step_import` between its flushes."""

    queue: Queue[Any]
    import_slice_series: int
    import_slice_samples: int
    after_import_slice: Callable[[], None] | None
    latest: Latest
    head_index: HeadIndex
    chunk_generation: Generation
    _imports: collections.deque[StagedImport]
    _import_cur: duckdb.DuckDBPyConnection
    _ids: SeriesIds
    _catalog: Catalog
    _clock: Clock
    _noted: list[np.ndarray] | None
    _head_rows: int
    _chunks_since_compact: int
    _reserved_from: int | None

    def flush(self) -> None:
        raise NotImplementedError

    def update_visible(self) -> None:
        raise NotImplementedError

    def _guarded(self, fn: Callable[[], Any]) -> None:
        raise NotImplementedError

    def _next_seq(self, n: int) -> int:
        raise NotImplementedError

    def _count_error(self, what: str, exc: BaseException, kept: str = "kept for retry") -> None:
        raise NotImplementedError

    def submit_import(self, columns: SeriesColumns, limits: SeriesLimits) -> Future[None]:
        """Queue an import to be written in a transaction of its own, all or nothing (any thread). Its
        Future is done when it has committed, or raises SeriesLimitExceeded if its new series are more
        than `limits` allow, or StoreError if the database refused it: nothing of it written."""
        fut: Future[None] = Future()
        job = StagedImport(
            columns,
            limits,
            fut,
            slice_series=self.import_slice_series,
            slice_samples=self.import_slice_samples,
        )
        self.queue.put(("import", job))
        return fut

    def _step_import(self) -> None:
        """Take the first import one step on: a slice looked up or written, or its commit."""
        job = self._imports[0]
        try:
            if not job.is_started:
                job.is_started = True
                if not job.future.set_running_or_notify_cancel():
                    self._imports.popleft()
                    return
                self._ids.made = []
            if not job.is_begun:
                if not job.is_counted:
                    job.count_slice(self._ids)
                if job.is_counted:
                    self._begin_import(job)
            elif not job.is_written:
                self._write_slice(job.write_slice(self._ids))
                if self.after_import_slice is not None:
                    self.after_import_slice()
            else:
                self._commit_import(job)
                self._end_import(job)
                job.future.set_result(None)
        except (duckdb.Error, OSError) as exc:
            self._end_import(job)
            self._count_error("import", exc, "rolled back")
            job.future.set_exception(StoreError(f"store write failed: {one_line(exc)}"))
        except BaseException as exc:
            self._end_import(job)
            job.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    def _finish_import(self) -> None:
        """Write the import under way, if any, to its end (those queued after it wait)."""
        while self._imports and self._imports[0].is_started:
            self._step_import()

    def _begin_import(self, job: StagedImport) -> None:
        job.limits.admit(job.new_series(), self._ids.recent, self._clock.monotonic())
        self._guarded(self.flush)  # what was appended before the import is older than it (seq)
        job.seq = self._next_seq(job.seqs_needed)
        self._reserved_from = job.seq
        self._import_cur.execute("BEGIN TRANSACTION")
        job.is_begun = True
        self._noted = []

    def _write_slice(self, rows: ImportSlice) -> None:
        cur = self._import_cur
        if rows.series is not None:
            sqlrows.insert_columns(cur, "series", rows.series)
        if rows.head is not None:
            sqlrows.insert_columns(cur, "head", rows.head)
        sqlrows.insert_chunks(cur, rows.chunks)

    def _commit_import(self, job: StagedImport) -> None:
        cur = self._import_cur
        moved = job.collisions(self._ids.made or [], self._ids)
        head = job.head
        ids = np.concatenate([h[0] for h in head]) if head else np.zeros(0, np.int32)
        t_ms = np.concatenate([h[1] for h in head]) if head else np.zeros(0, np.int64)
        values = np.concatenate([h[2] for h in head]) if head else np.zeros(0)
        chunks = job.chunks
        if moved:  # label sets a live write made meanwhile: one series, the live one
            rewrite.move_series(cur, moved)
            for mine, live in moved.items():
                ids[ids == mine] = live
            chunks = [
                dataclasses.replace(r, series_id=moved[r.series_id]) if r.series_id in moved else r
                for r in chunks
            ]
        self.head_index.add(ids, t_ms)  # before the rows can be seen (headindex.py)
        with self.chunk_generation.changing() if chunks else contextlib.nullcontext():
            cur.execute("COMMIT")
        job.is_begun = False
        self._ids.publish(job.staged)
        self._catalog.add_grouped(job.by_id, job.by_name)
        newer = np.unique(np.concatenate(self._noted)) if self._noted else None
        self.latest.note(chunks, ids, t_ms, values, newer=newer)
        self._head_rows += ids.size
        self._chunks_since_compact += len(chunks)

    def _end_import(self, job: StagedImport) -> None:
        self._imports.popleft()
        if job.is_begun:
            sqlrows.rollback(self._import_cur)
            job.is_begun = False
        self._ids.made = None
        self._noted = None
        self._reserved_from = None  # committed and published, or rolled back: never to be seen
        self.update_visible()
