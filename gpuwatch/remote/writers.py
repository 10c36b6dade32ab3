"""Every `remote_write` destination's sender on a thread of its own, and their figures.

The figures carry Prometheus's names and its `remote_name` and `url` labels, so dashboards and alerts
written for Prometheus's remote write read them unchanged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from gpuwatch.core.clock import Clock
from gpuwatch.core.model import MetricInfo, Sample, stable_labels
from gpuwatch.core.units import format_rfc3339
from gpuwatch.remote.config import RemoteWrite
from gpuwatch.remote.post import http_post
from gpuwatch.remote.sender import Backlog, Labels, Post, Sender

_LABELS = ("remote_name", "url")
REMOTE_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo(
        "prometheus_remote_storage_samples_total", "counter", "Samples a destination took.", "", _LABELS
    ),
    MetricInfo(
        "prometheus_remote_storage_samples_failed_total",
        "counter",
        "Samples a destination refused for good (a 4xx other than 429): dropped.",
        "",
        _LABELS,
    ),
    MetricInfo(
        "prometheus_remote_storage_samples_retried_total",
        "counter",
        "Samples sent again after a 5xx, 429 or no answer.",
        "",
        _LABELS,
    ),
    MetricInfo(
        "prometheus_remote_storage_samples_dropped_total",
        "counter",
        "Samples older than max_backlog when their turn came: skipped, not sent.",
        "",
        _LABELS,
    ),
    MetricInfo(
        "prometheus_remote_storage_samples_pending",
        "gauge",
        "Samples stored and not yet taken by the destination.",
        "",
        _LABELS,
    ),
    MetricInfo(
        "prometheus_remote_storage_queue_highest_sent_timestamp_seconds",
        "gauge",
        "Newest sample time the destination has taken.",
        "seconds",
        _LABELS,
    ),
)


class RemoteWriters:
    """The senders of all destinations; `start` and `stop` run their threads (`gpuwatch serve`)."""

    def __init__(
        self,
        destinations: Sequence[RemoteWrite],
        backlog: Backlog,
        clock: Clock,
        *,
        external_labels: Labels = (),
        max_backlog_s: float | None = None,
        post: Post | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        send = post or http_post(clock)
        self.senders = [
            Sender(
                d,
                backlog,
                send,
                clock,
                external_labels=external_labels,
                max_backlog_s=max_backlog_s,
                logger=logger,
            )
            for d in destinations
        ]
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for s in self.senders:
            t = threading.Thread(
                target=s.run, args=(self._stopping,), name=f"gpuwatch-rw-{s.dest.name}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop after the batch in flight (its watermark is committed only if it was taken)."""
        self._stopping.set()
        for t in self._threads:
            t.join(timeout_s)
        self._threads.clear()

    def samples(self) -> list[Sample]:
        """Each destination's figures (REMOTE_METRICS)."""
        out: list[Sample] = []
        for s in self.senders:
            labels = stable_labels({"remote_name": s.dest.name, "url": s.dest.url})
            st = s.state
            out += [
                Sample("prometheus_remote_storage_samples_total", labels, float(st.samples_total)),
                Sample(
                    "prometheus_remote_storage_samples_failed_total", labels, float(st.samples_failed_total)
                ),
                Sample(
                    "prometheus_remote_storage_samples_retried_total", labels, float(st.samples_retried_total)
                ),
                Sample(
                    "prometheus_remote_storage_samples_dropped_total", labels, float(st.samples_dropped_total)
                ),
                Sample("prometheus_remote_storage_samples_pending", labels, float(st.samples_pending)),
                Sample(
                    "prometheus_remote_storage_queue_highest_sent_timestamp_seconds",
                    labels,
                    st.highest_sent_timestamp_ms / 1000.0,
                ),
            ]
        return out

    def states(self) -> list[dict[str, Any]]:
        """For the targets page and `/api/v1/targets`' remote-write part."""
        return [
            {
                "name": s.dest.name,
                "url": s.dest.url,
                "health": "up" if not s.state.last_error else "down",
                "lastError": s.state.last_error,
                "lastStatus": s.state.last_status,
                "samplesSent": s.state.samples_total,
                "samplesFailed": s.state.samples_failed_total,
                "samplesPending": s.state.samples_pending,
                "gapSamplesPending": s.state.gap_samples_pending,
                "highestSentTimestamp": s.state.highest_sent_timestamp_ms / 1000.0,
                "highestSentTime": format_rfc3339(s.state.highest_sent_timestamp_ms)
                if s.state.highest_sent_timestamp_ms
                else "",
            }
            for s in self.senders
        ]
