"""The `for` state of pending alerts restored from a remote store's `ALERTS_FOR_STATE`, as vmalert's
`-remoteRead` does: where gpuwatch's rules run on `storage.remote`, a face started afresh (a new
machine, an empty data directory) keeps counting `for` from when the alert really became active.

Each alerting rule with a `for` asks once, after its group's first evaluation since start,
`last_over_time(ALERTS_FOR_STATE{alertname="<rule>"}[1h])`; a pending alert whose labels are found
there is active since the value found (Unix seconds), if that is earlier than it knew. An alert's
`ALERTS_FOR_STATE` was sent with the labels every sent series gets (`Hostname`, `external_labels`:
remote/config.py's `sent_labels`) wherever it had none of its own, so those are matched either way.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from gpuwatch.core.errors import QueryError
from gpuwatch.core.model import Labels, make_labels
from gpuwatch.query.values import Result, Vector
from gpuwatch.rules.evaluate import PENDING, Alert
from gpuwatch.rules.load import Rule

log = logging.getLogger("gpuwatch.rules")

LOOKBACK_S = 3600  # vmalert's -remoteRead.lookback: an older state is not the same activity

Query = Callable[[str, int], Result]


def for_state_query(rule: Rule, lookback_s: int = LOOKBACK_S) -> str:
    """The query of `rule`'s alerts' last recorded `ALERTS_FOR_STATE`."""
    return f"last_over_time(ALERTS_FOR_STATE{{alertname={json.dumps(rule.name)}}}[{int(lookback_s)}s])"


class ForStateRestorer:
    """Restore the `for` state of pending alerts from `query` (the remote), once per rule."""

    def __init__(
        self, query: Query, sent_labels: Mapping[str, str] | None = None, lookback_s: int = LOOKBACK_S
    ) -> None:
        self._query = query
        self._sent = dict(sent_labels or {})
        self._lookback_s = lookback_s

    def _found(self, rule: Rule, now_ms: int) -> dict[Labels, int]:
        """The active_at (ms) the remote holds, keyed by the alert's labels as sent and as evaluated."""
        result = self._query(for_state_query(rule, self._lookback_s), now_ms)
        out: dict[Labels, int] = {}
        if not isinstance(result, Vector):
            return out
        for s in result:
            labels = {k: v for k, v in s.labels.items() if k != "__name__"}
            at = int(round(s.value * 1000))
            out[make_labels(labels)] = at
            own = {k: v for k, v in labels.items() if self._sent.get(k) != v}
            out.setdefault(make_labels(own), at)
        return out

    def restore(self, rule: Rule, alerts: Mapping[Labels, Alert], now_ms: int) -> dict[Labels, Alert]:
        """`alerts` with each pending one active since the remote says, where that is earlier; on
        a failed query, `alerts` as they are (logged: the rule goes on counting from now)."""
        out = dict(alerts)
        if rule.kind != "alert" or rule.for_s <= 0 or not any(a.state == PENDING for a in alerts.values()):
            return out
        try:
            found = self._found(rule, now_ms)
        except QueryError as e:
            log.warning("rules: cannot restore the for state of %s from the remote store: %s", rule.name, e)
            return out
        for labels, alert in alerts.items():
            at = found.get(labels)
            if alert.state == PENDING and at is not None and at < alert.active_at_ms:
                out[labels] = replace(alert, active_at_ms=at)
        restored = sum(out[k] is not alerts[k] for k in alerts)
        if restored:
            log.info(
                "rules: %s: for state of %d alert(s) restored from the remote store", rule.name, restored
            )
        return out
