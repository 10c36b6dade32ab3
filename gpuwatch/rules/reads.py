"""Which metric names a rule's expression may read: to skip store flushes no later rule can observe."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import promql_parser as pp

from gpuwatch.core.errors import QueryError
from gpuwatch.core.model import Matcher, matcher_predicate
from gpuwatch.query.limits import walk
from gpuwatch.query.parse import matchers_of, parse
from gpuwatch.rules.roundcache import NAME


@functools.lru_cache(maxsize=1024)
def _name_matchers(expr: str) -> tuple[tuple[Matcher, ...], ...] | None:
    """Per vector selector of `expr`, its `__name__` matchers; None when `expr` does not parse."""
    try:
        tree = parse(expr).expr
    except QueryError:
        return None
    return tuple(
        tuple(m for m in matchers_of(node) if m.name == NAME)
        for node in walk(tree)
        if isinstance(node, pp.VectorSelector)
    )


def may_read(expr: str, names: Iterable[str], *, by_name: bool = True) -> bool:
    """Whether evaluating `expr` could read a series named one of `names` (when unsure: True).
    With `by_name` False, selectors of one exact name (`x`, `{__name__="x"}`) do not count: those
    the round's cache serves with what rules wrote (RoundCache.wrote)."""
    selectors = _name_matchers(expr)
    if selectors is None:
        return True
    names = list(names)
    for matchers in selectors:
        if not matchers:  # `{job="x"}`: any name
            return True
        if not by_name and any(m.op == "=" for m in matchers):
            continue
        tests = [matcher_predicate(m) for m in matchers]
        if any(all(test(n) for test in tests) for n in names):
            return True
    return False
