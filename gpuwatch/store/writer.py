"""The one thread that writes: it drains the append queue, flushes, compacts and applies retention.

Every change to the database happens here, on the writer's own cursor, so DuckDB never sees two
writers; an import is written on a second cursor, in a transaction of its own that the thread feeds a
slice at a time between its ordinary flushes (staged.py; the writer's steps are in importsteps.py).
Other threads hand work over through the queue and, when they need a result (flush, compact,
retention, an import), wait on a Future. A database error is logged and counted in `write_errors`;
the data it concerned stays buffered and is retried on the next flush (an import's: rolled back and
refused), and the thread keeps going.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from datetime import datetime, timezone
from operator import attrgetter, itemgetter
from typing import Any

import duckdb
import numpy as np

from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import StoreError, one_line
from gpuwatch.core.model import Batch, Labels, SeriesLimits, TableSamples
from gpuwatch.store import rewrite, sizecap, sqlrows, tierrows
from gpuwatch.store.catalog import Catalog
from gpuwatch.store.chunkindex import Generation
from gpuwatch.store.chunking import (
    ChunkRow,
    dedupe_last,
    encode_many,
    encode_series,
)
from gpuwatch.store.headindex import HeadIndex
from gpuwatch.store.importsteps import ImportSteps
from gpuwatch.store.latest import Latest
from gpuwatch.store.readgate import ReadGate
from gpuwatch.store.seriesids import SeriesIds
from gpuwatch.store.staged import BULK_MIN, StagedImport, labels_json
from gpuwatch.store.tierbuild import GRACE_MS, TierBuilder
from gpuwatch.store.tierrows import DAY_MS

log = logging.getLogger(__name__)

_BULK_MIN = BULK_MIN  # append_series calls at least this long skip the head and become chunks directly
_MAX_PENDING = 20_000_000  # samples kept for retry while the database refuses writes
_STOP = object()


def _iso(t_ms: int) -> str:
    return datetime.fromtimestamp(t_ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%MZ") if t_ms else "none"


TIER_STEP_S = 2.0  # between two steps of a tier build that has more to do (tierbuild.py) ...
TIER_PAUSE_S = 60.0  # ... and between two looks once it is done
TIER_BATCHES = 8  # tier batches (each its own transaction) a background step builds at most
RETENTION_BATCHES = 128  # tier batches (~32 M samples) a retention pass builds first, of days it deletes
DAY_MERGE_BYTES = 16 << 20  # chunk bytes of closed days merged into day chunks in one background step
_VALUE = itemgetter(2)  # a Sample's value
_SERIES_ID, _NAME, _LABELS = attrgetter("series_id"), attrgetter("name"), attrgetter("labels")  # an Entry's


def _changes_chunks(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a write that may change the `chunks` table inside `chunk_generation.changing()`, so that
    readers of chunks kept in memory notice (chunkcache.py); a flush changes chunks only with bulk ones."""

    @functools.wraps(method)
    def wrapped(self: Writer, *args: Any) -> Any:
        flush = method.__name__ == "flush"
        if flush and not self._pending_chunks:
            return method(self, *args)
        if not flush:  # compaction and retention wait for an import under way: they rewrite what it adds to
            self._finish_import()
        # Compaction and retention sort and rewrite much of the file: readers wait (readgate.py).
        with (
            self.read_gate.alone() if not flush else contextlib.nullcontext(),
            self.chunk_generation.changing(),
        ):
            result = method(self, *args)
        if not flush and self.after_rewrite is not None:  # compaction and retention, not each bulk flush
            try:
                self.after_rewrite(self._cur)
            except duckdb.Error as exc:
                log.debug("after a chunk rewrite: %s", one_line(exc))
        return result

    return wrapped


