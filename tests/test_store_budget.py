"""`store_memory_mb`: one setting shares the store's memory out between DuckDB, the indexes and the
chunk cache, and the cache gives back what growing indexes take (store/budget.py)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Matcher, make_labels
from gpuwatch.store import Store
from gpuwatch.store.budget import MB, MIN_MB, MemoryBudget

T0 = 1_700_000_000_000


def _add_series(store: Store, first: int, count: int) -> None:
    t = T0 + np.arange(4, dtype=np.int64) * 15_000
    for i in range(first, first + count):
        store.append_series("m", make_labels({"gpu": str(i)}), t, np.full(4, float(i)))
    store.flush()
    store.compact()  # as the writer does every few minutes: the chunk index is built anew


def _read_all(store: Store) -> int:
    got = store.select([Matcher("__name__", "=", "m")], T0, T0 + 60_000)
    return len(got)


def test_the_budget_shares_out_duckdb_indexes_and_the_cache() -> None:
    b = MemoryBudget(256)
    assert b.duckdb_mb == 64  # a quarter, at least 64
    assert MemoryBudget(1024).duckdb_mb == 256
    assert b.cache_bytes(0) == 192 * MB  # the rest, with no index yet
    assert b.cache_bytes(100 * MB) == 92 * MB  # indexes take from the cache
    assert b.cache_bytes(190 * MB) == 16 * MB and b.overdrawn(190 * MB)  # never under its floor
    assert not b.overdrawn(100 * MB)
    assert MemoryBudget(256, cache_cap_mb=32).cache_bytes(0) == 32 * MB  # chunk_cache_mb caps it
    assert MemoryBudget.index_bytes(1_000, 36_000) == 1_000 * 1_008 + 36_000
    with pytest.raises(ValueError, match="store_memory_mb must be at least"):
        MemoryBudget(MIN_MB - 1)


def test_duckdb_gets_its_share_and_the_cache_shrinks_as_series_arrive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    budget = MemoryBudget(MIN_MB)  # 96 MB: DuckDB 64, 32 left for the indexes and the cache
    with Store.open(tmp_path, clock=FakeClock(T0 / 1000), memory=budget) as store:
        limit = store._cursor().execute("SELECT current_setting('memory_limit')").fetchone()
        assert limit is not None and limit[0] in ("64.0 MiB", "61.0 MiB", "64.0 MB")
        _add_series(store, 0, 2_000)
        assert _read_all(store) == 2_000  # a read builds the chunk index, and the cache's share follows
        before = store.memory_figures()
        assert before["budget_bytes"] == 96 * MB
        assert before["index_bytes"] >= 2_000 * 1_000
        assert before["chunk_cache_limit_bytes"] == 32 * MB - before["index_bytes"]
        with caplog.at_level(logging.WARNING):
            _add_series(store, 2_000, 16_000)  # 18,000 series: ~18 MB of indexes leave less than 16
            assert _read_all(store) == 18_000
            after = store.memory_figures()
            assert after["chunk_cache_limit_bytes"] == 16 * MB  # the floor
            assert store._chunks is not None and store._chunks.bytes <= 16 * MB
            _add_series(store, 18_000, 10)
            _read_all(store)
        said = [r.getMessage() for r in caplog.records if "overdrawn" in r.getMessage()]
        assert len(said) == 1  # said once, not at every read
        assert "store_memory_mb 96 is overdrawn: the indexes of 18000 series" in said[0]


def test_serve_reads_the_setting_and_shows_it_on_metrics(tmp_path: Path, clock: FakeClock, nvml: Any) -> None:
    from gpuwatch.app.build import build_runtime
    from gpuwatch.app.config import load
    from gpuwatch.core.errors import ConfigError
    from gpuwatch.web import create_app

    settings = load(
        None, {"GPUWATCH_STORE_MEMORY_MB": "512"}, {"data_dir": str(tmp_path / "d"), "demo": True}
    )
    assert settings.store_memory_mb == 512
    runtime = build_runtime(settings, "node-1", clock=clock, nvml=nvml)
    try:
        for _ in range(2):  # /metrics shows the figures of the last sample: the second counts the first's
            runtime.jobs.run("sample")
            runtime.store.flush()
        limit = runtime.store._cursor().execute("SELECT current_setting('memory_limit')").fetchone()
        assert limit is not None and limit[0].startswith(("128.0", "122.0"))  # a quarter of 512 MB
        text = create_app(runtime).test_client().get("/metrics").get_data(as_text=True)
    finally:
        runtime.close()
    fams = {f.name: f.samples[0].value for f in text_string_to_metric_families(text) if f.samples}
    assert fams["gpuwatch_store_memory_budget_bytes"] == 512 * MB
    assert 0 < fams["gpuwatch_store_index_bytes"] < 10 * MB
    assert fams["gpuwatch_store_chunk_cache_limit_bytes"] == 384 * MB - fams["gpuwatch_store_index_bytes"]
    with pytest.raises(ConfigError, match="store_memory_mb"):
        load(None, {"GPUWATCH_STORE_MEMORY_MB": "50"}, {})
