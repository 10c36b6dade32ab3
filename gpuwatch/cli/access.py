"""`gpuwatch token create|list|revoke` and `gpuwatch password set`, and the `--token` flags of the
commands that call a server (`silence`, `query --url`, `import --url`)."""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from gpuwatch.app.config import load
from gpuwatch.core.clock import Clock, SystemClock
from gpuwatch.core.credentials import PASSWORD_ROLES, ROLES, AccessError, AccessFile
from gpuwatch.core.errors import GpuwatchError

TOKEN_ENV = "GPUWATCH_TOKEN"


def add_token_arguments(p: argparse.ArgumentParser) -> None:
    """`--token` / `--token-file`: the credential sent to a server (default: $GPUWATCH_TOKEN)."""
    p.add_argument(
        "--token", help=f"token sent as 'Authorization: Bearer' (default: ${TOKEN_ENV}; none from loopback)"
    )
    p.add_argument("--token-file", dest="token_file", type=Path, help="read the token from this file")


def auth_headers(args: argparse.Namespace, env: Mapping[str, str]) -> dict[str, str]:
    """The Authorization header for `args`' token, if any. GpuwatchError: the token file is unreadable."""
    token = getattr(args, "token", None)
    path = getattr(args, "token_file", None)
    if not token and path is not None:
        try:
            token = path.read_text(encoding="utf-8").strip()
        except OSError as e:
            raise GpuwatchError(f"cannot read the token file {path}: {e.strerror or e}") from None
    token = token or env.get(TOKEN_ENV, "").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def add_access_commands(sub: Any) -> None:
    """Declare `gpuwatch token ...` and `gpuwatch password set`."""

    def where(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--data-dir", dest="data_dir", help="gpuwatch's data directory (default: as configured)"
        )
        q.add_argument("--config", type=Path, help="YAML settings file (also GPUWATCH_CONFIG)")

    token = sub.add_parser("token", help="tokens for the SDK, pushes, imports, Prometheus, Grafana")
    actions = token.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    help_text = "make a token and print it once (the last line of the output is the token alone)"
    create = actions.add_parser("create", help=help_text, description=help_text)
    create.add_argument("name", metavar="NAME")
    create.add_argument(
        "--role",
        choices=ROLES,
        default="machine",
        help="viewer: pages and reads; machine: also pushes, imports, alerts; admin: everything (default: machine)",
    )
    where(create)
    where(actions.add_parser("list", help="list the tokens (names and roles; secrets are not stored)"))
    revoke = actions.add_parser("revoke", help="remove a token: it stops working at once")
    revoke.add_argument("name", metavar="NAME")
    where(revoke)
    password = sub.add_parser("password", help="the viewer and admin passwords of the browser login")
    pw_actions = password.add_subparsers(dest="password_command", metavar="ACTION", required=True)
    help_text = "set a password, read from the terminal (twice) or from the first line of stdin"
    set_pw = pw_actions.add_parser("set", help=help_text, description=help_text)
    set_pw.add_argument("role", choices=PASSWORD_ROLES)
    where(set_pw)


def _access_file(args: argparse.Namespace, env: Mapping[str, str]) -> AccessFile:
    settings = load(args.config, dict(env), {"data_dir": args.data_dir})
    return AccessFile(settings.data_dir)


def _read_password(stdin: TextIO, err: TextIO) -> str:
    if stdin.isatty():
        first = getpass.getpass("New password: ", stream=err)
        if getpass.getpass("Again: ", stream=err) != first:
            raise AccessError("the two passwords differ; nothing changed")
        return first
    return stdin.readline().rstrip("\r\n")


def run_access(
    args: argparse.Namespace,
    env: Mapping[str, str],
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    stdin: TextIO | None = None,
    clock: Clock | None = None,
) -> int:
    """Run `gpuwatch token ...` or `gpuwatch password set`; return the exit code."""
    out, err, stdin = out or sys.stdout, err or sys.stderr, stdin or sys.stdin
    clock = clock or SystemClock()
    try:
        access = _access_file(args, env)
        if args.command == "password":
            access.set_password(args.role, _read_password(stdin, err))
            print(f"set the {args.role} password in {access.path}; sessions of the old one ended", file=out)
        elif args.token_command == "create":
            secret = access.create_token(args.name, args.role, clock.now_ms())
            print(f"created token {args.name!r} (role {args.role}); it is shown only this once:", file=out)
            print(secret, file=out)
        elif args.token_command == "list":
            tokens = access.tokens()
            if not tokens:
                print("(no tokens)", file=out)
            for t in tokens:
                made = (
                    datetime.fromtimestamp(t.created_ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
                    if t.created_ms
                    else "first start"
                )
                print(f"{t.name:<24} {t.role:<8} {made}", file=out)
        else:
            gone = access.revoke(args.name)
            print(f"revoked token {gone.name!r} (role {gone.role})", file=out)
    except GpuwatchError as e:
        print(f"gpuwatch: {e}", file=err)
        return 2
    except OSError as e:
        print(f"gpuwatch: {e.strerror or e}: {getattr(e, 'filename', '') or ''}".rstrip(": "), file=err)
        return 2
    return 0


def access_line(settings: Any, first_token: str | None) -> str:
    """The one start-up line that says which access mode the server is in (docs/security.md)."""
    reads = "pages and reads need a login" if settings.read_access == "login" else "pages and reads are open"
    if settings.auth == "off":
        return (
            f"access: auth off: anyone who reaches port {settings.port} may push, import, silence alerts "
            f"and reload rules; {reads} (set auth: on)"
        )
    if settings.read_only:
        return f"access: read-only: every write is refused (read_only: true); {reads}"
    loopback = (
        "this machine's loopback acts as admin" if settings.trust_loopback else "loopback is not trusted"
    )
    token_file = Path(settings.data_dir) / "machine-token"
    if first_token is not None:
        token = f"machine token (also in {token_file}): {first_token}"
    elif token_file.exists():
        token = f"machine token in {token_file}"
    else:
        token = "make tokens with: gpuwatch token create NAME --role machine|admin"
    return f"access: writes need a token, {loopback}; {reads}; {token}"
