"""Create and upgrade the database schema with numbered migrations.

Tables (private to `gpuwatch.store`):

- `series(series_id, name, labels)`: one row a series; labels as a JSON list of [name, value] pairs.
- `head(series_id, t_ms, v_bits, seq)`: recent samples, one row each, as written every flush. Values
  are kept as their IEEE-754 bits because DuckDB turns NaNs (and so staleness markers) into NULLs.
- `chunks(series_id, t_min_ms, t_max_ms, n, seq, ts, vs, h, seqs, seq_lo)`: compacted samples, one row
  per series and stretch of time, with timestamps and values encoded by `gpuwatch.store.codec`. `seq`
  orders writes, so the newest write of a duplicate (series, time) wins. `h` is `hash(ts, vs)`,
  computed once as the row is written: reads key the chunks they keep in memory by it
  (`chunkcache.py`). `seqs` holds each sample's own write seq (NULL: all are `seq`) and `seq_lo` the
  lowest of them, for the samples appended after a watermark (`appended.py`).
- `remote_watermarks(destination, seq, t_ms, updated_ms)`: how far each remote-write destination has
  been sent (`appended.py`); `seq_floor(seq)`: the highest write seq given out when retention last
  deleted samples, which the writer numbers on from (a watermark may point at a deleted write).
  `remote_gaps(destination, end_seq, seq, t_ms, updated_ms)`: stretches a destination's live lane
  skipped (`queue_config.live_first`), each sent from its watermark (seq, t_ms) up to `end_seq`.
- `tier_1m` and `tier_1h(series_id, t_min_ms, t_max_ms, n, seq, data)`: 1-minute and 1-hour tier
  points (`core.tiers`), one row per series and period, the points encoded in `data` and their bucket
  ends from t_min_ms to t_max_ms (`tierrows.py`); a table each, so that a read of the few 1-hour rows
  does not scan the 1-minute rows' blobs. `data` is zstd already: stored uncompressed, as DuckDB's own
  ZSTD of 12,000-row segments of 17 KB blobs asked for 64 MB buffers, past its whole memory cap;
  `tier_state(built_ms, next_sid, checked_seq, span_end_ms)`:
  how far they are built (`tierbuild.py`).
- `runs(name, status, start_ms, end_ms, total_steps, config, host, gpus, last_step, last_seen_ms,
  updated_ms, process)`: training-run metadata (`gpuwatch.store.runs`); config, gpus and process (the
  SDK's pid and visible devices) as JSON text.
- `log_lines(t_ms, seq, file, run, level, text)` and `log_offsets(path, inode, offset_bytes)`: tailed
  log lines and how far each file was read, written together (`gpuwatch.store.logs`).
- `alert_state(group_key, rule, labels, annotations, state, active_at_ms, value, fired_at_ms,
  resolved_at_ms, keep_firing_since_ms, last_eval_ms)`: the rule evaluator's alerts, replaced per rule
  group after each evaluation that changed them (`gpuwatch.store.alerts`).
- `alert_history(seq, at_ms, group_name, rule, labels, before, after)`: alert transitions in the order
  they happened, the newest 10,000 within retention (`gpuwatch.store.alerthistory`).
- `silences(id, matchers, starts_at_ms, ends_at_ms, created_by, comment, updated_at_ms)`: silences in
  Alertmanager's model; matchers as a JSON list of [name, value, is_regex, is_equal] (`gpuwatch.store.silences`).
- `notify_queue(id, receiver, integration, group_key, status, payload, created_ms, attempts,
  next_attempt_ms, last_error)`: notifications waiting to be delivered; `notify_log(...)` the delivery
  log; `notify_state(group_key, receiver, firing, resolved, notified_ms)`: what each alert group last
  notified each receiver, as Alertmanager's notification log (`gpuwatch.store.notify`).
"""

from __future__ import annotations

import duckdb

