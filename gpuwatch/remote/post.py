"""Posting one remote-write request over HTTP(S) with a destination's credentials and TLS settings."""

from __future__ import annotations

import email.utils

import requests

from gpuwatch.core.clock import Clock
from gpuwatch.remote.config import RemoteWrite
from gpuwatch.remote.httpauth import failure, request_options
from gpuwatch.remote.sender import Answer, Post
from gpuwatch.remote.wire import HEADERS

_MAX_TEXT = 1000  # of a receiver's answer, kept for the log and the targets page


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
    return failure(exc)


def http_post(clock: Clock, session: requests.Session | None = None) -> Post:
    """A `Post` over `requests` (one session: connections kept alive between batches)."""
    http = session or requests.Session()

    def post(dest: RemoteWrite, body: bytes) -> Answer:
        try:
            opts = request_options(dest.headers, dest.auth, dest.tls)
        except OSError as exc:
            return Answer(0, f"cannot read the credentials file: {exc}")
        try:
            r = http.post(
                dest.url,
                data=body,
                headers={**opts.headers, **HEADERS},
                auth=opts.auth,
                timeout=dest.remote_timeout_s,
                verify=opts.verify,
                cert=opts.cert,
                allow_redirects=False,
            )
        except requests.RequestException as exc:
            return Answer(0, _reason(exc, dest.remote_timeout_s)[:_MAX_TEXT])
        return Answer(
            r.status_code, r.text[:_MAX_TEXT].strip(), _retry_after(r.headers.get("Retry-After"), clock.now())
        )

    return post
