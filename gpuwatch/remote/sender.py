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
from gpuwatch.remote.wire import compress, encode_request, encode_series

Labels = tuple[tuple[str, str], ...]


class Batch(NamedTuple):
    """Samples appended after a watermark, per series in time order, and the watermark past them."""

    names: Sequence[str]
    labels: Sequence[Labels]
    timestamps_ms: Sequence[np.ndarray]
    values: Sequence[np.ndarray]
    watermark: Any  # the store's, opaque here
    pending: int  # samples still after this batch (0: caught up)


class Backlog(Protocol):
    """What a sender needs of the store."""

    def load_watermark(self, destination: str) -> Any: ...

    def save_watermark(self, destination: str, watermark: Any, now_ms: int) -> None: ...

    def appended_since(self, watermark: Any, max_samples: int) -> Batch: ...


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
    samples_pending: int = 0
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
        self._backoff_s = 0.0
        self._warned: set[int] = set()
        self._lock = threading.Lock()

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
            pairs = (
                {**external, **dict(labels), "__name__": name}
                if external
                else {**dict(labels), "__name__": name}
            )
            kept = relabel(pairs, rules) if rules else pairs
            if kept is None or not kept.get("__name__"):
                continue
            ordered = sorted((k, v) for k, v in kept.items() if v)  # sorted, no empty value (the spec)
            messages.append(encode_series(ordered, ts.tolist(), vs.tolist()))
            samples += len(ts)
            newest = max(newest, int(ts[-1]))
        return compress(encode_request(messages)), samples, newest

    def step(self) -> float:
        """Try to send one batch; return how long to wait before the next step (0: go on at once)."""
        with self._lock:
            batch = self._backlog.appended_since(self._watermark, self.dest.queue.max_samples_per_send)
            if not any(len(t) for t in batch.timestamps_ms):
                self.state.samples_pending = batch.pending
                if batch.watermark is not None and batch.watermark != self._watermark:
                    self._commit(batch.watermark)  # nothing to send (all relabelled away or empty)
                return self.dest.queue.batch_send_deadline_s
            body, samples, newest = self._request(batch)
            answer = self._post(self.dest, body) if samples else Answer(204, "")
            return self._answered(answer, batch, samples, newest)

    def _answered(self, answer: Answer, batch: Batch, samples: int, newest: int) -> float:
        st, q = self.state, self.dest.queue
        st.last_status = answer.status
        if 200 <= answer.status < 300:
            self._commit(batch.watermark)
            st.samples_total += samples
            st.batches_total += 1
            st.samples_pending = batch.pending
            st.highest_sent_timestamp_ms = max(st.highest_sent_timestamp_ms, newest)
            st.last_error = ""
            self._backoff_s = 0.0
            return 0.0 if batch.pending else q.batch_send_deadline_s
        retry = answer.status == 0 or answer.status >= 500 or (answer.status == 429 and q.retry_on_http_429)
        st.last_error = f"HTTP {answer.status}: {answer.text}" if answer.status else answer.text
        if retry:
            st.samples_retried_total += samples
            st.samples_pending = batch.pending + samples
            self._backoff_s = min(q.max_backoff_s, max(q.min_backoff_s, self._backoff_s * 2))
            wait = self._backoff_s * (0.5 + self._rng.random() / 2)  # jitter: senders do not retry in step
            if answer.retry_after_s is not None:
                wait = max(wait, min(answer.retry_after_s, 300.0))
            self._note(answer, f"retrying in {wait:.2f} s", logging.WARNING)
            return wait
        st.samples_failed_total += samples
        self._commit(batch.watermark)  # refused for good: a sender never retries a 4xx
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
