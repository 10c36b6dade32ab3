"""`/api/export`: a query's answer, or a selector's raw samples, as a Parquet or CSV file.

Parameters: `query`, `start`, `end` (default now), `step` (optional: without it `query` must be a
series selector and every raw sample from `start` to `end` is written; with it, the range query's
answer), `format` (`parquet`, the default, or `csv`). The same limits and errors as /api/v1/query_range:
a bad parameter is a 400 JSON body, a query over `query_max_samples` a 422.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from flask import Blueprint, Response, jsonify
from flask.typing import ResponseReturnValue

from gpuwatch.query.longtable import long_table, raw_samples_query
from gpuwatch.store.export import FORMATS, Format, write_table
from gpuwatch.web.queryapi import (
    KNOWN_ERRORS,
    BadData,
    Params,
    error_status,
    instant_query,
    one,
    range_query,
    request_params,
    time_ms,
)
from gpuwatch.web.runtime import WebRuntime, runtime

bp = Blueprint("exportapi", __name__)

MEDIA_TYPES = {"parquet": "application/vnd.apache.parquet", "csv": "text/csv; charset=utf-8"}


def export_bytes(rt: WebRuntime, params: Params) -> tuple[bytes, Format, int]:
    """Evaluate the export `params` ask for and return the file's bytes, format and rows."""
    asked = one(params, "format") or "parquet"
    fmt = next((f for f in FORMATS if f == asked), None)
    if fmt is None:
        raise BadData(f'invalid parameter "format": expected parquet or csv, got "{asked}"')
    if not (one(params, "query") or "").strip():
        raise BadData('invalid parameter "query": empty query')
    if not one(params, "start"):
        raise BadData('invalid parameter "start": missing')
    now = rt.clock.now_ms()
    params = {**params, "end": params.get("end") or [str(now / 1000)]}
    if one(params, "step"):
        result = range_query(rt, params)
    else:
        start = time_ms(one(params, "start") or "", "start")
        end = time_ms(one(params, "end") or "", "end")
        if end < start:
            raise BadData('invalid parameter "end": end timestamp must not be before start time')
        text = raw_samples_query(one(params, "query") or "", start, end)
        result = instant_query(rt, {**params, "query": [text], "time": [str(end / 1000)]})
    try:
        table = long_table(result)
    except TypeError as exc:
        raise BadData(str(exc)) from None
    fd, name = tempfile.mkstemp(suffix=f".{fmt}", prefix="gpuwatch-export-")
    os.close(fd)
    try:
        write_table(table, Path(name), fmt)
        return Path(name).read_bytes(), fmt, len(table)
    finally:
        Path(name).unlink(missing_ok=True)


@bp.route("/api/export", methods=["GET", "POST"])
def export() -> ResponseReturnValue:
    """Answer with the export as a file download."""
    try:
        data, fmt, rows = export_bytes(runtime(), request_params())
    except KNOWN_ERRORS as exc:
        status, error_type = error_status(exc)
        return jsonify({"status": "error", "errorType": error_type, "error": str(exc)}), status
    return Response(
        data,
        mimetype=MEDIA_TYPES[fmt],
        headers={
            "Content-Disposition": f'attachment; filename="gpuwatch-export.{fmt}"',
            "X-Gpuwatch-Rows": str(rows),  # `gpuwatch export --url` says how many it wrote
        },
    )
