"""Scrape batches by series number (SeriesTable/TableSamples): the same samples, markers and report
series as a plain model of Prometheus's rules, and the same stored data as plain Sample batches."""

from __future__ import annotations

import math
import re
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gpuwatch.collect.scrape as scrape_module
from gpuwatch.collect.fetch import FetchResult
from gpuwatch.collect.scrape import Target
from gpuwatch.collect.scrapeconfig import Relabel
from gpuwatch.collect.targetspec import TargetSpec
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ScrapeError
from gpuwatch.core.model import STALE_NAN, STALE_NAN_BITS, Batch, Labels, Sample, SeriesTable, TableSamples
from gpuwatch.promtext.parser import parse
from gpuwatch.store.core import Store

ALL = (-(2**62), 2**62)
TARGET: Labels = (("instance", "h:1"), ("job", "j"))
# Lines of a page: repeated series with other values, one twice in a page, a timestamped one, a line
# that does not parse, one that relabelling drops (`drop_*`), an escaped label (no cache key), labels
# that clash with the target's or are empty, texts that only look as if they might, and two texts of
# one series.
LINES = [
    "a 1",
    "a 2",
    'b{x="1"} 3',
    'b{x="2"} 4',
    'b{x="1"} 5',
    "c 6 1790000000000",
    "c 8 1790000001000",
    "c 7",
    "drop_me 8",
    'drop_too{y="1"} 9',
    'e{z="q\\"uote"} 10',
    "f NaN",
    "g +Inf",
    "not a line",
    'k{job="x"} 11',
    'k{x=""} 12',
    'k{x="",y="1"} 13',
    'k{x="my_job"} 14',
    'instance_up{x="1"} 15',
    'm{x="1",y="2"} 16',
    'm{y="2",x="1"} 17',
]
PAGES = st.lists(st.one_of(st.none(), st.lists(st.sampled_from(LINES), max_size=9)), min_size=1, max_size=7)


def bits(v: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", v))[0])


def norm(samples: list[Sample]) -> list[tuple[str, Labels, object]]:
    """Samples with values compared bit for bit (a NaN is not a staleness marker)."""
    return [(s.name, s.labels, bits(s.value)) for s in samples]


class Model:
    """Prometheus's rules for one target, written plainly: what the batches of a scrape must hold."""

    def __init__(self, limit: int, drop: bool) -> None:
        self.limit, self.drop = limit, drop
        self.last: list[tuple[str, Labels]] = []
        self.ok = False  # did the previous scrape succeed
        self.newest: dict[tuple[str, Labels], int] = {}  # stored timestamped samples: newest time

    def scrape(self, page: str | None, now_ms: int) -> tuple[list[Sample], dict[int, list[Sample]], int]:
        samples: list[Sample] = []
        stamped: dict[int, list[Sample]] = {}
        newest = dict(self.newest)
        error, scraped, invalid = page is None, 0, 0
        if page is not None:
            parsed = parse(page.encode(), openmetrics=False)
            scraped, invalid = len(parsed.samples), len(parsed.errors)
            for name, labels, ts, value in parsed.samples:
                if self.drop and name.startswith("drop_"):
                    continue
                mine = dict(labels)
                for k, v in TARGET:  # honor_labels false: the target's win, a clash is kept as exported_*
                    if mine.get(k):
                        mine["exported_" + k] = mine[k]
                    mine[k] = v
                final = tuple(sorted((k, v) for k, v in mine.items() if v))
                if ts is None:
                    samples.append(Sample(name, final, value))
                elif ts > newest.get((name, final), -(2**63)):  # not a duplicate or out of order
                    newest[name, final] = ts
                    stamped.setdefault(ts, []).append(Sample(name, final, value))
            post = len(samples) + sum(map(len, stamped.values()))
            if self.limit and post > self.limit:
                error = True
            if invalid and not scraped:  # no valid line: a failed scrape
                error = True
        if error:
            samples, stamped = [], {}
        else:
            self.newest = newest
        current = list(dict.fromkeys((s.name, s.labels) for s in samples))
        added = sum(1 for k in current if not self.ok or k not in self.last)
        gone = [k for k in self.last if k not in set(current)]
        post = len(samples) + sum(map(len, stamped.values()))
        samples += [Sample(n, lab, STALE_NAN) for n, lab in gone]
        self.last, self.ok = current, not error
        report = [0.0 if error else 1.0, None, float(scraped), float(post), float(added), float(invalid)]
        samples += [Sample(n, TARGET, v) for n, v in zip(scrape_module.REPORT_NAMES, report, strict=True)]  # type: ignore[misc]
        return samples, stamped, 0 if error else 1


def spec(limit: int, drop: bool) -> TargetSpec:
    relabel = (
        (Relabel(action="drop", source_labels=("__name__",), regex=re.compile("(?:drop_.*)\\Z", re.S)),)
        if drop
        else ()
    )
    return TargetSpec(
        job="j", address="h:1", scheme="http", metrics_path="/metrics", params=(), labels=TARGET,
        interval_s=15.0, timeout_s=10.0, sample_limit=limit, relabel=relabel,
    )  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(pages=PAGES, limit=st.sampled_from([0, 4]), drop=st.booleans(), trim=st.booleans())
def test_batches_equal_the_plain_model(
    pages: list[list[str] | None], limit: int, drop: bool, trim: bool
) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scrape_module, "_MAX_CACHE", 2 if trim else 500_000)  # trim: a new table most scrapes
        check_against_model(pages, limit, drop)


