"""Silences as Alertmanager keeps them: matchers, a start and an end, who made it and why.

A silence is *pending* before `startsAt`, *active* from `startsAt` until `endsAt`, and *expired* from
`endsAt` on. An alert is silenced while an active silence's matchers all match its labels (a label the
alert lacks matches as the empty string, as in Alertmanager). `Silences` holds them in memory for
`muted_by` (called for every alert in every notification round) and writes every change through to
the store first, so a restart keeps them. The rules for changing one follow Alertmanager's
`silence.Set`: a change that rewrites history (other matchers, an earlier start of an active silence)
expires the old silence and makes a new one with a new id. Expired silences are kept five days
(Alertmanager's `--data.retention` default), then deleted.

Matchers are `gpuwatch.notify.matchers.LabelMatcher`s, as Alertmanager's routes and filters use them.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from gpuwatch.core import regex
from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import GpuwatchError, StoreError
from gpuwatch.core.model import SilenceRecord, is_utf8
from gpuwatch.core.units import format_rfc3339_millis, parse_rfc3339_ms
from gpuwatch.notify.matchers import LABEL_NAME, LabelMatcher, MatcherError, matches_all

log = logging.getLogger("gpuwatch.notify.silences")

PENDING, ACTIVE, EXPIRED = "pending", "active", "expired"
RETENTION_MS = 120 * 3600 * 1000
MAX_SILENCES = 10_000  # active and pending (Alertmanager's --silences.max-silences)
MAX_SILENCE_BYTES = 65_536  # (its --silences.max-silence-size-bytes)
_STATE_ORDER = {ACTIVE: 0, PENDING: 1, EXPIRED: 2}


class SilenceError(GpuwatchError):
    """A silence (or a matcher, or a time) is invalid; the API answers 400."""

    http_status = 400


class SilenceNotFound(SilenceError):
    """No silence has this id; the API answers 404."""

    http_status = 404


# -- times --------------------------------------------------------------------------------------------


def parse_time(text: str) -> int:
    """Parse an RFC 3339 time (`2024-05-01T12:00:00Z`, fractions and offsets allowed) into Unix ms."""
    try:
        return parse_rfc3339_ms(text if isinstance(text, str) else "")
    except ValueError as e:
        raise SilenceError(f"cannot parse {text!r}: {e}") from None


# -- matchers -----------------------------------------------------------------------------------------


def silence_matcher(name: str, value: str, is_regex: bool, is_equal: bool = True) -> LabelMatcher:
    """Build a silence's matcher, checked as Alertmanager's `silence.validateMatcher`; raise SilenceError.

    Stricter than a filter's: the name must be a Prometheus label name, and the regex must compile
    on its own (not only inside the anchors).
    """
    if not LABEL_NAME.fullmatch(name):
        raise SilenceError(f"invalid label name {name!r}")
    try:
        if is_regex:
            regex.check(value)
        return LabelMatcher.of(name, value, is_regex, is_equal)
    except regex.RegexError as e:
        raise SilenceError(str(e)) from None
    except MatcherError as e:
        raise SilenceError(str(e)) from None


# -- silences -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Silence:
    """One silence; times in Unix milliseconds."""

    id: str
    matchers: tuple[LabelMatcher, ...]
    starts_at_ms: int
    ends_at_ms: int
    created_by: str
    comment: str
    updated_at_ms: int = 0

    def state(self, now_ms: int) -> str:
        """Return `pending`, `active` or `expired` at `now_ms`."""
        if now_ms < self.starts_at_ms:
            return PENDING
        return ACTIVE if now_ms < self.ends_at_ms else EXPIRED

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Tell whether this silence's matchers all match `labels` (whatever its state)."""
        return matches_all(self.matchers, labels)

    def to_json(self, now_ms: int) -> dict[str, Any]:
        """Return the silence as Alertmanager's `gettableSilence`."""
        return {
            "id": self.id,
            "status": {"state": self.state(now_ms)},
            "updatedAt": format_rfc3339_millis(self.updated_at_ms),
            "comment": self.comment,
            "createdBy": self.created_by,
            "endsAt": format_rfc3339_millis(self.ends_at_ms),
            "matchers": [m.to_json() for m in self.matchers],
            "startsAt": format_rfc3339_millis(self.starts_at_ms),
        }

    def record(self) -> SilenceRecord:
        return SilenceRecord(
            self.id,
            tuple((m.name, m.value, m.is_regex, m.is_equal) for m in self.matchers),
            self.starts_at_ms,
            self.ends_at_ms,
            self.created_by,
            self.comment,
            self.updated_at_ms,
        )

    @classmethod
    def from_record(cls, r: SilenceRecord) -> Silence:
        return cls(
            r.id,
            tuple(silence_matcher(*m) for m in r.matchers),
            r.starts_at_ms,
            r.ends_at_ms,
            r.created_by,
            r.comment,
            r.updated_at_ms,
        )


