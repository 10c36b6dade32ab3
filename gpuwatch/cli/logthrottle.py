"""At most one log line per condition per minute: under load the same warning (waitress's "Task queue
depth", a target's failure, a write error) would otherwise repeat thousands of times a minute.

A condition is the logger and the message's format string, so "store flush failed: %s" with different
errors is one condition. The first line passes; later ones within the window are counted, and the
next line after the window says how many were held back. Time comes from each record's own stamp.
"""

from __future__ import annotations

import logging

WINDOW_S = 60.0


class LogThrottle(logging.Filter):
    """A handler filter that passes one record per (logger, format) per `window_s`, counting the rest."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        super().__init__()
        self.window_s = window_s
        self._last: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        last = self._last.get(key)
        if last is not None and record.created - last < self.window_s:
            self._held[key] = self._held.get(key, 0) + 1
            return False
        held = self._held.pop(key, 0)
        self._last[key] = record.created
        if held:
            record.msg = f"{record.msg} (and {held} more like it in the last {self.window_s:g} s)"
        if len(self._last) > 10_000:  # conditions come and go: forget the oldest half
            for k in sorted(self._last, key=self._last.__getitem__)[:5_000]:
                del self._last[k]
        return True
