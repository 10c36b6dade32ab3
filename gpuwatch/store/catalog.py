"""The series catalogue: every known series' id, name and labels, and label matching over it.

Matchers are evaluated in Python over an immutable snapshot that the writer replaces whenever series
appear or disappear (new series: the old snapshot's dicts copied, only their names' groups rebuilt). Readers never
lock for longer than it takes to grab the current snapshot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuwatch.core.model import Labels, Matcher, matcher_predicate

NAME = "__name__"


@dataclass(slots=True, unsafe_hash=True)
class Entry:
    """One series as the catalogue knows it; never changed once made (not frozen: a frozen one takes
    0.67 us to make against 0.18, 50 ms of a 100,000-series import)."""

    series_id: int
    name: str
    labels: Labels
    # Built on the first label match that needs it: most series of a big import are never matched
    # by label, and the dict is a third of what a series costs in memory (bench/README.md).
    _label_map: dict[str, str] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def make(cls, series_id: int, name: str, labels: Labels) -> Entry:
        return cls(series_id, name, labels)

    @property
    def label_map(self) -> dict[str, str]:
        """The labels as a dict with `__name__` (do not change it)."""
        found = self._label_map
        if found is None:
            found = {NAME: self.name, **dict(self.labels)}
            self._label_map = found  # a cache: equality and hash ignore it
        return found


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of the catalogue."""

    by_id: dict[int, Entry]
    by_name: dict[str, tuple[Entry, ...]]


def _index(entries: Iterable[Entry]) -> Snapshot:
    by_id = {e.series_id: e for e in entries}
    groups: dict[str, list[Entry]] = {}
    for e in by_id.values():
        groups.setdefault(e.name, []).append(e)
    return Snapshot(by_id, {k: tuple(v) for k, v in groups.items()})


class Catalog:
    """Thread-safe holder of the current snapshot; only the writer changes it."""

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        self._lock = threading.Lock()
        self._snap = _index(entries)

    def snapshot(self) -> Snapshot:
        """Return the current snapshot (cheap; never changes afterwards)."""
        with self._lock:
            return self._snap

    def add(self, entries: Sequence[Entry]) -> None:
        """Publish newly committed series: the old snapshot's dicts copied (in C), and only the names
        that got series rebuilt, so that many new series cost what they are, not the whole catalogue."""
        if not entries:
            return
        added: dict[str, list[Entry]] = {}
        for e in entries:
            added.setdefault(e.name, []).append(e)
        self.add_grouped({e.series_id: e for e in entries}, added)

    def add_grouped(self, entries: dict[int, Entry], added: dict[str, list[Entry]]) -> None:
        """`add` of new `entries` (by id) grouped by name already (`added`)."""
        if not entries:
            return
        with self._lock:
            old = self._snap
            by_id = {**old.by_id, **entries}
            by_name = dict(old.by_name)
            for name, group in added.items():
                if group:
                    by_name[name] = (*by_name.get(name, ()), *group)
            self._snap = Snapshot(by_id, by_name)

    def remove(self, series_ids: Iterable[int]) -> None:
        """Forget series whose samples are all gone."""
        gone = set(series_ids)
        if gone:
            with self._lock:
                self._snap = _index(e for e in self._snap.by_id.values() if e.series_id not in gone)


def match(snap: Snapshot, matchers: Sequence[Matcher]) -> list[Entry]:
    """Return the entries matching all matchers, sorted by name and labels."""
    candidates: Iterable[Entry] = snap.by_id.values()
    on_name = [m for m in matchers if m.name == NAME]
    exact = next((m for m in on_name if m.op == "="), None)
    if exact is not None:
        candidates = snap.by_name.get(exact.value, ())
    elif on_name:  # test the few distinct names, not every series (`{__name__=~"a|b|c"}`)
        name_tests = [matcher_predicate(m) for m in on_name]
        candidates = [
            e for n, group in snap.by_name.items() if all(test(n) for test in name_tests) for e in group
        ]
        matchers = [m for m in matchers if m.name != NAME]
    tests = [(m.name, matcher_predicate(m)) for m in matchers]
    found = [e for e in candidates if all(test(e.label_map.get(name, "")) for name, test in tests)]
    found.sort(key=lambda e: (e.name, e.labels))
    return found
