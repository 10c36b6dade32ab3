"""An import on its way into the database: its rows prepared a slice at a time for a transaction of
its own, its new series kept out of the writer's id map until that transaction commits.

The writer thread (writer.py; the steps are in importsteps.py) takes an import in steps, doing its
ordinary drain and flush between them, so that samples from GPUs and scrapes keep reaching the database
while a big import is written:

1. count: its series are looked up in the writer's id map, a slice at a time, and the new ones are
   counted against the series limits (SeriesLimitExceeded: nothing written, no transaction begun);
2. write: a transaction is begun on a second cursor of the same connection (DuckDB keeps it apart from
   the writer's own flushes), `seq` numbers are reserved for all its rows, and each slice gets ids for
   its new series and inserts its series rows, head rows and bulk chunks there;
3. commit: the writer resolves the label sets that live writes created meanwhile (their rows move to
   the live id), commits, and only then publishes the new series: the id map, and the catalogue
   entries that the write slices made (the commit merges them in C-level dict copies).

Until the commit nothing of it is visible, also after a crash: the import stays all or nothing.
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from gpuwatch.core.model import Labels, SeriesColumns, SeriesLimits
from gpuwatch.store.catalog import Entry
from gpuwatch.store.chunking import ChunkRow, encode_series
from gpuwatch.store.seriesids import SeriesIds

BULK_MIN = 1024  # series at least this long skip the head and become chunks directly


@dataclass(frozen=True)
class ImportSlice:
    """One slice's rows for the import's transaction."""

    series: dict[str, Any] | None  # the new series' rows
    head: dict[str, np.ndarray] | None
    chunks: list[ChunkRow]


class StagedImport:
    """One import being written (module docstring); the writer thread owns it."""

    def __init__(
        self,
        columns: SeriesColumns,
        limits: SeriesLimits,
        future: Future[None],
        *,
        slice_series: int,
        slice_samples: int,
    ) -> None:
        self.columns = columns
        self.limits = limits
        self.future = future
        self.is_started = False  # its future taken up (set_running_or_notify_cancel)
        self.is_begun = False  # its transaction open
        self._bounds = _slices(columns.starts, slice_series, slice_samples)
        self._counted = 0  # slices looked up
        self._written = 0  # slices written
        self._found: list[int | None] = []  # per series, its id in the live map when counted
        counts = np.diff(columns.starts)
        self._short = counts < BULK_MIN
        self.seqs_needed = int(counts[self._short].sum()) + int((~self._short).sum())
        self.seq = 0  # the next reserved seq (set when begun)
        self.staged: dict[tuple[str, Labels], int] = {}  # its new series' ids: not in the live map yet
        # Its catalogue entries, made a slice at a time and published whole after the commit.
        self.by_id: dict[int, Entry] = {}
        self.by_name: dict[str, list[Entry]] = {}
        self.head: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (ids, t_ms, values) written
        self.chunks: list[ChunkRow] = []

    @property
    def is_counted(self) -> bool:
        return len(self._found) == len(self.columns)

    @property
    def is_written(self) -> bool:
        return self.is_begun and self._written == len(self._bounds)

    def count_slice(self, ids: SeriesIds) -> None:
        """Look up the next slice's series in the live map."""
        i, j = self._bounds[self._counted]
        self._counted += 1
        names, labels = self.columns.names[i:j], self.columns.labels[i:j]
        self._found.extend(ids.lookup(list(zip(names, labels, strict=True))))

    def new_series(self) -> int:
        """How many of its series were not in the live map when counted."""
        return self._found.count(None)

    def write_slice(self, ids: SeriesIds) -> ImportSlice:
        """Give the next slice's new series ids (reserved, not published) and return its rows."""
        i, j = self._bounds[self._written]
        self._written += 1
        columns = self.columns
        found = self._found[i:j]
        series = None
        if None in found:
            names, labels = columns.names[i:j], columns.labels[i:j]
            missing = [k for k, sid in enumerate(found) if sid is None]
            if len(missing) < len(found):
                names, labels = [names[k] for k in missing], [labels[k] for k in missing]
            made = ids.reserve(len(missing))
            self.staged.update(zip(zip(names, labels, strict=True), made, strict=True))
            entries = list(map(Entry, made, names, labels))
            self.by_id.update(zip(made, entries, strict=True))
            if len(set(names)) == 1:  # (an import of one metric)
                self.by_name.setdefault(names[0], []).extend(entries)
            else:
                for entry in entries:
                    self.by_name.setdefault(entry.name, []).append(entry)
            new_ids = np.arange(made.start, made.stop, dtype=np.int32)
            series = {
                "series_id": new_ids,
                "name": np.array(names, dtype=object),
                "labels": np.array(labels_json(labels), dtype=object),
            }
            if len(missing) == len(found):
                sids = new_ids
            else:
                sids = np.array([-1 if sid is None else sid for sid in found], np.int32)
                sids[missing] = new_ids
        else:
            sids = np.array(found, np.int32)
        starts = columns.starts[i : j + 1]
        counts = np.diff(starts)
        short = self._short[i:j]
        a, b = int(starts[0]), int(starts[-1])
        t_ms, values = columns.t_ms[a:b], columns.values[a:b]
        head = None
        if short.all():
            head_ids = np.repeat(sids, counts)
        else:
            per_sample = np.repeat(short, counts)
            head_ids = np.repeat(sids[short], counts[short])
            t_ms, values = t_ms[per_sample], values[per_sample]
        if head_ids.size:
            head = {
                "series_id": head_ids,
                "t_ms": t_ms,
                "v_bits": values.view(np.int64),
                "seq": np.arange(self.seq, self.seq + head_ids.size, dtype=np.int64),
            }
            self.seq += head_ids.size
            self.head.append((head_ids, t_ms, values))
        chunks: list[ChunkRow] = []
        for k in np.flatnonzero(~short).tolist():
            t, v = columns.series(i + k)
            chunks.extend(encode_series(int(sids[k]), t, v, self.seq))
            self.seq += 1
        self.chunks.extend(chunks)
        return ImportSlice(series, head, chunks)

    def collisions(self, made: list[tuple[str, Labels]], ids: SeriesIds) -> dict[int, int]:
        """Of the label sets live writes created while it was written (`made`), those it holds too:
        its id -> the live one, dropped from what it publishes. The caller moves their rows."""
        staged = self.staged
        moved: dict[int, int] = {}
        for key in made:
            mine = staged.pop(key, None)
            live = ids.lookup([key])[0]
            if mine is not None and live is not None:
                moved[mine] = live
        if moved:
            for mine in moved:
                del self.by_id[mine]
            self.by_name = {
                name: [e for e in group if e.series_id not in moved] for name, group in self.by_name.items()
            }
        return moved


def _slices(starts: np.ndarray, most_series: int, most_samples: int) -> list[tuple[int, int]]:
    """Series ranges [i, j) of at most `most_series` series and, where a series allows, `most_samples`
    samples."""
    n = starts.size - 1
    bounds = []
    i = 0
    while i < n:
        j = min(n, i + most_series)
        by_samples = int(np.searchsorted(starts, starts[i] + most_samples, side="right")) - 1
        j = max(i + 1, min(j, by_samples))
        bounds.append((i, j))
        i = j
    return bounds


def labels_json(labels: list[Labels]) -> list[str]:
    """Series' labels as the JSON texts the series table keeps (orjson in C-level maps: 7x json.dumps)."""
    try:
        return list(map(bytes.decode, map(orjson.dumps, labels)))
    except TypeError:  # a lone surrogate (JSON's "\udcff" in a push): json escapes what orjson refuses
        return [json.dumps(found) for found in labels]
