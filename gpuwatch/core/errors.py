"""Exception hierarchy: one root, a few kinds, each with a one-line message for users."""

from __future__ import annotations


class GpuwatchError(Exception):
    """Root of every error gpuwatch raises on purpose; `http_status` is the API's answer to it."""

    http_status: int = 422


class ConfigError(GpuwatchError):
    """A setting is missing or has a bad value."""


class NvmlUnavailable(GpuwatchError):
    """No NVIDIA driver or GPU could be reached through NVML."""


class StoreError(GpuwatchError):
    """The store could not be opened, read or written."""


class StoreInUse(StoreError):
    """Another running gpuwatch owns the data directory."""


class SeriesLimitExceeded(GpuwatchError):
    """A push, import or scrape would make more new series than `max_new_series_per_request` or
    `max_new_series_per_minute` allow; nothing of it was written. 413 for a request over the first
    (it never fits), 429 for one over the second (it may, later)."""

    def __init__(self, message: str, http_status: int = 429) -> None:
        super().__init__(message)
        self.http_status = http_status


class QueryError(GpuwatchError):
    """A query could not be parsed or evaluated."""


class ScrapeError(GpuwatchError):
    """A scrape target could not be fetched or parsed."""


def one_line(exc: BaseException) -> str:
    """The first line of an error's text: DuckDB appends paragraphs of advice ("Possible solutions: ...")
    that do not belong in a one-line message or a log line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