def test_a_page_of_known_and_new_series_numbers_the_new_ones_densely() -> None:
    # page 2: `m` known under another text, `n` new; page 3: `n` under another text, then `m` again
    pages: list[list[str] | None] = [
        ['m{x="1",y="2"} 1'],
        ['m{y="2",x="1"} 2', 'n{x="1"} 3'],
        ['n{ x="1"} 4', 'm{x="1",y="2"} 5'],
    ]
    check_against_model(pages, 0, False)


def check_against_model(pages: list[list[str] | None], limit: int, drop: bool) -> None:
    clock = FakeClock(1_790_000_000)
    body: list[bytes | None] = [None]

    def fetch(spec: TargetSpec, timeout_s: float) -> FetchResult:
        if body[0] is None:
            raise ScrapeError("connection refused")
        return FetchResult(body[0], "text/plain; version=0.0.4")

    target, model = Target(spec(limit, drop), fetch, clock), Model(limit, drop)
    for lines in pages:
        page = None if lines is None else "\n".join(lines) + "\n"
        body[0] = None if page is None else page.encode()
        got = target.scrape()
        want, stamped, up = model.scrape(page, clock.now_ms())
        first = list(got[0].samples)
        assert first[-6].value == up
        first[-5] = first[-5]._replace(value=None)  # type: ignore[arg-type]  # scrape_duration_seconds
        assert [(s.name, s.labels, s.value if s.value is None else bits(s.value)) for s in first] == [
            (s.name, s.labels, s.value if s.value is None else bits(s.value)) for s in want
        ]
        assert [(b.timestamp_ms, norm(list(b.samples))) for b in got[1:]] == [
            (ts, norm(s)) for ts, s in sorted(stamped.items())
        ]
        clock.advance(15)


def test_table_samples_read_as_samples_with_the_staleness_marker_intact() -> None:
    table = SeriesTable()
    a, b = table.add("a", (("x", "1"),)), table.add("b", ())
    samples = TableSamples(table, np.array([b, a, b], np.intp), np.array([1.5, STALE_NAN, math.inf]))
    want = [Sample("b", (), 1.5), Sample("a", (("x", "1"),), STALE_NAN), Sample("b", (), math.inf)]
    assert len(samples) == 3
    assert norm(list(samples)) == norm(want)
    assert norm([samples[1]]) == norm(want[1:2]) and norm(samples[1:]) == norm(want[1:])
    assert bits(samples[1].value) == STALE_NAN_BITS


def stored(store: Store) -> dict[tuple[str, Labels], list[tuple[int, int]]]:
    return {
        (s.name, s.labels): [
            (t, bits(v)) for t, v in zip(s.timestamps_ms.tolist(), s.values.tolist(), strict=True)
        ]
        for s in store.select([], *ALL)
    }


@settings(max_examples=60, deadline=None)
@given(
    rounds=st.lists(
        st.tuples(st.lists(st.integers(0, 5), max_size=8), st.booleans(), st.booleans()),
        min_size=1,
        max_size=6,
    )
)
def test_the_store_keeps_the_same_data_as_from_plain_samples(
    rounds: list[tuple[list[int], bool, bool]],
) -> None:
    """Numbered batches and the same samples as plain batches store the same, through new tables,
    retention that deletes the series behind the numbers, and equal series under two numbers."""
    clock = FakeClock(1_790_000_000)
    by_number, plain = (
        Store.open(None, clock=clock, retention_s=3600),
        Store.open(None, clock=clock, retention_s=3600),
    )
    try:
        table = SeriesTable()
        names = [("m", (("i", str(k % 4)),)) for k in range(6)]  # numbers 4 and 5 repeat 0 and 1
        for name, labels in names:
            table.add(name, labels)
        t_ms = 1_000
        for numbers, new_table, retention in rounds:
            if new_table:
                table = SeriesTable()
                for name, labels in names:
                    table.add(name, labels)
            values = np.arange(len(numbers), dtype=np.float64) + t_ms
            values[::3] = STALE_NAN
            samples = TableSamples(table, np.array(numbers, np.intp), values)
            by_number.append(Batch(t_ms, samples))
            plain.append(Batch(t_ms, list(samples)))
            if retention:  # everything so far is older than the cutoff: every series is deleted
                t_ms += 10**8
                for store in (by_number, plain):
                    store.flush()
                    store.apply_retention(t_ms)
            t_ms += 1_000
            by_number.flush()
            plain.flush()
            assert stored(by_number) == stored(plain)
    finally:
        by_number.close()
        plain.close()
