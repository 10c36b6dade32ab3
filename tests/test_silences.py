"""Silences: states over a FakeClock, Alertmanager's update rules, validation, garbage collection and
persistence in a real DuckDB file across a restart (matcher syntax: test_matchers.py)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import StoreError
from gpuwatch.core.units import format_rfc3339_millis as format_time
from gpuwatch.notify.matchers import LabelMatcher, parse_matcher
from gpuwatch.notify.silences import (
    ACTIVE,
    EXPIRED,
    PENDING,
    Silence,
    SilenceError,
    SilenceNotFound,
    Silences,
    parse_postable,
    parse_time,
)
from gpuwatch.store import Store

H = 3600


@pytest.fixture
def store(clock: FakeClock) -> Iterator[Store]:
    s = Store.open(None, clock=clock)
    yield s
    s.close()


def ids() -> Iterator[str]:
    return (f"id-{n}" for n in itertools.count(1))


def silences(store: Store, clock: FakeClock) -> Silences:
    counter = ids()
    return Silences(store, clock, new_id=lambda: next(counter))


def draft(clock: FakeClock, *matchers: str, start_s: float = 0, end_s: float = H, sid: str = "") -> Silence:
    now = clock.now_ms()
    return Silence(
        sid,
        tuple(parse_matcher(m) for m in matchers),
        now + int(start_s * 1000),
        now + int(end_s * 1000),
        "ops",
        "maintenance",
    )


# -- matchers -----------------------------------------------------------------------------------------


def test_matchers_match_like_alertmanager() -> None:
    labels = {"alertname": "GPUHot", "gpu": "3", "job": "vllm"}
    assert parse_matcher("alertname=GPUHot").matches_value(labels["alertname"])
    assert not parse_matcher("alertname=GPU").matches_value(labels["alertname"])
    # regexes are anchored at both ends
    assert parse_matcher("job=~vl.*").matches_value("vllm")
    assert not parse_matcher("job=~ll").matches_value("vllm")
    assert parse_matcher("job!~sg.*").matches_value("vllm")
    s = Silence("x", (parse_matcher("alertname=GPUHot"), parse_matcher("severity!=critical")), 0, 1, "a", "c")
    assert s.matches(labels)  # an absent label is the empty string: "" != "critical"
    assert not s.matches({**labels, "severity": "critical"})


# -- states and muting over time ----------------------------------------------------------------------


def test_a_silence_is_pending_then_active_then_expired(store: Store, clock: FakeClock) -> None:
    sils = silences(store, clock)
    sid = sils.set(draft(clock, "alertname=GPUHot", "gpu=~[0-3]", start_s=600, end_s=1200))
    hot0 = {"alertname": "GPUHot", "gpu": "0"}
    assert sils.get(sid).state(clock.now_ms()) == PENDING
    assert sils.muted_by(hot0, clock.now_ms()) == []
    clock.advance(600)
    assert sils.get(sid).state(clock.now_ms()) == ACTIVE
    assert sils.muted_by(hot0, clock.now_ms()) == [sid]
    assert sils.muted_by({"alertname": "GPUHot", "gpu": "4"}, clock.now_ms()) == []
    assert sils.muted_by({"alertname": "GPUCold", "gpu": "0"}, clock.now_ms()) == []
    clock.advance(600)
    assert sils.get(sid).state(clock.now_ms()) == EXPIRED
    assert sils.muted_by(hot0, clock.now_ms()) == []


def test_muted_by_lists_every_matching_active_silence(store: Store, clock: FakeClock) -> None:
    sils = silences(store, clock)
    a = sils.set(draft(clock, "alertname=GPUHot"))
    b = sils.set(draft(clock, "gpu=~.+"))
    sils.set(draft(clock, "gpu=7"))
    assert sils.muted_by({"alertname": "GPUHot", "gpu": "1"}, clock.now_ms()) == sorted([a, b])


def test_expire_ends_an_active_silence_at_once_and_a_pending_one_never_starts(
    store: Store, clock: FakeClock
) -> None:
    sils = silences(store, clock)
    active = sils.set(draft(clock, "alertname=A"))
    pending = sils.set(draft(clock, "alertname=B", start_s=600))
    clock.advance(60)
    sils.expire(active)
    sils.expire(pending)
    now = clock.now_ms()
    assert sils.get(active).state(now) == EXPIRED and sils.get(active).ends_at_ms == now
    assert sils.muted_by({"alertname": "A"}, now) == []
    clock.advance(600)
    assert sils.get(pending).state(clock.now_ms()) == EXPIRED
    assert sils.muted_by({"alertname": "B"}, clock.now_ms()) == []
    sils.expire(active)  # expiring twice is fine, as in Alertmanager
    with pytest.raises(SilenceNotFound, match="silence not found"):
        sils.expire("nope")


def test_list_is_in_alertmanager_order(store: Store, clock: FakeClock) -> None:
    sils = silences(store, clock)
    late = sils.set(draft(clock, "a=1", end_s=2 * H))
    soon = sils.set(draft(clock, "a=2", end_s=H))
    pending = sils.set(draft(clock, "a=3", start_s=60))
    gone = sils.set(draft(clock, "a=4"))
    sils.expire(gone)
    clock.advance(1)
    assert [s.id for s in sils.list()] == [soon, late, pending, gone]


# -- changes and validation ---------------------------------------------------------------------------


def test_a_new_silence_starts_no_earlier_than_now(store: Store, clock: FakeClock) -> None:
    sils = silences(store, clock)
    sid = sils.set(draft(clock, "a=1", start_s=-600))
    assert sils.get(sid).starts_at_ms == clock.now_ms()
    assert sils.get(sid).updated_at_ms == clock.now_ms()


def test_updating_keeps_the_id_unless_history_would_change(store: Store, clock: FakeClock) -> None:
    sils = silences(store, clock)
    sid = sils.set(draft(clock, "alertname=A"))
    clock.advance(60)
    first = sils.get(sid)
    longer = Silence(sid, first.matchers, first.starts_at_ms, first.ends_at_ms + H * 1000, "ops", "longer")
    assert sils.set(longer) == sid
    assert sils.get(sid).comment == "longer" and sils.get(sid).updated_at_ms == clock.now_ms()
    # other matchers: the old silence ends now and a new one takes over
    other = Silence(sid, (parse_matcher("alertname=B"),), first.starts_at_ms, first.ends_at_ms, "ops", "c")
    new = sils.set(other)
    assert new != sid
    assert sils.get(sid).state(clock.now_ms()) == EXPIRED
    assert sils.muted_by({"alertname": "B"}, clock.now_ms()) == [new]
    assert sils.muted_by({"alertname": "A"}, clock.now_ms()) == []
    with pytest.raises(SilenceNotFound):
        sils.set(draft(clock, "a=1", sid="no-such-id"))


@pytest.mark.parametrize(
    ("matchers", "start_s", "end_s", "error"),
    [
        ((), 0, H, "at least one matcher required"),
        (("a=", "b=~.*"), 0, H, "at least one matcher must not match the empty string"),
        (("a=1",), H, H, "start time must be before end time"),
        (("a=1",), 2 * H, H, "start time must be before end time"),
        (("a=1",), -2 * H, -H, "end time can't be in the past"),
    ],
)
def test_invalid_silences_are_refused_and_nothing_changes(
    store: Store, clock: FakeClock, matchers: tuple[str, ...], start_s: float, end_s: float, error: str
) -> None:
    sils = silences(store, clock)
    with pytest.raises(SilenceError, match=error):
        sils.set(draft(clock, *matchers, start_s=start_s, end_s=end_s))
    assert sils.list() == [] and store.silences() == []


def test_postable_silence_json_is_checked_field_by_field() -> None:
    good = {
        "matchers": [{"name": "alertname", "value": "A", "isRegex": False}],
        "startsAt": "2026-01-01T00:00:00Z",
        "endsAt": "2026-01-01T01:00:00.5+01:00",
        "createdBy": "ops",
        "comment": "c",
    }
    s = parse_postable(good)
    assert s.matchers == (LabelMatcher("alertname", "=", "A"),)
    assert format_time(s.starts_at_ms) == "2026-01-01T00:00:00.000Z"
    assert format_time(s.ends_at_ms) == "2026-01-01T00:00:00.500Z"
    for body, error in [
        ({**good, "matchers": []}, "at least one matcher required"),
        ({k: v for k, v in good.items() if k != "comment"}, "comment in body is required"),
        ({**good, "matchers": [{"name": "a", "value": "(", "isRegex": True}]}, "invalid label matcher 0"),
        ({**good, "matchers": [{"name": "a-b", "value": "x", "isRegex": False}]}, "invalid label name"),
        ({**good, "matchers": [{"name": "a", "value": "x"}]}, "matchers.0.isRegex in body is required"),
        ({**good, "startsAt": "yesterday"}, "RFC 3339"),
        ({**good, "createdBy": 3}, "createdBy in body must be of type string"),
        ([good], "JSON object"),
    ]:
        with pytest.raises(SilenceError, match=error):
            parse_postable(body)


def test_times_round_trip_as_alertmanager_writes_them() -> None:
    assert parse_time("2026-11-30T12:00:00.123456789Z") == parse_time("2026-11-30T13:00:00.123+01:00")
    assert format_time(parse_time("2026-11-30T12:00:00.1Z")) == "2026-11-30T12:00:00.100Z"
    with pytest.raises(SilenceError):
        parse_time("2026-13-01T00:00:00Z")


# -- storage ------------------------------------------------------------------------------------------


def test_silences_survive_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    data = tmp_path / "data"
    with Store.open(data, clock=clock) as store:
        sils = silences(store, clock)
        kept = sils.set(draft(clock, "alertname=GPUHot", 'gpu=~"[0-3]"'))
        ended = sils.set(draft(clock, "alertname=GPUCold"))
        clock.advance(60)
        sils.expire(ended)
        before = {s.id: s for s in sils.list()}
    with Store.open(data, clock=clock) as store:
        again = Silences(store, clock)
        assert {s.id: s for s in again.list()} == before
        assert again.muted_by({"alertname": "GPUHot", "gpu": "2"}, clock.now_ms()) == [kept]
        assert again.muted_by({"alertname": "GPUCold"}, clock.now_ms()) == []


def test_expired_silences_are_deleted_after_five_days(tmp_path: Path, clock: FakeClock) -> None:
    with Store.open(tmp_path / "data", clock=clock) as store:
        sils = silences(store, clock)
        old = sils.set(draft(clock, "a=1"))
        sils.expire(old)
        young = sils.set(draft(clock, "a=2", end_s=4 * 24 * H))
        clock.advance(4 * 24 * H)
        assert sils.gc() == 0
        clock.advance(24 * H + 1)
        assert sils.gc() == 1
        assert [s.id for s in sils.list()] == [young]
        assert [r.id for r in store.silences()] == [young]


def test_a_store_failure_changes_nothing_and_says_why(store: Store, clock: FakeClock) -> None:
    sils = silences(store, clock)
    kept = sils.set(draft(clock, "alertname=A"))
    store.close()
    with pytest.raises(StoreError, match="the store is closed"):
        sils.set(draft(clock, "alertname=B"))
    with pytest.raises(StoreError):
        sils.expire(kept)
    assert [s.id for s in sils.list()] == [kept]
    assert sils.muted_by({"alertname": "A"}, clock.now_ms()) == [kept]


def test_concurrent_changes_and_reads_lose_nothing(tmp_path: Path, clock: FakeClock) -> None:
    with Store.open(tmp_path / "data", clock=clock) as store:
        sils = Silences(store, clock)
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(10):
                    sid = sils.set(draft(clock, f"alertname=A{n}", f"i={i}"))
                    assert sils.muted_by({"alertname": f"A{n}", "i": str(i)}, clock.now_ms()) == [sid]
                    if i % 2:
                        sils.expire(sid)
            except BaseException as e:  # noqa: BLE001 - reported below, in the test's thread
                errors.append(e)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        clock.advance(1)
        states = [s.state(clock.now_ms()) for s in sils.list()]
        assert states.count(ACTIVE) == 40 and states.count(EXPIRED) == 40
        assert sorted(store.silences()) == sorted(s.record() for s in sils.list())


def test_the_number_and_size_of_silences_are_capped(store: Store, clock: FakeClock) -> None:
    counter = ids()
    sils = Silences(store, clock, new_id=lambda: next(counter), limit=3, max_size_bytes=200)
    made = [sils.set(draft(clock, f"alertname=A{i}")) for i in range(3)]
    with pytest.raises(SilenceError, match=r"gpuwatch holds 3 silences already \(setting max_silences\)"):
        sils.set(draft(clock, "alertname=A3"))
    sils.set(replace(sils.get(made[0]), comment="longer"))  # updating one is not a new one
    sils.expire(made[1])
    assert sils.set(draft(clock, "alertname=A3")), "an expired silence frees its place"
    with pytest.raises(SilenceError, match=r"the limit is 200 \(setting max_silence_size_bytes\)"):
        sils.set(replace(draft(clock, "alertname=B"), comment="x" * 300))
    assert len([s for s in sils.list() if s.state(clock.now_ms()) != "expired"]) == 3
