"""gpuwatch's own figures reach its rules from memory: GpuwatchStoreWriteErrors fires while the store
cannot write (a full disk), not once space returns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest
from flask.testing import FlaskClient

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import StoreError
from gpuwatch.core.model import Matcher, Sample, SeriesData
from gpuwatch.demo.nvml import FakeNvml
from gpuwatch.query.recent import RecentSamples, WithRecent
from gpuwatch.store import sqlrows
from gpuwatch.web import create_app

DEMO_GPUS = 1
NAME = "__name__"


class _Stored:
    """A source holding fixed series (what the store had written)."""

    def __init__(self, *series: SeriesData) -> None:
        self.series = list(series)

    def select(self, matchers: list[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        out = []
        for s in self.series:
            keep = (s.timestamps_ms >= start_ms) & (s.timestamps_ms <= end_ms)
            if keep.any() and all(m.value == s.label_dict().get(m.name, "") for m in matchers):
                out.append(SeriesData(s.name, s.labels, s.timestamps_ms[keep], s.values[keep]))
        return out

    def select_last(self, matchers: list[Matcher], start_ms: int, end_ms: int) -> list[SeriesData]:
        return [
            SeriesData(s.name, s.labels, s.timestamps_ms[-1:], s.values[-1:])
            for s in self.select(matchers, start_ms, end_ms)
        ]


def _series(name: str, times: list[int], values: list[float]) -> SeriesData:
    return SeriesData(name, (), np.array(times, np.int64), np.array(values))


def test_recent_samples_keep_a_window_and_match_like_the_store() -> None:
    recent = RecentSamples(keep_ms=10_000)
    for t in range(0, 30_000, 1000):
        recent.add(t, [Sample("a", (("job", "x"),), t / 1000), Sample("b", (), 1.0)])
    got = recent.select([Matcher(NAME, "=", "a"), Matcher("job", "=~", "x|y")], 0, 2**62)
    assert len(got) == 1 and got[0].timestamps_ms.tolist() == list(range(19_000, 30_000, 1000))
    assert recent.select([Matcher(NAME, "=", "a"), Matcher("job", "=", "")], 0, 2**62) == []
    assert [s.name for s in recent.select([Matcher("job", "=", "")], 0, 2**62)] == ["b"]
    last = recent.select_last([Matcher(NAME, "=", "a")], 0, 25_500)
    assert last[0].timestamps_ms.tolist() == [25_000] and last[0].values.tolist() == [25.0]
    recent.add(100_000, [Sample("b", (), 2.0)])  # "a" went quiet: forgotten once out of the window
    assert [s.name for s in recent.select([], 0, 2**62)] == ["b"] and len(recent) == 1


def test_with_recent_merges_what_memory_holds_into_the_stored_series() -> None:
    stored = _Stored(_series("w", [1000, 2000], [0.0, 0.0]), _series("other", [1000], [5.0]))
    recent = RecentSamples(keep_ms=60_000)
    for t, v in ((2000, 0.0), (3000, 1.0), (4000, 2.0)):  # 2000 was flushed, 3000 and 4000 were not
        recent.add(t, [Sample("w", (), v)])
    both = WithRecent(stored, recent)
    got = both.select([Matcher(NAME, "=", "w")], 0, 10_000)
    assert len(got) == 1
    assert got[0].timestamps_ms.tolist() == [1000, 2000, 3000, 4000]
    assert got[0].values.tolist() == [0.0, 0.0, 1.0, 2.0]
    assert [s.name for s in both.select([], 0, 10_000)] == ["other", "w"]
    last = both.select_last([Matcher(NAME, "=", "w")], 0, 10_000)
    assert last[0].timestamps_ms.tolist() == [4000]
    assert both.select_last([Matcher(NAME, "=", "other")], 0, 10_000)[0].values.tolist() == [5.0]


class Disk:
    """The store's disk: while `is_full`, every database write fails as a full disk fails it."""

    is_full = False


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    real = sqlrows.insert_columns
    d = Disk()

    def insert(cur: duckdb.DuckDBPyConnection, table: str, columns: dict, computed: str = "") -> None:
        if d.is_full:
            raise duckdb.IOException("Could not write file: No space left on device")
        real(cur, table, columns, computed)

    monkeypatch.setattr(sqlrows, "insert_columns", insert)
    return d


CHAINED = """
groups:
  - name: chained
    rules:
      - record: probe:one
        expr: vector(1)
      - record: probe:two
        expr: probe:one * 2
"""


@pytest.fixture(params=["builtin", "chained recording rules"])
def runtime(
    request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock, nvml: FakeNvml, disk: Disk
) -> Iterator[Runtime]:
    """The built-in rules, alone or with recording rules that read each other (as the built-in
    inference pack's do once servers are scraped): those make the manager flush the store mid-round."""
    overrides: dict[str, object] = {"data_dir": str(tmp_path / "data"), "demo": True, "sample_interval": 5}
    if request.param != "builtin":
        (tmp_path / "chained.yml").write_text(CHAINED)
        overrides["rule_files"] = [str(tmp_path / "chained.yml")]
    settings = load(None, {}, overrides)
    rt = build_runtime(settings, "node-1", clock=clock, nvml=nvml)
    yield rt
    disk.is_full = False
    rt.close()


def _tick(runtime: Runtime, clock: FakeClock, disk: Disk, seconds: float = 5) -> None:
    """`seconds` later: a sample, the writer's flush (failing while the disk is full), the rules job."""
    clock.advance(seconds)
    runtime.jobs.run("sample")
    try:
        runtime.store.flush()
    except StoreError:
        assert disk.is_full
    assert runtime.jobs.run("rules"), "the rules job failed"


def _firing(client: FlaskClient) -> dict[str, str]:
    alerts = client.get("/api/v1/alerts").get_json()["data"]["alerts"]
    return {
        a["labels"]["alertname"]: a["state"]
        for a in alerts
        if a["labels"]["alertname"].startswith("Gpuwatch")
    }


def test_store_write_errors_alert_fires_while_the_disk_is_full_and_resolves(
    runtime: Runtime, clock: FakeClock, disk: Disk
) -> None:
    client = create_app(runtime).test_client()
    for _ in range(3):
        _tick(runtime, clock, disk)
    assert "GpuwatchStoreWriteErrors" not in _firing(client)
    disk.is_full = True
    for _ in range(4):  # the error is counted after a sample; the group evaluates every 15 s
        _tick(runtime, clock, disk)
    assert _firing(client).get("GpuwatchStoreWriteErrors") == "firing", _firing(client)
    assert runtime.store.counters()["write_failing"]  # still full: nothing of it was written
    rule = next(
        r
        for g in client.get("/api/v1/rules").get_json()["data"]["groups"]
        for r in g["rules"]
        if r["name"] == "GpuwatchStoreWriteErrors"
    )
    assert rule["health"] == "ok", rule
    disk.is_full = False
    for _ in range(22):  # space is back; 10 minutes without a new error later the alert resolves
        _tick(runtime, clock, disk, seconds=30)
    assert "GpuwatchStoreWriteErrors" not in _firing(client)
