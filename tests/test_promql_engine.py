"""The PromQL engine on its own: results, JSON form, limits, errors, range/instant agreement."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest

from gpuwatch.core.errors import QueryError
from gpuwatch.core.model import Matcher, SeriesData, last_samples, make_labels
from gpuwatch.query import (
    Engine,
    Matrix,
    PromQLEvalError,
    PromQLParseError,
    QueryTimeout,
    QueryTooLarge,
    Scalar,
    String,
    Unsupported,
    Vector,
    format_value,
    to_prometheus_json,
)
from tests.promql_harness import ArrayStore


class CountingSource:
    """A Queryable over ArrayStore that counts select calls."""

    def __init__(self, store: ArrayStore) -> None:
        self.store = store
        self.calls = 0

    def select(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        self.calls += 1
        return self.store.select(matchers, start_ms, end_ms)

    def select_last(self, matchers: Sequence[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return last_samples(self.select(matchers, start_ms, end_ms), start_ms, end_ms)


@pytest.fixture
def source() -> CountingSource:
    store = ArrayStore()
    for i in range(0, 24 * 240):  # 24 h at 15 s
        t = i * 15_000
        for gpu in range(4):
            store.append({"__name__": "util", "gpu": str(gpu)}, t, float((i * (gpu + 1)) % 100))
            store.append({"__name__": "req_total", "gpu": str(gpu)}, t, float(i * (gpu + 1) % 5000))
        for le, share in (("0.1", 0.2), ("0.5", 0.7), ("+Inf", 1.0)):
            store.append({"__name__": "lat_bucket", "le": le}, t, math.floor(i * 10 * share))
    store.prepare()
    return CountingSource(store)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.5, "1.5"),
        (2.0, "2"),
        (1e20, "100000000000000000000"),
        (1e-7, "0.0000001"),
        (-0.0, "-0"),
        (float("nan"), "NaN"),
        (float("inf"), "+Inf"),
        (float("-inf"), "-Inf"),
        (0.1 + 0.2, "0.30000000000000004"),
    ],
)
def test_format_value_matches_go(value: float, text: str) -> None:
    assert format_value(value) == text


def test_json_shapes(source: CountingSource) -> None:
    eng = Engine(source)
    assert to_prometheus_json(eng.instant("1 + 1", 1_000)) == {"resultType": "scalar", "result": [1, "2"]}
    assert to_prometheus_json(eng.instant('"hi"', 1_500)) == {"resultType": "string", "result": [1.5, "hi"]}
    vec = to_prometheus_json(eng.instant('util{gpu="1"}', 60_000))
    assert vec == {
        "resultType": "vector",
        "result": [{"metric": {"__name__": "util", "gpu": "1"}, "value": [60, "8"]}],
    }
    mat = to_prometheus_json(eng.range('util{gpu="0"}', 0, 30_000, 15_000))
    assert mat["result"][0]["values"] == [[0, "0"], [15, "1"], [30, "2"]]


def test_result_types(source: CountingSource) -> None:
    eng = Engine(source)
    assert isinstance(eng.instant("time()", 5_000), Scalar)
    assert isinstance(eng.instant('"x"', 5_000), String)
    assert isinstance(eng.instant("util", 5_000), Vector)
    raw = eng.instant("util[1m]", 60_000)
    assert isinstance(raw, Matrix) and len(raw.series) == 4 and len(raw.series[0].timestamps_ms) == 4
    assert isinstance(eng.range("time()", 0, 60_000, 15_000), Matrix)


@pytest.mark.parametrize(
    "expr",
    [
        "util",
        "rate(req_total[5m])",
        "sum by (gpu) (increase(req_total[1h])) > 10",
        "histogram_quantile(0.9, sum by (le) (rate(lat_bucket[5m])))",
        "avg_over_time(util[30m])",
        "util / on(gpu) group_left util",
        "topk(2, util)",
        "quantile_over_time(0.5, util[10m])",
        "deriv(util[5m])",
        "changes(util[5m]) + resets(req_total[10m])",
        "max_over_time(rate(req_total[1m])[5m:1m])",
        "util offset 5m unless util < 50",
        "stddev(util) + count_values by (gpu) ('v', util) * 0",
    ],
)
def test_range_agrees_with_instant(source: CountingSource, expr: str) -> None:
    eng = Engine(source)
    start, end, step = 3_600_000, 3_600_000 + 10 * 60_000, 60_000
    mat = eng.range(expr, start, end, step)
    by_labels = {tuple(sorted(s.labels.items())): s for s in mat.series}
    for t in range(start, end + 1, step):
        inst = eng.instant(expr, t)
        assert isinstance(inst, Vector)
        for sample in inst:
            s = by_labels[tuple(sorted(sample.labels.items()))]
            (hit,) = np.flatnonzero(s.timestamps_ms == t)
            assert s.values[hit] == pytest.approx(sample.value, nan_ok=True)
        count = sum(int((s.timestamps_ms == t).any()) for s in mat.series)
        assert count == len(inst)


def test_each_selector_fetched_once_per_range_query(source: CountingSource) -> None:
    eng = Engine(source)
    eng.range("rate(req_total[5m]) / rate(req_total[5m])", 0, 86_400_000, 15_000)
    assert source.calls == 1


def test_limits(source: CountingSource) -> None:
    with pytest.raises(QueryTooLarge, match="too many samples"):
        Engine(source, max_samples=100).instant("count_over_time(util[1h])", 3_600_000)
    with pytest.raises(QueryTooLarge, match="exceeded maximum resolution of 11,000 points per timeseries"):
        Engine(source).range("util", 0, 86_400_000, 1_000)
    ticks = iter(range(1000))
    with pytest.raises(QueryTimeout):
        Engine(source, timeout_s=2.0, monotonic=lambda: float(next(ticks))).instant(
            "sum(util) + sum(util)", 0
        )


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("up ==", "parse error: unexpected end of input"),
        ("sum(up) by", "parse error: unexpected end of input"),
        ("foo bar", 'parse error: unexpected identifier "bar"'),
        ('up{a="b"} 5', 'parse error: unexpected number "5"'),
        ("rate(up[5m)", "parse error: unexpected character inside brackets: ')'"),
    ],
)
def test_parse_errors_say_what_is_wrong(source: CountingSource, expr: str, message: str) -> None:
    # promql-parser says only "invalid promql query" for the first three; gpuwatch says what Prometheus says.
    with pytest.raises(PromQLParseError) as e:
        Engine(source).instant(expr, 0)
    assert str(e.value) == message


def test_errors_are_query_errors(source: CountingSource) -> None:
    eng = Engine(source)
    with pytest.raises(PromQLParseError):
        eng.instant("sum(", 0)
    for expr, feature in [
        ("histogram_count(util)", "native histograms"),
        ("limitk(1, util)", "limitk"),
        ("util + fill(0) util", "fill()"),
    ]:
        with pytest.raises(Unsupported, match=feature.replace("(", r"\(").replace(")", r"\)")):
            eng.instant(expr, 0)
    with pytest.raises(PromQLEvalError, match="many-to-many"):
        eng.instant("util + on() util", 60_000)
    with pytest.raises(PromQLEvalError):
        eng.range("util[5m]", 0, 60_000, 15_000)
    assert issubclass(Unsupported, QueryError) and issubclass(QueryTimeout, QueryError)


def test_staleness_and_lookback() -> None:
    from gpuwatch.core.model import STALE_NAN

    store = ArrayStore()
    for t, v in [(0, 1.0), (10_000, 2.0), (20_000, STALE_NAN)]:
        store.append({"__name__": "m"}, t, v)
    store.prepare()
    eng = Engine(store, lookback_ms=60_000)
    assert [s.value for s in eng.instant("m", 15_000)] == [2.0]
    assert len(eng.instant("m", 25_000)) == 0
    assert eng.instant("count_over_time(m[1m])", 30_000).samples[0].value == 2.0
    assert make_labels({"__name__": "m"}) == ()


def test_range_queries_over_a_day_answer_every_step_from_one_read_each(source: CountingSource) -> None:
    # 24 h at 15 s: 5,761 steps. A rate needs two samples in its window, so step 0 (one sample) has none;
    # avg_over_time has one sample there. Each selector is read from the store once, not once per step.
    eng = Engine(source)
    quantile = eng.range(
        "histogram_quantile(0.99, sum by (le) (rate(lat_bucket[5m])))", 0, 86_400_000, 15_000
    )
    rates = eng.range("sum by (gpu) (rate(req_total[1m]))", 0, 86_400_000, 15_000)
    averages = eng.range("avg_over_time(util[30m])", 0, 86_400_000, 15_000)
    assert [s.timestamps_ms.size for s in quantile.series] == [5_760]
    assert [s.timestamps_ms.size for s in rates.series] == [5_760] * 4
    assert [s.timestamps_ms.size for s in averages.series] == [5_761] * 4
    assert int(averages.series[0].timestamps_ms[-1]) == 86_400_000
    assert source.calls == 3


@pytest.mark.parametrize(
    ("text", "step_ms", "range_ms", "rewritten"),
    [
        ("changes(m[26m+4m])", 0, 0, "changes(m[1800000ms])"),
        ("m[30m]", 0, 0, "m[30m]"),
        ("m[1h30m % 1h]", 0, 0, "m[1800000ms]"),
        (
            "sum_over_time(m[29s+1s:20*500ms] offset -(2*5s))",
            0,
            0,
            "sum_over_time(m[30000ms:10000ms] offset -10000ms)",
        ),
        ("m offset (-2 ^ 2)", 0, 0, "m offset -4000ms"),
        ("m offset -step()*2", 5_000, 0, "m offset -5000ms*2"),
        ("count_over_time(m[max_of(min_of(step()+1, 1h), 1ms)])", 5_000, 0, "count_over_time(m[6000ms])"),
        ("m offset min_of(range(), 8s)", 5_000, 10_000, "m offset 8000ms"),
        ("m offset range()", 0, 0, "m "),
        ("m offset 0s", 0, 0, "m "),
        ('m{a="[1+1]", offset="x"}[5m] offset 5m', 0, 0, 'm{a="[1+1]", offset="x"}[5m] offset 5m'),
        ("sum by (offset) (m)", 0, 0, "sum by (offset) (m)"),
    ],
)
def test_duration_expressions_rewrite(text: str, step_ms: int, range_ms: int, rewritten: str) -> None:
    from gpuwatch.query.durations import rewrite

    assert rewrite(text, step_ms, range_ms) == rewritten


def test_duration_expressions_evaluate(source: CountingSource) -> None:
    eng = Engine(source)
    plain = eng.instant("count_over_time(util[5m])", 3_600_000)
    assert eng.instant("count_over_time(util[4m+60s])", 3_600_000) == plain
    shifted = to_prometheus_json(eng.range("util offset 1m", 3_600_000, 3_660_000, 30_000))
    doubled = eng.range("util offset (step()*2)", 3_600_000, 3_660_000, 30_000)
    assert to_prometheus_json(doubled) == shifted
    with pytest.raises(PromQLParseError, match="greater than 0"):
        eng.instant("util[1m-1m]", 0)


def test_the_same_text_with_step_follows_each_querys_step(source: CountingSource) -> None:
    # Parsed texts are kept for the next query; one with step() must still take each query's own step.
    eng = Engine(source)
    for step_ms, offset in ((30_000, "1m"), (15_000, "30s"), (30_000, "1m")):
        got = eng.range("util offset (step()*2)", 3_600_000, 3_660_000, step_ms)
        want = eng.range(f"util offset {offset}", 3_600_000, 3_660_000, step_ms)
        assert to_prometheus_json(got) == to_prometheus_json(want)
    for _ in range(2):  # an error is reported each time, not remembered as an answer
        with pytest.raises(PromQLParseError):
            eng.range("rate(util[5m]", 0, 60_000, 15_000)


def test_range_modifiers_are_unsupported_or_rejected(source: CountingSource) -> None:
    eng = Engine(source)
    with pytest.raises(Unsupported, match="'anchored' range modifier"):
        eng.instant("increase(req_total[5m] anchored)", 0)
    with pytest.raises(Unsupported, match="'smoothed' range modifier"):
        eng.instant("rate(req_total[5m] smoothed)", 0)
    with pytest.raises(PromQLParseError, match="smoothed modifier can only be used with"):
        eng.instant("deriv(util[5m] smoothed)", 0)
