"""The `Store`: an embedded DuckDB time-series database with one writer thread.

Threads: `append`/`append_series` only enqueue. The writer thread owns every write (see `writer.py`).
Reads (what selectors read: `selection.py`) run on the calling thread with a cursor of its own (DuckDB
connections must not be shared between threads, duckdb/duckdb#6248), so any number of threads may read;
at most `READERS` sample read statements run in DuckDB at once, and none while the writer compacts
(`readgate.py`). `flush`, `compact`, `apply_retention` and `close` hand their work to the writer and
wait for it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import StoreError, one_line
from gpuwatch.core.model import (
    NO_SERIES_LIMITS,
    Batch,
    Labels,
    Matcher,
    SeriesColumns,
    SeriesLimits,
)
from gpuwatch.core.tiers import HOUR_MS, MINUTE_MS
from gpuwatch.store import alerthistory as history_table
from gpuwatch.store import logs as logs_table
from gpuwatch.store import schema, sizecap
from gpuwatch.store.appended import AppendedReads
from gpuwatch.store.budget import MemoryBudget
from gpuwatch.store.catalog import Catalog, Entry, Snapshot
from gpuwatch.store.chunkcache import ChunkCache
from gpuwatch.store.chunkindex import ChunkIndex, Generation
from gpuwatch.store.headindex import HeadIndex
from gpuwatch.store.lock import DirLock
from gpuwatch.store.read import Statements
from gpuwatch.store.readgate import ReadGate
from gpuwatch.store.selection import SeriesSelection
from gpuwatch.store.tables import SideTables
from gpuwatch.store.writer import _STOP, Writer

log = logging.getLogger(__name__)

DB_FILE = "gpuwatch.duckdb"
_BACKPRESSURE_ITEMS = 64


MEMORY_LIMIT_MB = 64  # DuckDB's memory_limit where no budget is given (`budget.py` shares one out)
# How long each tier keeps its points (the `retention_1m` and `retention_1h` settings); raw samples
# are kept for `retention`.
TIER_RETENTION_S = {MINUTE_MS: 90 * 86400.0, HOUR_MS: 730 * 86400.0}
CHUNK_CACHE_MB = 128  # decoded chunks kept for reads (chunkcache.py); the `chunk_cache_mb` setting
# Sample read statements in DuckDB at once (readgate.py); DuckDB runs one thread a statement, so two keep both
# cores of a small machine busy.
READERS = 2


class Store(SeriesSelection, SideTables, AppendedReads):
    """Time-series samples in DuckDB (and the appliance's other tables: `tables.py`); build it with
    `Store.open`."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        *,
        clock: Clock,
        retention_s: float,
        path: Path | None,
        lock: DirLock | None,
        writer: Writer | None,
        catalog: Catalog,
        chunk_cache_mb: float | None = None,
        memory: MemoryBudget | None = None,
        tier_retention_s: Mapping[int, float] = TIER_RETENTION_S,
        size_cap_bytes: int = 0,
    ) -> None:
        self._con = con
        self._memory = memory
        self._overdrawn_said = False
        self._clock = clock
        self._retention_s = retention_s
        self._tier_retention_s = dict(tier_retention_s)
        self._size_cap_bytes = size_cap_bytes  # 0: none (an in-memory store has no file to cap)
        self._built_ms = None
        self._raw_floor = None
        self._path = path
        self._lock = lock
        self._writer = writer
        self._catalog = catalog
        self._local = threading.local()
        self._cursors: dict[threading.Thread, duckdb.DuckDBPyConnection] = {}  # each reading thread's
        self._statements = Statements()
        self._guard = threading.Lock()
        self._gate = writer.read_gate if writer is not None else ReadGate(READERS)
        self._closed = False
        self._dropped = 0
        self._head_index: HeadIndex | None = None if writer is None else writer.head_index
        # Chunks in memory for reads; a read-only store's generation never moves (nothing writes).
        generation = Generation() if writer is None else writer.chunk_generation
        self._chunks: ChunkCache | None = None
        if memory is None:  # a fixed cache (tests and tools that open a store by hand)
            mb = CHUNK_CACHE_MB if chunk_cache_mb is None else chunk_cache_mb
            if mb > 0:
                self._chunks = ChunkCache(generation, int(mb * 2**20), clock)
        elif memory.cache_cap_mb != 0:
            start = memory.cache_bytes(memory.index_bytes(len(catalog.snapshot().by_id), 0))
            self._chunks = ChunkCache(generation, start, clock, share=self._cache_share)
        if writer is not None and self._chunks is not None:
            writer.after_rewrite = self._chunks.refresh  # the index rebuilt off the query path
        # Series matched by selectors, per catalog snapshot (a panel or rule selects the same again).
        self._matched: tuple[Snapshot | None, dict[tuple[Matcher, ...], list[Entry]]] = (None, {})

    @classmethod
    def open(
        cls,
        data_dir: Path | None,
        *,
        clock: Clock,
        flush_interval_s: float = 2.0,
        retention_s: float = 30 * 86400,
        read_only: bool = False,
        compact_interval_s: float = 300.0,
        compact_rows: int = 1_000_000,
        chunk_cache_mb: float | None = None,
        memory: MemoryBudget | None = None,
        tier_retention_s: Mapping[int, float] = TIER_RETENTION_S,
        size_cap_bytes: int = 0,
    ) -> Store:
        """Open (creating if needed) the store in `data_dir`, or an in-memory one for None."""
        lock = None
        path = None
        try:
            if data_dir is None:
                con = duckdb.connect(":memory:")
            else:
                data_dir = Path(data_dir)
                path = data_dir / DB_FILE
                if read_only and not path.exists():
                    raise StoreError(f"no gpuwatch data in {data_dir}: {path} does not exist")
                data_dir.mkdir(parents=True, exist_ok=True)
                lock = DirLock(data_dir)
                # An appliance shares the machine with training jobs: DuckDB's defaults (80% of RAM,
                # one thread per core, a 128 MB allocator cache) let a 64-GPU node grow past 200 MB
                # of RSS. Blocks of the file are re-read from disk (page cache) when evicted. Given at
                # the connect, the cap also holds while DuckDB replays the WAL a kill left (240 MB of
                # the head's rows, DuckDB alone: peak RSS 291 -> 133 MiB; bench/README.md, "Soak").
                duckdb_mb = MEMORY_LIMIT_MB if memory is None else memory.duckdb_mb
                config: dict[str, str | bool | int | float | list[str]] = {
                    "memory_limit": f"{duckdb_mb}MB",
                    "allocator_flush_threshold": "4MB",
                    "threads": "1",
                }
                if not read_only:
                    # DuckDB's default (16 MB) checkpoints so often during bulk loads that rewritten
                    # blocks leave the file ~60% free space; 256 MB keeps it within 2% of the data.
                    # Live, each compaction checkpoints (writer.py), so the WAL holds ~5 minutes.
                    config["checkpoint_threshold"] = "256MB"
                con = duckdb.connect(str(path), read_only=read_only, config=config)
        except duckdb.Error as exc:
            if lock is not None:
                lock.release()
            raise StoreError(f"cannot open the store at {path}: {one_line(exc)}") from None
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        try:
            cur = con.cursor()
            version = schema.read_version(cur)
            if version > schema.LATEST:
                raise StoreError(
                    f"the store at {path} has schema version {version}, written by a newer gpuwatch; "
                    f"this one reads up to {schema.LATEST}: run the newer gpuwatch"
                )
            if read_only and version != schema.LATEST:
                raise StoreError(
                    f"the store at {path} has schema version {version}, this gpuwatch needs "
                    f"{schema.LATEST}; start `gpuwatch serve` on it once to upgrade it"
                )
            if not read_only:
                try:
                    schema.migrate(cur, clock.now_ms())
                except duckdb.Error as exc:
                    raise StoreError(
                        f"cannot upgrade the store at {path} from schema version {version} "
                        f"(left as it was): {one_line(exc)}"
                    ) from None
            catalog = Catalog(
                Entry.make(sid, name, tuple((k, v) for k, v in json.loads(labels)))
                for sid, name, labels in cur.execute("SELECT series_id, name, labels FROM series").fetchall()
            )
            cur.close()
            writer = None
            if not read_only:
                writer = Writer(
                    con,
                    catalog,
                    clock,
                    flush_interval_s=flush_interval_s,
                    compact_interval_s=compact_interval_s,
                    compact_rows=compact_rows,
                    read_gate=ReadGate(READERS),
                )
                writer.start()
        except BaseException:
            con.close()
            if lock is not None:
                lock.release()
            raise
        return cls(
            con,
            clock=clock,
            retention_s=retention_s,
            path=path,
            lock=lock,
            writer=writer,
            catalog=catalog,
            chunk_cache_mb=chunk_cache_mb,
            memory=memory,
            tier_retention_s=tier_retention_s,
            size_cap_bytes=size_cap_bytes,
        )

    # -- writing --------------------------------------------------------------------------------------

    def append(self, batch: Batch) -> None:
        """Queue one batch for writing; never blocks and never raises for database trouble."""
        if self._closed or self._writer is None:
            self._dropped += len(batch.samples)
            return
        self._writer.batches.append(batch)

    def append_series(self, name: str, labels: Labels, timestamps_ms: np.ndarray, values: np.ndarray) -> None:
        """Queue many samples of one series (import, backfill); waits while a lot is already queued."""
        t = np.array(timestamps_ms, dtype=np.int64)
        v = np.array(values, dtype=np.float64)
        if t.shape != v.shape or t.ndim != 1:
            raise ValueError("timestamps_ms and values must be 1-d arrays of the same length")
        if self._writer is None or self._closed:
            raise StoreError("the store is closed or open read-only")
        if self._writer.queue.qsize() >= _BACKPRESSURE_ITEMS:
            self.flush()  # let a bulk import wait for the writer rather than fill memory
        self._writer.queue.put(("series", name, labels, t, v))

    def append_many(self, series: Sequence[tuple[str, Labels, np.ndarray, np.ndarray]]) -> None:
        """Queue many series at once (an import): one item for the writer, however many series."""
        if self._writer is None or self._closed:
            raise StoreError("the store is closed or open read-only")
        items = []
        for name, labels, timestamps_ms, values in series:
            t = np.array(timestamps_ms, dtype=np.int64)
            v = np.array(values, dtype=np.float64)
            if t.shape != v.shape or t.ndim != 1:
                raise ValueError("timestamps_ms and values must be 1-d arrays of the same length")
            items.append((name, labels, t, v))
        if self._writer.queue.qsize() >= _BACKPRESSURE_ITEMS:
            self.flush()
        self._writer.queue.put(("many", items))

    def write_columns(self, columns: SeriesColumns, limits: SeriesLimits = NO_SERIES_LIMITS) -> None:
        """Write many series (an import) in one transaction, all or nothing, and wait for it; raise
        SeriesLimitExceeded (nothing written) if their new series are more than `limits` allow, or
        StoreError (nothing written) if the database refused it. The writer keeps flushing other
        samples while it is written (staged.py)."""
        writer = self._need_writer()
        if self._closed:
            raise StoreError("the store is closed")
        fut = writer.submit_import(columns, limits)
        with self._gate.paused():
            fut.result()

    def admit_series(self, keys: Iterable[tuple[str, Labels]], limits: SeriesLimits) -> None:
        """Count the new series among `keys` (a push's, before it is appended) against `limits` and
        the last minute's, or raise SeriesLimitExceeded; waits for the writer, which need not flush."""
        writer = self._need_writer()
        self._ask(lambda: writer.admit(keys, limits), kind="now")

    def flush(self) -> None:
        """Block until everything appended so far is written; raise StoreError if it could not be."""
        self._ask(lambda: None)

    def compact(self) -> None:
        """Move the recent write buffer into series-sorted chunks."""
        self._ask(self._need_writer().compact)

    def build_tiers(self, max_batches: int = 1_000_000) -> bool:
        """Build the tier points that are due now (the writer builds them in the background, a few
        batches at a time); return whether more is due."""
        writer = self._need_writer()
        return bool(self._ask(lambda: writer.build_tiers(max_batches)))

    def apply_retention(self, now_ms: int) -> int:
        """Delete samples older than the retention period and series left empty; return samples deleted."""
        # On the minute: a deleted sample's 1-minute bucket then ends at or before every kept sample
        # (`SeriesSelection._raw_floor_ms` tells from that whether raw samples were deleted).
        cutoff = (now_ms - int(self._retention_s * 1000)) // MINUTE_MS * MINUTE_MS
        tier_cutoffs = {res: now_ms - int(keep_s * 1000) for res, keep_s in self._tier_retention_s.items()}
        writer = self._need_writer()
        path = self._path

        def file_bytes() -> int:
            return 0 if path is None else sizecap.file_bytes(path)

        def apply() -> int:
            deleted = writer.apply_retention(
                cutoff, tier_cutoffs, self._size_cap_bytes if path is not None else 0, file_bytes
            )
            logs_table.delete_before(writer._cur, cutoff)
            history_table.delete_before(writer._cur, cutoff)
            return deleted

        deleted = int(self._ask(apply))
        self._raw_floor = None  # read again: the oldest raw samples may be gone
        return deleted

    def _need_writer(self) -> Writer:
        if self._writer is None:
            raise StoreError("the store is open read-only")
        return self._writer

    def _ask(self, fn: Any, kind: str = "call") -> Any:
        if self._closed:
            raise StoreError("the store is closed")
        writer = self._need_writer()
        fut: Future[Any] = Future()
        writer.queue.put((kind, fn, fut))
        with self._gate.paused():
            return fut.result()

    # -- reading --------------------------------------------------------------------------------------

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        cur: duckdb.DuckDBPyConnection | None = getattr(self._local, "cursor", None)
        if cur is None:
            with self._guard:
                if self._closed:
                    raise StoreError("the store is closed")
                for thread in [t for t in self._cursors if not t.is_alive()]:
                    self._cursors.pop(thread).close()  # a finished thread's: nothing else uses it
                cur = self._con.cursor()
                self._cursors[threading.current_thread()] = cur
            self._local.cursor = cur
        return cur

    # -- housekeeping ---------------------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        """Return the in-memory counters of stats() without touching the database (cheap, for every tick)."""
        w = self._writer
        return {
            "series": len(self._snapshot().by_id),
            "write_errors": w.write_errors if w else 0,
            "write_failing": w.failing if w else "",
            "dropped_samples": self._dropped + (w.dropped_samples if w else 0),
            "queue_depth": (w.queue.qsize() + len(w.batches)) if w else 0,
            "pending_samples": w.pending_samples if w else 0,
            "last_flush_ms": w.last_flush_ms if w else None,
            "chunk_cache_bytes": self._chunks.bytes if self._chunks is not None else 0,
        }

    def _index_bytes(self, index: ChunkIndex | None) -> int:
        """What the series catalogue and the chunk and head indexes hold now (`budget.py`)."""
        chunk_bytes = index.nbytes if index is not None else 0
        return MemoryBudget.index_bytes(len(self._snapshot().by_id), chunk_bytes)

    def _cache_share(self, index: ChunkIndex | None) -> int:
        """The chunk cache's share of the budget beside `index` (said once where it is overdrawn)."""
        memory = self._memory
        assert memory is not None  # only a budgeted cache asks
        held = self._index_bytes(index)
        if memory.overdrawn(held) and not self._overdrawn_said:
            self._overdrawn_said = True
            log.warning(
                "store_memory_mb %d is overdrawn: the indexes of %d series hold %.0f MB; raise it, or keep "
                "raw samples for a shorter retention",
                memory.total_mb,
                len(self._snapshot().by_id),
                held / 2**20,
            )
        return memory.cache_bytes(held)

    def memory_figures(self) -> dict[str, int]:
        """Return the budget and what its parts hold now, in bytes, for /metrics (no database statement);
        the cache's share follows the indexes here too, as series arrive between compactions."""
        chunks = self._chunks
        index = chunks.current_index() if chunks is not None else None
        held = self._index_bytes(index)
        if chunks is not None and self._memory is not None:
            share = self._cache_share(index)
            if share != chunks.max_bytes:
                chunks.resize(share)
        out = {"index_bytes": held, "chunk_cache_limit_bytes": chunks.max_bytes if chunks is not None else 0}
        if self._memory is not None:
            out["budget_bytes"] = self._memory.total_mb * 2**20
        return out

    def _duckdb_figure(self, sql: str) -> int | None:
        """The one number `sql` (a sum over one of DuckDB's own table functions) answers, or None if
        DuckDB cannot say (~0.25 ms)."""
        try:
            # fetchall: a result not read to its end keeps its transaction open (no checkpoint then)
            rows = self._cursor().execute(sql).fetchall()
        except (duckdb.Error, StoreError):
            return None
        return int(rows[0][0]) if rows else None

    def duckdb_memory_bytes(self) -> int | None:
        """Return the memory DuckDB's buffer manager holds now (its tables' pages, the head, the
        statements' working memory: at most `MEMORY_LIMIT_MB`), or None if it cannot say."""
        return self._duckdb_figure("SELECT coalesce(sum(memory_usage_bytes), 0) FROM duckdb_memory()")

    def duckdb_dead_queue_nodes(self) -> int | None:
        """Return how many nodes DuckDB's eviction queues hold for blocks that are gone: each keeps ~200
        bytes of heap that `duckdb_memory_bytes` does not count, and a queue is purged only past 32,768
        of them (~45 MB over ~7 queues, reached at the pace of reads: bench/README.md, "Soak"); None
        where this DuckDB cannot say (one without `duckdb_eviction_queues()`)."""
        nodes = self._duckdb_figure("SELECT coalesce(sum(dead_nodes), 0) FROM duckdb_eviction_queues()")
        return None if nodes is None else max(0, nodes)

    def stats(self) -> dict[str, Any]:
        """Return counters for /-/health and /metrics, with sample counts and file size (queries the database)."""
        snap = self._snapshot()
        row = (
            self._cursor()
            .execute(
                "SELECT (SELECT coalesce(sum(n), 0) FROM chunks), (SELECT count(*) FROM head), "
                "(SELECT count(*) FROM chunks)"
            )
            .fetchone()
        )
        chunk_samples, head_samples, chunks = (int(x) for x in row) if row else (0, 0, 0)
        file_bytes = 0
        if self._path is not None:
            for p in (self._path, self._path.with_name(self._path.name + ".wal")):
                file_bytes += p.stat().st_size if p.exists() else 0
        w = self._writer
        return {
            "series": len(snap.by_id),
            "samples": chunk_samples + head_samples,
            "head_samples": head_samples,
            "chunks": chunks,
            "file_bytes": file_bytes,
            "write_errors": w.write_errors if w else 0,
            "last_error": w.last_error if w else "",
            "dropped_samples": self._dropped + (w.dropped_samples if w else 0),
            "queue_depth": (w.queue.qsize() + len(w.batches)) if w else 0,
            "pending_samples": w.pending_samples if w else 0,
            "last_flush_ms": w.last_flush_ms if w else None,
            "last_compact_ms": w.last_compact_ms if w else None,
            "read_only": w is None,
        }

    def close(self) -> None:
        """Flush, compact, checkpoint, close the database and release the lock; safe to call twice.

        Everything is released even when the last writes fail (a full disk); then StoreError says, in
        one line, how many samples were not written."""
        with self._guard:
            if self._closed:
                return
            self._closed = True
        problem = ""
        try:
            if self._writer is not None:
                fut: Future[Any] = Future()
                self._writer.queue.put((_STOP, fut))
                try:
                    with self._gate.paused():
                        fut.result()
                except Exception as exc:  # noqa: BLE001 - closing must finish; the error is reported below
                    problem = one_line(exc)
                self._writer.join()
        finally:
            with self._guard:
                for cur in self._cursors.values():
                    cur.close()
                self._cursors.clear()
            try:
                self._con.close()
            except (duckdb.Error, OSError) as exc:
                problem = problem or one_line(exc)
            if self._lock is not None:
                self._lock.release()
        if problem:
            lost = self._writer.pending_samples if self._writer is not None else 0
            raise StoreError(f"the last {lost} samples could not be written before exit: {problem}")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
