"""The scrape cache: a reused parser and target give what a fresh parse gives, scrape after scrape."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatch.collect import scrape
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ScrapeError
from gpuwatch.core.model import is_stale
from gpuwatch.promtext.parser import Parser, parse
from gpuwatch.promtext.result import ParsedSample
from gpuwatch.promtext.scanner import LineError, label_entry, parse_float, scan_sample, timestamp_ms
from tests.test_scrape import FakeFetch, L, by_key, pool_for

# Lines that share a series text with different values, and the lines that must not take a cached
# reading: bad values, timestamps, tabs, CR, escapes, a TYPE that makes an `le` invalid, odd spacing.
LINES = [
    "# TYPE h histogram",
    "# HELP h Latency.",
    'h_bucket{le="0.5"} 1',
    'h_bucket{le="0.5"} 2',
    'h_bucket{le="x"} 2',
    'h_bucket{le="+Inf"} 3',
    "h_sum 1.5",
    "h_count 3",
    "# TYPE s summary",
    's{quantile="0.5"} 1',
    's{quantile="a"} 1',
    "a 1",
    "a 2",
    "a 1_0",
    "a 0x1p3",
    "a 1e999",
    "a -Inf",
    "a nan",
    "a NaN",
    "g +Inf",
    "g 1e999",
    "h_bucket 4",
    "a .5",
    "a 5.",
    "a 1e5",
    "a +1",
    "a 1 1700000000000",
    "a 1 17e3",
    "a\t1",
    "a 1\r",
    "a  1",
    "a  2",
    'b{x="1"} 1',
    'b{x="1"} 3',
    'b{x="1",} 3',
    'b{x="1"}3',
    'b{x="1", y="2"} 3',
    'b{x="a b"} 4',
    'b{x="a\\"b"} 4',
    'b{x="1",x="2"} 4',
    "b{} 5",
    "c",
    "c{",
    " a 7",
    "a 7 ",
    "",
    "# a comment",
    "# TYPE a gauge",
    "# TYPE a counter",
    'a{__name__="z"} 1',
]


@settings(max_examples=200, deadline=None)
@given(pages=st.lists(st.lists(st.sampled_from(LINES), max_size=14), min_size=2, max_size=5))
def test_reused_parser_equals_a_fresh_parse(pages: list[list[str]]) -> None:
    reused = Parser()
    for lines in pages:
        text = "\n".join(lines) + "\n"
        got, want = reused.parse(text.encode(), openmetrics=False), parse(text.encode(), openmetrics=False)
        assert _same(got.samples, want.samples)
        assert got.errors == want.errors
        assert got.metadata == want.metadata
        assert len(got.keys) == len(got.samples)
        for (name, labels, ts, _), key in zip(got.samples, got.keys, strict=True):
            if key is not None:  # a key always names the same series, with no timestamp
                assert ts is None
                assert reused._series[key][:2] == (name, labels)


# Lines that take a page's shortcuts once their names were seen (a metric name, a label name), and
# lines that look like them but must not: a brace or quote in a value, blanks, CR, a timestamp, an
# invalid name, a dotted name, an escape, a duplicate or reserved label.
TRICKY = [
    'b{x="1"} 1',
    'b{x="2",y="3"} 2',
    'b{y="3",x="2"} 2',
    'b{x="}"} 1',
    'b{x="1"}} 1',
    'b{x="{"} 1',
    'b{x="1"} 1\r',
    'b{x="1"}  1',
    'b{x="1"}\t1',
    'b{x="1"} 1 1700000000000',
    'b{x="1"}1',
    'b {x="1"} 1',
    'b{ x="1"} 1',
    'b{x= "1"} 1',
    'b{x="1" } 1',
    'b{x="1",} 1',
    'b{x="",y="1"} 1',
    'b{x="a\\"b"} 1',
    'b{x="a"b"} 1',
    'b{x="1",x="2"} 1',
    'b{__name__="z"} 1',
    'b{1x="1"} 1',
    "b{x=1} 1",
    'b{x="1"} 1e999',
    'b{x="1"} 0x1p3',
    'b{x="1"} NaN',
    'b{x="1"}',
    'b.c{x="1"} 1',
    '{"b", x="1"} 1',
    'b{le="0.5"} 1',
    'b{le="x"} 1',
    "c 1",
    "c{} 1",
]


@settings(max_examples=300, deadline=None)
@given(pages=st.lists(st.lists(st.sampled_from(TRICKY), max_size=16), min_size=1, max_size=3))
def test_a_page_reads_each_line_as_the_careful_scanner_does(pages: list[list[str]]) -> None:
    reused = Parser()
    for lines in pages:
        got = reused.parse(("\n".join(lines) + "\n").encode(), openmetrics=False)
        want = [_careful(line) for line in lines]
        assert _same(got.samples, [s for s in want if s is not None])
        assert [e.line_no for e in got.errors] == [n for n, s in enumerate(want, 1) if s is None]


def _careful(line: str) -> ParsedSample | None:
    """One text line read by the character-level scanner alone; None: the line is invalid."""
    try:
        scanned = scan_sample(line.removesuffix("\r"), False)  # (text tolerates CRLF)
        labels = label_entry(scanned.pairs)[0]
        ts = timestamp_ms(scanned.timestamp, False) if scanned.timestamp else None
        return scanned.name, labels, ts, parse_float(scanned.value)
    except LineError:
        return None


def _same(a: list, b: list) -> bool:  # type: ignore[type-arg]
    def norm(s: list) -> list:  # type: ignore[type-arg]
        return [(n, lab, t, "nan" if math.isnan(v) else v) for n, lab, t, v in s]

    return norm(a) == norm(b)


def test_a_changed_value_a_changed_line_and_a_vanished_series(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b'a 1\nb{x="1"} 2\nc 3\n'
    pool, batches = pool_for([{"job_name": "j", "static_configs": [{"targets": ["h:1"]}]}], fetch, clock)
    t = {"job": "j", "instance": "h:1"}
    pool.scrape_all()
    fetch.bodies["h:1"] = b'a 5\nb{x="2"} 2\n'
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    got = by_key(batches)
    assert got[("a", L(**t))] == 5
    assert got[("b", L(x="2", **t))] == 2
    assert is_stale(got[("b", L(x="1", **t))]) and is_stale(got[("c", L(**t))])
    assert got[("scrape_series_added", L(**t))] == 1
    assert len(batches[0].samples) == 2 + 2 + 6  # two samples, two markers, the report series
    fetch.bodies["h:1"] = b'a 6\nb{x="2"} 2\nc 4\n'
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    got = by_key(batches)
    assert got[("c", L(**t))] == 4, "a series that comes back is a series again"
    assert got[("scrape_series_added", L(**t))] == 1
    assert not any(is_stale(v) for v in got.values())


def test_sample_limit_and_failures_reset_what_counts_as_added(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b"a 1\nb 2\n"
    pool, batches = pool_for(
        [{"job_name": "j", "sample_limit": 2, "static_configs": [{"targets": ["h:1"]}]}], fetch, clock
    )
    t = L(job="j", instance="h:1")
    pool.scrape_all()
    assert by_key(batches)[("scrape_series_added", t)] == 2
    for body in (b"a 1\nb 2\nc 3\n", ScrapeError("connection refused")):
        fetch.bodies["h:1"] = body
        clock.advance(15)
        del batches[:]
        pool.scrape_all()
        got = by_key(batches)
        assert got[("up", t)] == 0 and got[("scrape_series_added", t)] == 0
        if isinstance(body, bytes):
            assert is_stale(got[("a", t)]) and is_stale(got[("b", t)]) and ("c", t) not in got
        else:
            assert ("a", t) not in got, "markers were written once, by the first failed scrape"
    fetch.bodies["h:1"] = b"a 1\nb 2\n"
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    got = by_key(batches)
    assert got[("up", t)] == 1 and got[("a", t)] == 1
    assert got[("scrape_series_added", t)] == 2, "after a failed scrape every series is added again"


def test_lines_that_relabel_to_one_series_share_it(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b'a{pod="1"} 1\na{pod="2"} 2\n'
    job = {
        "job_name": "j",
        "static_configs": [{"targets": ["h:1"]}],
        "metric_relabel_configs": [{"action": "labeldrop", "regex": "pod"}],
    }
    pool, batches = pool_for([job], fetch, clock)
    t = L(job="j", instance="h:1")
    pool.scrape_all()
    assert by_key(batches)[("scrape_series_added", t)] == 1
    fetch.bodies["h:1"] = b'a{pod="2"} 3\n'
    clock.advance(15)
    del batches[:]
    pool.scrape_all()
    got = by_key(batches)
    assert got[("a", t)] == 3, "one line left: the series goes on, no staleness marker"
    assert [s.value for s in batches[0].samples if s.name == "a"] == [3]


def test_new_relabel_rules_start_with_an_empty_cache(clock: FakeClock) -> None:
    fetch = FakeFetch()
    fetch.bodies["h:1"] = b'a{pod="1"} 1\n'
    job: dict[str, object] = {"job_name": "j", "static_configs": [{"targets": ["h:1"]}]}
    pool, batches = pool_for([job], fetch, clock)
    pool.scrape_all()
    assert ("a", L(job="j", instance="h:1", pod="1")) in by_key(batches)
    job["metric_relabel_configs"] = [{"action": "labeldrop", "regex": "pod"}]
    reloaded, batches2 = pool_for([job], fetch, clock)
    reloaded.scrape_all()
    got = by_key(batches2)
    assert got[("a", L(job="j", instance="h:1"))] == 1
    assert ("a", L(job="j", instance="h:1", pod="1")) not in got


def test_a_page_bigger_than_the_cache_bound_is_still_cached_at_the_next_parse() -> None:
    """The caches are cleared past `max_cache` entries, or twice the last page's lines where that is
    more: a page of 300 lines under a bound of 100 is found in them at the next parse (each line's
    parse the one kept from before), not parsed afresh at every scrape."""
    parser = Parser(max_cache=100)
    page = "".join(f'm{{i="{i}"}} {i}\n' for i in range(300)).encode()
    first = parser.parse(page, openmetrics=False)
    kept = dict(parser._series)
    second = parser.parse(page, openmetrics=False)
    assert _same(first.samples, second.samples) and len(second.samples) == 300
    assert len(kept) == 300 and all(parser._series[k] is kept[k] for k in kept)
    parser.parse(b"m 1\n", openmetrics=False)  # a small page again: the bound is back to max_cache
    parser.parse(b"m 1\n", openmetrics=False)
    assert len(parser._series) <= 100


def test_label_pieces_a_page_repeats_outlive_the_piece_cache_clearing() -> None:
    """A page of more new series than the bound clears the piece cache as it goes; the oldest pieces
    (those repeated on every line) are kept, so every sample's `job` pair stays one object and equal
    label sets stay identical, while the cache stays within its bound."""
    parser = Parser(max_cache=100)
    page = "".join(f'm{{job="x",i="{i}"}} {i}\n' for i in range(1000)).encode()
    got = parser.parse(page, openmetrics=False).samples
    assert [s[3] for s in got] == [float(i) for i in range(1000)]
    assert got[-1][1] == (("i", "999"), ("job", "x"))
    assert len({id(next(p for p in s[1] if p[0] == "job")) for s in got}) == 1
    assert len(parser._pairs[False]) <= 101


def test_a_target_bigger_than_the_cache_bound_keeps_its_series_numbers(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scrape, "_MAX_CACHE", 100)
    fetch = FakeFetch()
    fetch.bodies["h:1"] = "".join(f'm{{i="{i}"}} {i}\n' for i in range(300)).encode()
    pool, batches = pool_for([{"job_name": "j", "static_configs": [{"targets": ["h:1"]}]}], fetch, clock)
    pool.scrape_all()
    (target,) = pool._targets.values()
    table = target._table
    for _ in range(3):
        clock.advance(15)
        del batches[:]
        pool.scrape_all()
        got = by_key(batches)
        assert got[("m", L(i="299", job="j", instance="h:1"))] == 299
        assert got[("scrape_series_added", L(job="j", instance="h:1"))] == 0
    assert target._table is table  # not started afresh at every scrape
