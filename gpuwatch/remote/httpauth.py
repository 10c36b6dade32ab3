"""A remote's headers, credentials and TLS settings as `requests` takes them, and a failed request in one
line (remote write and remote queries share them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import requests
import urllib3

from gpuwatch import __version__
from gpuwatch.collect.scrapeconfig import Auth, Tls

USER_AGENT = f"gpuwatch/{__version__}"
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")


@dataclass(frozen=True)
class RequestOptions:
    """The keyword arguments of a `requests` call that carry who gpuwatch is and how it connects."""

    headers: dict[str, str]
    auth: tuple[str, str] | None
    verify: bool | str
    cert: tuple[str, str] | None


def _secret(value: str, path: str) -> str:
    """An inline secret, or a file's (read on each request: a rotated token is used at once)."""
    return Path(path).read_text().strip() if path else value


def request_options(headers: tuple[tuple[str, str], ...], auth: Auth | None, tls: Tls) -> RequestOptions:
    """The options of one request; OSError where a credentials file cannot be read."""
    out = {**dict(headers), "User-Agent": USER_AGENT}
    basic = None
    if auth is not None and auth.kind == "basic":
        basic = (auth.username, _secret(auth.secret, auth.secret_file))
    elif auth is not None:
        out["Authorization"] = f"{auth.kind} {_secret(auth.secret, auth.secret_file)}"
    verify: bool | str = False if tls.insecure_skip_verify else (tls.ca_file or True)
    cert = (tls.cert_file, tls.key_file) if tls.cert_file else None
    return RequestOptions(out, basic, verify, cert)


def failure(exc: requests.RequestException) -> str:
    """One short line for a request that got no answer (requests' own text nests three exceptions)."""
    found = _ERRNO.search(str(exc))
    cause = exc.args[0] if exc.args else None
    # requests' ChunkedEncodingError is no ConnectionError: the remote died while it was answering
    dropped = isinstance(exc, requests.ConnectionError | requests.exceptions.ChunkedEncodingError)
    if dropped and isinstance(cause, urllib3.exceptions.ProtocolError):
        inner = cause.args[-1] if cause.args else None  # ('Connection aborted.', ConnectionResetError(...))
        why = inner.strerror if isinstance(inner, OSError) and inner.strerror else str(inner)
        when = "before" if isinstance(exc, requests.ConnectionError) else "during"
        return f"connection dropped {when} the answer: {why}"
    if isinstance(exc, requests.ConnectionError) and found:
        return f"cannot connect: {found.group(1).strip()}"
    return f"{type(exc).__name__}: {exc}"
