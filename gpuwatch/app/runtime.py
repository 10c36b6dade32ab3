"""The running process: what each scheduled job does (sample the GPUs, the host, runs, logs and
TensorBoard files; apply retention), gpuwatch's own figures, and start and stop (`build.py` builds it)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuwatch import __version__
from gpuwatch.app.config import Settings
from gpuwatch.app.memtrim import Trimmer
from gpuwatch.collect.host import HostCollector
from gpuwatch.collect.logs import LogTailer
from gpuwatch.collect.nvml import EXPECT_GPUS_HINT, GpuCollector
from gpuwatch.collect.push import PushGroups
from gpuwatch.collect.runenergy import RunEnergy, energy_samples
from gpuwatch.collect.rungpus import RunGpus, runs_by_gpu
from gpuwatch.collect.runs import (
    RUN_STATUS_FINISHED_MS,
    run_status_samples,
)
from gpuwatch.collect.scrapeconfig import ScrapeConfig, url_config
from gpuwatch.collect.scrapepool import ScrapePool
from gpuwatch.collect.tensorboard import TensorBoardWatcher
from gpuwatch.core.clock import Clock
from gpuwatch.core.credentials import AccessFile
from gpuwatch.core.jobs import JobRegistry
from gpuwatch.core.model import Batch, Labels, MetricInfo, Sample, stable_labels
from gpuwatch.demo.sources import DemoSources
from gpuwatch.notify.notifier import Notifier
from gpuwatch.notify.received import ReceivedAlerts
from gpuwatch.notify.silences import Silences
from gpuwatch.promtext.writer import format_text
from gpuwatch.query.backend import LocalBackend, QueryBackend
from gpuwatch.query.recent import RecentSamples, WithRecent
from gpuwatch.remote.writers import RemoteWriters
from gpuwatch.rules.manager import RuleManager
from gpuwatch.store import Store
from gpuwatch.web.admission import Admission

log = logging.getLogger("gpuwatch")

# How long gpuwatch's own figures are held in memory for the rules (query/recent.py): longer than the
# self-monitoring rules' 10-minute ranges, so they fire while a full disk keeps the figures unwritten.
SELF_FIGURES_HELD_MS = 15 * 60 * 1000

SELF_METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("gpuwatch_build_info", "gauge", "gpuwatch version; always 1.", "", ("version",)),
    MetricInfo("gpuwatch_gpus", "gauge", "Number of GPUs gpuwatch samples (0 when NVML is unavailable).", ""),
    MetricInfo(
        "gpuwatch_nvml_up", "gauge", "1 if NVML answered at start-up, 0 if no GPU or driver was found.", ""
    ),
    MetricInfo("gpuwatch_store_series", "gauge", "Series in the store.", ""),
    MetricInfo("gpuwatch_store_queue_depth", "gauge", "Batches waiting to be written to the store.", ""),
    MetricInfo("gpuwatch_store_write_errors_total", "counter", "Failed writes to the store since start.", ""),
    MetricInfo(
        "gpuwatch_store_dropped_samples_total",
        "counter",
        "Samples dropped since start because too many waited for a store that could not write.",
        "",
    ),
    # Scheduled jobs are labelled `task`, not `job`: `job` is the scrape job's, and a hub scraping this
    # node with honor_labels would otherwise take `job="rules"` for the node's own scrape job.
    MetricInfo(
        "gpuwatch_job_runs_total", "counter", "Runs of each scheduled job since start.", "", ("task",)
    ),
    MetricInfo("gpuwatch_job_failures_total", "counter", "Failed runs of each scheduled job.", "", ("task",)),
    MetricInfo(
        "gpuwatch_store_chunk_cache_bytes",
        "gauge",
        "Decoded chunks held in memory for reads (at most gpuwatch_store_chunk_cache_limit_bytes; unused "
        "ones go after 10 minutes).",
        "bytes",
    ),
    MetricInfo(
        "gpuwatch_store_chunk_cache_limit_bytes",
        "gauge",
        "The chunk cache's share of store_memory_mb now: what DuckDB's quarter and the indexes leave.",
        "bytes",
    ),
    MetricInfo(
        "gpuwatch_store_index_bytes",
        "gauge",
        "Memory the series catalogue and the chunk and head indexes hold (~1 KB a series, 36 B a chunk).",
        "bytes",
    ),
    MetricInfo(
        "gpuwatch_store_memory_budget_bytes",
        "gauge",
        "store_memory_mb: DuckDB's buffer, the indexes and the chunk cache together.",
        "bytes",
    ),
    MetricInfo(
        "gpuwatch_store_duckdb_memory_bytes",
        "gauge",
        "Memory DuckDB's buffer manager holds: table pages, unwritten rows, statements (a quarter of "
        "store_memory_mb, at least 64 MB).",
        "bytes",
    ),
    MetricInfo(
        "gpuwatch_store_duckdb_dead_queue_nodes",
        "gauge",
        "Nodes DuckDB's eviction queues keep for blocks that are gone, ~200 bytes of heap each that "
        "gpuwatch_store_duckdb_memory_bytes does not count (a queue is purged past 32,768).",
        "",
    ),
    MetricInfo("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", "bytes"),
    MetricInfo(
        "gpuwatch_memory_trimmed_bytes_total",
        "counter",
        "Resident memory the allocator gave back to the system at the trim job's calls (glibc only).",
        "bytes",
    ),
    MetricInfo(
        "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.", "seconds"
    ),
    MetricInfo(
        "gpuwatch_queries_refused_total",
        "counter",
        "PromQL queries and dashboard twins answered 503 unavailable since start: more were asked than "
        "query_max_concurrency and query_max_queued take.",
        "",
    ),
    MetricInfo(
        "gpuwatch_rule_evaluation_failures_total",
        "counter",
        "Failed rule evaluations of each rule group (`file;group`) since start.",
        "",
        ("rule_group",),
    ),
    MetricInfo(
        "gpuwatch_job_last_duration_seconds",
        "gauge",
        "How long the last run of each job took.",
        "seconds",
        ("task",),
    ),
)


def _cpu_seconds() -> float:
    """This process's user and system CPU time so far (as prometheus_client's process collector)."""
    t = os.times()
    return t.user + t.system


def _resident_bytes() -> float | None:
    """This process's resident memory, from /proc/self/statm (None where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return float(int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        return None


