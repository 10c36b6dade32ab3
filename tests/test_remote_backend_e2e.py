"""The remote query backend against the real stores: a lab's data (tests/labdata.py) written into
Debian's VictoriaMetrics 1.79 and Prometheus 2.42 by remote write and into a gpuwatch store, then every
built-in panel and rule query (tests/remotecompare.py) asked of gpuwatch's engine and of the remote:
the same answers, within float tolerance, except where MetricsQL means something else (listed here
and in docs/scale.md, each with its reason)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from gpuwatch.app.config import Settings, load
from gpuwatch.core.clock import FakeClock
from gpuwatch.query.backend import LocalBackend
from gpuwatch.query.remote import RemoteBackend
from gpuwatch.query.values import Scalar, Vector
from gpuwatch.remote.storage import RemoteStorage
from gpuwatch.store import Store
from tests.conftest import run_prometheus, run_victoriametrics
from tests.labdata import NODE, RUN, LabData, Series, generate, load_store, remote_write, steady
from tests.remotecompare import Asked, ask_both, normal, registry_queries

pytestmark = pytest.mark.slow

VARIABLES = {
    "hostname": NODE,
    "gpu": "0",
    "host_re": "node\\-a",
    "run": RUN,
    "__rate": "60s",
    "__interval": "15s",
    "__range": "1800s",
    "__today": "600s",
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> LabData:
    """52 minutes of a demo node's data, ending now."""
    return generate(tmp_path_factory.mktemp("lab"), int(time.time()))


def settings() -> Settings:
    return load(None, {}, {"data_dir": "unused", "query_timeout": 60})


@pytest.fixture
def victoriametrics(tmp_path: Path) -> Iterator[str]:
    with run_victoriametrics(tmp_path) as url:
        yield url