def _field(body: Mapping[str, Any], key: str, kind: type, where: str = "") -> Any:
    if key not in body or body[key] is None:
        raise SilenceError(f"{where}{key} in body is required")
    value = body[key]
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise SilenceError(f"{where}{key} in body must be of type {kind.__name__.replace('str', 'string')}")
    if isinstance(value, str) and not is_utf8(value):  # JSON's "\udcff", which the store cannot hold
        raise SilenceError(f"{where}{key} in body must be valid UTF-8")
    return value


def parse_postable(body: Any) -> Silence:
    """Return the silence of a `postableSilence` JSON body (id "" for a new one); raise SilenceError."""
    if not isinstance(body, dict):
        raise SilenceError("the body must be a JSON object (a postableSilence)")
    raw = _field(body, "matchers", list)
    if not raw:
        raise SilenceError("silence invalid: at least one matcher required")
    matchers: list[LabelMatcher] = []
    for i, m in enumerate(raw):
        where = f"matchers.{i}."
        if not isinstance(m, dict):
            raise SilenceError(f"matchers.{i} in body must be of type object")
        name = _field(m, "name", str, where)
        value = _field(m, "value", str, where)
        is_regex = _field(m, "isRegex", bool, where)
        is_equal = _field(m, "isEqual", bool, where) if m.get("isEqual") is not None else True
        try:
            matchers.append(silence_matcher(name, value, is_regex, is_equal))
        except SilenceError as e:
            raise SilenceError(f"silence invalid: invalid label matcher {i}: {e}") from None
    sid = body.get("id") or ""
    if not isinstance(sid, str) or not is_utf8(sid):
        raise SilenceError("id in body must be of type string")
    return Silence(
        id=sid,
        matchers=tuple(matchers),
        starts_at_ms=parse_time(_field(body, "startsAt", str)),
        ends_at_ms=parse_time(_field(body, "endsAt", str)),
        created_by=_field(body, "createdBy", str),
        comment=_field(body, "comment", str),
    )


def validate(s: Silence) -> None:
    """Raise SilenceError unless `s` is a silence Alertmanager would store."""
    if not s.matchers:
        raise SilenceError("silence invalid: at least one matcher required")
    if all(m.is_equal and m.matches_value("") for m in s.matchers):
        raise SilenceError("silence invalid: at least one matcher must not match the empty string")
    if s.ends_at_ms < s.starts_at_ms:
        raise SilenceError("silence invalid: end time must not be before start time")


def silence_size(s: Silence) -> int:
    """Return the bytes a silence holds: its matchers' names and values, comment and author."""
    text = [s.comment, s.created_by, *(part for m in s.matchers for part in (m.name, m.value))]
    return sum(len(t.encode("utf-8", "surrogatepass")) for t in text)


def _can_update(old: Silence, new: Silence, now_ms: int) -> bool:
    """Tell whether `old` may become `new` in place without rewriting what was silenced when."""
    if old.matchers != new.matchers:
        return False
    state = old.state(now_ms)
    if state == ACTIVE:
        return new.starts_at_ms // 1000 == old.starts_at_ms // 1000 and new.ends_at_ms >= now_ms
    if state == PENDING:
        return new.starts_at_ms >= now_ms
    return False


def sort_key(s: Silence, now_ms: int) -> tuple[int, int]:
    """Alertmanager's order: active (next to end first), pending (next to start), expired (latest first)."""
    state = s.state(now_ms)
    when = {ACTIVE: s.ends_at_ms, PENDING: s.starts_at_ms, EXPIRED: -s.ends_at_ms}[state]
    return _STATE_ORDER[state], when


class SilenceStore(Protocol):
    """What `Silences` needs of the store."""

    def save_silences(self, silences: Sequence[SilenceRecord]) -> None: ...
    def delete_silences(self, ids: Sequence[str]) -> None: ...
    def silences(self) -> list[SilenceRecord]: ...


