"""What selectors read, as `Store` methods: the series their matchers match in the catalogue (remembered
while its snapshot stays), their samples in a range (read.py: chunks, head and the chunk cache) or only
the last one (from each series' newest sample in memory, latest.py, where it can be), and the names and
values of their labels.

Each read runs on the calling thread's own cursor; a DuckDB error becomes a one-line StoreError.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import duckdb
import numpy as np

from gpuwatch.core.errors import StoreError, one_line
from gpuwatch.core.model import Matcher, SeriesData
from gpuwatch.core.tiers import TierPoints, TierSeries, build, concat, cut, only
from gpuwatch.store import tierrows
from gpuwatch.store.catalog import Catalog, Entry, Snapshot, match
from gpuwatch.store.chunkcache import ChunkCache
from gpuwatch.store.headindex import HeadIndex
from gpuwatch.store.read import CachedRead, Statements, ids_with_samples, read_samples, read_samples_cached
from gpuwatch.store.readgate import ReadGate
from gpuwatch.store.writer import Writer

_MATCHED_MAX = 256  # selectors whose matched series are remembered (Store._match)


class SeriesSelection:
    """Mixed into `Store`, which provides the catalogue, the cursors, the chunk cache, the read gate, the
    parsed statements and the writer."""

    _closed: bool
    _catalog: Catalog
    _chunks: ChunkCache | None
    _gate: ReadGate
    _statements: Statements
    _writer: Writer | None
    _head_index: HeadIndex | None
    _matched: tuple[Snapshot | None, dict[tuple[Matcher, ...], list[Entry]]]
    _built_ms: int | None  # a read-only store's `tier_state`, read once (-1: none built)
    _raw_floor: int | None  # the oldest chunk's first timestamp (`_raw_floor_ms`), None: not read yet

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        raise NotImplementedError

    def _heads(self) -> HeadIndex:
        # Read-only: nothing writes the file while it is open (the directory lock), so the head is
        # read once, on first use.
        if self._head_index is None:
            self._head_index = HeadIndex.load(self._cursor())
        return self._head_index

    def _snapshot(self) -> Snapshot:
        if self._closed:
            raise StoreError("the store is closed")
        return self._catalog.snapshot()

    def _read(self, ids: Sequence[int], start_ms: int, end_ms: int) -> CachedRead:
        cur, heads = self._cursor(), self._heads()
        if self._chunks is not None:
            found = read_samples_cached(
                cur, ids, start_ms, end_ms, heads, self._chunks, self._gate, self._statements
            )
            if found is not None:
                return found
        return CachedRead(
            read_samples(cur, ids, start_ms, end_ms, heads, self._gate, self._statements), False
        )

    def _match(self, matchers: Sequence[Matcher]) -> list[Entry]:
        """`match` on the current snapshot, remembered while the snapshot stays (do not change it)."""
        snap, key = self._snapshot(), tuple(matchers)
        matched = self._matched
        if matched[0] is not snap or len(matched[1]) >= _MATCHED_MAX:
            # Only the current snapshot's: an older one (the whole catalog) is not kept alive here.
            matched = self._matched = (snap, {})
        entries = matched[1].get(key)
        if entries is None:
            entries = matched[1][key] = match(snap, matchers)
        return entries

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """Return the series matching all matchers with their samples in [start_ms, end_ms]."""
        entries = self._match(matchers)
        try:
            read = self._read([e.series_id for e in entries], start_ms, end_ms)
        except duckdb.Error as exc:
            raise StoreError(f"store read failed: {one_line(exc)}") from None
        found, clean = read.samples, read.is_stale_free
        return [
            SeriesData(e.name, e.labels, *found[e.series_id], is_stale_free=clean)
            for e in entries
            if e.series_id in found
        ]

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        """Return what `select` returns cut to each series' last sample: for an instant selector.

        Answered from the newest sample of each series kept in memory (`latest.py`) where it is
        provably the newest stored one; the other series are read from the database."""
        entries = self._match(matchers)
        if not entries:
            return []
        ids = np.fromiter((e.series_id for e in entries), np.int64, len(entries))
        if self._writer is None:
            known, t, v = np.zeros(ids.size, bool), ids, ids.astype(np.float64)
        else:
            known, t, v = self._writer.latest.lookup(ids)
        vouched = known & (t <= end_ms)
        found: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        rest = ids[~vouched].tolist()
        if rest:
            try:
                found = self._read(rest, start_ms, end_ms).samples
            except duckdb.Error as exc:
                raise StoreError(f"store read failed: {one_line(exc)}") from None
        out = []
        for i, e in enumerate(entries):
            if vouched[i]:
                if t[i] >= start_ms:  # (views: `lookup` returned arrays of their own)
                    out.append(SeriesData(e.name, e.labels, t[i : i + 1], v[i : i + 1]))
            elif e.series_id in found:
                st, sv = found[e.series_id]
                out.append(SeriesData(e.name, e.labels, st[-1:], sv[-1:]))
        return out

    def _raw_floor_ms(self) -> int:
        """From when on raw samples are all kept; read once, and again after each retention.

        Retention deletes raw samples only where tier points exist, and up to a whole minute (by age)
        or day (by size). So where the oldest tier point's bucket ends after the oldest raw sample,
        nothing was deleted (a point's bucket ends at or after its samples): all raw is kept. Else
        raw samples are kept from the oldest one on."""
        floor = self._raw_floor
        if floor is None:
            with self._gate.reading():
                row = (
                    self._cursor()
                    .execute(
                        "SELECT least((SELECT min(t_min_ms) FROM chunks), (SELECT min(t_ms) FROM head)), "
                        f"least({', '.join(f'(SELECT min(t_min_ms) FROM {t})' for t in tierrows.TABLE.values())})"
                    )
                    .fetchone()
                )
            raw, tier = row if row else (None, None)
            if tier is None or (raw is not None and tier > raw):
                floor = -(2**62)  # nothing deleted
            else:
                floor = 2**62 if raw is None else raw
            self._raw_floor = floor
        return int(floor)

    def _tiers_built(self) -> int | None:
        """The end of the last day whose tier points are all built (None: none is)."""
        if self._writer is not None:
            return self._writer.tiers.state.built_ms
        if self._built_ms is None:  # read-only: nothing builds while it is open
            row = self._cursor().execute("SELECT max(built_ms) FROM tier_state").fetchone()
            self._built_ms = (row[0] if row and row[0] is not None else -1) if row else -1
        return None if self._built_ms == -1 else self._built_ms

    def select_tiers(
        self,
        matchers: Sequence[Matcher],
        res_ms: int,
        start_ms: int,
        end_ms: int,
        columns: Collection[str] | None = None,
    ) -> list[TierSeries] | None:
        """Return the matching series' tier points of resolution `res_ms` (core.tiers), those of the
        buckets ending in (start_ms, end_ms] (multiples of `res_ms`): read from the tier rows for the
        days they are built for, made from the raw samples for the rest (tierbuild.py). None where
        most of the span is not built yet and raw samples still cover all of it: making points from
        samples costs ~10x reading them (bench/README.md, "Face"), so the engine reads samples then.
        `columns` (names of TierPoints' columns; None: all): only those are decoded and returned, the
        others are None (`end_ms` is always there)."""
        built = self._tiers_built()
        split = start_ms if built is None else min(max(built, start_ms), end_ms)
        if 2 * (end_ms - split) > end_ms - start_ms and start_ms >= self._raw_floor_ms():
            return None
        entries = self._match(matchers)
        if not entries or end_ms <= start_ms:
            return []
        ids = [e.series_id for e in entries]
        try:
            stored: dict[int, TierPoints] = {}
            if split > start_ms:
                with self._gate.reading():
                    stored = tierrows.read_points(self._cursor(), ids, res_ms, start_ms, split, columns)
            fresh = self._read(ids, split + 1, end_ms).samples if end_ms > split else {}
        except duckdb.Error as exc:
            raise StoreError(f"store read failed: {one_line(exc)}") from None
        out = []
        for e in entries:
            parts = [stored[e.series_id]] if e.series_id in stored else []
            if e.series_id in fresh:
                t, v = fresh[e.series_id]
                parts.append(only(cut(build(t, v, res_ms), split, end_ms), columns))
            points = concat(parts)
            if points.size:
                out.append(TierSeries(e.name, e.labels, points))
        return out

    def _entries(self, matchers: Sequence[Matcher], start_ms: int | None, end_ms: int | None) -> list[Entry]:
        entries = match(self._snapshot(), matchers)
        if start_ms is None and end_ms is None:
            return entries
        lo = -(2**63) if start_ms is None else start_ms
        hi = 2**63 - 1 if end_ms is None else end_ms
        try:
            with self._gate.reading():
                keep = ids_with_samples(self._cursor(), [e.series_id for e in entries], lo, hi)
        except duckdb.Error as exc:
            raise StoreError(f"store read failed: {one_line(exc)}") from None
        return [e for e in entries if e.series_id in keep]

    def series(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[dict[str, str]]:
        """Return the label sets (with `__name__`) of matching series that have samples in range."""
        return [dict(e.label_map) for e in self._entries(matchers, start_ms, end_ms)]

    def label_names(
        self, matchers: Sequence[Matcher] = (), start_ms: int | None = None, end_ms: int | None = None
    ) -> list[str]:
        """Return the sorted label names (with `__name__`) used by matching series."""
        names = {k for e in self._entries(matchers, start_ms, end_ms) for k in e.label_map}
        return sorted(names)

    def label_values(
        self,
        label: str,
        matchers: Sequence[Matcher] = (),
        start_ms: int | None = None,
        end_ms: int | None = None,
    ) -> list[str]:
        """Return the sorted values of `label` among matching series."""
        entries = self._entries(matchers, start_ms, end_ms)
        return sorted({e.label_map[label] for e in entries if label in e.label_map})
