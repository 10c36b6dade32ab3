"""RoundCache: rules sharing store reads within a round answer exactly as direct reads do."""

from __future__ import annotations

import tempfile
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import StoreError
from gpuwatch.core.model import STALE_NAN, Batch, Sample, make_labels
from gpuwatch.query import Engine, Vector
from gpuwatch.rules.load import load_groups
from gpuwatch.rules.manager import RuleManager
from gpuwatch.rules.roundcache import RoundCache
from gpuwatch.store import Store
from gpuwatch.store import writer as writer_module

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


RANGE_QUERIES = [
    "increase(errors_total[1h])",
    "max_over_time(DCGM_FI_DEV_GPU_UTIL[10m])",
    'count_over_time(DCGM_FI_DEV_GPU_UTIL{gpu="1"}[3m] offset 2m)',
    "DCGM_FI_DEV_GPU_UTIL",
    "errors_total offset 5m",
    "temp - temp offset 20m",  # last-sample reads only, one of them over a minute back
]


def test_rounds_with_live_writes_backfills_imports_and_retention_between_answer_as_the_store_does(
    tmp_path: Path,
) -> None:
    clock = FakeClock(1_800_000_000)
    store = Store.open(tmp_path / "d", clock=clock, retention_s=3 * 3600)
    cache = RoundCache(store)

    def write(t_ms: int, k: int, gpus: range = range(3)) -> None:
        samples = [
            Sample("DCGM_FI_DEV_GPU_UTIL", make_labels({"gpu": str(g)}), float((k * 7 + g) % 100))
            for g in gpus
        ]
        samples.append(Sample("errors_total", make_labels({"kind": "a"}), float(k // 4)))
        samples.append(Sample("temp", make_labels({"gpu": "0"}), float(k % 13)))
        store.append(Batch(t_ms, samples))

    try:
        for k in range(400):
            write(clock.now_ms(), k)
            clock.advance(15)
        store.flush()
        for rnd in range(12):
            now = clock.now_ms()
            cache.begin(now)
            for q in RANGE_QUERIES:
                assert _vec(Engine(cache).instant(q, now)) == _vec(Engine(store).instant(q, now)), (rnd, q)
            for j in range(3):  # live samples until the next round, one series appearing midway
                write(clock.now_ms(), 400 + rnd * 3 + j, range(4) if rnd >= 6 else range(3))
                clock.advance(5)
            if rnd == 3:  # a backfill inside the kept part of the windows: must be read again
                write(clock.now_ms() - 600_000, 999)
            if rnd == 8:  # an import of a new series reaching back before the cut
                store.append_series(
                    "DCGM_FI_DEV_GPU_UTIL",
                    make_labels({"gpu": "9"}),
                    np.arange(clock.now_ms() - 300_000, clock.now_ms(), 10_000),
                    np.arange(30, dtype=np.float64),
                )
            if rnd == 10:
                store.apply_retention(clock.now_ms() - 1800_000)
            store.flush()
        assert cache.reads < 12 * len(RANGE_QUERIES)
    finally:
        store.close()


def test_a_group_that_runs_every_other_round_answers_as_the_store_does(tmp_path: Path) -> None:
    # The rules job runs every 15 s; a 30 s group (the inference quantiles) reads its names every other
    # round, so they are not in the plan of the round it runs in: it reads them itself.
    clock = FakeClock(1_800_000_000)
    store = Store.open(tmp_path / "d", clock=clock)
    cache = RoundCache(store)
    every_round = "max_over_time(DCGM_FI_DEV_GPU_UTIL[5m])"
    every_other = "sum by (le) (rate(latency_bucket[5m]))"

    def write(k: int) -> None:
        samples = [
            Sample("DCGM_FI_DEV_GPU_UTIL", make_labels({"gpu": str(g)}), float((k * 7 + g) % 100))
            for g in range(3)
        ]
        samples += [
            Sample("latency_bucket", make_labels({"le": le}), float(k * (i + 1))) for i, le in enumerate("12")
        ]
        store.append(Batch(clock.now_ms(), samples))

    try:
        for k in range(60):
            write(k)
            clock.advance(5)
        store.flush()
        reads = []
        for rnd in range(8):
            now = clock.now_ms()
            cache.begin(now)
            before = cache.reads
            queries = [every_round, every_other] if rnd % 2 == 0 else [every_round]
            for q in queries:
                assert _vec(Engine(cache).instant(q, now)) == _vec(Engine(store).instant(q, now)), (rnd, q)
            cache.end()
            reads.append(cache.reads - before)
            for j in range(3):
                write(60 + rnd * 3 + j)
                clock.advance(5)
            store.flush()
        assert reads == [2, 0, 1, 0, 1, 0, 1, 0]  # then prefetched, `latency_bucket` when it was read last
    finally:
        store.close()


T0 = 1_800_000_000_000
_value = st.one_of(st.floats(-5, 5, allow_nan=False), st.just(STALE_NAN))
# a live batch at some second (may be before the last round: late samples, a backfill; or after the
# evaluation time: a future timestamp)
_batch = st.tuples(
    st.just("batch"),
    st.integers(-30, 45),
    st.lists(st.tuples(st.sampled_from(["m", "n"]), st.sampled_from("abc"), _value), max_size=4),
)
_op = st.one_of(
    _batch,
    _batch,
    _batch,
    # an import (long ones become chunks directly)
    st.tuples(
        st.just("series"),
        st.sampled_from("abd"),
        st.lists(st.tuples(st.integers(-40, 40), _value), min_size=1, max_size=10),
    ),
    st.tuples(st.just("compact")),
    st.tuples(st.just("retention"), st.integers(-60, 20)),
)
WINDOW_QUERIES = [
    "count_over_time(m[20s])",
    "sum_over_time(n[35s]) + 0",
    "last_over_time(m[50s] offset 5s)",
    "timestamp(m)",
    "max_over_time(n[1m])",
]


def _bits(result: object) -> list[tuple[tuple[tuple[str, str], ...], bytes]]:
    assert isinstance(result, Vector)
    return sorted((tuple(sorted(s.labels.items())), np.float64(s.value).tobytes()) for s in result)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(_op, st.integers(-3, 12)), min_size=1, max_size=16))
def test_a_cache_over_many_rounds_with_writes_between_answers_as_no_cache(
    ops: list[tuple[tuple, int]],  # type: ignore[type-arg]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Late samples, backfills, imports, compaction and retention between rounds must not matter.
    monkeypatch.setattr(writer_module, "_BULK_MIN", 6)
    clock = FakeClock(T0 / 1000 + 60)
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp), clock=clock, flush_interval_s=3600, retention_s=0)
        cache = RoundCache(store)
        rounds = 0
        try:
            for op, seconds in [*ops, (("compact",), 1), (("compact",), 1)]:
                now = clock.now_ms()
                if op[0] == "batch":
                    by_name: dict[str, list[Sample]] = {}
                    for name, s, v in op[2]:
                        by_name.setdefault(name, []).append(Sample(name, make_labels({"s": s}), v))
                    store.append(Batch(now + op[1] * 1000, [x for xs in by_name.values() for x in xs]))
                elif op[0] == "series":
                    t = np.unique(np.array([now + x * 1000 for x, _ in op[2]], np.int64))
                    store.append_series("m", make_labels({"s": op[1]}), t, np.linspace(0, 1, t.size))
                elif op[0] == "compact":
                    store.compact()
                else:
                    store.apply_retention(now + op[1] * 1000)
                if seconds < 0:  # more writes before the next round, a second later
                    clock.advance(1)
                    continue
                clock.advance(seconds)  # then a round
                store.flush()
                now = clock.now_ms()
                cache.begin(now)
                rounds += 1
                # each query skips every third round (groups of longer intervals): read unplanned after
                for i, q in enumerate(WINDOW_QUERIES):
                    if (rounds + i) % 3:
                        assert _bits(Engine(cache).instant(q, now)) == _bits(Engine(store).instant(q, now)), q
                cache.end()
        finally:
            store.close()


