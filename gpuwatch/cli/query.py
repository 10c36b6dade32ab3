"""`gpuwatch query` and `gpuwatch import`: run against a server's API (`--url`) or a stopped data directory.

Both print one line per problem on stderr and return an exit code: 0 fine, 1 the input or query is
wrong, 2 the environment is (bad flag value, server unreachable, data directory in use).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import requests

from gpuwatch.app.config import Settings, load
from gpuwatch.core import units
from gpuwatch.core.clock import Clock, SystemClock
from gpuwatch.core.errors import ConfigError, GpuwatchError, StoreInUse
from gpuwatch.core.model import LabelLimits

if TYPE_CHECKING:
    from gpuwatch.cli.tbimport import EventImport

_RELATIVE = re.compile(r"(?:now)?\s*([-+])\s*(\S+)")
HTTP_TIMEOUT_S = 300.0


class UsageError(Exception):
    """A flag value cannot be understood (exit 2)."""


def parse_duration_ms(text: str) -> int:
    """Parse `15s`, `1m30s`, `1.5h` or plain seconds into milliseconds."""
    try:
        return units.parse_duration_ms(text)
    except ValueError:
        raise UsageError(f"cannot parse {text.strip()!r} as a duration like 15s, 5m or 1h30m") from None


def parse_time_ms(text: str, now_ms: int) -> int:
    """Parse `now`, `now-1h`, `-1h`, Unix seconds or RFC3339 into Unix milliseconds."""
    text = text.strip()
    if text == "now":
        return now_ms
    m = _RELATIVE.fullmatch(text)
    if m is not None and not text[1:].replace(".", "").isdigit():
        delta = parse_duration_ms(m.group(2))
        return now_ms - delta if m.group(1) == "-" else now_ms + delta
    try:
        return units.parse_time_ms(text)
    except ValueError:
        raise UsageError(
            f"cannot parse {text!r} as a time: use RFC3339, Unix seconds, now or now-1h"
        ) from None


def add_query_arguments(p: argparse.ArgumentParser) -> None:
    """Declare `gpuwatch query`'s flags."""
    p.add_argument("expr", metavar="EXPR", help="PromQL expression")
    p.add_argument("--time", help="evaluation time for an instant query (default: now)")
    p.add_argument("--start", help="start of a range query: RFC3339, Unix seconds, now-1h or -1h")
    p.add_argument("--end", help="end of a range query (default: now)")
    p.add_argument("--step", help="resolution of a range query, e.g. 15s (default: range/250, at least 1s)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running gpuwatch, e.g. http://127.0.0.1:9842")
    where.add_argument("--data-dir", dest="data_dir", help="a stopped gpuwatch's data directory")
    p.add_argument("--config", type=Path, help="YAML settings file (also GPUWATCH_CONFIG)")
    p.add_argument("--json", action="store_true", help="print the Prometheus API's data object as JSON")


def _format_time(ms: float) -> str:
    when = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(ms) % 1000:03d}Z"


def format_metric(metric: Mapping[str, str]) -> str:
    """Write a label set as PromQL would: `name{a="1", b="2"}`."""
    name = metric.get("__name__", "")
    inner = ", ".join(f'{k}="{v}"'.replace("\n", "\\n") for k, v in sorted(metric.items()) if k != "__name__")
    return f"{name}{{{inner}}}" if inner or not name else name


def render_table(data: Mapping[str, Any]) -> str:
    """Render a Prometheus `data` object (vector, matrix, scalar, string) as readable text."""
    kind, result = data.get("resultType"), data.get("result")
    if kind in ("scalar", "string"):
        t, v = result  # type: ignore[misc]
        return f"{v}  @ {_format_time(float(t) * 1000)}\n"
    if not result:
        return "(no data)\n"
    lines: list[str] = []
    if kind == "vector":
        rows = [
            (format_metric(r["metric"]), r["value"][1], _format_time(float(r["value"][0]) * 1000))
            for r in result
        ]
        w0 = max(len("SERIES"), *(len(r[0]) for r in rows))
        w1 = max(len("VALUE"), *(len(r[1]) for r in rows))
        lines.append(f"{'SERIES':<{w0}}  {'VALUE':>{w1}}  TIME")
        lines.extend(f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows)
        return "\n".join(lines) + "\n"
    for i, r in enumerate(result):
        if i:
            lines.append("")
        lines.append(format_metric(r["metric"]))
        lines.extend(f"  {_format_time(float(t) * 1000)}  {v}" for t, v in r["values"])
    return "\n".join(lines) + "\n"


def _settings(args: argparse.Namespace, env: Mapping[str, str]) -> Settings:
    return load(args.config, dict(env), {"data_dir": args.data_dir})


