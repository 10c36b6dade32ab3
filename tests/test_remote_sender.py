"""The remote-write sender over an in-memory backlog: what it posts, how it retries, what it drops,
and that its watermark moves only past what a receiver took. (Over the real store and real receivers:
tests/test_remote_write_e2e.py.)"""

from __future__ import annotations

import logging
import random
from typing import Any

import numpy as np
import pytest
import requests
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import ConfigError
from gpuwatch.remote.config import RemoteWrite, parse_remote_write, sent_labels
from gpuwatch.remote.post import http_post
from gpuwatch.remote.sender import Answer, Batch, Gap, Sender
from gpuwatch.remote.wire import decode_request, decompress


class MemoryBacklog:
    """Samples in append order; the watermark is the count sent."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, tuple[tuple[str, str], ...], int, float]] = []
        self.saved: dict[str, Any] = {}
        self.gaps: dict[str, dict[int, Gap]] = {}

    def add(self, name: str, labels: dict[str, str], t: int, v: float) -> None:
        self.rows.append((name, tuple(sorted(labels.items())), t, v))

    def load_watermark(self, destination: str) -> Any:
        return self.saved.get(destination, 0)

    def save_watermark(self, destination: str, watermark: Any, now_ms: int) -> None:
        self.saved[destination] = watermark

    def newest(self) -> int:
        return len(self.rows)

    def load_gaps(self, destination: str) -> list[Gap]:
        return sorted(self.gaps.get(destination, {}).values(), key=lambda g: g.end)

    def save_gap(self, destination: str, gap: Gap, now_ms: int, live: Any = None) -> None:
        gaps = self.gaps.setdefault(destination, {})
        if gap.start >= gap.end:
            gaps.pop(gap.end, None)
        else:
            gaps[gap.end] = gap
        if live is not None:
            self.saved[destination] = live

    def appended_since(self, watermark: Any, max_samples: int, until: Any = None) -> Batch:
        end = len(self.rows) if until is None else until
        rows = self.rows[watermark : min(end, watermark + max_samples)]
        series: dict[tuple[str, Any], list[tuple[int, float]]] = {}
        for name, labels, t, v in rows:
            series.setdefault((name, labels), []).append((t, v))
        keys = list(series)
        return Batch(
            [k[0] for k in keys],
            [k[1] for k in keys],
            [np.array([t for t, _ in series[k]], np.int64) for k in keys],
            [np.array([v for _, v in series[k]]) for k in keys],
            watermark + len(rows),
            end - watermark - len(rows),
        )


class Receiver:
    """A scripted receiver: answers in turn, records what it took."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.bodies: list[list[Any]] = []

    def __call__(self, dest: RemoteWrite, body: bytes) -> Answer:
        self.bodies.append(decode_request(decompress(body, 1 << 26)))
        return self.answers.pop(0) if self.answers else Answer(204, "")


def dest(**queue: Any) -> RemoteWrite:
    (d,) = parse_remote_write([{"url": "http://hub:9842/api/v1/write", "name": "hub", "queue_config": queue}])
    return d


def sender(backlog: MemoryBacklog, post: Any, d: RemoteWrite | None = None, **kw: Any) -> Sender:
    return Sender(d or dest(), backlog, post, FakeClock(), rng=random.Random(1), **kw)


def test_a_batch_taken_moves_the_watermark_and_is_counted() -> None:
    backlog = MemoryBacklog()
    for t in range(3):
        backlog.add("gpu_util", {"gpu": "0", "job": "gpuwatch"}, 1000 * t, 50.0 + t)
    receiver = Receiver()
    s = sender(backlog, receiver, external_labels=(("cluster", "lab"),))
    assert s.step() == 5.0  # caught up: the next look after batch_send_deadline
    (series,) = receiver.bodies[0]
    assert series.labels == (("__name__", "gpu_util"), ("cluster", "lab"), ("gpu", "0"), ("job", "gpuwatch"))
    assert (series.timestamps_ms, series.values) == ((0, 1000, 2000), (50.0, 51.0, 52.0))
    assert backlog.saved == {"hub": 3}
    assert (s.state.samples_total, s.state.samples_pending, s.state.highest_sent_timestamp_ms) == (3, 0, 2000)


