"""`gpuwatch export`: a query's answer, or a selector's raw samples, to a Parquet or CSV file.

Through a running server (`--url`, its /api/export) or from a stopped data directory. Exit codes as
`gpuwatch query`: 0 written, 1 the query is wrong, 2 the environment is (bad flag, server unreachable,
data directory in use, file not writable).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import requests

from gpuwatch.cli.query import (
    HTTP_TIMEOUT_S,
    UsageError,
    _in_use,
    _settings,
    parse_duration_ms,
    parse_time_ms,
)
from gpuwatch.core.clock import Clock, SystemClock
from gpuwatch.core.errors import ConfigError, GpuwatchError, StoreInUse

if TYPE_CHECKING:
    from gpuwatch.store.export import Format

ROWS_HEADER = "X-Gpuwatch-Rows"


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    """Declare `gpuwatch export`'s flags."""
    p.add_argument("expr", metavar="EXPR", help="PromQL expression, or a series selector for raw samples")
    p.add_argument("--start", required=True, help="RFC3339, Unix seconds, now-7d or -7d")
    p.add_argument("--end", help="default: now")
    p.add_argument("--step", help="evaluate EXPR every STEP (e.g. 1m); without it, EXPR's raw samples")
    p.add_argument("-o", "--output", type=Path, required=True, help="FILE.parquet or FILE.csv")
    p.add_argument("--format", choices=("parquet", "csv"), help="default: from the output file's suffix")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running gpuwatch, e.g. http://127.0.0.1:9842")
    where.add_argument("--data-dir", dest="data_dir", help="a stopped gpuwatch's data directory")
    p.add_argument("--config", type=Path, help="YAML settings file (also GPUWATCH_CONFIG)")


def _format(args: argparse.Namespace) -> Format:
    from gpuwatch.store.export import format_of  # DuckDB loads only for the command that needs it

    fmt: Format | None = args.format or format_of(args.output)
    if fmt is None:
        raise UsageError(
            f"cannot tell the format of {args.output}: name it .parquet or .csv, or give --format"
        )
    return fmt


def _over_http(url: str, params: dict[str, str], auth: dict[str, str], output: Path) -> int:
    base = url.rstrip("/")
    try:
        resp = requests.post(base + "/api/export", data=params, headers=auth, timeout=HTTP_TIMEOUT_S)
    except requests.RequestException as exc:
        raise ConnectionError(f"cannot reach {base}: {type(exc).__name__}") from None
    if resp.status_code != 200:
        try:
            message = str(resp.json().get("error") or f"HTTP {resp.status_code}")
        except ValueError:
            raise ConnectionError(f"{base}/api/export answered HTTP {resp.status_code}") from None
        raise (GpuwatchError if 400 <= resp.status_code < 500 else ConnectionError)(message)
    _write_file(output, resp.content)
    return int(resp.headers.get(ROWS_HEADER, "-1"))


def _write_file(output: Path, data: bytes) -> None:
    """Write `data` to `output` through a temporary file, so a failed export leaves no half file."""
    part = output.with_name(output.name + ".part")
    try:
        part.write_bytes(data)
        os.replace(part, output)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None


def _local(
    args: argparse.Namespace, env: Mapping[str, str], t: dict[str, int], fmt: Format, clock: Clock
) -> int:
    from gpuwatch.query import Engine
    from gpuwatch.query.longtable import long_table, raw_samples_query
    from gpuwatch.query.values import Result
    from gpuwatch.store import Store
    from gpuwatch.store.export import write_table

    settings = _settings(args, env)
    try:
        store = Store.open(settings.data_dir, clock=clock, retention_s=settings.retention, read_only=True)
    except StoreInUse:
        raise UsageError(_in_use(settings)) from None
    try:
        engine = Engine.configured(store, settings, clock.monotonic)
        result: Result
        if "step" in t:
            result = engine.range(args.expr, t["start"], t["end"], t["step"])
        else:
            result = engine.instant(raw_samples_query(args.expr, t["start"], t["end"]), t["end"])
    finally:
        store.close()
    try:
        table = long_table(result)
    except TypeError as exc:
        raise GpuwatchError(str(exc)) from None
    part = args.output.with_name(args.output.name + ".part")
    try:
        write_table(table, part, fmt)
        os.replace(part, args.output)
    except (OSError, GpuwatchError) as exc:
        part.unlink(missing_ok=True)
        raise UsageError(f"cannot write {args.output}: {getattr(exc, 'strerror', None) or exc}") from None
    return len(table)


def run_export(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Clock | None = None,
) -> int:
    """Run `gpuwatch export`; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    clock = clock or SystemClock()
    now_ms = clock.now_ms()
    try:
        fmt = _format(args)
        t = {
            "start": parse_time_ms(args.start, now_ms),
            "end": parse_time_ms(args.end, now_ms) if args.end else now_ms,
        }
        if t["end"] < t["start"]:
            raise UsageError("--end must not be before --start")
        if args.step:
            t["step"] = parse_duration_ms(args.step)
            if t["step"] <= 0:
                raise UsageError("--step must be positive")
        if args.url:
            from gpuwatch.cli.access import auth_headers

            params = {"query": args.expr, "format": fmt, **{k: str(v / 1000) for k, v in t.items()}}
            rows = _over_http(args.url, params, auth_headers(args, env), args.output)
        else:
            rows = _local(args, env, t, fmt, clock)
    except (UsageError, ConnectionError, ConfigError) as exc:
        print(f"gpuwatch: {exc}", file=err)
        return 2
    except GpuwatchError as exc:
        print(f"gpuwatch: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=err)
        return 1
    print(f"wrote {args.output}" + (f": {rows:,} rows" if rows >= 0 else ""), file=out)
    return 0
