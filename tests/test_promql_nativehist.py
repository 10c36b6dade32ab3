"""Native histogram samples in the engine: presence and the functions Prometheus defines on a mix
of floats and histograms behave as there; every other operation refuses them by name."""

from __future__ import annotations

import math

import pytest

from gpuwatch.query import Engine, Unsupported, Vector
from gpuwatch.query.nativehist import NativeHistogram, go_float
from tests.promql_harness import ArrayStore

H = NativeHistogram(
    count=20, sum=10, zero_threshold=0.001, zero_count=2, positive={0: 1, 1: 2}, negative={0: 1, 1: 2}
)


@pytest.fixture
def engine() -> Engine:
    store = ArrayStore()
    for i in range(5):  # 0, 60, 120, 180, 240 s
        store.append({"__name__": "x", "kind": "float"}, i * 60_000, float(i))
        store.append({"__name__": "x", "kind": "hist"}, i * 60_000, H)
        # floats, then histograms from 180 s on
        store.append({"__name__": "mix"}, i * 60_000, H if i >= 3 else float(i * 10))
    store.prepare()
    return Engine(store)


def _vector(result: object) -> dict[str, float]:
    assert isinstance(result, Vector)
    return {s.labels.get("kind", ""): s.value for s in result}


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (20.0, "20"),
        (0.5, "0.5"),
        (1e6, "1e+06"),
        (123456789.0, "1.23456789e+08"),
        (1e-5, "1e-05"),
        (-2.0, "-2"),
    ],
)
def test_go_float_matches_go_percent_g(value: float, text: str) -> None:
    assert go_float(value) == text


def test_histogram_text_is_prometheus_string_form() -> None:
    assert H.text() == "{count:20, sum:10, [-2,-1):2, [-1,-0.5):1, [-0.001,0.001]:2, (0.5,1]:1, (1,2]:2}"


def test_presence_counts_histograms(engine: Engine) -> None:
    assert _vector(engine.instant("count(x)", 240_000)) == {"": 2}
    assert _vector(engine.instant("group by (kind) (x)", 240_000)) == {"float": 1, "hist": 1}
    assert _vector(engine.instant("count_over_time(x[5m])", 240_000)) == {"float": 5, "hist": 5}
    assert len(engine.instant('absent(x{kind="hist"})', 240_000)) == 0
    labels = {s.labels["v"] for s in engine.instant('count_values("v", x)', 240_000)}
    assert labels == {"4", H.text()}


def test_mixed_windows_give_no_result(engine: Engine) -> None:
    # (0, 240 s] holds floats at 60 and 120 s and histograms at 180 and 240 s: no result, as Prometheus.
    assert len(engine.instant("sum_over_time(mix[4m])", 240_000)) == 0
    assert len(engine.instant("rate(mix[4m])", 240_000)) == 0
    # Only floats in the window: an ordinary answer.
    assert _vector(engine.instant("sum_over_time(mix[2m])", 120_000)) == {"": 30}
    # Functions Prometheus defines on the floats of a mixed window use them alone.
    assert _vector(engine.instant("max_over_time(mix[4m])", 240_000)) == {"": 20}


def test_ignored_where_prometheus_ignores_them(engine: Engine) -> None:
    assert _vector(engine.instant("max(x)", 240_000)) == {"": 4}
    assert _vector(engine.instant("abs(x)", 240_000)) == {"float": 4}
    assert _vector(engine.instant("x > 1", 240_000)) == {"float": 4}
    assert engine.instant("scalar(x)", 240_000).value == 4  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("expr", "what"),
    [
        ('x{kind="hist"}', "a query result"),
        ("sum(x)", "sum()"),
        ("x * 2", "the * operator"),
        ("x > bool 1", "the > operator"),
        ('sum_over_time(x{kind="hist"}[5m])', "sum_over_time()"),
        ("last_over_time(x[5m])", "last_over_time()"),
        ("label_replace(x, 'a', 'b', 'kind', '.*')", "label_replace()"),
        ("x[5m:1m]", "a subquery"),
    ],
)
def test_other_operations_refuse_histograms_by_name(engine: Engine, expr: str, what: str) -> None:
    with pytest.raises(Unsupported) as exc:
        engine.instant(expr, 240_000)
    assert str(exc.value) == f"native histograms are not supported: {what} over histogram samples"
    with pytest.raises(Unsupported):
        engine.range(expr, 0, 240_000, 60_000)


def test_float_series_unaffected(engine: Engine) -> None:
    m = engine.range('x{kind="float"} * 2', 0, 240_000, 60_000)
    assert [list(s.values) for s in m] == [[0.0, 2.0, 4.0, 6.0, 8.0]]
    assert not math.isnan(m.series[0].values[-1])