def test_every_series_is_sent_naming_its_node_unless_it_names_one() -> None:
    """gpuwatch's own figures have no label naming the machine: two nodes' `gpuwatch_gpus` would be one
    series on a hub (and the hub's own GPUCountDropped fired on their mix)."""
    backlog = MemoryBacklog()
    backlog.add("gpuwatch_gpus", {}, 1000, 2.0)
    backlog.add("DCGM_FI_DEV_GPU_UTIL", {"Hostname": "gpu-7", "gpu": "0"}, 1000, 50.0)
    receiver = Receiver()
    sender(backlog, receiver, external_labels=sent_labels((("cluster", "lab"),), "node-a")).step()
    assert {s.labels for s in receiver.bodies[0]} == {
        (("Hostname", "node-a"), ("__name__", "gpuwatch_gpus"), ("cluster", "lab")),
        (("Hostname", "gpu-7"), ("__name__", "DCGM_FI_DEV_GPU_UTIL"), ("cluster", "lab"), ("gpu", "0")),
    }
    assert sent_labels((("Hostname", "rack-1"),), "node-a") == (("Hostname", "rack-1"),)
    backlog, receiver = MemoryBacklog(), Receiver()
    backlog.add("gpuwatch_gpus", {}, 1000, 2.0)
    sender(backlog, receiver, external_labels=sent_labels((("Hostname", ""),), "node-a")).step()
    assert receiver.bodies[0][0].labels == (("__name__", "gpuwatch_gpus"),)  # '' sends none


def test_a_backlog_goes_in_batches_back_to_back() -> None:
    backlog = MemoryBacklog()
    for t in range(5):
        backlog.add("m", {}, t, float(t))
    receiver = Receiver()
    s = sender(backlog, receiver, dest(max_samples_per_send=2))
    assert [s.step(), s.step(), s.step()] == [0.0, 0.0, 5.0]
    assert [len(b[0].values) for b in receiver.bodies] == [2, 2, 1]


def test_5xx_and_no_answer_retry_the_same_batch_with_growing_backoff() -> None:
    backlog = MemoryBacklog()
    backlog.add("m", {}, 1, 1.0)
    receiver = Receiver(Answer(503, "down"), Answer(0, "ConnectionError: refused"), Answer(500, "oops"))
    s = sender(backlog, receiver, dest(min_backoff="100ms", max_backoff="1s"))
    waits = [s.step(), s.step(), s.step()]
    assert backlog.saved == {}  # nothing committed while the receiver does not take it
    assert 0.05 <= waits[0] <= 0.1 and 0.1 <= waits[1] <= 0.2 and 0.2 <= waits[2] <= 0.4  # doubling, jittered
    assert s.state.samples_retried_total == 3 and s.state.last_error == "HTTP 500: oops"
    s.step()
    assert backlog.saved == {"hub": 1} and len(receiver.bodies) == 4
    assert all(b == receiver.bodies[0] for b in receiver.bodies)  # the same batch each time


def test_429_waits_for_retry_after_and_can_be_made_final() -> None:
    backlog = MemoryBacklog()
    backlog.add("m", {}, 1, 1.0)
    s = sender(backlog, Receiver(Answer(429, "slow down", 7.0)))
    assert s.step() == 7.0 and backlog.saved == {}
    final = sender(MemoryBacklog(), Receiver(Answer(429, "slow down")), dest(retry_on_http_429=False))
    final._backlog.add("m", {}, 1, 1.0)  # type: ignore[attr-defined]
    assert final.step() == 0.0 and final.state.samples_failed_total == 1


def test_a_4xx_drops_the_batch_once_logged_with_the_receivers_words(caplog: pytest.LogCaptureFixture) -> None:
    backlog = MemoryBacklog()
    for t in range(4):
        backlog.add("m", {}, t, 1.0)
    receiver = Receiver(Answer(400, "out of order sample"), Answer(400, "out of order sample"))
    s = sender(backlog, receiver, dest(max_samples_per_send=2))
    with caplog.at_level(logging.DEBUG):
        s.step()
        s.step()
    assert backlog.saved == {"hub": 4} and s.state.samples_failed_total == 4
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "HTTP 400: out of order sample" in errors[0].getMessage()


