"""Embedded DuckDB time-series store: `Store.open(...)`, then append, flush, select, close."""

from __future__ import annotations

from gpuwatch.store.core import Store

__all__ = ["Store"]