MIGRATIONS: tuple[tuple[int, str], ...] = (
    (
        1,
        """
        CREATE TABLE series (
            series_id INTEGER PRIMARY KEY,
            name VARCHAR NOT NULL,
            labels VARCHAR NOT NULL
        );
        CREATE TABLE head (series_id INTEGER NOT NULL, t_ms BIGINT NOT NULL,
                           v_bits BIGINT NOT NULL, seq BIGINT NOT NULL);
        CREATE TABLE chunks (series_id INTEGER NOT NULL, t_min_ms BIGINT NOT NULL,
                             t_max_ms BIGINT NOT NULL, n INTEGER NOT NULL, seq BIGINT NOT NULL,
                             ts BLOB NOT NULL, vs BLOB NOT NULL);
        """,
    ),
    (
        2,
        """
        CREATE TABLE runs (
            name VARCHAR PRIMARY KEY,
            status VARCHAR NOT NULL,
            start_ms BIGINT,
            end_ms BIGINT,
            total_steps BIGINT,
            config VARCHAR,
            host VARCHAR,
            gpus VARCHAR,
            last_step DOUBLE,
            last_seen_ms BIGINT,
            updated_ms BIGINT NOT NULL
        );
        """,
    ),
    (
        3,
        """
        CREATE SEQUENCE log_line_seq;
        CREATE TABLE log_lines (
            t_ms BIGINT NOT NULL,
            seq BIGINT NOT NULL,
            file VARCHAR NOT NULL,
            run VARCHAR NOT NULL,
            level VARCHAR NOT NULL,
            text VARCHAR NOT NULL
        );
        CREATE TABLE log_offsets (
            path VARCHAR PRIMARY KEY,
            inode BIGINT NOT NULL,
            offset_bytes BIGINT NOT NULL
        );
        """,
    ),
    (
        4,
        """
        CREATE TABLE alert_state (
            group_key VARCHAR NOT NULL,
            rule VARCHAR NOT NULL,
            labels VARCHAR NOT NULL,
            annotations VARCHAR NOT NULL,
            state VARCHAR NOT NULL,
            active_at_ms BIGINT NOT NULL,
            value DOUBLE,
            fired_at_ms BIGINT,
            resolved_at_ms BIGINT,
            keep_firing_since_ms BIGINT,
            last_eval_ms BIGINT NOT NULL
        );
        """,
    ),
    (
        5,
        """
        CREATE SEQUENCE notify_seq;
        CREATE TABLE notify_queue (
            id BIGINT PRIMARY KEY,
            receiver VARCHAR NOT NULL,
            integration VARCHAR NOT NULL,
            group_key VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            payload VARCHAR NOT NULL,
            created_ms BIGINT NOT NULL,
            attempts INTEGER NOT NULL,
            next_attempt_ms BIGINT NOT NULL,
            last_error VARCHAR NOT NULL
        );
        CREATE TABLE notify_log (
            id BIGINT NOT NULL,
            receiver VARCHAR NOT NULL,
            integration VARCHAR NOT NULL,
            group_key VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            alerts INTEGER NOT NULL,
            created_ms BIGINT NOT NULL,
            finished_ms BIGINT NOT NULL,
            attempts INTEGER NOT NULL,
            result VARCHAR NOT NULL,
            error VARCHAR NOT NULL
        );
        CREATE TABLE notify_state (
            group_key VARCHAR NOT NULL,
            receiver VARCHAR NOT NULL,
            firing VARCHAR NOT NULL,
            resolved VARCHAR NOT NULL,
            notified_ms BIGINT NOT NULL,
            PRIMARY KEY (group_key, receiver)
        );
        """,
    ),
    (
        6,
        """
        CREATE TABLE silences (
            id VARCHAR NOT NULL,
            matchers VARCHAR NOT NULL,
            starts_at_ms BIGINT NOT NULL,
            ends_at_ms BIGINT NOT NULL,
            created_by VARCHAR NOT NULL,
            comment VARCHAR NOT NULL,
            updated_at_ms BIGINT NOT NULL
        );
        """,
    ),
    (
        7,
        """
        ALTER TABLE chunks ADD COLUMN h UBIGINT;
        UPDATE chunks SET h = hash(ts, vs);
        """,
    ),
    (8, "ALTER TABLE runs ADD COLUMN process VARCHAR;"),
    (
        9,
        """
        CREATE TABLE alert_history (
            seq BIGINT NOT NULL,
            at_ms BIGINT NOT NULL,
            group_name VARCHAR NOT NULL,
            rule VARCHAR NOT NULL,
            labels VARCHAR NOT NULL,
            before VARCHAR NOT NULL,
            after VARCHAR NOT NULL
        );
        """,
    ),
    (
        10,
        """
        ALTER TABLE chunks ADD COLUMN seqs BLOB;
        ALTER TABLE chunks ADD COLUMN seq_lo BIGINT;
        UPDATE chunks SET seq_lo = seq;
        CREATE TABLE remote_watermarks (
            destination VARCHAR PRIMARY KEY,
            seq BIGINT NOT NULL,
            t_ms BIGINT NOT NULL,
            updated_ms BIGINT NOT NULL
        );
        CREATE TABLE seq_floor (seq BIGINT NOT NULL);
        """,
    ),
    (
        11,
        """
        CREATE TABLE remote_gaps (
            destination VARCHAR NOT NULL,
            end_seq BIGINT NOT NULL,
            seq BIGINT NOT NULL,
            t_ms BIGINT NOT NULL,
            updated_ms BIGINT NOT NULL,
            PRIMARY KEY (destination, end_seq)
        );
        """,
    ),
    (
        12,
        """
        CREATE TABLE tier_1m (series_id INTEGER NOT NULL, t_min_ms BIGINT NOT NULL, t_max_ms BIGINT NOT NULL,
                              n INTEGER NOT NULL, seq BIGINT NOT NULL,
                              data BLOB NOT NULL USING COMPRESSION uncompressed);
        CREATE TABLE tier_1h (series_id INTEGER NOT NULL, t_min_ms BIGINT NOT NULL, t_max_ms BIGINT NOT NULL,
                              n INTEGER NOT NULL, seq BIGINT NOT NULL,
                              data BLOB NOT NULL USING COMPRESSION uncompressed);
        CREATE TABLE tier_state (built_ms BIGINT, next_sid BIGINT NOT NULL, checked_seq BIGINT NOT NULL,
                                 span_end_ms BIGINT NOT NULL);
        """,
    ),
)


def current_version(cur: duckdb.DuckDBPyConnection) -> int:
    """Return the highest applied migration, 0 for an empty database."""
    cur.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_ms BIGINT NOT NULL)"
    )
    row = cur.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0


def read_version(cur: duckdb.DuckDBPyConnection) -> int:
    """Return the highest applied migration without creating anything (read-only databases)."""
    row = cur.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'schema_migrations'"
    ).fetchone()
    if not row or not row[0]:
        return 0
    row = cur.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0


def migrate(cur: duckdb.DuckDBPyConnection, now_ms: int) -> int:
    """Apply every migration newer than the database in one transaction: an upgrade that fails leaves
    the database as it was, and a new store commits once (a commit of a file store waits for its
    write to disk: one a migration took ~130 ms of each first start). Return the version."""
    cur.execute("BEGIN TRANSACTION")
    try:
        version = current_version(cur)
        for number, sql in MIGRATIONS:
            if number > version:
                cur.execute(sql)
                cur.execute("INSERT INTO schema_migrations VALUES (?, ?)", [number, now_ms])
                version = number
        cur.execute("COMMIT")
    except duckdb.Error:
        cur.execute("ROLLBACK")
        raise
    return version


LATEST = MIGRATIONS[-1][0]