def test_write_relabel_configs_drop_and_rename() -> None:
    backlog = MemoryBacklog()
    backlog.add("python_gc_total", {}, 1, 1.0)
    backlog.add("gpu_util", {"gpu": "0", "scratch": "x"}, 1, 2.0)
    receiver = Receiver()
    (d,) = parse_remote_write(
        [
            {
                "url": "http://hub/api/v1/write",
                "write_relabel_configs": [
                    {"source_labels": ["__name__"], "regex": "python_.*", "action": "drop"},
                    {"regex": "scratch", "action": "labeldrop"},
                ],
            }
        ]
    )
    s = sender(backlog, receiver, d)
    s.step()
    assert [ts.labels for ts in receiver.bodies[0]] == [(("__name__", "gpu_util"), ("gpu", "0"))]


def test_the_remote_write_block_is_read_as_prometheus_writes_it(tmp_path: Any) -> None:
    (d,) = parse_remote_write(
        [
            {
                "url": "https://vm.lab:8428/api/v1/write",
                "name": "vm",
                "remote_timeout": "10s",
                "headers": {"X-Scope-OrgID": "lab"},
                "basic_auth": {"username": "u", "password_file": "/etc/pw"},
                "tls_config": {"ca_file": "/etc/ca.pem"},
                "queue_config": {"max_samples_per_send": 500, "batch_send_deadline": "2s", "capacity": 10000},
            }
        ]
    )
    assert (d.name, d.remote_timeout_s, d.headers) == ("vm", 10.0, (("X-Scope-OrgID", "lab"),))
    assert d.auth is not None and (d.auth.kind, d.auth.username, d.auth.secret_file) == (
        "basic",
        "u",
        "/etc/pw",
    )
    assert (d.queue.max_samples_per_send, d.queue.batch_send_deadline_s, d.tls.ca_file) == (
        500,
        2.0,
        "/etc/ca.pem",
    )
    for bad, message in (
        ([{"url": "ftp://x"}], "remote_write[0].url: expected an http:// or https:// URL"),
        (
            [{"url": "http://x", "queue_config": {"max_shards": 1, "bogus": 1}}],
            "remote_write[0].queue_config.bogus",
        ),
        ([{"url": "http://x", "headers": {"Authorization": "x"}}], "is set by remote write itself"),
        (
            [{"url": "http://x", "name": "a"}, {"url": "http://y", "name": "a"}],
            "two destinations are named 'a'",
        ),
    ):
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            parse_remote_write(bad)


def test_http_post_sends_the_protocols_headers_and_credentials(tmp_path: Any) -> None:
    """Over real HTTP: the four headers, the bearer token read from its file, Retry-After read."""
    seen: list[dict[str, str]] = []

    def app(environ: Any, start_response: Any) -> Any:
        req = Request(environ)
        seen.append({k: v for k, v in req.headers.items()})
        decode_request(decompress(req.get_data(), 1 << 20))
        return Response("busy", status=429, headers={"Retry-After": "3"})(environ, start_response)

    server = make_server("127.0.0.1", 0, app, threaded=True)
    import threading

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        token = tmp_path / "token"
        token.write_text("s3cret\n")
        (d,) = parse_remote_write(
            [
                {
                    "url": f"http://127.0.0.1:{server.server_port}/api/v1/write",
                    "authorization": {"credentials_file": str(token)},
                }
            ]
        )
        backlog = MemoryBacklog()
        backlog.add("m", {}, 1, 1.0)
        s = Sender(d, backlog, http_post(FakeClock(), requests.Session()), FakeClock(), rng=random.Random(1))
        assert s.step() == 3.0
    finally:
        server.shutdown()
    (headers,) = seen
    assert headers["Content-Encoding"] == "snappy" and headers["Content-Type"] == "application/x-protobuf"
    assert headers["X-Prometheus-Remote-Write-Version"] == "0.1.0" and headers["User-Agent"].startswith(
        "gpuwatch/"
    )
    assert headers["Authorization"] == "Bearer s3cret"


