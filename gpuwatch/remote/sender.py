"""Remote write out: one destination's sender, reading the store from its durable watermark.

The queue is the store. Each destination keeps a watermark in the store, committed after every 2xx,
so an outage of the receiver, and a restart of gpuwatch during it (SIGTERM or kill -9), lose nothing:
the sender resumes where the receiver last said yes. One `step` reads the samples appended after the
watermark (at most `max_samples_per_send`), labels them (`global.external_labels`, then
`write_relabel_configs`), and posts one `WriteRequest`:

- 2xx: the watermark moves past the batch.
- 5xx, a connection error, a timeout, and 429 with `retry_on_http_429` (gpuwatch's default): the same
  batch again after a backoff from `min_backoff` doubling to `max_backoff`, with jitter, or after the
  receiver's `Retry-After`. Nothing moves on until it is taken.
- any other 4xx: the receiver refuses the batch for good (an invalid series, a label it will not
  take): the batch is dropped and counted, its words logged once per status, the watermark moves on.

Samples of a series go in time order, and a staleness marker ends a series as it was stored. What a
destination has sent, retried, failed and still has pending is counted under Prometheus's own names
(`prometheus_remote_storage_*`, `DestinationState`).

A backlog (after an outage) is sent in order by default, as fast as the receiver takes it, one request
at a time: the live samples wait behind it. With `queue_config.live_first` (for receivers that take
samples older than those they have, as gpuwatch and VictoriaMetrics do) the sender keeps a live lane:
once the batch it sent is older than `LIVE_DELAY_S` and more is pending, the rest up to what is stored
now becomes a `Gap`, saved with the live watermark moved past it in one transaction; live samples go
first, and gaps, oldest first, at `catch_up_rate` samples/s in between.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from gpuwatch.collect.relabel import relabel
from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import GpuwatchError
from gpuwatch.remote.config import RemoteWrite
from gpuwatch.remote.wire import compress, encode_labels, encode_request, encode_samples

Labels = tuple[tuple[str, str], ...]


class Batch(NamedTuple):
    """Samples appended after a watermark, per series in time order, and the watermark past them."""

    names: Sequence[str]
    labels: Sequence[Labels]
    timestamps_ms: Sequence[np.ndarray]
    values: Sequence[np.ndarray]
    watermark: Any  # the store's, opaque here
    pending: int  # samples still after this batch (0: caught up)


class Gap(NamedTuple):
    """Samples after `start` up to `end` (watermarks) that the live lane skipped."""

    start: Any
    end: Any


class Backlog(Protocol):
    """What a sender needs of the store."""

    def load_watermark(self, destination: str) -> Any: ...

    def save_watermark(self, destination: str, watermark: Any, now_ms: int) -> None: ...

    def appended_since(self, watermark: Any, max_samples: int, until: Any = None) -> Batch:
        """Samples after `watermark` (and up to `until`, given)."""
        ...

    def newest(self) -> Any:
        """The watermark past everything stored now."""
        ...

    def load_gaps(self, destination: str) -> list[Gap]: ...

    def save_gap(self, destination: str, gap: Gap, now_ms: int, live: Any = None) -> None:
        """Save a gap's progress (gone once `start >= end`), and `live` in the same transaction."""
        ...


LIVE_DELAY_S = 10.0  # live_first: a batch this much older than now, with more pending, opens a gap
GAP_EVERY_S = 30.0  # and at most one gap is opened in this time
_LABEL_BYTES_MAX = 200_000  # series whose encoded labels a destination keeps (then it starts over)
_UNSEEN = object()


class Answer(NamedTuple):
    status: int  # 0: no answer (connection refused, timeout)
    text: str  # the receiver's words (or the error's)
    retry_after_s: float | None = None


Post = Callable[[RemoteWrite, bytes], Answer]


@dataclass
class DestinationState:
    """A destination's figures, as Prometheus's `prometheus_remote_storage_*` name them."""

    samples_total: int = 0  # sent and taken
    samples_failed_total: int = 0  # refused for good (4xx)
    samples_retried_total: int = 0
    samples_dropped_total: int = 0  # older than max_backlog when their turn came: not sent
    samples_pending: int = 0  # the live lane's and the gaps' together
    gap_samples_pending: int = 0  # of which in gaps (live_first)
    highest_sent_timestamp_ms: int = 0
    last_error: str = ""
    last_status: int = 0
    batches_total: int = 0


