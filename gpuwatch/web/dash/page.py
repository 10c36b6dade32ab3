"""What every dashboard page shares: the navigation, the UI strings, the page's JSON and its twin.

A page module renders with `render_page(template, page=..., panels=..., data=..., variables=...)`
and answers its JSON twin (`/api/ui/<page>...`) with `page_json(...)` from the same arguments, so
the twin holds exactly what the page was drawn from.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from flask import Blueprint, jsonify, render_template, request
from flask.typing import ResponseReturnValue

import gpuwatch
from gpuwatch.web.dash.assets import plotly_url
from gpuwatch.web.dash.i18n import LANGUAGES, strings
from gpuwatch.web.dash.panel import Panel, panels_json
from gpuwatch.web.runtime import runtime

bp = Blueprint("dash_page", __name__)

DEFAULT_FROM = "now-1h"  # a page's range where the URL gives none

# (path, string key, page id) of every page, in the navigation's order.
NAV: tuple[tuple[str, str, str], ...] = (
    ("/", "nav.cluster", "cluster"),
    ("/usage", "nav.usage", "usage"),
    ("/training", "nav.training", "training"),
    ("/inference", "nav.inference", "inference"),
    ("/alerts", "nav.alerts", "alerts"),
    ("/explore", "nav.explore", "explore"),
    ("/targets", "nav.targets", "targets"),
    ("/logs", "nav.logs", "logs"),
    ("/timeline", "nav.timeline", "timeline"),
)


def language() -> str:
    """The UI language: the `lang` URL parameter when it names one, else the `language` setting."""
    asked = request.args.get("lang", "")
    if asked in LANGUAGES:
        return asked
    lang = getattr(runtime().settings, "language", "en")
    return lang if lang in LANGUAGES else "en"


def page_payload(
    page: str,
    panels: Iterable[Panel] = (),
    data: Mapping[str, Any] | None = None,
    variables: Mapping[str, str] | None = None,
    tables: Iterable[Mapping[str, tuple[str, str]]] = (),
    default_from: str = DEFAULT_FROM,
) -> dict[str, Any]:
    """The page's data as its template embeds it and its JSON twin returns it (`default_from`: the
    range's start where the URL names none, as the time picker writes it)."""
    rt = runtime()
    texts = strings(language(), *tables)
    return {
        "page": page,
        "now_ms": rt.clock.now_ms(),
        "variables": dict(variables or {}),
        "panels": panels_json(panels, texts),
        "data": dict(data or {}),
        "default_from": default_from,
    }


def render_page(
    template: str,
    *,
    page: str,
    panels: Iterable[Panel] = (),
    data: Mapping[str, Any] | None = None,
    variables: Mapping[str, str] | None = None,
    tables: Iterable[Mapping[str, tuple[str, str]]] = (),
    title: str = "",
    default_from: str = DEFAULT_FROM,
) -> ResponseReturnValue:
    """Render a page template (which extends base.html) with the page's payload."""
    tables = tuple(tables)
    payload = page_payload(page, panels, data, variables, tables, default_from)
    texts = strings(language(), *tables)
    return render_template(
        template,
        page=page,
        payload=payload,
        panels=payload["panels"],
        data=payload["data"],
        variables=payload["variables"],
        gw_strings=texts,
        t=lambda key: texts.get(key, key),
        title=title,
    )


def page_json(
    page: str,
    panels: Iterable[Panel] = (),
    data: Mapping[str, Any] | None = None,
    variables: Mapping[str, str] | None = None,
    tables: Iterable[Mapping[str, tuple[str, str]]] = (),
) -> ResponseReturnValue:
    return jsonify(page_payload(page, panels, data, variables, tables))


@bp.app_context_processor
def base_context() -> dict[str, Any]:
    """What base.html needs on every page, error pages included."""
    lang = language()
    texts = strings(lang)
    return {
        "gw_lang": lang,
        "gw_nav": [(path, texts.get(key, key), pid) for path, key, pid in NAV],
        "gw_plotly_url": plotly_url(),
        "gw_version": gpuwatch.__version__,
        "gw_demo": bool(getattr(runtime().settings, "demo", False)),
        "t": lambda key: texts.get(key, key),
    }
