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


class QueryError(GpuwatchError):
    """A query could not be parsed or evaluated."""


class ScrapeError(GpuwatchError):
    """A scrape target could not be fetched or parsed."""


def one_line(exc: BaseException) -> str:
    """The first line of an error's text: DuckDB appends paragraphs of advice ("Possible solutions: ...")
    that do not belong in a one-line message or a log line."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
