"""RoundCache: rules sharing store reads within a round answer exactly as direct reads do."""

from __future__ import annotations

from pathlib import Path

from gpuwatch.clock import FakeClock
from gpuwatch.model import Batch, Sample, make_labels
from gpuwatch.query import Engine, Vector
from gpuwatch.rules.load import load_groups
from gpuwatch.rules.manager import RuleManager
from gpuwatch.rules.roundcache import RoundCache
from gpuwatch.store import Store

QUERIES = [
    "DCGM_FI_DEV_GPU_UTIL < 50",
    'DCGM_FI_DEV_GPU_UTIL{gpu=~"1|2"}',
    'DCGM_FI_DEV_GPU_UTIL{gpu!="0"} offset 30m',
    "increase(errors_total[1h])",
    'errors_total{kind="a"} - errors_total{kind="a"} offset 1h',
    "absent(nothing_here)",
    '{__name__=~"DCGM_.*", gpu="3"}',
]


def _vec(result: object) -> list[tuple[tuple[tuple[str, str], ...], float]]:
    assert isinstance(result, Vector)
    return sorted((tuple(sorted(s.labels.items())), s.value) for s in result)


def test_cached_reads_answer_as_the_store_does_with_fewer_reads(tmp_path: Path) -> None:
    clock = FakeClock(1_800_000_000)
    store = Store.open(tmp_path / "d", clock=clock)
    try:
        for minute in range(120):
            samples = [
                Sample(
                    "DCGM_FI_DEV_GPU_UTIL", make_labels({"gpu": str(g)}), float((minute * 7 + g * 13) % 100)
                )
                for g in range(4)
            ] + [
                Sample("errors_total", make_labels({"kind": k}), float(minute // (3 if k == "a" else 7)))
                for k in "ab"
            ]
            store.append(Batch(clock.now_ms(), samples))
            clock.advance(60)
        store.flush()
        now = clock.now_ms()
        cache = RoundCache(store)
        for _ in range(2):  # the second round prefetches what the first read
            cache.begin(now)
            before = cache.reads
            for q in QUERIES:
                assert _vec(Engine(cache).instant(q, now)) == _vec(Engine(store).instant(q, now)), q
            reads = cache.reads - before
        assert reads < len(QUERIES) - 2  # one read per window a name was read over, plus `{__name__=~...}`
    finally:
        store.close()


def test_a_rule_reads_what_a_recording_rule_before_it_wrote(tmp_path: Path) -> None:
    clock = FakeClock(1_800_000_000)
    store = Store.open(tmp_path / "d", clock=clock)
    try:
        rules = load_groups(
            "groups: [{name: g, rules: [{alert: Before, expr: 'x:doubled > 0'}, {record: 'x:doubled', expr: 'x * 2'},"
            " {alert: After, expr: 'x:doubled > 5'}]}]",
            "r.yml",
        )
        cache = RoundCache(store)
        m = RuleManager(store, Engine(cache).instant, clock, rules, cache=cache)
        store.append(Batch(clock.now_ms(), [Sample("x", make_labels({"a": "1"}), 3.0)]))
        store.flush()
        m.run_due()
        assert sorted(r.name for r, _ in m.active_alerts()) == [
            "After"
        ]  # Before read x:doubled before it existed
    finally:
        store.close()
