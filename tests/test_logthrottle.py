"""Under load a condition is logged once a minute, with a count of the lines held back."""

from __future__ import annotations

import logging

from gpuwatch.cli.logthrottle import LogThrottle


def _record(msg: str, at: float, *args: object, name: str = "waitress.queue") -> logging.LogRecord:
    r = logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)
    r.created = at
    return r


def test_one_line_per_condition_per_minute_with_a_count() -> None:
    throttle = LogThrottle(window_s=60)
    passed = [
        r
        for r in (_record("Task queue depth is %d", 1000 + i / 10, i) for i in range(2000))
        if throttle.filter(r)
    ]
    # 2,000 lines over 200 s: one per minute, each after the first saying how many it stands for
    assert [round(r.created) for r in passed] == [1000, 1060, 1120, 1180]
    assert passed[0].getMessage() == "Task queue depth is 0"
    assert passed[1].getMessage() == "Task queue depth is 600 (and 599 more like it in the last 60 s)"


def test_other_conditions_and_loggers_pass_on_their_own() -> None:
    throttle = LogThrottle(window_s=60)
    assert throttle.filter(_record("store flush failed: %s", 0, "disk full", name="gpuwatch.store"))
    assert throttle.filter(_record("Task queue depth is %d", 1, 5))
    assert throttle.filter(_record("store flush failed: %s", 2, "disk full", name="gpuwatch.other"))
    assert not throttle.filter(_record("store flush failed: %s", 3, "again", name="gpuwatch.store"))