def _in_use(settings: Settings) -> str:
    return (
        f"data directory {settings.data_dir} is in use by a running gpuwatch; "
        f"use --url http://127.0.0.1:{settings.port}"
    )


def _times(args: argparse.Namespace, now_ms: int) -> dict[str, int] | None:
    """Return instant {'time'} or range {'start','end','step'} in ms; None means an instant query at now."""
    if args.start is None:
        if args.end is not None or args.step is not None:
            raise UsageError("--end and --step need --start")
        return {"time": parse_time_ms(args.time, now_ms)} if args.time else None
    if args.time is not None:
        raise UsageError("use either --time or --start/--end/--step")
    start = parse_time_ms(args.start, now_ms)
    end = parse_time_ms(args.end, now_ms) if args.end else now_ms
    if end < start:
        raise UsageError("--end must not be before --start")
    step = parse_duration_ms(args.step) if args.step else max(1000, (end - start) // 250 // 1000 * 1000)
    if step <= 0:
        raise UsageError("--step must be positive")
    return {"start": start, "end": end, "step": step}


def _over_http(
    url: str, expr: str, times: dict[str, int] | None, now_ms: int, auth: dict[str, str]
) -> dict[str, Any]:
    base = url.rstrip("/")
    if times is not None and "start" in times:
        path = "/api/v1/query_range"
        params = {"query": expr, **{k: str(v / 1000) for k, v in times.items()}}
    else:
        path = "/api/v1/query"
        params = {"query": expr, "time": str((times or {"time": now_ms})["time"] / 1000)}
    try:
        resp = requests.post(base + path, data=params, headers=auth, timeout=HTTP_TIMEOUT_S)
    except requests.RequestException as exc:
        raise ConnectionError(f"cannot reach {base}: {type(exc).__name__}") from None
    try:
        body = resp.json()
    except ValueError:
        raise ConnectionError(f"{base}{path} answered HTTP {resp.status_code} without JSON") from None
    if body.get("status") != "success":
        raise GpuwatchError(str(body.get("error") or f"HTTP {resp.status_code}"))
    return dict(body["data"])


def _local(
    settings: Settings, expr: str, times: dict[str, int] | None, now_ms: int, clock: Clock
) -> dict[str, Any]:
    from gpuwatch.query import Engine, to_prometheus_json
    from gpuwatch.store import Store

    store = Store.open(settings.data_dir, clock=clock, retention_s=settings.retention, read_only=True)
    try:
        engine = Engine.configured(store, settings, clock.monotonic)
        if times is not None and "start" in times:
            return to_prometheus_json(engine.range(expr, times["start"], times["end"], times["step"]))
        return to_prometheus_json(engine.instant(expr, (times or {"time": now_ms})["time"]))
    finally:
        store.close()


def run_query(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Clock | None = None,
) -> int:
    """Run `gpuwatch query`; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    import json

    clock = clock or SystemClock()
    now_ms = clock.now_ms()
    say: Callable[[str], None] = lambda msg: print(f"gpuwatch: {msg}", file=err)  # noqa: E731
    try:
        times = _times(args, now_ms)
        if args.url:
            from gpuwatch.cli.access import auth_headers

            data = _over_http(args.url, args.expr, times, now_ms, auth_headers(args, env))
        else:
            settings = _settings(args, env)
            try:
                data = _local(settings, args.expr, times, now_ms, clock)
            except StoreInUse:
                say(_in_use(settings))
                return 2
    except (UsageError, ConnectionError, ConfigError) as exc:
        say(str(exc))
        return 2
    except GpuwatchError as exc:
        say(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return 1
    out.write(json.dumps(data) + "\n" if args.json else render_table(data))
    return 0


# -- gpuwatch import ----------------------------------------------------------------------------------


def add_import_arguments(p: argparse.ArgumentParser) -> None:
    """Declare `gpuwatch import`'s flags."""
    p.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="Prometheus text or OpenMetrics file ('-' = stdin), or a TensorBoard event file or run folder",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--url", help="import through a running gpuwatch, e.g. http://127.0.0.1:9842")
    where.add_argument("--data-dir", dest="data_dir", help="a stopped gpuwatch's data directory")
    p.add_argument("--config", type=Path, help="YAML settings file (also GPUWATCH_CONFIG)")
    p.add_argument("--partial", action="store_true", help="import the valid lines even if some are bad")
    p.add_argument(
        "--format",
        choices=("auto", "text", "openmetrics"),
        default="auto",
        help="input format (default: OpenMetrics if the file ends with '# EOF')",
    )


def _read(name: str, stdin: Any) -> bytes:
    if name == "-":
        return bytes(stdin.buffer.read() if hasattr(stdin, "buffer") else stdin.read().encode())
    try:
        return Path(name).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {name}: {exc.strerror or exc}") from None


def _post(
    url: str, name: str, data: bytes, openmetrics: bool | None, partial: bool, auth: dict[str, str]
) -> tuple[int, int]:
    from gpuwatch.promtext.formats import OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE

    headers = dict(auth)
    if openmetrics is not None:
        headers["Content-Type"] = OPENMETRICS_CONTENT_TYPE if openmetrics else TEXT_CONTENT_TYPE
    endpoint = url.rstrip("/") + "/api/v1/import/prometheus" + ("?partial=1" if partial else "")
    try:
        resp = requests.post(endpoint, data=data, headers=headers, timeout=HTTP_TIMEOUT_S)
        body = resp.json()
    except requests.RequestException as exc:
        raise ConnectionError(f"cannot reach {url.rstrip('/')}: {type(exc).__name__}") from None
    except ValueError:
        raise ConnectionError(f"{endpoint} answered HTTP {resp.status_code} without JSON") from None
    if body.get("status") != "success":
        raise GpuwatchError(f"{name}: server refused the import: {body.get('error')}")
    return int(body["data"]["samples"]), int(body["data"]["series"])


def _inputs(
    names: list[str], stdin: Any, now_ms: int, limits: LabelLimits
) -> tuple[list[tuple[str, bytes]], list[EventImport]]:
    """Read the files to import: Prometheus text, and TensorBoard event files or run folders."""
    from gpuwatch.cli import tbimport

    files, events = [], []
    for name in names:
        if tbimport.is_event_target(name):
            if not Path(name).exists():
                raise UsageError(f"cannot read {name}: no such file or folder")
            events.append(tbimport.prepare_events(name, now_ms=now_ms, limits=limits))
            continue
        data = _read(name, stdin)
        if name != "-" and tbimport.looks_like_events(data):
            events.append(tbimport.prepare_events(name, now_ms=now_ms, limits=limits))
        else:
            files.append((name, data))
    return files, events


def run_import(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: Any = None,
    clock: Clock | None = None,
) -> int:
    """Run `gpuwatch import`: check every file first, then import them all (or none)."""
    out, err, stdin = out or sys.stdout, err or sys.stderr, stdin or sys.stdin
    from gpuwatch.cli import tbimport
    from gpuwatch.collect.importer import prepare, write

    clock = clock or SystemClock()
    now_ms = clock.now_ms()
    openmetrics = {"auto": None, "text": False, "openmetrics": True}[args.format]
    say: Callable[[str], None] = lambda msg: print(f"gpuwatch: {msg}", file=err)  # noqa: E731
    try:
        settings = _settings(args, env)
        limits = settings.label_limits
        files, events = _inputs(args.files, stdin, now_ms, limits)
        prepared = [
            (name, data, prepare(data, now_ms=now_ms, openmetrics=openmetrics, limits=limits))
            for name, data in files
        ]
        bad = 0
        for name, p in [(n, p) for n, _, p in prepared] + [(ev.name, ev.prepared) for ev in events]:
            for e in p.errors:
                print(f"{name}:{e.line_no}: {e.message}" if e.line_no else f"{name}: {e.message}", file=err)
                bad += 1
        if bad and not args.partial:
            say(f"{bad} invalid line(s); nothing imported (use --partial to import the valid lines)")
            return 1
        if args.url:
            from gpuwatch.cli.access import auth_headers

            auth = auth_headers(args, env)
            for name, data, _ in prepared:
                samples, series = _post(args.url, name, data, openmetrics, args.partial, auth)
                print(f"imported {samples} samples in {series} series from {name}", file=out)
            for ev in events:
                print(tbimport.summary(ev, *tbimport.post(args.url, ev, auth)), file=out)
            return 0
        from gpuwatch.store import Store

        try:
            store = Store.open(settings.data_dir, clock=clock, retention_s=settings.retention)
        except StoreInUse:
            say(_in_use(settings))
            return 2
        try:
            for name, _, p in prepared:
                result = write(store, p)
                print(f"imported {result.samples} samples in {result.series} series from {name}", file=out)
                if result.oldest_ms is not None and result.oldest_ms < now_ms - settings.retention * 1000:
                    say(f"{name}: some samples are older than the retention period and will be removed")
            for ev in events:
                print(tbimport.summary(ev, *tbimport.write_local(store, store, ev)), file=out)
        finally:
            store.close()
    except (UsageError, ConnectionError, ConfigError) as exc:
        say(str(exc))
        return 2
    except GpuwatchError as exc:
        say(str(exc))
        return 1
    return 0