CHAINED_RULES = """
groups:
  - name: a
    rules:
      - {record: 'x:sum', expr: 'sum by (k) (x)'}
      - {alert: A1, expr: 'x:sum > 1', annotations: {v: '{{ $value }}'}}
      - {record: 'x:max', expr: 'max(x:sum)'}
      - {alert: A2, expr: '{__name__=~"x:.*"} > 0', annotations: {v: '{{ $value }}'}}
  - name: b
    rules:
      - {alert: B1, expr: 'x:max > 2', annotations: {v: '{{ $value }}'}}
      - {alert: B2, expr: 'delta(x:sum[1m]) > -100', annotations: {v: '{{ $value }}'}}
      - {record: 'y:last', expr: 'x:max * 2'}
  - name: c
    rules:
      - {alert: C1, expr: 'y:last > 0', annotations: {v: '{{ $value }}'}}
      - {alert: C2, expr: 'count_over_time({__name__="y:last"}[2m]) > 0', annotations: {v: '{{ $value }}'}}
"""


def test_recorded_series_read_through_the_cache_as_through_the_store(tmp_path: Path) -> None:
    # The cache shows what recording rules wrote where the manager would flush the store (a later
    # rule of the group, a later group), and not before; a read it cannot serve gets a real flush.
    rng = np.random.default_rng(3)
    clock = FakeClock(1_800_000_000)
    stores = [Store.open(tmp_path / d, clock=clock, flush_interval_s=3600) for d in "pc"]
    try:
        rules = load_groups(CHAINED_RULES, "r.yml")
        cache = RoundCache(stores[1])
        plain = RuleManager(stores[0], Engine(stores[0]).instant, clock, rules)
        cached = RuleManager(stores[1], Engine(cache).instant, clock, rules, cache=cache)
        names: set[str] = set()
        for _ in range(12):
            samples = [
                Sample("x", make_labels({"k": k, "i": str(i)}), float(rng.integers(-2, 3)))
                for k in "ab"
                for i in range(2)
            ]
            seen = []
            for store, m in zip(stores, (plain, cached), strict=True):
                store.append(Batch(clock.now_ms(), samples))
                store.flush()
                m.evaluate_all()
                seen.append(sorted((r.name, a.labels, a.annotations, a.state) for r, a in m.active_alerts()))
            assert seen[0] == seen[1]
            names.update(name for name, *_ in seen[1])
            clock.advance(15)
        assert names == {"A1", "A2", "B1", "B2", "C1", "C2"}
        for store in stores:
            store.flush()
        for q in ("x:sum", "x:max", "y:last"):
            assert _bits(Engine(stores[0]).instant(f"last_over_time({q}[1m])", clock.now_ms())) == _bits(
                Engine(stores[1]).instant(f"last_over_time({q}[1m])", clock.now_ms())
            )
    finally:
        for store in stores:
            store.close()


