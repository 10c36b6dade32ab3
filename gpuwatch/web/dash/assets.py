"""Plotly's JavaScript, served from the installed `plotly` package: no CDN.

The file (about 4.8 MB, 1.4 MB gzipped) is served under a URL that names its version, so browsers may
cache it for a year (`immutable`); it is read and gzipped once, at the first request, and sent
compressed to clients that accept gzip.
"""

from __future__ import annotations

import gzip
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from flask import Blueprint, Response, abort, current_app, request
from flask.typing import ResponseReturnValue

bp = Blueprint("dash_assets", __name__)

CACHE_CONTROL = "public, max-age=31536000, immutable"
_VERSION = re.compile(rb"plotly\.js v(\d+\.\d+\.\d+)")


def plotly_js_path() -> Path:
    """The plotly.min.js of the installed plotly package (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the plotly package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "package_data" / "plotly.min.js"


@dataclass(frozen=True)
class PlotlyAsset:
    version: str
    raw: bytes
    gzipped: bytes

    @property
    def url(self) -> str:
        return f"/static/vendor/plotly-{self.version}.min.js"


def load_plotly(path: Path) -> PlotlyAsset:
    raw = path.read_bytes()
    m = _VERSION.search(raw[:2000])
    version = m.group(1).decode() if m else "0"
    return PlotlyAsset(version, raw, gzip.compress(raw, compresslevel=6, mtime=0))


def plotly_asset() -> PlotlyAsset:
    """The app's Plotly asset, loaded at the first call (kept in app.extensions)."""
    asset = current_app.extensions.get("gpuwatch.plotly")
    if asset is None:
        asset = current_app.extensions["gpuwatch.plotly"] = load_plotly(plotly_js_path())
    return cast(PlotlyAsset, asset)


def plotly_version() -> str:
    """The version the URL names; reads only the file's head, not the whole asset."""
    version = current_app.extensions.get("gpuwatch.plotly_version")
    if version is None:
        with plotly_js_path().open("rb") as f:
            m = _VERSION.search(f.read(2000))
        version = current_app.extensions["gpuwatch.plotly_version"] = m.group(1).decode() if m else "0"
    return str(version)


def plotly_url() -> str:
    return f"/static/vendor/plotly-{plotly_version()}.min.js"


@bp.get("/static/vendor/plotly-<version>.min.js")
def plotly_js(version: str) -> ResponseReturnValue:
    asset = plotly_asset()
    if version != asset.version:
        abort(404)
    gz = "gzip" in request.headers.get("Accept-Encoding", "")
    resp = Response(asset.gzipped if gz else asset.raw, mimetype="text/javascript")
    if gz:
        resp.headers["Content-Encoding"] = "gzip"
    resp.headers["Vary"] = "Accept-Encoding"
    resp.headers["Cache-Control"] = CACHE_CONTROL
    return resp
