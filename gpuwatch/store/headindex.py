"""Which series the head may hold samples of, kept in memory so reads can leave the head table out.

A read of compacted data (anything older than the last compaction, or a store opened read-only
after `close()` compacted it) finds no head rows, yet asking DuckDB for them costs about a third of
a small read's statement (~0.35 ms of one selector's ~1.1 ms). `HeadIndex` remembers, per series id,
the oldest timestamp the head may hold; a read whose series all have none at or before its end
leaves the head out. Rules that keep it safe (it may say "maybe" wrongly, never "no"):

- at open, it is read from the head table;
- the writer marks the series and timestamps of head rows *before* the transaction inserting them
  (`add`), and counts every mark in `marks`; a failed write leaves marks behind, which only costs
  the saving;
- compaction empties the head: its marks are cleared only after that commit (`clear`);
- retention deletes old head rows and leaves the marks (older than any remaining row: still safe).

A reader that decided to leave the head out checks `marks` again after its statement: if the writer
marked rows meanwhile, they may have been committed before the statement ran, so the read is
repeated with the head (`read.read_samples`).
"""

from __future__ import annotations

import threading

import duckdb
import numpy as np

_NONE = np.iinfo(np.int64).max  # no head rows


class HeadIndex:
    """Per series id, the oldest timestamp the head may hold (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._oldest = np.full(0, _NONE, np.int64)
        self.marks = 0  # number of `add` calls so far: readers compare it before and after a read

    @classmethod
    def load(cls, cur: duckdb.DuckDBPyConnection) -> HeadIndex:
        """Return one describing the head table as it is now."""
        rows = cur.execute("SELECT series_id, min(t_ms) AS t FROM head GROUP BY series_id").fetchnumpy()
        index = cls()
        index.add(np.asarray(rows["series_id"], np.int64), np.asarray(rows["t"], np.int64))
        return index

    def add(self, ids: np.ndarray, t_ms: np.ndarray) -> None:
        """Mark head rows (series `ids`, timestamps `t_ms`) about to be written."""
        ids = np.asarray(ids, np.int64)
        with self._lock:
            self.marks += 1
            if not ids.size:
                return
            size = int(ids.max()) + 1
            if size > self._oldest.size:
                grown = np.full(max(size, 2 * self._oldest.size, 1024), _NONE, np.int64)
                grown[: self._oldest.size] = self._oldest
                self._oldest = grown
            np.minimum.at(self._oldest, ids, np.asarray(t_ms, np.int64))

    def clear(self) -> None:
        """Forget every mark: a compaction moved the whole head into chunks and committed."""
        with self._lock:
            self._oldest = np.full(self._oldest.size, _NONE, np.int64)

    def clear_of(self, ids: np.ndarray, end_ms: int) -> int | None:
        """If the head holds no sample of series `ids` at or before `end_ms`, return `marks` as of that
        answer (for `unmarked_since`); otherwise None."""
        ids = np.asarray(ids, np.int64)
        with self._lock:
            inside = ids[ids < self._oldest.size]
            if inside.size and (self._oldest[inside] <= end_ms).any():
                return None
            return self.marks

    def unmarked_since(self, marks: int) -> bool:
        """Whether nothing was marked since `clear_of` returned `marks`."""
        with self._lock:
            return self.marks == marks
