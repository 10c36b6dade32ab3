"""Posting one remote-write request over HTTP(S) with a destination's credentials and TLS settings."""

from __future__ import annotations

import email.utils
import re
from pathlib import Path

import requests

from gpuwatch import __version__
from gpuwatch.core.clock import Clock
from gpuwatch.remote.config import RemoteWrite
from gpuwatch.remote.sender import Answer, Post
from gpuwatch.remote.wire import HEADERS

_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
_MAX_TEXT = 1000  # of a receiver's answer, kept for the log and the targets page


def _secret(value: str, path: str) -> str:
    """An inline secret, or a file's (read on each request: a rotated token is used at once)."""
    return Path(path).read_text().strip() if path else value


def _retry_after(header: str | None, now_s: float) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date."""
    if not header:
        return None
    text = header.strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now_s)


def _reason(exc: requests.RequestException, timeout_s: float) -> str:
    """One short line for a request that got no answer (requests' own text nests three exceptions)."""
    if isinstance(exc, requests.Timeout):
        return f"no answer within remote_timeout ({timeout_s:g} s)"
    found = _ERRNO.search(str(exc))
    if isinstance(exc, requests.ConnectionError) and found:
        return f"cannot connect: {found.group(1).strip()}"
    return f"{type(exc).__name__}: {exc}"


def http_post(clock: Clock, session: requests.Session | None = None) -> Post:
    """A `Post` over `requests` (one session: connections kept alive between batches)."""
    http = session or requests.Session()

    def post(dest: RemoteWrite, body: bytes) -> Answer:
        headers = {**dict(dest.headers), **HEADERS, "User-Agent": f"gpuwatch/{__version__}"}
        auth = None
        try:
            if dest.auth is not None and dest.auth.kind == "basic":
                auth = (dest.auth.username, _secret(dest.auth.secret, dest.auth.secret_file))
            elif dest.auth is not None:
                headers["Authorization"] = (
                    f"{dest.auth.kind} {_secret(dest.auth.secret, dest.auth.secret_file)}"
                )
        except OSError as exc:
            return Answer(0, f"cannot read the credentials file: {exc}")
        tls = dest.tls
        verify: bool | str = False if tls.insecure_skip_verify else (tls.ca_file or True)
        cert = (tls.cert_file, tls.key_file) if tls.cert_file else None
        try:
            r = http.post(
                dest.url,
                data=body,
                headers=headers,
                auth=auth,
                timeout=dest.remote_timeout_s,
                verify=verify,
                cert=cert,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            return Answer(0, _reason(exc, dest.remote_timeout_s)[:_MAX_TEXT])
        return Answer(
            r.status_code, r.text[:_MAX_TEXT].strip(), _retry_after(r.headers.get("Retry-After"), clock.now())
        )

    return post