def _compare(lab: LabData, store_dir: Path, remote_url: str) -> tuple[list[Asked], int]:
    """Ask every registry query of the local engine over `lab` and of the remote; return the answers
    compared and the number of queries."""
    clock = FakeClock(lab.end_ms / 1000)
    store: Store = load_store(lab.series, store_dir, clock)
    try:
        s = settings()
        ours = LocalBackend(store, store, s, clock.monotonic)
        theirs = RemoteBackend(RemoteStorage(remote_url), s)
        end = lab.end_ms // 60_000 * 60_000
        # whole seconds, never a sample's time (labdata.generate)
        times = [lab.end_ms // 1000 * 1000, (lab.end_ms - 600_000) // 1000 * 1000 + 2_000]
        ranges = [(end - 1_800_000, end, 60_000), (end - 600_000, end, 15_000)]
        # every 2 minutes through the incidents, from when the 5-minute windows hold only data (where a
        # window reaches before a counter's first sample, Prometheus 2.42 extrapolates otherwise: docs/scale.md)
        first = min(int(x.timestamps_ms[0]) for x in lab.series) // 1000 * 1000
        rule_times = list(range(first + 361_000, lab.end_ms, 120_000))
        queries = registry_queries()
        return ask_both(ours, theirs, queries, VARIABLES, times, ranges, rule_times), len(queries)
    finally:
        store.close()


def _report(asked: list[Asked]) -> str:
    return "\n".join(f"{a.key}: {a.difference}\n    {a.text}" for a in asked if a.difference)


def test_every_panel_and_rule_query_answers_the_same_on_prometheus(tmp_path: Path, lab: LabData) -> None:
    """Prometheus 2.42 and gpuwatch's engine over the same samples: the same answer to every query."""
    with run_prometheus(
        tmp_path, "global: {scrape_interval: 1m}\n", "--web.enable-remote-write-receiver"
    ) as p:
        written = remote_write(lab.series, f"{p.url}/api/v1/write")
        assert written > 100_000
        asked, n = _compare(lab, tmp_path / "store", p.url)
    assert n > 100
    assert not [a for a in asked if a.difference], _report(asked)
    _assert_most_have_data(asked)


def _assert_most_have_data(asked: list[Asked]) -> None:
    """Most queries had an answer with data: the same empty answer twice proves little."""
    keys = {a.key.split("@")[0] for a in asked}
    with_data = {a.key.split("@")[0] for a in asked if a.has_data}
    assert len(with_data) > 0.65 * len(keys), sorted(keys - with_data)


def test_every_panel_and_rule_query_answers_the_same_on_victoriametrics(
    tmp_path: Path, lab: LabData, victoriametrics: str
) -> None:
    """VictoriaMetrics 1.79 and gpuwatch's engine over the same samples, the lab's data made steady
    (labdata.steady: where series start, stop or hold NaN, MetricsQL answers otherwise by design, as
    test_victoriametrics_answers_otherwise_where_documented shows)."""
    data = steady(lab, 46)  # before the GPU lost at 48:00
    assert len(data.series) > 0.8 * len(lab.series)
    remote_write(data.series, f"{victoriametrics}/api/v1/write")
    requests.get(f"{victoriametrics}/internal/force_flush", timeout=10)
    asked, n = _compare(data, tmp_path / "store", victoriametrics)
    assert n > 100
    assert not [a for a in asked if a.difference], _report(asked)
    _assert_most_have_data(asked)


def _differences_data(t_ms: int) -> list[Series]:
    """A few series shaped to show each documented difference (docs/scale.md), all ending by `t_ms`."""

    def series(name: str, times_s: list[int], values: list[float]) -> Series:
        times = np.array([t_ms + 1000 * x for x in times_s], dtype=np.int64)
        return Series(name, (("case", name),), times, np.array(values, dtype=np.float64))

    every_15 = list(range(-600, 1, 15))
    return [
        # a counter that starts 2 minutes before t at 100, 10 more every 15 s
        series("started_total", list(range(-120, 1, 15)), [100.0 + 10 * i for i in range(9)]),
        # a gauge that stops 4 minutes before t, with no staleness marker
        series("stopped", list(range(-600, -239, 15)), [1.0] * len(range(-600, -239, 15))),
        # a gauge whose last two samples are NaN
        series("diverged", every_15, [1.0] * (len(every_15) - 2) + [math.nan] * 2),
        # a counter that starts a minute before t at 12, 1 a second: its zero point 12 s before
        series("young_total", list(range(-60, 1, 15)), [12.0 + x for x in range(0, 61, 15)]),
        # a gauge sampled every 15 s up to t (and so exactly at t - 1m)
        series("gauge", every_15, [float(i) for i in range(len(every_15))]),
    ]


def test_victoriametrics_and_prometheus_answer_otherwise_where_documented(
    tmp_path: Path, victoriametrics: str
) -> None:
    """Each difference docs/scale.md lists, shown on data shaped for it: gpuwatch's answer, VictoriaMetrics
    1.79's and Prometheus 2.42's."""
    t_ms = int(time.time()) // 60 * 60_000
    data = _differences_data(t_ms)
    clock = FakeClock(t_ms / 1000)
    store = load_store(data, tmp_path / "store", clock)
    s = settings()
    with run_prometheus(
        tmp_path, "global: {scrape_interval: 1m}\n", "--web.enable-remote-write-receiver"
    ) as p:
        for url in (f"{victoriametrics}/api/v1/write", f"{p.url}/api/v1/write"):
            remote_write(data, url)
        requests.get(f"{victoriametrics}/internal/force_flush", timeout=10)
        backends = {
            "gpuwatch": LocalBackend(store, store, s, clock.monotonic),
            "vm": RemoteBackend(RemoteStorage(victoriametrics), s),
            "prometheus": RemoteBackend(RemoteStorage(p.url), s),
        }

        def one(expr: str) -> dict[str, float | None]:
            out = {}
            for name, b in backends.items():
                got = normal(b.instant(expr, t_ms))
                out[name] = next(iter(got.values())) if got else None
            return out

        def points(expr: str) -> dict[str, int]:
            return {
                name: sum(len(ts) for ts, _ in normal(b.range(expr, t_ms - 300_000, t_ms, 15_000)).values())
                for name, b in backends.items()
            }

        # 1. increase() where the counter starts inside the window: gpuwatch and Prometheus extrapolate
        # half a sample interval before its first sample; VictoriaMetrics counts from 0 (the first
        # value is small next to its rises), or from the first sample where it is not.
        assert one("increase(started_total[10m])") == {"gpuwatch": 85.0, "vm": 180.0, "prometheus": 85.0}
        # 2. a series that stops without a staleness marker: gpuwatch and Prometheus carry its last value
        # for the 5-minute lookback, VictoriaMetrics ends it after a gap of about two sample intervals.
        got = points("stopped")
        assert got["gpuwatch"] == got["prometheus"] == 21 and got["vm"] < 10, got
        # 3. NaN samples: VictoriaMetrics drops them (TrainingLossNaN's `training_loss != training_loss`
        # has nothing to find there; its last real value stands instead).
        nan = one("diverged != diverged")
        assert (
            math.isnan(nan["gpuwatch"] or 0.0) and math.isnan(nan["prometheus"] or 0.0) and nan["vm"] is None
        )
        assert one("diverged")["vm"] == 1.0
        # 4. the metric name: VictoriaMetrics 1.79 keeps it on *_over_time results, Prometheus drops it
        # (the GPU page's `users` panel aggregates with `max without ()`, which drops it on both).
        names = {n: list(normal(b.instant("max_over_time(gauge[5m])", t_ms))) for n, b in backends.items()}
        assert names["gpuwatch"] == names["prometheus"] == [(("case", "gauge"),)]
        assert names["vm"] == [(("__name__", "gauge"), ("case", "gauge"))]
        # 5. a sample exactly at the window's start: Prometheus 2 counts it (closed windows), gpuwatch,
        # Prometheus 3 and VictoriaMetrics do not.
        assert one("count_over_time(gauge[1m])") == {"gpuwatch": 4.0, "vm": 4.0, "prometheus": 5.0}
        # 6. a counter whose zero point is nearer than 1.1 sample intervals before its first sample:
        # Prometheus 2.42 extrapolates to the zero point, gpuwatch as Prometheus since 2.51
        # (prometheus/prometheus#13725) half an interval; VictoriaMetrics counts from 0.
        assert one("increase(young_total[5m])") == pytest.approx(
            {"gpuwatch": 67.5, "vm": 72.0, "prometheus": 72.0}
        )
        # 7. scalars: VictoriaMetrics answers `scalar()` as a vector without labels.
        assert isinstance(backends["vm"].instant("scalar(gauge)", t_ms), Vector)
        assert isinstance(backends["prometheus"].instant("scalar(gauge)", t_ms), Scalar)
    store.close()
