"""PromQL: parse with promql-parser, evaluate vectorised over a `Queryable` (the store)."""

from __future__ import annotations

from gpuwatch.query.engine import Engine
from gpuwatch.query.errors import (
    PromQLEvalError,
    PromQLParseError,
    QueryTimeout,
    QueryTooLarge,
    Unsupported,
)
from gpuwatch.query.source import EngineSettings, Queryable
from gpuwatch.query.values import (
    Matrix,
    Sample,
    Scalar,
    Series,
    String,
    Vector,
    format_value,
    to_prometheus_json,
)

__all__ = [
    "Engine",
    "EngineSettings",
    "Matrix",
    "PromQLEvalError",
    "PromQLParseError",
    "QueryTimeout",
    "QueryTooLarge",
    "Queryable",
    "Sample",
    "Scalar",
    "Series",
    "String",
    "Unsupported",
    "Vector",
    "format_value",
    "to_prometheus_json",
]