class Silences:
    """Every silence, in memory for matching and written through to the store on each change."""

    def __init__(
        self,
        store: SilenceStore,
        clock: Clock,
        *,
        new_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        retention_ms: int = RETENTION_MS,
        limit: int = MAX_SILENCES,
        max_size_bytes: int = MAX_SILENCE_BYTES,
    ) -> None:
        self._store = store
        self._limit = limit
        self._max_size = max_size_bytes
        self._clock = clock
        self._new_id = new_id
        self._retention_ms = retention_ms
        self._lock = threading.Lock()
        self._by_id: dict[str, Silence] = {}
        try:
            records = store.silences()
        except StoreError as e:
            log.warning("silences: cannot read the stored silences: %s", e)
            records = []
        for r in records:
            try:
                self._by_id[r.id] = Silence.from_record(r)
            except SilenceError as e:  # a regex this Python rejects: keep serving, say which
                log.warning("silences: skipping stored silence %s: %s", r.id, e)
        # Silences not yet expired when last changed, what muted_by scans: those with an
        # `alertname="X"` matcher by X, and the rest. Replaced as a whole, never mutated.
        self._live: tuple[dict[str, tuple[Silence, ...]], tuple[Silence, ...]] = ({}, ())
        self._rebuild(clock.now_ms())

    def _rebuild(self, now_ms: int) -> None:
        by_name: dict[str, list[Silence]] = {}
        rest: list[Silence] = []
        for s in self._by_id.values():
            if s.ends_at_ms <= now_ms:
                continue
            name = next((m.value for m in s.matchers if m.name == "alertname" and m.op == "="), None)
            if name is None:
                rest.append(s)
            else:
                by_name.setdefault(name, []).append(s)
        self._live = ({k: tuple(v) for k, v in by_name.items()}, tuple(rest))

    # -- reading ------------------------------------------------------------------------------------
    def muted_by(self, labels: Mapping[str, str], now_ms: int) -> list[str]:
        """Return the ids of the silences active at `now_ms` whose matchers all match `labels`, sorted."""
        by_name, rest = self._live
        found = [
            s.id
            for group in (by_name.get(labels.get("alertname", ""), ()), rest)
            for s in group
            if s.starts_at_ms <= now_ms < s.ends_at_ms and matches_all(s.matchers, labels)
        ]
        found.sort()
        return found

    def list(self) -> list[Silence]:
        """Return every silence (expired ones until garbage-collected) in Alertmanager's order."""
        now_ms = self._clock.now_ms()
        with self._lock:
            found = list(self._by_id.values())
        return sorted(found, key=lambda s: sort_key(s, now_ms))

    def get(self, silence_id: str) -> Silence:
        """Return one silence; raise SilenceNotFound."""
        with self._lock:
            found = self._by_id.get(silence_id)
        if found is None:
            raise SilenceNotFound("silence not found")
        return found

    # -- changing -----------------------------------------------------------------------------------
    def _write(self, changed: Sequence[Silence], now_ms: int) -> None:
        self._store.save_silences([s.record() for s in changed])  # the store first: no change is lost
        for s in changed:
            self._by_id[s.id] = s
        self._rebuild(now_ms)

    def set(self, draft: Silence) -> str:
        """Create `draft` (id "") or update the silence of its id, as Alertmanager does; return the id."""
        now_ms = self._clock.now_ms()
        if draft.starts_at_ms >= draft.ends_at_ms:
            raise SilenceError("Failed to create silence: start time must be before end time")
        if draft.ends_at_ms < now_ms:
            raise SilenceError("Failed to create silence: end time can't be in the past")
        validate(draft)
        size = silence_size(draft)
        if self._max_size and size > self._max_size:
            raise SilenceError(
                f"silence invalid: {size} bytes of matchers, comment and author; "
                f"the limit is {self._max_size} (setting max_silence_size_bytes)"
            )
        with self._lock:
            if not draft.id and self._limit:
                live = sum(1 for s in self._by_id.values() if s.state(now_ms) != EXPIRED)
                if live >= self._limit:
                    raise SilenceError(
                        f"gpuwatch holds {live} silences already (setting max_silences); expire some first"
                    )
            changed: list[Silence] = []
            if draft.id:
                old = self._by_id.get(draft.id)
                if old is None:
                    raise SilenceNotFound("silence not found")
                if _can_update(old, draft, now_ms):
                    self._write([replace(draft, updated_at_ms=now_ms)], now_ms)
                    return draft.id
                if old.state(now_ms) != EXPIRED:
                    changed.append(self._expired(old, now_ms))
            new = replace(
                draft,
                id=self._new_id(),
                starts_at_ms=max(draft.starts_at_ms, now_ms),
                updated_at_ms=now_ms,
            )
            self._write([*changed, new], now_ms)
            return new.id

    @staticmethod
    def _expired(s: Silence, now_ms: int) -> Silence:
        if s.state(now_ms) == PENDING:
            return replace(s, starts_at_ms=now_ms, ends_at_ms=now_ms, updated_at_ms=now_ms)
        return replace(s, ends_at_ms=now_ms, updated_at_ms=now_ms)

    def expire(self, silence_id: str) -> None:
        """End a silence now (a pending one never starts); expiring an expired silence does nothing."""
        now_ms = self._clock.now_ms()
        with self._lock:
            old = self._by_id.get(silence_id)
            if old is None:
                raise SilenceNotFound("silence not found")
            if old.state(now_ms) != EXPIRED:
                self._write([self._expired(old, now_ms)], now_ms)

    def gc(self) -> int:
        """Delete silences expired longer than the retention period; return how many (the `silences` job)."""
        now_ms = self._clock.now_ms()
        with self._lock:
            old = [i for i, s in self._by_id.items() if s.ends_at_ms + self._retention_ms < now_ms]
            if old:
                self._store.delete_silences(old)
                for i in old:
                    del self._by_id[i]
            self._rebuild(now_ms)
        return len(old)
