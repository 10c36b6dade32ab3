"""The two exposition formats, Prometheus text 0.0.4 and OpenMetrics 1.0: their content types, and which
one a body is in, told from its Content-Type or from the text itself."""

from __future__ import annotations

OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text"
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def is_openmetrics_content_type(content_type: str | None) -> bool | None:
    """Tell from a Content-Type whether the body is OpenMetrics (True), text (False) or unknown (None)."""
    if not content_type:
        return None
    media = content_type.split(";", 1)[0].strip().lower()
    if media == OPENMETRICS_CONTENT_TYPE:
        return True
    if media == "text/plain":
        return False
    return None


def looks_like_openmetrics(text: str) -> bool:
    """Guess the format: OpenMetrics ends with `# EOF` (and at most one newline after it)."""
    tail = text[-8:]
    return tail.endswith("\n# EOF\n") or tail.endswith("\n# EOF") or text in ("# EOF", "# EOF\n")
