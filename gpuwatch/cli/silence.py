"""`gpuwatch silence add | list | expire`: manage silences of a running gpuwatch over its Alertmanager API.

One line per problem on stderr and an exit code: 0 fine, 1 the server refused the request or a
matcher is bad, 2 the environment is wrong (bad flag value, bad settings, server unreachable).
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

import requests

from gpuwatch.app.config import load
from gpuwatch.cli.access import add_token_arguments, auth_headers
from gpuwatch.cli.query import UsageError, parse_duration_ms, parse_time_ms
from gpuwatch.core.clock import Clock, SystemClock
from gpuwatch.core.errors import ConfigError, GpuwatchError
from gpuwatch.core.units import format_rfc3339_millis as format_time
from gpuwatch.notify.matchers import format_matcher, parse_matcher

HTTP_TIMEOUT_S = 30.0


def add_silence_arguments(p: argparse.ArgumentParser) -> None:
    """Declare `gpuwatch silence`'s actions and flags."""
    actions = p.add_subparsers(dest="silence_command", metavar="ACTION", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--url", help="the running gpuwatch (default: http://127.0.0.1:<configured port>)")
        q.add_argument("--config", type=Path, help="YAML settings file, for the port (also GPUWATCH_CONFIG)")
        add_token_arguments(q)

    help_text = "silence alerts matching every MATCHER (name=value, name!=value, name=~regex, name!~regex)"
    add = actions.add_parser("add", help=help_text, description=help_text)
    add.add_argument(
        "matchers", nargs="+", metavar="MATCHER", help="a bare first word means alertname=WORD, as in amtool"
    )
    add.add_argument("-c", "--comment", required=True, help="why (required)")
    add.add_argument("-a", "--author", help="who (default: your user name)")
    add.add_argument("--start", help="when it starts: RFC3339, Unix seconds or now+1h (default: now)")
    until = add.add_mutually_exclusive_group()
    until.add_argument("-d", "--duration", help="how long it lasts, e.g. 2h or 30m (default: 1h)")
    until.add_argument("--end", help="when it ends: RFC3339, Unix seconds or now+2h")
    common(add)

    help_text = "list active and pending silences (expired ones with --expired)"
    ls = actions.add_parser("list", help=help_text, description=help_text)
    ls.add_argument("matchers", nargs="*", metavar="MATCHER", help="only silences with these matchers")
    ls.add_argument("--expired", action="store_true", help="list expired silences instead")
    ls.add_argument("-q", "--quiet", action="store_true", help="print only the ids")
    common(ls)

    help_text = "expire silences now (they stay listed with --expired for five days)"
    ex = actions.add_parser("expire", help=help_text, description=help_text)
    ex.add_argument("ids", nargs="+", metavar="ID")
    common(ex)


def _base_url(args: argparse.Namespace, env: Mapping[str, str]) -> str:
    if args.url:
        return str(args.url).rstrip("/")
    settings = load(args.config, dict(env), {})
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.port}"


def _call(method: str, url: str, **kw: Any) -> Any:
    try:
        resp = requests.request(method, url, timeout=HTTP_TIMEOUT_S, **kw)
    except requests.RequestException as exc:
        raise ConnectionError(f"cannot reach {url.split('/api/')[0]}: {type(exc).__name__}") from None
    try:
        body = resp.json() if resp.content else None
    except ValueError:
        raise ConnectionError(f"{url} answered HTTP {resp.status_code} without JSON") from None
    if resp.status_code >= 400:
        msg = body.get("error") if isinstance(body, dict) else body
        raise GpuwatchError(str(msg or f"HTTP {resp.status_code}"))
    return body


def _matchers(texts: list[str]) -> list[str]:
    """Return the matchers as strings, checked; a first word without an operator means alertname=WORD."""
    out = list(texts)
    if out and "=" not in out[0] and "!~" not in out[0]:
        out[0] = f"alertname={out[0]}"
    for t in out:
        parse_matcher(t)
    return out


def _user(env: Mapping[str, str]) -> str:
    """Return the user's name as getpass does, from the environment we were given."""
    for key in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if env.get(key):
            return env[key]
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return "unknown"


def _short_time(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(silences: list[dict[str, Any]]) -> str:
    from gpuwatch.notify.silences import parse_time

    def matchers(s: dict[str, Any]) -> str:
        return " ".join(
            format_matcher(m["name"], m["value"], bool(m["isRegex"]), bool(m.get("isEqual", True)))
            for m in s["matchers"]
        )

    rows = [
        (
            s["id"],
            matchers(s),
            s["status"]["state"],
            _short_time(parse_time(s["startsAt"])),
            _short_time(parse_time(s["endsAt"])),
            s["createdBy"],
            s["comment"].replace("\n", " "),
        )
        for s in silences
    ]
    head = ("ID", "MATCHERS", "STATE", "STARTS", "ENDS", "CREATED BY", "COMMENT")
    widths = [max(len(head[i]), *(len(r[i]) for r in rows)) for i in range(len(head) - 1)]
    lines = [
        "  ".join(f"{c:<{w}}" for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1]
        for r in [head, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def _add(
    args: argparse.Namespace,
    env: Mapping[str, str],
    base: str,
    now_ms: int,
    out: TextIO,
    auth: dict[str, str],
) -> None:
    matchers = [parse_matcher(t).to_json() for t in _matchers(args.matchers)]
    start = parse_time_ms(args.start, now_ms) if args.start else now_ms
    if args.end:
        end = parse_time_ms(args.end, now_ms)
    else:
        duration = parse_duration_ms(args.duration or "1h")
        if duration <= 0:
            raise UsageError("--duration must be longer than 0")
        end = start + duration
    if end <= start:
        raise UsageError("the silence must end after it starts")
    body = {
        "matchers": matchers,
        "startsAt": format_time(start),
        "endsAt": format_time(end),
        "createdBy": args.author or _user(env),
        "comment": args.comment,
    }
    answer = _call("POST", base + "/api/v2/silences", json=body, headers=auth)
    print(answer["silenceID"], file=out)


def _list(args: argparse.Namespace, base: str, out: TextIO, auth: dict[str, str]) -> None:
    params = [("filter", m) for m in _matchers(args.matchers)]
    found = _call("GET", base + "/api/v2/silences", params=params, headers=auth)
    shown = [s for s in found if (s["status"]["state"] == "expired") == args.expired]
    if args.quiet:
        out.write("".join(f"{s['id']}\n" for s in shown))
    elif not shown:
        out.write("(no expired silences)\n" if args.expired else "(no silences)\n")
    else:
        out.write(_table(shown))


def run_silence(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    clock: Clock | None = None,
) -> int:
    """Run `gpuwatch silence ACTION`; return the exit code."""
    out, err = out or sys.stdout, err or sys.stderr
    now_ms = (clock or SystemClock()).now_ms()
    try:
        base = _base_url(args, env)
        auth = auth_headers(args, env)
        if args.silence_command == "add":
            _add(args, env, base, now_ms, out, auth)
        elif args.silence_command == "list":
            _list(args, base, out, auth)
        else:
            for sid in args.ids:
                _call("DELETE", f"{base}/api/v2/silence/{quote(sid, safe='')}", headers=auth)
                print(f"expired {sid}", file=out)
    except (UsageError, ConnectionError, ConfigError) as exc:
        print(f"gpuwatch: {exc}", file=err)
        return 2
    except GpuwatchError as exc:
        print(f"gpuwatch: {exc}", file=err)
        return 1
    return 0
