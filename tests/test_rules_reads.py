"""may_read: whether a rule could read a just-recorded name (a flush is skipped only when it cannot)."""

from __future__ import annotations

import pytest

from gpuwatch.rules.reads import may_read


@pytest.mark.parametrize(
    ("expr", "names", "expected"),
    [
        ("rate(vllm:requests_total[1m])", {"gpu:x"}, False),
        ("gpu:x > 1", {"gpu:x"}, True),
        ("sum(rate(gpu:x[5m]))", {"gpu:x"}, True),
        ('{__name__=~"gpu:.*"} > 0', {"gpu:x"}, True),  # a regex on the name
        ('{__name__=~"cpu:.*"} > 0', {"gpu:x"}, False),
        ('{job="a"}', {"gpu:x"}, True),  # no name: any series
        ("max_over_time(gpu:x[10m:1m])", {"gpu:x"}, True),  # a subquery
        ("a + on() group_left b offset 5m", {"b"}, True),
        ("not a query (", {"gpu:x"}, True),  # when unsure, flush
    ],
)
def test_may_read(expr: str, names: set[str], expected: bool) -> None:
    assert may_read(expr, names) is expected


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("gpu:x > 1", False),  # by its name: the round's cache serves it with what was written
        ('{__name__="gpu:x", job="a"}', False),
        ('{__name__=~"gpu:.*"} > 0', True),  # the cache passes these on to the store
        ('{job="a"} or gpu:x', True),
        ("not a query (", True),
    ],
)
def test_may_read_other_than_by_name(expr: str, expected: bool) -> None:
    assert may_read(expr, {"gpu:x"}, by_name=False) is expected