class Sender:
    """Sends one destination's backlog; `step` is one attempt, `run` loops until stopped."""

    def __init__(
        self,
        dest: RemoteWrite,
        backlog: Backlog,
        post: Post,
        clock: Clock,
        *,
        external_labels: Labels = (),
        max_backlog_s: float | None = None,
        logger: logging.Logger | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """`max_backlog_s`: samples older than this when their turn comes are skipped and counted
        (the destination's own `max_backlog`, else this: gpuwatch passes its retention)."""
        self.dest = dest
        backlog_s = dest.queue.max_backlog_s if dest.queue.max_backlog_s is not None else max_backlog_s
        self._max_backlog_ms = int(backlog_s * 1000) if backlog_s else None
        self.state = DestinationState()
        self._backlog = backlog
        self._post = post
        self._clock = clock
        self._external = dict(external_labels)
        self._log = logger or logging.getLogger(__name__)
        self._rng = rng or random.Random()
        self._watermark: Any = backlog.load_watermark(dest.name)
        self._gaps: list[Gap] = backlog.load_gaps(dest.name)
        self._gap_pending: dict[Any, int] = {}
        self._gap_opened_ms: int | None = None
        self._catch_up_at_ms = 0  # the next gap batch not before this (catch_up_rate)
        self._failing = False
        self._backoff_s = 0.0
        self._warned: set[int] = set()
        self._lock = threading.Lock()
        # Each series' labels as encoded (after external labels and relabelling; None: dropped): a
        # live batch is a sample or two of thousands of series, and encoding their labels was most of
        # the sender's CPU (bench/README.md, "Remote write (sender)").
        self._label_bytes: dict[tuple[str, Any], bytes | None] = {}

    def _request(self, batch: Batch) -> tuple[bytes, int, int]:
        """The compressed WriteRequest of `batch`, its sample count and newest timestamp (ms)."""
        rules, external = self.dest.write_relabel_configs, self._external
        messages = []
        samples, newest = 0, 0
        cutoff = self._clock.now_ms() - self._max_backlog_ms if self._max_backlog_ms else None
        for name, labels, ts, vs in zip(
            batch.names, batch.labels, batch.timestamps_ms, batch.values, strict=True
        ):
            if cutoff is not None and len(ts) and ts[0] < cutoff:
                keep = ts >= cutoff
                self.state.samples_dropped_total += int(len(ts) - keep.sum())
                ts, vs = ts[keep], vs[keep]
            if not len(ts):
                continue
            key = (name, labels)
            head = self._label_bytes.get(key, _UNSEEN)
            if head is _UNSEEN:
                pairs = (
                    {**external, **dict(labels), "__name__": name}
                    if external
                    else {**dict(labels), "__name__": name}
                )
                kept = relabel(pairs, rules) if rules else pairs
                head = None
                if kept is not None and kept.get("__name__"):
                    head = encode_labels(
                        sorted((k, v) for k, v in kept.items() if v)
                    )  # sorted, no empty value
                if len(self._label_bytes) >= _LABEL_BYTES_MAX:
                    self._label_bytes.clear()
                self._label_bytes[key] = head
            if not isinstance(head, bytes):
                continue
            messages.append(head + encode_samples(ts.tolist(), vs.tolist()))
            samples += len(ts)
            newest = max(newest, int(ts[-1]))
        return compress(encode_request(messages)), samples, newest

    def step(self) -> float:
        """Try to send one batch (live first, then a gap's); return how long to wait before the next
        step (0: go on at once)."""
        with self._lock:
            wait = self._step_live()
            if self._failing or wait == 0 or not self._gaps:
                return wait
            now = self._clock.now_ms()
            if now < self._catch_up_at_ms:
                return min(wait, (self._catch_up_at_ms - now) / 1000)
            return min(wait, self._step_gap(now))

    def _step_live(self) -> float:
        q = self.dest.queue
        batch = self._backlog.appended_since(self._watermark, q.max_samples_per_send)
        if not any(len(t) for t in batch.timestamps_ms):
            self._count_pending(batch.pending)
            if batch.watermark is not None and batch.watermark != self._watermark:
                self._commit(batch.watermark)  # nothing to send (all relabelled away or empty)
            return q.batch_send_deadline_s
        body, samples, newest = self._request(batch)
        answer = self._post(self.dest, body) if samples else Answer(204, "")
        wait = self._answered(answer, samples, newest, lambda: self._commit(batch.watermark))
        if self._failing:
            self._count_pending(batch.pending + samples)
            return wait
        self._count_pending(batch.pending)
        if q.live_first and batch.pending:
            self._maybe_open_gap(batch)
        return 0.0 if batch.pending else wait

    def _maybe_open_gap(self, batch: Batch) -> None:
        """Move the live lane past what is stored now when it is behind (module docstring)."""
        now = self._clock.now_ms()
        oldest = min(int(t[0]) for t in batch.timestamps_ms if len(t))
        recent = self._gap_opened_ms is not None and now - self._gap_opened_ms < GAP_EVERY_S * 1000
        if now - oldest < LIVE_DELAY_S * 1000 or recent:
            return
        end = self._backlog.newest()
        if not end > self._watermark:
            return
        gap = Gap(self._watermark, end)
        self._backlog.save_gap(self.dest.name, gap, now, live=end)
        self._watermark = end
        self._gaps.append(gap)
        self._gap_pending[end] = batch.pending
        self._gap_opened_ms = now
        self._count_pending(0)
        self._log.info(
            "remote_write %s: %d samples behind; live samples go first, the backlog at %d samples/s",
            self.dest.name,
            batch.pending,
            self.dest.queue.catch_up_rate,
        )

    def _step_gap(self, now: int) -> float:
        """Send one batch of the oldest gap; the wait is the catch-up pace (or the backoff)."""
        q = self.dest.queue
        gap = self._gaps[0]
        batch = self._backlog.appended_since(gap.start, q.max_samples_per_send, gap.end)
        sent = Gap(batch.watermark if batch.watermark is not None else gap.end, gap.end)
        if not any(len(t) for t in batch.timestamps_ms):
            self._save_gap(Gap(gap.end, gap.end), 0)
            return 0.0
        body, samples, newest = self._request(batch)
        answer = self._post(self.dest, body) if samples else Answer(204, "")
        wait = self._answered(answer, samples, newest, lambda: self._save_gap(sent, batch.pending))
        if self._failing:
            return wait
        if q.catch_up_rate:
            self._catch_up_at_ms = now + int(samples * 1000 / q.catch_up_rate)
        return max(0.0, (self._catch_up_at_ms - self._clock.now_ms()) / 1000)

    def _save_gap(self, gap: Gap, pending: int) -> None:
        self._backlog.save_gap(self.dest.name, gap, self._clock.now_ms())
        if gap.start >= gap.end:
            self._gaps.pop(0)
            self._gap_pending.pop(gap.end, None)
        else:
            self._gaps[0] = gap
            self._gap_pending[gap.end] = pending
        self._count_pending(self.state.samples_pending - self.state.gap_samples_pending)

    def _count_pending(self, live: int) -> None:
        """Pending: the live lane's, and the gaps' as last counted (a gap is counted when opened and
        as it is sent; after a restart, once its turn comes)."""
        self.state.gap_samples_pending = sum(self._gap_pending.values())
        self.state.samples_pending = live + self.state.gap_samples_pending

    def _answered(self, answer: Answer, samples: int, newest: int, commit: Callable[[], None]) -> float:
        st, q = self.state, self.dest.queue
        st.last_status = answer.status
        if 200 <= answer.status < 300:
            commit()
            st.samples_total += samples
            st.batches_total += 1
            st.highest_sent_timestamp_ms = max(st.highest_sent_timestamp_ms, newest)
            st.last_error = ""
            self._backoff_s = 0.0
            self._failing = False
            return q.batch_send_deadline_s
        retry = answer.status == 0 or answer.status >= 500 or (answer.status == 429 and q.retry_on_http_429)
        st.last_error = f"HTTP {answer.status}: {answer.text}" if answer.status else answer.text
        if retry:
            self._failing = True
            st.samples_retried_total += samples
            self._backoff_s = min(q.max_backoff_s, max(q.min_backoff_s, self._backoff_s * 2))
            wait = self._backoff_s * (0.5 + self._rng.random() / 2)  # jitter: senders do not retry in step
            if answer.retry_after_s is not None:
                wait = max(wait, min(answer.retry_after_s, 300.0))
            self._note(answer, f"retrying in {wait:.2f} s", logging.WARNING)
            return wait
        self._failing = False
        st.samples_failed_total += samples
        commit()  # refused for good: a sender never retries a 4xx
        self._note(answer, f"{samples} samples dropped", logging.ERROR)
        return 0.0

    def _note(self, answer: Answer, what: str, level: int) -> None:
        """Log a status once (then at DEBUG), with the receiver's own words."""
        seen = answer.status in self._warned
        self._warned.add(answer.status)
        self._log.log(
            logging.DEBUG if seen else level,
            "remote_write %s (%s): %s; %s",
            self.dest.name,
            self.dest.url,
            self.state.last_error[:500],
            what,
        )

    def _commit(self, watermark: Any) -> None:
        self._backlog.save_watermark(self.dest.name, watermark, self._clock.now_ms())
        self._watermark = watermark

    def run(self, stopping: threading.Event) -> None:
        """Send until `stopping` is set (the thread's body); a store that cannot be read is retried."""
        while not stopping.is_set():
            try:
                wait = self.step()
            except GpuwatchError as exc:
                self.state.last_error = str(exc)
                self._log.warning("remote_write %s: %s", self.dest.name, exc)
                wait = self.dest.queue.max_backoff_s
            if wait > 0:
                stopping.wait(wait)
