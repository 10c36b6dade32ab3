"""Schema upgrades: all of them or none."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import StoreError
from gpuwatch.core.model import Matcher
from gpuwatch.store import Store, schema
from gpuwatch.store.chunking import encode_series
from gpuwatch.store.core import DB_FILE

T0 = 1_790_000_000_000


def _schema_6_store(data_dir: Path, t: np.ndarray) -> None:
    """A store as a gpuwatch of schema 6 left it: one series, its samples in one chunk."""
    con = duckdb.connect(str(data_dir / DB_FILE))
    schema.current_version(con)
    for number, sql in schema.MIGRATIONS:
        if number <= 6:
            con.execute(sql)
            con.execute("INSERT INTO schema_migrations VALUES (?, 0)", [number])
    con.execute("""INSERT INTO series VALUES (1, 'm', '[["s", "a"]]')""")
    for r in encode_series(1, t, t / 1000.0, 1):
        con.execute(
            "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
            [r.series_id, r.t_min_ms, r.t_max_ms, r.n, r.seq, r.ts, r.vs],
        )
    con.close()


def _version_and_columns(data_dir: Path) -> tuple[int, list[str]]:
    con = duckdb.connect(str(data_dir / DB_FILE), read_only=True)
    try:
        version = con.execute("SELECT max(version) FROM schema_migrations").fetchone()
        columns = con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = 'chunks' ORDER BY column_index"
        ).fetchall()
        return int(version[0]) if version else 0, [c[0] for c in columns]
    finally:
        con.close()


def test_an_upgrade_that_fails_leaves_the_store_as_it_was_and_the_next_one_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = np.arange(T0, T0 + 30_000, 1_000, dtype=np.int64)
    _schema_6_store(tmp_path, t)
    broken = (
        *schema.MIGRATIONS,
        (schema.LATEST + 1, "CREATE TABLE extra (a INTEGER); SELECT error('no space');"),
    )
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    with pytest.raises(
        StoreError,
        match=r"cannot upgrade the store at .* from schema version 6 \(left as it was\): .*no space",
    ):
        Store.open(tmp_path, clock=FakeClock(T0 / 1000))
    # Nothing of migrations 7-12 stayed: the file is schema 6 still, and readable as it.
    assert _version_and_columns(tmp_path) == (
        6,
        ["series_id", "t_min_ms", "t_max_ms", "n", "seq", "ts", "vs"],
    )

    monkeypatch.undo()
    with Store.open(tmp_path, clock=FakeClock(T0 / 1000), flush_interval_s=3600, retention_s=0) as store:
        (sd,) = store.select([Matcher("__name__", "=", "m")], T0, T0 + 60_000)
        assert sd.timestamps_ms.tolist() == t.tolist() and sd.values.tolist() == (t / 1000.0).tolist()
    version, columns = _version_and_columns(tmp_path)
    assert version == schema.LATEST and columns[-3:] == ["h", "seqs", "seq_lo"]


def test_a_new_store_has_every_migration_recorded(tmp_path: Path) -> None:
    Store.open(tmp_path, clock=FakeClock(T0 / 1000)).close()
    con = duckdb.connect(str(tmp_path / DB_FILE), read_only=True)
    try:
        versions = [
            r[0] for r in con.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
        ]
    finally:
        con.close()
    assert versions == [number for number, _ in schema.MIGRATIONS]
