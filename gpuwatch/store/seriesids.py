"""The writer's series ids: the id of every series it has written or will write, the new series that
wait for the next flush, and the new series the last minute brought through pushes and imports.

Owned by the writer thread; nothing here locks. Sources hand in the same label tuple objects batch
after batch (a scrape target's cache, a GPU's labels), so a batch's series ids are found by the
tuple's identity and the name, hashing no label set; a scrape's numbers into its `SeriesTable` by one
numpy take; an import's columns by C-level `map`s over its (name, labels) keys, a slice at a time
(staged.py), its new ids reserved and published only once it has committed.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from gpuwatch.core.model import Labels, MinuteCounts, Sample, SeriesLimits, SeriesTable, make_labels
from gpuwatch.store.catalog import Entry

_KEY_NAME, _KEY_LABELS = itemgetter(0), itemgetter(1)
_MAX_LABEL_OBJECTS = 200_000  # label tuples remembered by identity (sources that make new ones each time)


class SeriesIds:
    """Series ids by (name, labels), and the new series not yet committed (`new`)."""

    def __init__(self, entries: Iterable[Entry], next_id: int) -> None:
        self._ids: dict[tuple[str, Labels], int] = {(e.name, e.labels): e.series_id for e in entries}
        self._by_labels_obj: dict[int, Any] = {}  # id(labels) -> see of_samples
        # a source's SeriesTable -> its numbers' series ids (see of_table)
        self._table_ids: weakref.WeakKeyDictionary[SeriesTable, np.ndarray] = weakref.WeakKeyDictionary()
        self._next_id = next_id
        self.new: list[Entry] = []  # made since the last flush, published to the catalog after it
        self.recent = MinuteCounts()  # new series admitted through pushes and imports
        # While an import is written: the keys made since it began (staged.py resolves the ones it
        # holds too); None otherwise.
        self.made: list[tuple[str, Labels]] | None = None

    def of(self, name: str, labels: Labels) -> int:
        """The id of `name{labels}` (labels in any order, empty values allowed), made if new."""
        key = (name, labels)
        sid = self._ids.get(key)
        if sid is None:
            clean = (name, make_labels(dict(labels)))
            sid = self._ids.get(clean)
            if sid is None:
                sid = self._make(*clean)
            self._ids[key] = sid
        return sid

    def _make(self, name: str, labels: Labels) -> int:
        sid = self._next_id
        self._next_id += 1
        self.new.append(Entry.make(sid, name, labels))
        self._ids[(name, labels)] = sid
        if self.made is not None:
            self.made.append((name, labels))
        return sid

    def of_samples(self, samples: Sequence[Sample]) -> np.ndarray:
        """Each sample's series id (int32)."""
        by_obj = self._by_labels_obj
        if len(by_obj) > _MAX_LABEL_OBJECTS:
            by_obj.clear()
        get = by_obj.get
        ids: list[int] = []
        id_append = ids.append
        for name, labels, _ in samples:
            # An entry holds the tuple itself, so no other object can have its id while it is here:
            # (labels, name, id) for a tuple seen with one name (a scraped series), or
            # (labels, {name: id}) for one shared by many names (a GPU's labels).
            entry = get(id(labels))
            if entry is not None and len(entry) == 3 and entry[1] == name:
                sid = entry[2]
            elif entry is not None and len(entry) == 2:
                sid = entry[1].get(name)
                if sid is None:
                    sid = entry[1][name] = self.of(name, labels)
            else:
                sid = self.of(name, labels)
                if entry is None:
                    by_obj[id(labels)] = (labels, name, sid)
                else:
                    by_obj[id(labels)] = (labels, {entry[1]: entry[2], name: sid})
            id_append(sid)
        return np.array(ids, np.int32)

    def of_table(self, table: SeriesTable, numbers: np.ndarray) -> np.ndarray:
        """The series ids of numbers into a source's `SeriesTable`: a number -> id array is kept per
        table (-1 until a sample of it arrives), so a batch is one numpy take."""
        ids = self._table_ids.get(table)
        if ids is None or ids.size < len(table):
            grown = np.full(max(64, 2 * len(table)), -1, np.int32)
            if ids is not None:
                grown[: ids.size] = ids
            ids = self._table_ids[table] = grown
        sids = ids[numbers]
        if sids.min() < 0:  # series this writer has not seen under these numbers yet
            unseen = np.unique(numbers[sids < 0]).tolist()
            names, labels = table.names, table.labels
            keys = list(zip(map(names.__getitem__, unseen), map(labels.__getitem__, unseen), strict=True))
            ids[unseen] = self._of_keys(keys)
            sids = ids[numbers]
        return sids

    def _of_keys(self, keys: list[tuple[str, Labels]]) -> np.ndarray:
        """The ids (int32) of (name, labels) keys in `make_labels` form, made for those not seen yet."""
        found = list(map(self._ids.get, keys))
        if None not in found:
            return np.array(found, np.int32)
        missing = [k for k, sid in enumerate(found) if sid is None]
        new = keys if len(missing) == len(keys) else [keys[k] for k in missing]
        fill: list[int] | range | None = self._make_distinct(new)
        if fill is None:  # a key twice among them gets one id
            unique = list(dict.fromkeys(new))
            made = self._make_many(unique, list(map(_KEY_NAME, unique)), list(map(_KEY_LABELS, unique)))
            fill = made if len(unique) == len(new) else list(map(self._ids.__getitem__, new))
        if len(missing) == len(keys):
            return np.array(fill, np.int32)
        sids = np.array([-1 if sid is None else sid for sid in found], np.int32)
        sids[missing] = fill
        return sids

    def _make_distinct(self, keys: list[tuple[str, Labels]]) -> list[int] | None:
        """Make ids for new keys, hashing each once; None (making none) if a key is there twice."""
        ids, first = self._ids, self._next_id
        made = list(range(first, first + len(keys)))  # (one int object per series, shared)
        before = len(ids)
        for _ in map(ids.setdefault, keys, made):
            pass
        if len(ids) - before < len(keys):
            for key in keys:
                if ids.get(key, -1) >= first:
                    del ids[key]
            return None
        self._next_id = first + len(keys)
        self.new.extend(map(Entry, made, map(_KEY_NAME, keys), map(_KEY_LABELS, keys)))
        return made

    def _make_many(self, keys: list[tuple[str, Labels]], names: list[str], labels: list[Labels]) -> range:
        """Make ids for new keys (all distinct), in C-level passes; return them."""
        first = self._next_id
        self._next_id += len(keys)
        made = range(first, self._next_id)
        self._ids.update(zip(keys, made, strict=True))
        self.new.extend(map(Entry, made, names, labels))
        if self.made is not None:
            self.made.extend(keys)
        return made

    def lookup(self, keys: list[tuple[str, Labels]]) -> list[int | None]:
        """The ids of (name, labels) keys in `make_labels` form, None for those not known; makes none."""
        return list(map(self._ids.get, keys))

    def reserve(self, n: int) -> range:
        """`n` ids for an import's new series, made known only by `publish` after it commits."""
        first = self._next_id
        self._next_id += n
        return range(first, self._next_id)

    def publish(self, staged: dict[tuple[str, Labels], int]) -> None:
        """Make a committed import's new series known (`staged`: their keys and reserved ids)."""
        self._ids.update(staged)  # (a dict's stored hashes: no key hashed again)

    def admit(self, keys: Iterable[tuple[str, Labels]], limits: SeriesLimits, now_s: float) -> None:
        """Count the series among `keys` that are new against `limits` (and in `recent`), or raise
        SeriesLimitExceeded; their ids are made when their samples arrive."""
        ids = self._ids
        new = [k for k in set(keys) if k not in ids and (k[0], make_labels(dict(k[1]))) not in ids]
        limits.admit(len(new), self.recent, now_s)

    def forget(self, gone: set[int]) -> None:
        """Drop series deleted by retention."""
        if gone:
            self._ids = {k: v for k, v in self._ids.items() if v not in gone}
            self._by_labels_obj.clear()
            self._table_ids.clear()