def test_series_sampled_together_then_apart_keep_their_own_timestamps(tmp_path: Path) -> None:
    clock = FakeClock(1_800_000_000)
    store = Store.open(tmp_path / "d", clock=clock, flush_interval_s=3600)
    cache = RoundCache(store)
    queries = ["count_over_time(m[1m])", "timestamp(m)", "sum_over_time(m[30s])"]
    try:
        for k in range(12):
            # together in rounds 0-5 and 9-11; in rounds 6-8 the GPUs are sampled apart
            apart = 6 <= k < 9
            for g in "abc":
                t = clock.now_ms() + (1000 * "abc".index(g) if apart else 0)
                store.append(Batch(t, [Sample("m", make_labels({"gpu": g}), float(k))]))
            clock.advance(5)
            store.flush()
            now = clock.now_ms()
            cache.begin(now)
            for q in queries:
                assert _bits(Engine(cache).instant(q, now)) == _bits(Engine(store).instant(q, now)), (k, q)
    finally:
        store.close()


def test_a_round_keeps_no_samples_after_it_ends(tmp_path: Path) -> None:
    clock = FakeClock(1_800_000_000)
    store = Store.open(tmp_path / "d", clock=clock)
    try:
        rules = load_groups(
            "groups: [{name: g, rules: [{record: 'x:max', expr: 'max_over_time(x[1m])'},"
            " {alert: High, expr: 'x:max > 2 and x > 0'}]}]",
            "r.yml",
        )
        cache = RoundCache(store)
        m = RuleManager(store, Engine(cache).instant, clock, rules, cache=cache)
        for k in range(4):
            store.append(Batch(clock.now_ms(), [Sample("x", make_labels({"a": "1"}), float(k))]))
            store.flush()
            m.run_due()
            assert not cache._by_name and not cache._last_by_name and not cache._written
            clock.advance(15)
        assert [r.name for r, _ in m.active_alerts()] == ["High"]  # x:max reached 3 in the last round
        # The first round reads x's window, x's and x:max's last samples; then a round prefetches them in
        # two reads (one per window), and x:max is what the round's recording rule wrote (`wrote`).
        assert cache.reads == 3 + 3 * 2
    finally:
        store.close()


class _FailingSaves:
    """The store, but the first queued alert saves fail (a full disk, say)."""

    def __init__(self, store: Store, failures: int) -> None:
        self.store, self.failures, self.saved = store, failures, 0
        self.append, self.flush, self.alerts, self.select = (
            store.append,
            store.flush,
            store.alerts,
            store.select,
        )
        self.save_alert_history_soon, self.alert_history = store.save_alert_history_soon, store.alert_history

    def save_alerts_soon(self, group_key: str, alerts: list) -> Future:  # type: ignore[type-arg]
        fut: Future = Future()  # type: ignore[type-arg]
        if self.failures:
            self.failures -= 1
            fut.set_exception(StoreError("cannot store the alerts: disk full"))
            return fut
        self.saved += 1
        return self.store.save_alerts_soon(group_key, alerts)


def test_a_queued_alert_save_that_failed_is_logged_and_done_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(1_800_000_000)
    store = Store.open(tmp_path / "d", clock=clock)
    try:
        failing = _FailingSaves(store, failures=1)
        rules = load_groups("groups: [{name: g, rules: [{alert: High, expr: 'x > 1'}]}]", "r.yml")
        cache = RoundCache(store)
        m = RuleManager(failing, Engine(cache).instant, clock, rules, cache=cache)  # type: ignore[arg-type]
        store.append(Batch(clock.now_ms(), [Sample("x", make_labels({"a": "1"}), 3.0)]))
        store.flush()
        with caplog.at_level("WARNING", logger="gpuwatch.rules"):
            m.evaluate_all()  # the save is queued; it fails
            assert failing.saved == 0
            clock.advance(15)
            m.evaluate_all()  # the failure is logged at the start of the next round, and saved again
        assert "cannot save the alerts of group g: cannot store the alerts: disk full" in caplog.text
        assert failing.saved == 1
        store.flush()
        assert [a.rule for a in store.alerts()] == ["High"]
    finally:
        store.close()