class Writer(ImportSteps):
    """Own all writes to one database; run `start()` once, then talk to it through the queue."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        catalog: Catalog,
        clock: Clock,
        *,
        flush_interval_s: float,
        compact_interval_s: float,
        compact_rows: int,
        read_gate: ReadGate,
        flush_rows: int = 500_000,
    ) -> None:
        self._cur = con.cursor()
        self.read_gate = read_gate  # readers wait while a compaction or retention pass runs
        self._catalog = catalog
        self._clock = clock
        self._flush_interval_s = flush_interval_s
        self._compact_interval_s = compact_interval_s
        self._compact_rows = compact_rows
        self._flush_rows = flush_rows
        self.queue: queue.Queue[Any] = queue.Queue()
        # Live batches wait here without waking the thread (a wake-up per tick costs more CPU than the
        # write itself on small VMs); the thread drains them every flush interval or when asked to work.
        self.batches: collections.deque[Batch] = collections.deque()
        self._thread = threading.Thread(target=self._run, name="gpuwatch-store-writer", daemon=True)
        cur = self._cur
        self._ids = SeriesIds(
            catalog.snapshot().by_id.values(),
            sqlrows.scalar(cur, "SELECT coalesce(max(series_id), 0) + 1 FROM series"),
        )
        # Past every stored seq and every saved watermark's: retention or a crash may have removed the
        # highest seqs, and a new sample numbered at or below a watermark would never be sent (appended.py).
        self._seq = sqlrows.scalar(
            cur,
            "SELECT coalesce(greatest((SELECT max(seq) FROM head), (SELECT max(seq) FROM chunks), "
            "(SELECT max(seq) FROM remote_watermarks), (SELECT max(seq) FROM seq_floor)), 0) + 1",
        )
        # Every seq below this is committed (or will never be) and its series are in the catalogue:
        # imports and bulk chunks reserve seqs before they commit, flushes after them may commit first.
        self.visible_seq = self._seq
        self._reserved_from: int | None = None  # the first seq of the import being written
        self._head_rows = sqlrows.scalar(cur, "SELECT count(*) FROM head")
        self.latest = Latest.load(cur)  # each series' newest stored sample (Store.select_last)
        self.head_index = HeadIndex.load(cur)  # which series the head may hold (reads leave it out)
        self.chunk_generation = Generation()  # counts the writes that change chunks (chunkcache.py)
        # Called in this thread after a compaction or retention pass rewrote chunks (with its cursor):
        # the store rebuilds the chunk index here, so that the next query does not wait for it.
        self.after_rewrite: Callable[[duckdb.DuckDBPyConnection], None] | None = None
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending_chunks: list[ChunkRow] = []
        self._pending_rows = 0
        # Imports waiting or being written, the first under way (staged.py), on a cursor of their own.
        self._imports: collections.deque[StagedImport] = collections.deque()
        self._import_cur = con.cursor()
        self.import_slice_series = 20_000  # an import's writes between two of the writer's flushes
        self.import_slice_samples = 200_000
        self.after_import_slice: Callable[[], None] | None = None  # (tests: a moment inside an import)
        self._noted: list[np.ndarray] | None = None  # series flushed while an import is written
        self._chunks_since_compact = 0
        self.tiers = TierBuilder(self._cur)  # 1-minute and 1-hour points of closed days (tierbuild.py)
        self._tiers_due = clock.monotonic() + TIER_PAUSE_S
        # Days with more than one chunk a series are merged a share at a time (an upgraded store's
        # year of 2-hour chunks), every TIER_STEP_S while any are left.
        self.is_merging_days = True
        self._days_due = clock.monotonic()
        self._size_mark = 0  # the file's size after the last deletion by size (sizecap.py)
        self._last_flush = clock.monotonic()
        self._last_compact = clock.monotonic()
        self.write_errors = 0
        self.failing = ""  # the last write's error while writes fail; "" once one succeeds
        self.dropped_samples = 0
        self.last_error = ""
        self.last_flush_ms: int | None = None
        self.last_compact_ms: int | None = None

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()

    @property
    def pending_samples(self) -> int:
        return self._pending_rows

    # -- the thread ---------------------------------------------------------------------------------

    def _drain_batches(self) -> None:
        while self.batches:
            self._add_batch(self.batches.popleft())

    def _run(self) -> None:
        while True:
            try:
                item = (
                    self.queue.get_nowait()
                    if self._imports
                    else self.queue.get(timeout=self._flush_interval_s)
                )
            except queue.Empty:
                item = None
            try:
                self._drain_batches()
                if item is not None and self._dispatch(item):
                    return
                while self._pending_rows < self._flush_rows:
                    try:
                        item = self.queue.get_nowait()
                    except queue.Empty:
                        break
                    self._drain_batches()
                    if self._dispatch(item):
                        return
                if self._imports:
                    self._step_import()
                    self._drain_batches()  # (those that came during the step)
                self._maybe_flush()  # (after an import's commit: a compaction it made due runs now)
            except Exception as exc:  # noqa: BLE001 - the writer is the job wrapper: it logs, counts and goes on
                self._count_error("writer", exc)

    def _dispatch(self, item: Any) -> bool:
        kind = item[0]
        if kind == "batch":
            self._add_batch(item[1])
        elif kind == "series":
            self._add_series(*item[1:])
        elif kind == "many":
            self._add_many(item[1])
        elif kind == "import":
            self._imports.append(item[1])
        elif kind == "call":
            self._call(item[1], item[2])
        elif kind == "now":  # a question for the writer that writes nothing: no flush first
            self._call(item[1], item[2], flush_first=False)
        elif kind is _STOP:
            self._call(self._finish, item[1])
            return True
        return False

    def _call(self, fn: Callable[[], Any], fut: Future[Any], *, flush_first: bool = True) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        try:
            if flush_first:
                self.flush()
            fut.set_result(fn())
        except (duckdb.Error, OSError) as exc:
            self._count_error("write", exc)
            fut.set_exception(StoreError(f"store write failed: {one_line(exc)}"))
        except Exception as exc:  # noqa: BLE001 - hand any other failure to the caller who asked for this work
            fut.set_exception(exc)

    def _finish(self) -> None:
        while self._imports:  # every import queued is written before the store closes
            self._step_import()
        self.after_rewrite = None  # closing: nobody will read the index
        self._move_head()
        try:
            self._merge_closed_windows(DAY_MERGE_BYTES)
        except (
            duckdb.Error
        ) as exc:  # the samples are all stored: merging is for reads, and waits for the next start
            log.warning("store: closed windows left unmerged at exit: %s", one_line(exc))
        self._cur.execute("CHECKPOINT")

    def _maybe_flush(self) -> None:
        since = self._clock.monotonic() - self._last_flush
        if self._pending_rows and (self._pending_rows >= self._flush_rows or since >= self._flush_interval_s):
            self._guarded(self.flush)
        since = self._clock.monotonic() - self._last_compact
        if self._imports and self._imports[0].is_started:  # it waits for the import under way
            return
        if (
            self._head_rows >= self._compact_rows
            or self._chunks_since_compact >= 4096
            or (self._head_rows and since >= self._compact_interval_s)
        ):
            self._guarded(self._compact_some, "compact")
        elif self.is_merging_days and self._clock.monotonic() >= self._days_due:
            self._guarded(self.merge_days)

        if self._clock.monotonic() >= self._tiers_due:
            self._guarded(self.build_tiers)

    def build_tiers(self, max_batches: int = TIER_BATCHES) -> bool:
        """Build a share of the tiers that is due; return whether more is (then again after
        `TIER_STEP_S`, else after `TIER_PAUSE_S`: a backfill takes a few batches every few seconds)."""
        more = True
        try:
            more = self.tiers.step(self._clock.now_ms(), self.visible_seq - 1, self.head_index, max_batches)
        finally:
            self._tiers_due = self._clock.monotonic() + (TIER_STEP_S if more else TIER_PAUSE_S)
        return more

    def _guarded(self, fn: Callable[[], Any], what: str = "") -> None:
        try:
            fn()
        except (duckdb.Error, OSError) as exc:
            self._count_error(what or fn.__name__, exc)

    def _count_error(self, what: str, exc: BaseException, kept: str = "kept for retry") -> None:
        self.write_errors += 1
        self.last_error = self.failing = f"{what}: {one_line(exc)}"
        log.warning("store %s failed (%s): %s", what, kept, one_line(exc))

    # -- buffering ----------------------------------------------------------------------------------

    def _add_batch(self, batch: Batch) -> None:
        samples = batch.samples
        if not samples:
            return
        if isinstance(samples, TableSamples):
            ids, values = self._ids.of_table(samples.table, samples.numbers), samples.values
        else:
            ids = self._ids.of_samples(samples)
            values = np.fromiter(map(_VALUE, samples), np.float64, ids.size)
        self._buffer(ids, np.full(ids.size, batch.timestamp_ms, np.int64), values)

    def _add_series(self, name: str, labels: Labels, t_ms: np.ndarray, values: np.ndarray) -> None:
        n = t_ms.size
        if not n:
            return
        sid = self._ids.of(name, labels)
        if n < _BULK_MIN:
            self._buffer(np.full(n, sid, np.int32), t_ms, values)
            return
        t_ms, values = dedupe_last(t_ms, values, np.arange(n))
        self._pending_chunks.extend(encode_series(sid, t_ms, values, self._next_seq(1)))
        self._pending_rows += n

    def _add_many(self, items: list[tuple[str, Labels, np.ndarray, np.ndarray]]) -> None:
        """`_add_series` of each; the one-sample series (most of an import of new series) buffered as
        one block rather than one per series, the long ones (a history) encoded together
        (`encode_many`: the same rows, numpy work per chunk length rather than per chunk)."""
        ids: list[int] = []
        times: list[int] = []
        values: list[float] = []
        bulk: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for name, labels, t, v in items:
            if t.size == 1:
                ids.append(self._ids.of(name, labels))
                times.append(int(t[0]))
                values.append(float(v[0]))
                continue
            sid = self._ids.of(name, labels) if t.size >= _BULK_MIN else -1
            if sid in bulk:  # the same series twice: both in order, so that the second wins
                self._add_series(name, labels, *bulk.pop(sid))
                self._add_series(name, labels, t, v)
            elif sid < 0:
                self._add_series(name, labels, t, v)
            else:
                bulk[sid] = dedupe_last(t, v, np.arange(t.size))
        if bulk:
            sids = sorted(bulk)
            first = self._next_seq(len(sids))
            lengths = np.array([bulk[sid][0].size for sid in sids])
            self._pending_chunks.extend(
                encode_many(
                    np.repeat(np.array(sids, np.int64), lengths),
                    np.concatenate([bulk[sid][0] for sid in sids]),
                    np.concatenate([bulk[sid][1] for sid in sids]),
                    np.repeat(first + np.arange(len(sids), dtype=np.int64), lengths),
                )
            )
            self._pending_rows += int(lengths.sum())
        if ids:
            self._buffer(np.array(ids, np.int32), np.array(times, np.int64), np.array(values, np.float64))

    def admit(self, keys: Iterable[tuple[str, Labels]], limits: SeriesLimits) -> None:
        """Count the new series among `keys` (a push's) against `limits`, or raise SeriesLimitExceeded."""
        self._ids.admit(keys, limits, self._clock.monotonic())

    def _buffer(self, ids: np.ndarray, t_ms: np.ndarray, values: np.ndarray) -> None:
        self._pending.append((ids, t_ms, values))
        self._pending_rows += ids.size
        if self._pending_rows > _MAX_PENDING:
            dropped = self._pending.pop(0)
            self._pending_rows -= dropped[0].size
            self.dropped_samples += dropped[0].size
            log.warning("store write buffer full; dropped %d samples", dropped[0].size)

    def _next_seq(self, n: int) -> int:
        seq = self._seq
        self._seq += n
        return seq

    def update_visible(self) -> None:
        """Move `visible_seq` up to the lowest seq reserved but not yet committed (or the next one)."""
        low = self._seq
        if self._pending_chunks:
            low = min(low, min(r.seq for r in self._pending_chunks))
        if self._reserved_from is not None:
            low = min(low, self._reserved_from)
        self.visible_seq = max(self.visible_seq, low)

    def seq_past(self, seq: int) -> None:
        """Number new writes after `seq` (a saved watermark's), whatever was removed since."""
        if self._seq <= seq:
            self._seq = seq + 1
            self.update_visible()

    # -- writing ------------------------------------------------------------------------------------

    @_changes_chunks
    def flush(self) -> None:
        """Write everything buffered in one transaction; on failure keep it for the next try."""
        self._last_flush = self._clock.monotonic()
        new = self._ids.new
        if not (self._pending_rows or new):
            return
        cur = self._cur
        head = None
        if self._pending:
            ids, t_ms, values = (np.concatenate(cols) for cols in zip(*self._pending, strict=True))
            head = {
                "series_id": ids,
                "t_ms": t_ms,
                "v_bits": values.view(np.int64),
                "seq": np.arange(self._seq, self._seq + ids.size, dtype=np.int64),
            }
            self.head_index.add(ids, t_ms)  # before the rows can be seen (headindex.py)
        cur.execute("BEGIN TRANSACTION")
        try:
            if new:  # one columnar insert: executemany takes ~0.1 ms a row
                sqlrows.insert_columns(
                    cur,
                    "series",
                    {
                        "series_id": np.fromiter(map(_SERIES_ID, new), np.int32, len(new)),
                        "name": np.array(list(map(_NAME, new)), dtype=object),
                        "labels": np.array(labels_json(list(map(_LABELS, new))), dtype=object),
                    },
                )
            if head is not None:
                sqlrows.insert_columns(cur, "head", head)
            sqlrows.insert_chunks(cur, self._pending_chunks)
            cur.execute("COMMIT")
        except BaseException:
            sqlrows.rollback(cur)
            raise
        if head is not None:
            self._seq += head["seq"].size
            self._head_rows += head["seq"].size
            self.latest.note(
                self._pending_chunks, head["series_id"], head["t_ms"], head["v_bits"].view(np.float64)
            )
        elif self._pending_chunks:
            self.latest.note(self._pending_chunks, np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        self._chunks_since_compact += len(self._pending_chunks)
        if self._noted is not None:  # written after an import under way, which commits later (latest.py)
            if head is not None:
                self._noted.append(head["series_id"])
            self._noted.append(np.fromiter((r.series_id for r in self._pending_chunks), np.int32))
        self._catalog.add(new)
        self._ids.new, self._pending, self._pending_chunks, self._pending_rows = [], [], [], 0
        self.update_visible()
        self.last_flush_ms = self._clock.now_ms()
        self.failing = ""

    def compact(self, day_bytes: int | None = None) -> None:
        """Move the head into chunks, then merge the chunks of closed windows into one per series and
        those of closed days into one per series and day (at most about `day_bytes` of the latter;
        None: all)."""
        self._move_head()
        self._merge_closed_windows(day_bytes)

    def _compact_some(self) -> None:
        self.compact(DAY_MERGE_BYTES)

    def merge_days(self) -> None:
        """Merge another `DAY_MERGE_BYTES` of closed days' chunks (a store written before day chunks)."""
        self._days_due = self._clock.monotonic() + TIER_STEP_S
        self._merge_closed_windows(DAY_MERGE_BYTES)

    def _merge_closed_windows(self, day_bytes: int | None = None) -> None:
        """Merge closed windows and days a batch of series at a time (rewrite.py), each batch its own
        transaction under `chunk_generation.changing()`, reads going on between batches; then rebuild
        the index. Past `day_bytes` of days merged, the rest waits (`is_merging_days`)."""
        merged = False
        self.is_merging_days = False
        done = 0
        try:
            for batch in rewrite.merge_batches(self._cur):
                if batch.is_day and day_bytes is not None and done >= day_bytes:
                    self.is_merging_days = True
                    break
                with self.chunk_generation.changing():
                    rewrite.merge_series(self._cur, batch.lo_ms, batch.hi_ms, batch.sids)
                merged = True
                done += batch.nbytes if batch.is_day else 0
            if done:
                # The days' 2-hour chunks are deleted: a checkpoint frees their blocks for the rows
                # written next (the tier build's, the next day's), or the file grows by them (bytes
                # a sample in the file after a 7-day load: 2.56 -> 1.83, its rows alone 1.76). It
                # fails while a reader's transaction is open; the next one (DuckDB's own) frees them.
                self._checkpoint("after merging days")
        finally:
            if merged and self.after_rewrite is not None:
                try:
                    self.after_rewrite(self._cur)
                except duckdb.Error as exc:
                    log.debug("after merging windows: %s", one_line(exc))

    @_changes_chunks
    def _move_head(self) -> None:
        """Write the head as chunks and empty it, in one transaction."""
        self.flush()
        self._last_compact = self._clock.monotonic()
        cur = self._cur
        rows = rewrite.head_chunks(cur)
        cur.execute("BEGIN TRANSACTION")
        try:
            sqlrows.insert_chunks(cur, rows)
            cur.execute("DELETE FROM head")
            cur.execute("COMMIT")
        except BaseException:
            sqlrows.rollback(cur)
            raise
        self.head_index.clear()
        self._head_rows = 0
        self._chunks_since_compact = 0
        self.last_compact_ms = self._clock.now_ms()
        # The head's rows are deleted, not gone: DuckDB keeps them, and the WAL that wrote them, until a
        # checkpoint, which its 256 MB threshold brought every ~30 minutes on a 64-GPU node; a kill then
        # left that WAL to replay at the next open (2.71 s, 288 MiB; now 0.29-0.52 s: bench/README.md,
        # "Soak"). One now, while no read runs, drops them with the head empty.
        self._checkpoint("after moving the head")

    def _checkpoint(self, what: str) -> None:
        """Write what is in the WAL into the file and free the blocks of deleted rows. It fails while
        another transaction is open; DuckDB's own checkpoint (`checkpoint_threshold`) does it later."""
        try:
            self._cur.execute("CHECKPOINT")
        except duckdb.Error as exc:
            log.debug("checkpoint %s: %s", what, one_line(exc))

    @_changes_chunks
    def apply_retention(
        self,
        cutoff_ms: int,
        tier_cutoffs: dict[int, int] | None = None,
        size_cap_bytes: int = 0,
        file_bytes: Callable[[], int] | None = None,
    ) -> int:
        """Delete raw samples before `cutoff_ms` (but none of a day the tiers are not built for yet:
        the days it reaches into are built first), tier points of each resolution before its cutoff,
        and series left without either; then, if the file (`file_bytes()`) grew past 90 % of
        `size_cap_bytes`, the oldest raw days and tier points as `sizecap.py` says. Return raw samples
        deleted."""
        # (A retention under a day reaches into today: built early, it is rebuilt as samples come.)
        until = -(-cutoff_ms // DAY_MS) * DAY_MS + GRACE_MS
        self.tiers.step(until, self.visible_seq - 1, self.head_index, RETENTION_BATCHES)
        built = self.tiers.state.built_ms
        deleted = self._delete(min(cutoff_ms, built if built is not None else cutoff_ms), tier_cutoffs or {})
        if not size_cap_bytes or file_bytes is None:
            return deleted
        size = file_bytes()
        by_size = sizecap.cutoffs(
            self._cur, size_cap_bytes, size, self._size_mark, built, self._clock.now_ms()
        )
        if by_size.over > 0:
            more = self._delete(by_size.raw_ms, by_size.tiers)
            self._size_mark = size
            log.warning(
                "retention_size: the database file is %d MB over %d%% of its %d MB cap: deleted %d raw "
                "samples before %s and tier points before %s",
                by_size.over >> 20,
                int(sizecap.KEEP * 100),
                size_cap_bytes >> 20,
                more,
                _iso(by_size.raw_ms),
                ", ".join(f"{_iso(t)} ({res // 60_000} min)" for res, t in sorted(by_size.tiers.items()))
                or "none",
            )
            deleted += more
        return deleted

    def _delete(self, cutoff_ms: int, tier_cutoffs: dict[int, int]) -> int:
        if tier_cutoffs:
            tierrows.delete_before(self._cur, tier_cutoffs)
        deleted, head_old, orphans = rewrite.delete_before(self._cur, cutoff_ms, self._seq - 1)
        self.tiers.raw_floor_ms = max(self.tiers.raw_floor_ms, cutoff_ms)
        self._head_rows -= head_old
        gone = set(orphans)
        self._ids.forget(gone)
        self._catalog.remove(gone)
        self.latest.drop_before(cutoff_ms)
        return deleted + head_old
