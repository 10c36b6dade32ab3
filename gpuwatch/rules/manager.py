"""Evaluate rule groups on schedule: query, advance alert state, write ALERTS and recorded samples, persist.

One `RuleManager` holds the loaded groups and their alerts. `run_due()` (the `rules` job) evaluates each
group whose interval has passed. Alert state is saved in the store after every evaluation that changed
it and read back at start, so a restart resumes pending timers and keeps firing alerts firing; the time
gpuwatch was down counts toward `for`, as the alert was already active before. Each transition is also
queued for the store's history table, and the latest are read back at start for the alerts page. What is
kept of each group, and its saving, is in `state.py`.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import QueryError, StoreError
from gpuwatch.core.model import STALE_NAN, Batch, Labels, Sample
from gpuwatch.query import Scalar, Vector
from gpuwatch.query.errors import RemoteUnavailable
from gpuwatch.query.values import Result
from gpuwatch.rules.config import BuiltinRules
from gpuwatch.rules.evaluate import (
    INACTIVE,
    Alert,
    EvaluationError,
    Transition,
    alert_series,
    evaluate,
    record_samples,
)
from gpuwatch.rules.load import (
    Group,
    Rule,
    RuleFileError,
    expand,
    load_builtin,
    load_files,
)
from gpuwatch.rules.pack import apply_builtin
from gpuwatch.rules.reads import may_read
from gpuwatch.rules.restore import ForStateRestorer
from gpuwatch.rules.roundcache import RoundCache
from gpuwatch.rules.state import (
    HISTORY_LENGTH,
    AlertPersistence,
    GroupState,
    HistoryEntry,
    RuleStatus,
    RuleStore,
)
from gpuwatch.store.alerts import StoredAlert

log = logging.getLogger("gpuwatch.rules")


Query = Callable[[str, int], Result]
# Called after each group evaluation with the group's alerts (every state), its interval and the time.
Listener = Callable[[Sequence[tuple[Rule, Alert]], float, int], None]


def _samples(result: Result) -> list[tuple[Mapping[str, str], float]]:
    if isinstance(result, Vector):
        return [(s.labels, s.value) for s in result]
    if isinstance(result, Scalar):
        return [({}, result.value)]
    raise EvaluationError(f"rule result is not a vector or scalar: {type(result).__name__.lower()}")


def _static_labels_match(rule: Rule, labels: Labels) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in rule.labels if "{{" not in v)


class RuleManager(AlertPersistence):
    """Hold rule groups and their alert state; evaluate due groups when `run_due` is called."""

    def __init__(
        self,
        store: RuleStore,
        query: Query,
        clock: Clock,
        groups: Sequence[Group],
        *,
        default_interval_s: float = 15.0,
        external_labels: Mapping[str, str] | None = None,
        loader: Callable[[], list[Group]] | None = None,
        cache: RoundCache | None = None,
        restorer: ForStateRestorer | None = None,
    ) -> None:
        self._loader = loader
        # Groups whose pending alerts' `for` state is still to be restored from the remote store
        # (after their first evaluation since start, as vmalert does).
        self._restorer = restorer
        self._to_restore = {g.key for g in groups} if restorer is not None else set()
        self._cache = cache  # the store reads `query` goes through, shared within a round
        self._store = store
        self._query = query
        self._clock = clock
        self._default_interval_s = default_interval_s
        self._external = dict(external_labels or {})
        self._lock = threading.Lock()
        self._eval_lock = threading.Lock()  # a reload waits for a running evaluation, and vice versa
        self.transitions: list[Transition] = []  # the latest evaluation's, for a notifier to pick up
        self._history: deque[HistoryEntry] = deque(maxlen=HISTORY_LENGTH)
        self._listeners: list[Listener] = []
        self._groups: list[GroupState] = []
        self._failures: dict[str, int] = {}  # failed rule evaluations by group key, since start
        # Names appended since the last flush, and whether a recording rule's output still awaits the
        # flush that lets later rules of its group read it (done before the first rule that may).
        self._unflushed: set[str] = set()
        self._flush_owed = False
        self._store_owed = False  # shown to reads through the cache only (`_flush`)
        self._saving: list[tuple[GroupState, Future[Any]]] = []  # queued alert saves (`_save`)
        self.replace_groups(groups, restore=True)
        self._restore_history()

    # -- loading --------------------------------------------------------------------------------------
    def replace_groups(self, groups: Sequence[Group], *, restore: bool = False) -> None:
        """Use `groups` from now on, keeping the alerts of rules that stay (by group and rule name)."""
        stored: list[StoredAlert] = []
        if restore:
            try:
                stored = self._store.alerts()
            except StoreError as e:
                log.warning("rules: cannot restore alert state: %s", e)
        with self._lock:
            old = {g.group.key: g for g in self._groups}
            new: list[GroupState] = []
            for group in groups:
                prev = old.pop(group.key, None)
                alerts: list[dict[Labels, Alert]] = []
                status: list[RuleStatus] = []
                written: list[set[tuple[str, Labels]]] = []
                for rule in group.rules:
                    kept: dict[Labels, Alert] = {}
                    st = RuleStatus()
                    wr: set[tuple[str, Labels]] = set()
                    if prev is not None:
                        for j, r in enumerate(prev.group.rules):
                            if r.kind == rule.kind and r.name == rule.name:
                                kept, st, wr = prev.alerts[j], prev.status[j], prev.written[j]
                                break
                    elif rule.kind == "alert":
                        kept = {
                            s.labels: Alert(
                                s.labels,
                                s.annotations,
                                s.state,
                                s.active_at_ms,
                                s.value,
                                s.fired_at_ms,
                                s.resolved_at_ms,
                                s.keep_firing_since_ms,
                                s.last_eval_ms,
                            )
                            for s in stored
                            if s.group_key == group.key
                            and s.rule == rule.name
                            and _static_labels_match(rule, s.labels)
                        }
                    alerts.append(kept)
                    status.append(st)
                    written.append(wr)
                interval = group.interval_s or self._default_interval_s
                state = GroupState(group, interval, alerts, status, written)
                if prev is not None:
                    state.last_eval_ms, state.duration_s = prev.last_eval_ms, prev.duration_s
                state.saved = self._fingerprint(state) if not restore or not stored else ()
                new.append(state)
            self._groups = new
        gone = list(old.values())
        now_ms = self._clock.now_ms()
        for g in gone:  # series of removed groups go stale now, as Prometheus does on reload
            stale = [Sample(n, labels, STALE_NAN) for w in g.written for n, labels in w]
            if stale:
                self._store.append(Batch(now_ms, stale))
            try:
                self._store.save_alerts(g.group.key, [])
            except StoreError as e:
                log.warning("rules: cannot clear the alerts of group %s: %s", g.group.name, e)

    def reload(self) -> list[str]:
        """Load the rule files again; on any error keep the running rules and return the errors."""
        if self._loader is None:
            return []
        try:
            groups = self._loader()
        except RuleFileError as e:
            log.error("rules: reload failed, keeping the previous rules: %s", e)
            return e.errors
        with self._eval_lock:
            self.replace_groups(groups)
            if self._cache is not None:
                self._cache.clear()
        log.info("rules: reloaded %d group(s)", len(groups))
        return []

    @property
    def min_interval_s(self) -> float:
        """Return the shortest group interval (how often the `rules` job should run)."""
        with self._lock:
            return min((g.interval_s for g in self._groups), default=self._default_interval_s)

    # -- evaluating -----------------------------------------------------------------------------------
    def run_due(self) -> None:
        """Evaluate every group whose interval has passed since its last evaluation (the `rules` job)."""
        with self._eval_lock:
            self._run_due()

    def _run_due(self) -> None:
        now_ms = self._clock.now_ms()
        self._begin(now_ms)
        with self._lock:
            groups = list(self._groups)
        try:
            for g in groups:
                # A little slack so that a job firing a few ms early does not skip a whole interval.
                if g.last_eval_ms is None or now_ms - g.last_eval_ms >= g.interval_s * 1000 - 50:
                    self.evaluate_group(g, now_ms)
        finally:
            self._end()

    def evaluate_all(self) -> None:
        """Evaluate every group now (tests, `rules check --eval` style tools)."""
        with self._eval_lock:
            now_ms = self._clock.now_ms()
            self._begin(now_ms)
            with self._lock:
                groups = list(self._groups)
            try:
                for g in groups:
                    self.evaluate_group(g, now_ms)
            finally:
                self._end()

    def evaluate_group(self, g: GroupState, now_ms: int) -> list[Transition]:
        """Evaluate one group's rules in order at `now_ms`; write their samples; save changed alerts."""
        start = self._clock.monotonic()
        transitions: list[Transition] = []
        n = len(g.group.rules)
        skipped = False
        for i, rule in enumerate(g.group.rules):
            t0 = self._clock.monotonic()
            st = g.status[i]
            st.last_eval_ms = now_ms
            self._readable_by(rule.expr)
            try:
                result = _samples(self._query(rule.expr, now_ms))
                if rule.kind == "alert":
                    found, changed = evaluate(rule, result, g.alerts[i], now_ms, self._external)
                    if self._restorer is not None and g.group.key in self._to_restore:
                        # restored before anyone sees them: a page read while the remote is asked
                        # shows the alerts of the round before, not one counting `for` from now
                        found = self._restorer.restore(rule, found, now_ms)
                    g.alerts[i] = found
                    transitions.extend(changed)
                    if changed:
                        self._remember([HistoryEntry(g.group.name, rule.name, t) for t in changed])
                    out = alert_series(g.alerts[i])
                else:
                    out = record_samples(rule, result)
            except RemoteUnavailable as e:
                # The store cannot be asked: the round is skipped, as vmalert skips it, and every rule
                # keeps its alerts as they were (none resolves for want of an answer).
                self._skip(g, i, f"{e}; round skipped, alerts kept as they were")
                st.duration_s = self._clock.monotonic() - t0
                skipped = True
                break
            except (QueryError, EvaluationError) as e:
                st.health, st.last_error = "err", str(e)
                with self._lock:
                    self._failures[g.group.key] = self._failures.get(g.group.key, 0) + 1
                st.duration_s = self._clock.monotonic() - t0
                log.warning("rules: %s %s in group %s: %s", rule.kind, rule.name, g.group.name, e)
                continue
            st.health, st.last_error = "ok", ""
            now_series = {(s.name, s.labels) for s in out}
            stale = [Sample(name, labels, STALE_NAN) for name, labels in g.written[i] - now_series]
            g.written[i] = now_series
            if out or stale:
                self._store.append(Batch(now_ms, [*out, *stale]))
                self._unflushed.update(s.name for s in out)
                self._unflushed.update(s.name for s in stale)
                if rule.kind == "record" and i < n - 1:
                    self._flush_owed = True  # later rules of the group read what this one recorded
                if rule.kind == "record" and self._cache is not None:
                    self._cache.wrote([*out, *stale], now_ms)
            st.duration_s = self._clock.monotonic() - t0
        if self._flush_owed:
            self._show(None)
        if not skipped:  # the `for` state is restored once the remote answers
            self._to_restore.discard(g.group.key)
        g.last_eval_ms = now_ms
        g.duration_s = self._clock.monotonic() - start
        self._save(g)
        with self._lock:
            self.transitions = transitions
        if self._listeners:
            alerts = [
                (r, a)
                for r, rule_alerts in zip(g.group.rules, g.alerts, strict=True)
                for a in rule_alerts.values()
            ]
            for listener in self._listeners:
                listener(alerts, g.interval_s, now_ms)
        return transitions

    def _skip(self, g: GroupState, first: int, error: str) -> None:
        """Mark the group's rules from `first` on failed with `error`, unevaluated this round."""
        for st in g.status[first:]:
            st.health, st.last_error = "err", error
            st.last_eval_ms = g.status[first].last_eval_ms
        with self._lock:
            self._failures[g.group.key] = self._failures.get(g.group.key, 0) + len(g.status) - first
        log.warning("rules: group %s: %s", g.group.name, error)

    def _readable_by(self, expr: str) -> None:
        """Make what earlier rules recorded readable by `expr` where it may read it."""
        if self._flush_owed and may_read(expr, self._unflushed):
            self._show(expr)
        elif self._store_owed and may_read(expr, self._unflushed, by_name=False):
            self._flush()

    def _show(self, reader: str | None) -> None:
        """Make what recording rules appended readable by `reader` (None: any later group's rule).
        With a round cache that serves all of the reads concerned, it alone shows them (no wait for
        the store's writer); the store flush is then owed before a read the cache passes on to the
        store, at the latest at the start of the next round."""
        if self._cache is not None and (
            reader is None or not may_read(reader, self._unflushed, by_name=False)
        ):
            self._cache.publish()
            self._flush_owed = False
            self._store_owed = True
            return
        self._flush()

    def _flush(self) -> None:
        try:
            self._store.flush()
        except StoreError as e:
            # A full disk: what rules appended waits in the writer's buffer, and the round goes on
            # (GpuwatchStoreWriteErrors is among its rules); reads through the cache still see it.
            log.warning("rules: the store could not write what rules recorded; evaluating on: %s", e)
        if self._cache is not None:
            self._cache.publish()
        self._unflushed.clear()
        self._flush_owed = self._store_owed = False

    def _begin(self, now_ms: int) -> None:
        self._check_saves()
        if self._cache is not None:
            if self._store_owed:
                self._flush()
            self._cache.begin(now_ms)

    def _end(self) -> None:
        if self._cache is not None:
            self._cache.end()  # the round's reads are not kept for the next one

    def add_listener(self, listener: Listener) -> None:
        """Call `listener` after each group evaluation (the notifier; it must return quickly)."""
        self._listeners.append(listener)

    # -- reading (API) --------------------------------------------------------------------------------
    def groups(self) -> list[GroupState]:
        with self._lock:
            return list(self._groups)

    def failure_counts(self) -> dict[str, int]:
        """Return failed rule evaluations since start by group key (`file;name`), 0 for every loaded group."""
        with self._lock:
            return {g.group.key: self._failures.get(g.group.key, 0) for g in self._groups}

    def active_alerts(self) -> list[tuple[Rule, Alert]]:
        """Return every pending or firing alert with its rule."""
        out: list[tuple[Rule, Alert]] = []
        for g in self.groups():
            for rule, alerts in zip(g.group.rules, g.alerts, strict=True):
                out.extend((rule, a) for a in alerts.values() if a.state != INACTIVE)
        return out


def configured_groups(
    builtin: BuiltinRules, language: str, rule_files: Sequence[str], base: Path | None
) -> list[Group]:
    """Return the built-in groups (as `builtin_rules` and `language` say) and those of `rule_files`."""
    groups = apply_builtin(load_builtin(), builtin, language)
    return groups + load_files(expand(rule_files, base))
