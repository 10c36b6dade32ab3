"""Errors the query engine raises; all are `QueryError`s with a one-line message."""

from __future__ import annotations

from gpuwatch.core.errors import QueryError


class PromQLParseError(QueryError):
    """The expression is not valid PromQL."""


class PromQLEvalError(QueryError):
    """The expression is valid but cannot be evaluated on this data."""


class Unsupported(QueryError):
    """The expression uses a PromQL feature gpuwatch knowingly lacks."""

    def __init__(self, feature: str) -> None:
        super().__init__(f"unsupported PromQL feature: {feature}")
        self.feature = feature


class QueryTooLarge(PromQLEvalError):
    """The query would load more samples or points than allowed."""


class QueryTimeout(QueryError):
    """The query ran past its deadline."""


class RemoteUnavailable(QueryError):
    """The remote query backend (`storage.remote`) could not be asked, or failed to answer."""

    http_status = 503
