"""`gpuwatch report`: who used the GPUs over a range, as a table, CSV, JSON or Parquet.

Per user, run, host, Slurm job or pod (`--by`), over the range or each day, week or month of it
(`--every`, UTC): GPU-hours allocated, busy and idle-but-held, energy and cost, top idle-but-held first,
and the lab's allocation rate (docs/usage.md). Through a running server (`--url`, the usage page's JSON
twin) or from a stopped data directory. Exit codes as `gpuwatch export`: 0 written, 1 the query
failed, 2 the environment is wrong (bad flag, server unreachable, data directory in use, file not
writable).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import requests

from gpuwatch.cli.query import HTTP_TIMEOUT_S, UsageError, _in_use, _settings, parse_time_ms
from gpuwatch.core.clock import Clock, SystemClock
from gpuwatch.core.errors import ConfigError, GpuwatchError, StoreInUse
from gpuwatch.core.units import format_rfc3339
from gpuwatch.query.usage import EVERY, GROUPS, UsageReport

if TYPE_CHECKING:
    from gpuwatch.store.export import Format

FORMATS = ("table", "csv", "json", "parquet")
DEFAULT_START = "now-7d"


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    """Declare `gpuwatch report`'s flags."""
    p.add_argument(
        "--start", default=DEFAULT_START, help="RFC3339, Unix seconds, now-7d or -7d (default now-7d)"
    )
    p.add_argument("--end", help="default: now")
    p.add_argument("--by", choices=tuple(GROUPS), default="user", help="group by (default user)")
    p.add_argument("--every", choices=EVERY, help="one row per group and day, week or month (UTC)")
    p.add_argument("--format", choices=FORMATS, help="default: from -o's suffix, else table")
    p.add_argument("-o", "--output", type=Path, help="write to FILE instead of stdout (needed for parquet)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running gpuwatch, e.g. http://127.0.0.1:9842")
    where.add_argument("--data-dir", dest="data_dir", help="a stopped gpuwatch's data directory")
    p.add_argument("--config", type=Path, help="YAML settings file (also GPUWATCH_CONFIG)")


def _format(args: argparse.Namespace) -> str:
    if args.format:
        fmt = str(args.format)
    elif args.output is not None:
        suffix = args.output.suffix.lower().lstrip(".")
        fmt = suffix if suffix in FORMATS else "table"
    else:
        fmt = "table"
    if fmt == "parquet" and args.output is None:
        raise UsageError("a parquet report needs -o FILE.parquet")
    return fmt


def _over_http(url: str, params: dict[str, str], auth: dict[str, str]) -> UsageReport:
    base = url.rstrip("/")
    try:
        resp = requests.get(base + "/api/ui/usage", params=params, headers=auth, timeout=HTTP_TIMEOUT_S)
    except requests.RequestException as exc:
        raise ConnectionError(f"cannot reach {base}: {type(exc).__name__}") from None
    try:
        body = resp.json()
    except ValueError:
        raise ConnectionError(f"{base}/api/ui/usage answered HTTP {resp.status_code}") from None
    if resp.status_code != 200:
        message = str(body.get("error") or f"HTTP {resp.status_code}")
        raise (GpuwatchError if 400 <= resp.status_code < 500 else ConnectionError)(message)
    return UsageReport.from_json(body["data"]["report"])


def _local(
    args: argparse.Namespace, env: Mapping[str, str], start_ms: int, end_ms: int, clock: Clock
) -> UsageReport:
    from gpuwatch.query import Engine
    from gpuwatch.query.usage import usage_report
    from gpuwatch.store import Store

    settings = _settings(args, env)
    try:
        store = Store.open(settings.data_dir, clock=clock, retention_s=settings.retention, read_only=True)
    except StoreInUse:
        raise UsageError(_in_use(settings)) from None
    try:
        engine = Engine.configured(store, settings, clock.monotonic)
        return usage_report(
            engine.instant,
            start_ms,
            end_ms,
            by=args.by,
            every=args.every,
            price_per_kwh=settings.energy_price_per_kwh,
            currency=settings.energy_currency,
        )
    finally:
        store.close()


