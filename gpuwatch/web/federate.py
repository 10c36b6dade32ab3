"""GET /federate: the newest sample of every stored series matching `match[]`, as Prometheus serves it.

A hub gpuwatch (or a Prometheus) scrapes a node's `/federate` with `honor_labels: true` and so receives
everything the node stored: its GPU and host figures, what it scraped (vLLM, SGLang, exporters) with
their own `job`/`instance`, what was pushed to it, and its recording rules' outputs, each sample with
its original timestamp. As in Prometheus: at least one `match[]` selector (a series matching several
counts once); per series the newest sample within the lookback window (5 minutes by default), none
where that sample is a staleness marker; text format 0.0.4, one `# TYPE <name> untyped` line per
name, names sorted, timestamps in milliseconds; gzip when the client accepts it.

What gpuwatch adds, for a lab where every node scrapes its inference server on the same local address:
an `instance` naming a loopback address (`127.0.0.1:8000`, `localhost:8000`, `[::1]:8000`) is sent with
this node's host name instead (`gpu-node-1:8000`), so the hub keeps two nodes' servers apart. And a node
never hands back what it got from another server's `/federate` (a hub that is also scraped, or two
servers that scrape each other): only what this gpuwatch collected itself is served, unless the request
says `federated=true` (a central Prometheus that federates a hub, knowing there is no loop).
"""

from __future__ import annotations

import gzip
import re

from flask import Blueprint, Response, request
from flask.typing import ResponseReturnValue

from gpuwatch.core.errors import GpuwatchError
from gpuwatch.core.model import Labels, Matcher, is_stale
from gpuwatch.promtext.writer import CONTENT_TYPE, encode_text, format_federate
from gpuwatch.query.parse import selector_matchers
from gpuwatch.web.queryapi import BadData, request_params
from gpuwatch.web.runtime import runtime

bp = Blueprint("federate", __name__)

_LOOPBACK = re.compile(r"^(?:127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?$")
_GZIP_MIN_BYTES = 1024


def _plain(message: str, status: int) -> Response:
    return Response(message + "\n", status=status, content_type="text/plain; charset=utf-8")


def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("", "0", "false", "no"):
        return False
    raise BadData(f'invalid parameter "federated": {text!r} is not true or false')


def node_instance(labels: Labels, hostname: str) -> Labels:
    """`labels` with a loopback `instance` renamed to `hostname` (the port kept)."""
    for i, (k, v) in enumerate(labels):
        if k == "instance":
            m = _LOOPBACK.match(v)
            if m is None or not hostname:
                return labels
            return (*labels[:i], ("instance", hostname + (m.group(1) or "")), *labels[i + 1 :])
    return labels


@bp.get("/federate")
def federate() -> ResponseReturnValue:
    """Serve the newest sample of each series matching any `match[]` selector (module docstring)."""
    try:
        params = request_params()
        texts = params.get("match[]", [])
        if not texts:
            return _plain("bad request: no match[] parameter provided", 400)
        sets: list[list[Matcher]] = [selector_matchers(t) for t in texts]
        everything = _flag(params.get("federated", ["false"])[-1])
    except (BadData, GpuwatchError) as e:
        return _plain(f"bad request: {e}", 400)
    rt = runtime()
    now_ms = rt.clock.now_ms()
    start_ms = now_ms - int(rt.settings.lookback * 1000)
    is_federated = None if everything else rt.federation_filter()
    hostname = rt.hostname
    rows: dict[tuple[str, Labels], tuple[str, Labels, int, float]] = {}
    for matchers in sets:
        for s in rt.store.select_last(matchers, start_ms, now_ms):
            if not len(s.values):
                continue
            value = float(s.values[-1])
            if is_stale(value) or (is_federated is not None and is_federated(s.name, s.labels)):
                continue
            labels = node_instance(s.labels, hostname)
            rows.setdefault((s.name, labels), (s.name, labels, int(s.timestamps_ms[-1]), value))
    body = encode_text(format_federate(rows.values()))
    response = Response(body, content_type=CONTENT_TYPE)
    if len(body) >= _GZIP_MIN_BYTES and request.accept_encodings["gzip"]:
        response.set_data(gzip.compress(body, compresslevel=1))
        response.headers["Content-Encoding"] = "gzip"
    response.headers["Vary"] = "Accept-Encoding"
    return response