def scrape_pool(
    settings: Settings, store: Store, clock: Clock, extra: tuple[ScrapeConfig, ...] = ()
) -> ScrapePool | None:
    """Return the pool of the configured scrape targets plus `extra`, or None when there are none."""
    configs = (*settings.scrape_configs, *(url_config(u) for u in settings.scrape), *extra)
    if not configs:
        return None
    return ScrapePool(
        configs,
        default_interval_s=settings.scrape_interval,
        sink=store.append,
        clock=clock,
        base_dir=settings.config_file.parent if settings.config_file is not None else None,
        label_limits=settings.label_limits,
        series_limits=settings.series_limits,
    )


@dataclass
class Runtime:
    """Everything one gpuwatch process holds; passed down, never global."""

    settings: Settings
    clock: Clock
    store: Store
    hostname: str
    gpu: GpuCollector | None
    gpu_problem: str | None
    jobs: JobRegistry
    metadata: dict[str, MetricInfo] = field(default_factory=dict)
    host: HostCollector | None = None
    pushes: PushGroups = field(default_factory=PushGroups)
    scrapes: ScrapePool | None = None
    demo: DemoSources | None = None  # simulated vLLM/SGLang servers and training run (demo mode)
    rules: RuleManager | None = None
    silences: Silences | None = None
    received: ReceivedAlerts | None = None  # alerts other senders POST to /api/v2/alerts
    logs: LogTailer | None = None
    tensorboard: TensorBoardWatcher | None = None
    notifier: Notifier | None = None
    access: AccessFile | None = None  # tokens and passwords (<data_dir>/access.json)
    first_token: str | None = None  # the machine token made on this first start, to show once
    run_gpus: RunGpus | None = None  # joins runs with the process table (gpuwatch_run_gpu_info)
    run_energy: RunEnergy = field(default_factory=RunEnergy)
    remote: RemoteWriters | None = None  # remote_write destinations' senders
    remote_queries: QueryBackend | None = None  # storage.remote: what answers PromQL instead of the store
    # the turns PromQL queries and the pages' twins take (web/admission.py; counted in /metrics)
    admission: Admission = field(default_factory=lambda: Admission.of(None))  # the defaults
    # gpuwatch's own figures as sampled, which the rules read even while the store cannot write them
    own_figures: RecentSamples = field(default_factory=lambda: RecentSamples(SELF_FIGURES_HELD_MS))
    trimmer: Trimmer = field(default_factory=Trimmer)
    _latest: dict[str, Batch] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _scheduler: Any = None

    @property
    def queryable(self) -> WithRecent:
        """What queries read: the store, with gpuwatch's own figures of the last minutes merged in from
        memory (so they answer while the disk is full and cannot take them)."""
        return WithRecent(self.store, self.own_figures)

    @property
    def backend(self) -> QueryBackend:
        """What answers PromQL, series and label questions for the pages, the API and the rules: the
        remote store where `storage.remote` is set, else gpuwatch's engine over `queryable`."""
        if self.remote_queries is not None:
            return self.remote_queries
        return LocalBackend(self.queryable, self.store, self.settings, self.clock.monotonic)

    # -- sampling -------------------------------------------------------------------------------
    def sample(self) -> None:
        """Take one sample of every source and hand it to the store (the 'sample' job)."""
        now_ms = self.clock.now_ms()
        samples: list[Sample] = []
        if self.gpu is not None:
            samples.extend(self.gpu.collect(now_ms).samples)
            samples.extend(self.gpu.usage_samples())
        own = self._self_samples()
        self.own_figures.add(now_ms, own)
        samples.extend(own)
        batch = Batch(now_ms, samples)
        with self._lock:
            self._latest["gpu"] = batch
        self.store.append(batch)

    def sample_host(self) -> None:
        """Read the host's CPU, memory, network, disk and InfiniBand figures (the 'host' job)."""
        if self.host is None:
            return
        batch = self.host.collect(self.clock.now_ms())
        with self._lock:
            self._latest["host"] = batch
        self.store.append(batch)

    def _self_samples(self) -> list[Sample]:
        stats = self.store.counters()
        out = [
            Sample("gpuwatch_build_info", stable_labels({"version": __version__}), 1.0),
            Sample("gpuwatch_gpus", (), float(len(self.gpu.gpus) if self.gpu is not None else 0)),
            Sample("gpuwatch_nvml_up", (), 1.0 if self.gpu is not None else 0.0),
            Sample("gpuwatch_store_series", (), float(stats.get("series", 0))),
            Sample("gpuwatch_store_queue_depth", (), float(stats.get("queue_depth", 0))),
            Sample("gpuwatch_store_write_errors_total", (), float(stats.get("write_errors", 0))),
            Sample("gpuwatch_store_dropped_samples_total", (), float(stats.get("dropped_samples", 0))),
            Sample("gpuwatch_queries_refused_total", (), float(self.admission.refused)),
            Sample("gpuwatch_store_chunk_cache_bytes", (), float(stats.get("chunk_cache_bytes", 0))),
            Sample("process_cpu_seconds_total", (), _cpu_seconds()),
        ]
        memory = self.store.memory_figures()
        out.append(
            Sample("gpuwatch_store_chunk_cache_limit_bytes", (), float(memory["chunk_cache_limit_bytes"]))
        )
        out.append(Sample("gpuwatch_store_index_bytes", (), float(memory["index_bytes"])))
        if "budget_bytes" in memory:
            out.append(Sample("gpuwatch_store_memory_budget_bytes", (), float(memory["budget_bytes"])))
        duckdb_bytes = self.store.duckdb_memory_bytes()
        if duckdb_bytes is not None:
            out.append(Sample("gpuwatch_store_duckdb_memory_bytes", (), float(duckdb_bytes)))
        dead_nodes = self.store.duckdb_dead_queue_nodes()
        if dead_nodes is not None:
            out.append(Sample("gpuwatch_store_duckdb_dead_queue_nodes", (), float(dead_nodes)))
        rss = _resident_bytes()
        if rss is not None:
            out.append(Sample("process_resident_memory_bytes", (), rss))
        if self.trimmer.available:
            out.append(Sample("gpuwatch_memory_trimmed_bytes_total", (), float(self.trimmer.released_bytes)))
        if self.remote is not None:
            out += self.remote.samples()
        if self.rules is not None:
            for key, n in self.rules.failure_counts().items():
                out.append(
                    Sample(
                        "gpuwatch_rule_evaluation_failures_total",
                        stable_labels({"rule_group": key}),
                        float(n),
                    )
                )
        for name, runs, failures, last_duration_s in self.jobs.counters():
            labels = stable_labels({"task": name})
            out.append(Sample("gpuwatch_job_runs_total", labels, float(runs)))
            out.append(Sample("gpuwatch_job_failures_total", labels, float(failures)))
            if last_duration_s is not None:
                out.append(Sample("gpuwatch_job_last_duration_seconds", labels, last_duration_s))
        if self.notifier is not None:
            out.extend(self.notifier.samples())
        return out

    def sample_runs(self) -> None:
        """Write each recent training run's status gauges, for the training rules, the GPUs each running
        run uses and its energy so far (the 'runs' job)."""
        now_ms = self.clock.now_ms()
        records = self.store.runs()
        samples = run_status_samples(records, now_ms)
        if self.run_gpus is not None:
            held = self.run_gpus.samples(records, self.store, now_ms)
            samples.extend(held)
            if self.gpu is not None:
                self.gpu.assign_runs(runs_by_gpu(held))
        samples.extend(energy_samples(self.run_energy, records, self.store, now_ms, RUN_STATUS_FINISHED_MS))
        batch = Batch(now_ms, samples)
        with self._lock:
            self._latest["runs"] = batch
        if batch.samples:
            self.store.append(batch)

    def repush(self) -> None:
        """Write every pushed group's last values again, as a scraped Pushgateway shows them (the 'push' job)."""
        samples = self.pushes.current()
        if samples:
            self.store.append(Batch(self.clock.now_ms(), samples))

    def tail_logs(self) -> None:
        """Read what is new in the tailed log files; store lines, offsets and figures (the 'logs' job)."""
        if self.logs is None:
            return
        got = self.logs.poll(self.clock.now_ms())
        for batch in got.batches:
            if batch.samples:
                self.store.append(batch)
        if got.lines or got.offsets:
            self.store.append_log_lines(got.lines, got.offsets)

    def read_tensorboard(self) -> None:
        """Read what is new in the TensorBoard event files; store samples, text, offsets and runs (the
        'tensorboard' job)."""
        if self.tensorboard is None:
            return
        now_ms = self.clock.now_ms()
        got = self.tensorboard.poll(now_ms)
        if got.series:
            self.store.append_many([(s.name, s.labels, s.timestamps_ms, s.values) for s in got.series])
        if got.counters:
            self.store.append(Batch(now_ms, got.counters))
        if got.lines or got.offsets:  # after the samples: the writer stores them first
            self.store.append_log_lines(got.lines, got.offsets)
        for update in got.runs:
            self.store.upsert_run(update)

    def retention(self) -> None:
        """Drop samples older than the retention period (the 'retention' job)."""
        deleted = self.store.apply_retention(self.clock.now_ms())
        if deleted:
            log.info("retention: deleted %d samples older than %ss", deleted, int(self.settings.retention))

    def _watch_events(self) -> None:
        assert self.gpu is not None
        while not self._stop.is_set():
            try:
                self.gpu.wait_events(2000)
            except Exception as e:  # noqa: BLE001 - a broken event set must not end monitoring
                log.warning("XID event watch stopped: %s", e)
                return

    # -- what the web layer reads ----------------------------------------------------------------
    def exposition(self) -> str:
        """Return the latest figures in Prometheus text format (for GET /metrics)."""
        with self._lock:
            batch = self._latest.get("gpu")
            host = self._latest.get("host")
            runs = self._latest.get("runs")
        samples = list(batch.samples) if batch is not None else self._self_samples()
        if host is not None:
            samples.extend(host.samples)
        if runs is not None:
            samples.extend(runs.samples)
        samples.extend(self.pushes.current())  # pushed groups, as a Pushgateway's /metrics shows them
        return format_text(samples, self.metadata)

    def targets(self) -> list[dict[str, Any]]:
        """Return the scrape targets as Prometheus's /api/v1/targets `activeTargets` entries."""
        return self.scrapes.states() if self.scrapes is not None else []

    def dropped_targets(self) -> list[dict[str, Any]]:
        """Return the targets that relabel_configs dropped, as /api/v1/targets `droppedTargets` entries."""
        return self.scrapes.dropped_states() if self.scrapes is not None else []

    def remote_write_states(self) -> list[dict[str, Any]]:
        """Each remote_write destination's state (the targets page)."""
        return self.remote.states() if self.remote is not None else []

    def federation_filter(self) -> Callable[[str, Labels], bool] | None:
        """Which stored series came from another server's /federate (/federate leaves them out)."""
        return self.scrapes.federation_filter() if self.scrapes is not None else None

    def metric_metadata(self) -> dict[str, list[dict[str, str]]]:
        """Return metadata as Prometheus's /api/v1/metadata shapes it (gpuwatch's own, then scraped)."""
        own = {n: [{"type": m.type, "help": m.help, "unit": m.unit}] for n, m in self.metadata.items()}
        scraped = self.scrapes.metadata() if self.scrapes is not None else {}
        return dict(sorted({**scraped, **own}.items()))

    def status(self) -> dict[str, Any]:
        """Return a short status for /-/health and the overview page: "degraded" with the reason while
        the store cannot write (a full disk): samples wait in memory, bounded, until it can."""
        counters = self.store.counters()
        failing = counters["write_failing"]
        problem = None
        if failing:
            problem = f"store writes fail ({counters['pending_samples']} samples wait in memory): {failing}"
        elif self.gpu is None and self.settings.expect_gpus and not self.settings.demo:
            problem = self.gpu_problem or f"no NVIDIA GPU found; {EXPECT_GPUS_HINT}"
        return {
            "status": "degraded" if problem else "ok",
            "problem": problem,
            "version": __version__,
            "hostname": self.hostname,
            "demo": self.settings.demo,
            "gpus": len(self.gpu.gpus) if self.gpu is not None else 0,
            "gpu_problem": self.gpu_problem,
        }

    # -- life cycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the scheduler and the XID event thread (only `gpuwatch serve` calls this)."""
        from apscheduler.executors.debug import DebugExecutor
        from apscheduler.executors.pool import ThreadPoolExecutor
        from apscheduler.schedulers.background import BackgroundScheduler

        # The sampler runs inline in the scheduler's own thread: one thread wake-up a tick instead of
        # two (on small VMs each wake-up costs milliseconds of CPU). Slow jobs go to a worker thread.
        scheduler = BackgroundScheduler(
            timezone="UTC",
            executors={"default": ThreadPoolExecutor(2), "inline": DebugExecutor()},
            job_defaults={"coalesce": True, "max_instances": 1},
        )
        for name in self.jobs.names():
            interval = self.jobs.interval(name)
            scheduler.add_job(
                self.jobs.run,
                "interval",
                args=[name],
                seconds=interval,
                id=name,
                name=name,  # what the scheduler's log lines call it ("rules", not "JobRegistry.run")
                executor="inline" if name == "sample" else "default",
                misfire_grace_time=max(1, int(interval)),
            )
        scheduler.start()
        self._scheduler = scheduler
        if self.demo is not None:
            # The simulated servers get their ports only now: rebuild the (not yet started) pool with them.
            self.demo.start()
            self.scrapes = scrape_pool(self.settings, self.store, self.clock, self.demo.scrape_configs())
        if self.scrapes is not None:
            self.scrapes.start()
        if self.notifier is not None:
            self.notifier.start()
        self.jobs.run("sample")
        if "host" in self.jobs.names():
            self.jobs.run("host")  # /metrics has host figures from the start, not after host_interval
        if self.remote is not None:
            self.remote.start()
        if self.gpu is not None:
            t = threading.Thread(target=self._watch_events, name="gpuwatch-xid", daemon=True)
            t.start()
            self._threads.append(t)

    def stop_demo(self) -> None:
        """Stop the simulated servers and finish the simulated training run (demo mode). Safe to call twice."""
        if self.demo is not None:
            self.demo.stop()

    def close(self) -> None:
        """Stop jobs, flush and checkpoint the store, release NVML. Safe to call twice."""
        self._stop.set()
        self.stop_demo()
        if self.scrapes is not None:
            self.scrapes.stop()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()
        if self.notifier is not None:
            self.notifier.stop()
        if self.remote is not None:
            self.remote.stop()  # before the store closes: a batch in flight commits its watermark or not
        if self.logs is not None:
            self.logs.close()
        if self.gpu is not None:
            try:
                self.gpu.close()
            except Exception as e:  # noqa: BLE001 - shutdown must reach the store even if NVML misbehaves
                log.warning("NVML shutdown failed: %s", e)
        self.store.close()
