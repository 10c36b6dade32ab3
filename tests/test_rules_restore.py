"""The `for` state of pending alerts restored from a remote store's ALERTS_FOR_STATE, as vmalert's
-remoteRead does (rules/restore.py): the rules query a second store standing for the remote, through
gpuwatch's engine (the real remotes: test_face_e2e.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Sample, make_labels
from gpuwatch.query import Engine
from gpuwatch.query.errors import RemoteUnavailable
from gpuwatch.query.values import Result
from gpuwatch.rules.evaluate import FIRING, PENDING
from gpuwatch.rules.load import load_groups
from gpuwatch.rules.manager import RuleManager
from gpuwatch.rules.restore import ForStateRestorer, for_state_query
from gpuwatch.store import Store

T0 = 1_800_000_000.0
GPU = {"gpu": "0", "Hostname": "n1"}
HOT = """
groups:
  - name: gpu
    rules:
      - alert: Hot
        expr: temp > 85
        for: 10m
      - alert: Lost
        expr: lost == 1
"""
SENT = {"Hostname": "face", "cluster": "lab"}  # what the face's remote write adds (sent_labels)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def remote(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    """The remote store: the nodes' samples, and the ALERTS_FOR_STATE an earlier face wrote."""
    s = Store.open(tmp_path / "remote", clock=clock)
    yield s
    s.close()


@pytest.fixture
def local(tmp_path: Path, clock: FakeClock) -> Iterator[Store]:
    """The face's own store, empty: a face started on a new machine."""
    s = Store.open(tmp_path / "local", clock=clock)
    yield s
    s.close()


def put(store: Store, t_ms: int, name: str, value: float, labels: dict[str, str]) -> None:
    store.append(Batch(t_ms, [Sample(name, make_labels(labels), value)]))
    store.flush()


class Remote:
    """Queries answered over the remote store; `asked` lists them; those naming `failing` fail."""

    def __init__(self, store: Store, failing: str = "") -> None:
        self.engine = Engine(store)
        self.asked: list[str] = []
        self.failing = failing

    def __call__(self, expr: str, t_ms: int) -> Result:
        self.asked.append(expr)
        if self.failing and self.failing in expr:
            raise RemoteUnavailable("remote query backend http://vm:8428 unreachable: cannot connect")
        return self.engine.instant(expr, t_ms)


def face(local: Store, clock: FakeClock, remote: Remote, restore: bool = True) -> RuleManager:
    restorer = ForStateRestorer(remote, SENT) if restore else None
    return RuleManager(local, remote, clock, load_groups(HOT, "rules.yml"), restorer=restorer)


def states(m: RuleManager) -> dict[str, tuple[str, int]]:
    return {r.name: (a.state, a.active_at_ms) for r, a in m.active_alerts()}


def hot_for(remote: Store, clock: FakeClock, minutes: int) -> int:
    """The remote holds a hot GPU, and the ALERTS_FOR_STATE of a face that saw it active `minutes`
    ago (as it sent it: its own Hostname kept, `cluster` added); return that time."""
    now = clock.now_ms()
    active = now - minutes * 60_000
    for t in range(active, now + 1, 15_000):
        put(remote, t, "temp", 90.0, GPU)
        put(remote, t, "ALERTS_FOR_STATE", active / 1000, {**GPU, "alertname": "Hot", "cluster": "lab"})
    return active


def test_a_new_face_keeps_counting_for_from_the_remotes_state(
    local: Store, remote: Store, clock: FakeClock
) -> None:
    active = hot_for(remote, clock, 8)
    m = face(local, clock, Remote(remote))
    m.run_due()
    assert states(m) == {"Hot": (PENDING, active)}  # restored after the first evaluation
    clock.advance(150)
    put(remote, clock.now_ms(), "temp", 90.0, GPU)
    m.run_due()
    assert states(m) == {"Hot": (FIRING, active)}  # 10m since it really began, not since the face started


def test_without_restoring_a_new_face_counts_from_its_start(
    local: Store, remote: Store, clock: FakeClock
) -> None:
    hot_for(remote, clock, 8)
    m = face(local, clock, Remote(remote), restore=False)
    m.run_due()
    clock.advance(150)
    put(remote, clock.now_ms(), "temp", 90.0, GPU)
    m.run_due()
    assert states(m) == {"Hot": (PENDING, int(T0 * 1000))}


def test_the_state_is_read_once_per_rule_with_a_for(local: Store, remote: Store, clock: FakeClock) -> None:
    hot_for(remote, clock, 3)
    put(remote, clock.now_ms(), "lost", 1.0, GPU)
    asking = Remote(remote)
    m = face(local, clock, asking)
    for _ in range(3):
        m.run_due()
        clock.advance(15)
        put(remote, clock.now_ms(), "temp", 90.0, GPU)
    restores = [q for q in asking.asked if "ALERTS_FOR_STATE" in q]
    assert restores == [for_state_query(load_groups(HOT, "rules.yml")[0].rules[0])]
    assert restores == ['last_over_time(ALERTS_FOR_STATE{alertname="Hot"}[3600s])']


def test_a_remote_that_cannot_answer_leaves_the_alert_counting_from_now(
    local: Store, remote: Store, clock: FakeClock
) -> None:
    hot_for(remote, clock, 8)
    asking = Remote(remote)
    m = face(local, clock, asking)
    evaluate = asking.engine.instant
    asking.engine.instant = lambda expr, t: (  # type: ignore[method-assign]
        evaluate(expr, t)
        if "ALERTS_FOR_STATE" not in expr
        else (_ for _ in ()).throw(RemoteUnavailable("down"))
    )
    m.run_due()
    assert states(m) == {"Hot": (PENDING, int(T0 * 1000))}


def test_a_later_remote_state_does_not_move_an_alert_back(
    local: Store, remote: Store, clock: FakeClock
) -> None:
    """The local store's state (an earlier start of this face) is kept where it is older."""
    hot_for(remote, clock, 2)
    first = face(local, clock, Remote(remote), restore=False)
    clock.advance(-600)  # this face saw it 10 minutes ago and saved it locally
    put(remote, clock.now_ms(), "temp", 90.0, GPU)
    first.run_due()
    clock.advance(600)
    put(remote, clock.now_ms(), "temp", 90.0, GPU)
    m = face(local, clock, Remote(remote))
    m.run_due()
    assert states(m) == {"Hot": (FIRING, int(T0 * 1000) - 600_000)}


def test_no_one_sees_the_alert_counting_from_now_while_the_remote_is_asked(
    local: Store, remote: Store, clock: FakeClock
) -> None:
    """The alerts page, read while the remote's state is still being asked, shows the alert as it was
    before the round (none), never active since the face's start (seen in test_face_e2e on a slow box)."""
    active = hot_for(remote, clock, 8)
    asking = Remote(remote)
    seen: list[dict[str, tuple[str, int]]] = []
    m = face(local, clock, asking)
    evaluate = asking.engine.instant

    def slow_remote(expr: str, t_ms: int) -> Result:
        if "ALERTS_FOR_STATE" in expr:
            seen.append(states(m))  # a page's read, while the restore's query is out
        return evaluate(expr, t_ms)

    asking.engine.instant = slow_remote  # type: ignore[method-assign]
    m.run_due()
    assert seen == [{}]
    assert states(m) == {"Hot": (PENDING, active)}