def _hours(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _name(value: str) -> str:
    return value or "(none)"


def table_text(report: UsageReport) -> str:
    """The report as an aligned text table, its lab totals below."""
    money = report.price_per_kwh > 0
    head = ["period"] if report.every else []
    head += list(report.group_labels)
    head += ["allocated_h", "busy_h", "idle_held_h", "idle_%", "kWh"]
    head += ["gpu_h", "allocation_%"] if report.by == "host" else []
    head += [f"cost_{report.currency}"] if money else []
    lines = [head]
    for r in report.rows:
        cells = [format_rfc3339(r.start_ms)[:10]] if report.every else []
        cells += [_name(r.group.get(k, "")) for k in report.group_labels]
        idle = 100 * r.idle_held_gpu_hours / r.allocated_gpu_hours if r.allocated_gpu_hours > 0 else 0.0
        cells += [_hours(r.allocated_gpu_hours), _hours(r.busy_gpu_hours), _hours(r.idle_held_gpu_hours)]
        cells += [f"{idle:.1f}", f"{r.energy_kwh:.3f}"]
        if report.by == "host":
            cells += [
                _hours(r.gpu_hours),
                "-" if r.allocation_rate is None else f"{100 * r.allocation_rate:.1f}",
            ]
        cells += [f"{r.cost or 0.0:.2f}"] if money else []
        lines.append(cells)
    numeric = {i for i, h in enumerate(head) if h.endswith(("_h", "_%", "kWh")) or h.startswith("cost_")}
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = [
        "  ".join(
            c.rjust(widths[i]) if i in numeric else c.ljust(widths[i]) for i, c in enumerate(row)
        ).rstrip()
        for row in lines
    ]
    t = report.total
    title = (
        f"GPU usage by {report.by}, {format_rfc3339(report.start_ms)} to {format_rfc3339(report.end_ms)}"
        + (f", per {report.every} (UTC)" if report.every else "")
    )
    out = [title, "", *text] if report.rows else [title, "", "no GPU was held in this range"]
    if t is not None:
        lab_rate = "-" if t.allocation_rate is None else f"{100 * t.allocation_rate:.1f} %"
        lab = (
            f"lab: {t.gpu_hours:.2f} GPU-hours, allocated {t.allocated_gpu_hours:.2f} ({lab_rate}), busy "
            f"{t.busy_gpu_hours:.2f}, idle but held {t.idle_held_gpu_hours:.2f}, {t.energy_kwh:.3f} kWh"
        )
        if t.cost is not None:
            lab += f", {t.cost:.2f} {report.currency}"
        out += ["", lab]
    return "\n".join(out) + "\n"


def _write(report: UsageReport, fmt: str, output: Path | None, out: TextIO) -> None:
    if fmt in ("table", "json"):
        text = table_text(report) if fmt == "table" else json.dumps(report.to_json(), indent=2) + "\n"
        if output is None:
            out.write(text)
            return
        _replace(output, lambda part: part.write_text(text, encoding="utf-8"))
        return
    from gpuwatch.store.export import write_columns  # DuckDB loads only for the formats that need it

    file_fmt: Format = "parquet" if fmt == "parquet" else "csv"
    if output is not None:
        _replace(output, lambda part: write_columns(report.columns(), part, file_fmt))
        return
    with tempfile.TemporaryDirectory(prefix="gpuwatch-report-") as d:
        path = Path(d) / "report.csv"
        write_columns(report.columns(), path, file_fmt)
        out.write(path.read_text(encoding="utf-8"))


def _replace(output: Path, write: Callable[[Path], object]) -> None:
    """Write through `<output>.part` and rename, so a failed write leaves no half file."""
    part = output.with_name(output.name + ".part")
    try:
        write(part)
        os.replace(part, output)
    except (OSError, GpuwatchError) as exc:
        part.unlink(missing_ok=True)
        raise UsageError(f"cannot write {output}: {getattr(exc, 'strerror', None) or exc}") from None


def run_report(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Clock | None = None,
) -> int:
    """Run `gpuwatch report`; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    clock = clock or SystemClock()
    now_ms = clock.now_ms()
    try:
        fmt = _format(args)
        start = parse_time_ms(args.start, now_ms)
        end = parse_time_ms(args.end, now_ms) if args.end else now_ms
        if end <= start:
            raise UsageError("--end must be after --start")
        if args.url:
            from gpuwatch.cli.access import auth_headers

            params = {"start": str(start / 1000), "end": str(end / 1000), "by": args.by}
            if args.every:
                params["every"] = args.every
            report = _over_http(args.url, params, auth_headers(args, env))
        else:
            report = _local(args, env, start, end, clock)
        _write(report, fmt, args.output, out)
    except (UsageError, ConnectionError, ConfigError) as exc:
        print(f"gpuwatch: {exc}", file=err)
        return 2
    except ValueError as exc:  # a range the report cannot split (too many periods)
        print(f"gpuwatch: {exc}", file=err)
        return 2
    except GpuwatchError as exc:
        print(f"gpuwatch: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", file=err)
        return 1
    if args.output is not None:
        print(f"wrote {args.output}: {len(report.rows):,} rows", file=out)
    return 0