def test_samples_older_than_max_backlog_are_skipped_and_counted() -> None:
    backlog = MemoryBacklog()
    clock = FakeClock(1_000_000)
    now = clock.now_ms()
    for t in (now - 7_200_000, now - 3_000, now - 1_000):
        backlog.add("m", {}, t, 1.0)
    receiver = Receiver()
    s = Sender(dest(max_backlog="1h"), backlog, receiver, clock, rng=random.Random(1))
    s.step()
    assert [list(b[0].timestamps_ms) for b in receiver.bodies] == [[now - 3_000, now - 1_000]]
    assert s.state.samples_dropped_total == 1 and backlog.saved == {"hub": 3}


def _values(bodies: list[list[Any]]) -> list[list[float]]:
    return [[v for ts in body for v in ts.values] for body in bodies]


def test_live_first_sends_new_samples_ahead_of_a_backlog_then_the_backlog_at_its_pace() -> None:
    clock = FakeClock(1_000.0)
    backlog = MemoryBacklog()
    for i in range(8):  # an outage's backlog, 100 s old and older
        backlog.add("m", {"lane": "old"}, 800_000 + 1000 * i, float(i))
    receiver = Receiver()
    d = dest(max_samples_per_send=2, live_first=True, catch_up_rate=1)
    s = Sender(d, backlog, receiver, clock, rng=random.Random(1))
    assert s.step() == 0.0  # the oldest 2 go; 6 more, 200 s old: the rest becomes a gap
    assert backlog.load_gaps("hub") == [Gap(2, 8)] and backlog.saved == {"hub": 8}
    assert s.state.samples_pending == 6
    backlog.add("m", {"lane": "live"}, 1_000_000, 100.0)
    backlog.add("m", {"lane": "live"}, 1_000_500, 101.0)
    wait = s.step()  # live first; caught up, one gap batch, then the next at 1 sample/s
    assert _values(receiver.bodies) == [[0.0, 1.0], [100.0, 101.0], [2.0, 3.0]] and wait == 2.0
    assert s.step() == 2.0 and len(receiver.bodies) == 3  # not before its time
    backlog.add("m", {"lane": "live"}, 1_001_000, 102.0)
    clock.advance(2.0)
    s.step()
    s.step()
    assert _values(receiver.bodies)[3:] == [[102.0], [4.0, 5.0]]
    restarted = Sender(d, backlog, receiver, clock, rng=random.Random(1))  # the gap is in the store
    clock.advance(2.0)
    restarted.step()
    clock.advance(2.0)
    restarted.step()
    assert backlog.load_gaps("hub") == []
    sent = sorted(v for body in _values(receiver.bodies) for v in body)
    assert sent == [*map(float, range(8)), 100.0, 101.0, 102.0]  # every sample once
    assert restarted.state.samples_pending == 0


def test_by_default_a_backlog_goes_first_in_order_and_no_gap_is_opened() -> None:
    clock = FakeClock(1_000.0)
    backlog = MemoryBacklog()
    for i in range(6):
        backlog.add("m", {}, 800_000 + 1000 * i, float(i))
    receiver = Receiver()
    s = Sender(dest(max_samples_per_send=2), backlog, receiver, clock, rng=random.Random(1))
    s.step()
    backlog.add("m", {}, 1_000_000, 100.0)
    while s.step() == 0.0:
        pass
    assert _values(receiver.bodies) == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [100.0]]
    assert backlog.load_gaps("hub") == []


def test_a_gap_waits_while_the_receiver_is_down_and_nothing_is_lost() -> None:
    clock = FakeClock(1_000.0)
    backlog = MemoryBacklog()
    for i in range(6):
        backlog.add("m", {}, 800_000 + 1000 * i, float(i))
    receiver = Receiver()
    d = dest(max_samples_per_send=2, live_first=True, catch_up_rate=1_000_000, min_backoff="1s")
    s = Sender(d, backlog, receiver, clock, rng=random.Random(1))
    s.step()  # opens the gap (2, 6)
    backlog.add("m", {}, 1_000_000, 100.0)
    receiver.answers = [Answer(503, "restarting")]
    assert s.step() >= 0.5  # the live batch is refused: back off, the gap is not tried
    assert len(receiver.bodies) == 2 and backlog.load_gaps("hub") == [Gap(2, 6)]
    while s.step() == 0.0 or backlog.load_gaps("hub"):
        clock.advance(1.0)
    assert sorted(v for body in _values(receiver.bodies)[2:] for v in body) == [2.0, 3.0, 4.0, 5.0, 100.0]
