"""Build the object graph (settings -> store -> collectors -> jobs -> web) and run it."""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from gpuwatch.app.config import Settings
from gpuwatch.app.memtrim import INTERVAL_S as TRIM_INTERVAL_S
from gpuwatch.app.runtime import SELF_METRICS, Runtime, scrape_pool
from gpuwatch.collect.allocation import ALLOCATION_METRICS
from gpuwatch.collect.host import HOST_METRICS, HostCollector
from gpuwatch.collect.logs import LOG_METRICS, LogTailer
from gpuwatch.collect.nvml import DEMO_HINT, EXPECT_GPUS_HINT, GPU_METRICS, GpuCollector, load_nvml
from gpuwatch.collect.push import PUSH_METRICS, REEMIT_INTERVAL_S
from gpuwatch.collect.runenergy import RUN_ENERGY_METRICS
from gpuwatch.collect.rungpus import RUN_GPU_METRICS, RunGpus, runs_by_gpu
from gpuwatch.collect.runs import (
    RUN_METRICS,
    RUN_STATUS_INTERVAL_S,
)
from gpuwatch.collect.tensorboard import TB_METRICS, TensorBoardWatcher
from gpuwatch.collect.tfevents import TensorBoardUnavailable, load_codec
from gpuwatch.collect.usage import USAGE_METRICS
from gpuwatch.core.clock import Clock, SystemClock
from gpuwatch.core.credentials import AccessFile
from gpuwatch.core.errors import ConfigError, NvmlUnavailable
from gpuwatch.core.jobs import JobRegistry
from gpuwatch.core.tiers import HOUR_MS, MINUTE_MS
from gpuwatch.demo.incidents import IncidentSchedule
from gpuwatch.demo.sources import DemoSources, local_url
from gpuwatch.demo.training import training_log_file
from gpuwatch.notify.config import load_templates
from gpuwatch.notify.dispatcher import MutedBy, no_silences
from gpuwatch.notify.notifier import NOTIFY_METRICS, Notifier, NotifyStore
from gpuwatch.notify.received import ReceivedAlerts
from gpuwatch.notify.silences import Silences
from gpuwatch.query import Engine
from gpuwatch.query.fallback import FallbackBackend
from gpuwatch.query.remote import RemoteBackend
from gpuwatch.remote.backlog import StoreBacklog
from gpuwatch.remote.config import sent_labels
from gpuwatch.remote.writers import REMOTE_METRICS, RemoteWriters
from gpuwatch.rules.load import Group, RuleFileError
from gpuwatch.rules.manager import Query, RuleManager, configured_groups
from gpuwatch.rules.restore import ForStateRestorer
from gpuwatch.rules.roundcache import RoundCache
from gpuwatch.rules.state import RuleStore
from gpuwatch.store import Store
from gpuwatch.store.budget import MemoryBudget
from gpuwatch.web.admission import Admission

log = logging.getLogger("gpuwatch")

LOG_INTERVAL_S = 1.0  # one job for every tailed file: a thread wake-up costs CPU on small VMs
DEMO_HISTORY_DAYS = 7.0  # the week a new demo imports (demo_history)


def make_nvml(
    settings: Settings,
    clock: Clock,
    hostname: str = "",
    incidents: IncidentSchedule | None = None,
    serving_pid: int | None = None,
    start: float | None = None,
) -> Any:
    """Return the simulated NVML in demo mode (UUIDs derived from `hostname`), else the real pynvml module.
    `serving_pid`: the pid the simulated inference GPUs' process reports (see FakeNvml); `start`: when
    the simulation started (default: now).

    The simulated NVML is imported here, in demo mode only: it reads pynvml's names at import, so a
    real start never depends on what the installed binding spells."""
    if settings.demo:
        from gpuwatch.demo.nvml import FakeNvml

        try:
            return FakeNvml(
                gpu_count=settings.demo_gpus,
                model=settings.demo_model,
                workload="mixed",
                clock=clock,
                hostname=hostname,
                incidents=incidents,
                serving_pid=serving_pid,
                start=start,
            )
        except ValueError as e:
            raise ConfigError(f"config error: demo_model: {e}") from None
    return load_nvml()


def build_runtime(settings: Settings, hostname: str, clock: Clock | None = None, nvml: Any = None) -> Runtime:
    """Open the store and the GPU collector as `settings` say; raise StoreInUse/StoreError on trouble.

    A demo on an empty store (`demo_history`) starts its simulation a week ago and imports what it
    would have stored since (demo/history.py); a caller's own `nvml` is a simulation of its own, with
    no history."""
    clock = clock or SystemClock()
    codec = None
    # A setting that cannot work fails before the store opens (and before a demo imports its week).
    if settings.tensorboard_dirs:
        try:
            codec = load_codec()
        except TensorBoardUnavailable as e:
            raise ConfigError(f"config error: tensorboard_dirs is set, but {e}") from None
    store = Store.open(
        settings.data_dir,
        clock=clock,
        flush_interval_s=settings.flush_interval,
        retention_s=settings.retention,
        memory=MemoryBudget(settings.store_memory_mb, settings.chunk_cache_mb),
        tier_retention_s={MINUTE_MS: settings.retention_1m, HOUR_MS: settings.retention_1h},
        size_cap_bytes=settings.retention_size,
    )
    try:
        with_history = (
            settings.demo and settings.demo_history and nvml is None and store.counters()["series"] == 0
        )
        demo_start = clock.now() - DEMO_HISTORY_DAYS * 86400.0 if with_history else clock.now()
        # The demo's incidents (incidents.py), shared by the simulated GPUs, servers and training run.
        incidents = IncidentSchedule(demo_start, settings.demo_gpus) if settings.demo else None
        if nvml is None:
            # The demo's simulated vLLM and SGLang listen in this process (demo/sources.py): its pid is
            # the one the inference GPUs report, so the serving-GPU lookup (port -> pid) finds them.
            nvml = make_nvml(
                settings,
                clock,
                hostname,
                incidents,
                serving_pid=os.getpid() if settings.demo_sources else None,
                start=demo_start,
            )
        proc_root = settings.proc_root
        if settings.demo and hasattr(nvml, "write_proc_root"):
            # Simulated processes get simulated /proc entries, so users and containers show too.
            proc_root = settings.data_dir / "demo-proc"
            nvml.write_proc_root(proc_root)
        hint = EXPECT_GPUS_HINT if settings.expect_gpus and not settings.demo else DEMO_HINT
        gpu: GpuCollector | None = GpuCollector(
            nvml,
            hostname=hostname,
            proc_root=proc_root,
            no_gpu_hint=hint,
            idle_below=settings.usage_idle_below,
            # a sample interval past a minute still charges every interval, not none
            max_gap_s=max(60.0, 3 * settings.sample_interval),
        )
        problem: str | None = None
        try:
            gpu.open()  # type: ignore[union-attr]
        except NvmlUnavailable as e:
            gpu, problem = None, str(e)
            log.warning("%s", problem)
        # The simulated fine-tuning job's GPUs: the run names them, as a trainer's CUDA_VISIBLE_DEVICES
        # would (its process is gpuwatch's own, which NVML's simulated table does not list).
        roles = getattr(getattr(nvml, "workload", None), "roles", ())
        training_gpus = [i for i, role in enumerate(roles) if role == "training"]
        run_step = 0
        if with_history and gpu is not None:
            run_step = import_history(
                settings,
                store,
                clock,
                nvml,
                gpu,
                hostname,
                proc_root,
                training_gpus if settings.demo_sources else [],
            )
        jobs = JobRegistry(clock)
        metadata = {
            m.name: m
            for m in (
                *GPU_METRICS,
                *HOST_METRICS,
                *SELF_METRICS,
                *PUSH_METRICS,
                *LOG_METRICS,
                *RUN_METRICS,
                *RUN_GPU_METRICS,
                *RUN_ENERGY_METRICS,
                *USAGE_METRICS,
                *ALLOCATION_METRICS,
                *TB_METRICS,
                *REMOTE_METRICS,
            )
        }
        metadata.update({m.name: m for m in NOTIFY_METRICS})
        runtime = Runtime(
            settings=settings,
            clock=clock,
            store=store,
            hostname=hostname,
            gpu=gpu,
            gpu_problem=problem,
            jobs=jobs,
            metadata=metadata,
            host=HostCollector(instance=hostname, data_dir=settings.data_dir, proc_root=settings.proc_root),
            run_gpus=RunGpus(hostname, proc_root, machine_name=socket.gethostname()),
            admission=Admission.of(settings),
        )
        if settings.destinations:
            runtime.remote = RemoteWriters(
                settings.destinations,
                StoreBacklog(store, clock.now_ms),
                clock,
                external_labels=sent_labels(settings.external_labels, hostname),
                max_backlog_s=settings.retention,
                logger=logging.getLogger("gpuwatch.remote"),
            )
        face: FallbackBackend | None = None
        if settings.storage.remote is not None:
            # While the remote cannot be reached, pages and the API answer from the local store's
            # last minutes, saying so; the rules do not (query/fallback.py).
            face = FallbackBackend(
                RemoteBackend(settings.storage.remote, settings),
                runtime.queryable,
                store,
                settings,
                clock,
                buffer_s=settings.storage.remote.local_buffer_s,
            )
            runtime.remote_queries = face
        jobs.add("sample", runtime.sample, settings.sample_interval)
        jobs.add("push", runtime.repush, REEMIT_INTERVAL_S)
        jobs.add("host", runtime.sample_host, settings.host_interval)
        jobs.add("retention", runtime.retention, 3600.0)
        jobs.add("trim", runtime.trimmer.trim, TRIM_INTERVAL_S)
        jobs.add("runs", runtime.sample_runs, RUN_STATUS_INTERVAL_S)
        runtime.access = AccessFile(settings.data_dir)
        runtime.first_token = runtime.access.ensure(clock.now_ms())
        # The rules read the store, and gpuwatch's own latest figures from memory: on a full disk,
        # GpuwatchStoreWriteErrors fires from the write errors counted, not from what was stored.
        runtime.rules = build_manager(
            settings,
            store,
            clock,
            runtime.queryable,
            remote=face.instant_remote if face is not None else None,
            hostname=hostname,
        )
        jobs.add("rules", runtime.rules.run_due, runtime.rules.min_interval_s)
        runtime.silences = Silences(
            store, clock, limit=settings.max_silences, max_size_bytes=settings.max_silence_size_bytes
        )
        jobs.add("silences", runtime.silences.gc, 3600.0)
        runtime.received = ReceivedAlerts(
            clock, limit=settings.max_posted_alerts, label_limits=settings.label_limits
        )
        runtime.notifier = build_notifier(
            settings, store, clock, hostname, muted_by=runtime.silences.muted_by
        )
        if runtime.notifier is not None:
            runtime.rules.add_listener(runtime.notifier.observe)
            runtime.received.add_listener(runtime.notifier.observe_received)
        log_files = settings.log_files
        if settings.demo and settings.demo_sources:
            # Nothing is bound until start(); the training run pushes to this very gpuwatch and writes
            # a trainer's log that is tailed like any `log_files` entry.
            demo_log = settings.data_dir / "demo-logs" / "train.log"
            runtime.demo = DemoSources(
                local_url(settings.host, settings.port),
                clock=clock,
                training_log=demo_log,
                token=runtime.access.first_token(),
                training_gpus=[str(i) for i in training_gpus] or None,
                incidents=incidents,
                training_step=run_step,
            )
            log_files = (*log_files, training_log_file(demo_log))
        if log_files:
            runtime.logs = LogTailer(log_files, offsets=store.log_offsets())
            jobs.add("logs", runtime.tail_logs, LOG_INTERVAL_S)
        if codec is not None:
            runtime.tensorboard = TensorBoardWatcher(
                settings.tensorboard_dirs, codec, offsets=store.log_offsets(), runs=store.runs()
            )
            jobs.add("tensorboard", runtime.read_tensorboard, settings.tensorboard_interval)
        runtime.scrapes = scrape_pool(settings, store, clock)
        return runtime
    except BaseException:
        store.close()
        raise


def import_history(
    settings: Settings,
    store: Store,
    clock: Clock,
    nvml: Any,
    gpu: GpuCollector,
    hostname: str,
    proc_root: Path,
    run_gpus: list[int],
) -> int:
    """Import the demo's week of history into `store`, let the collector go on from its last values,
    and return the training run's step at its end (0: none going on).

    Imported here, in demo mode only, as the simulated NVML is (make_nvml): it reads pynvml's names."""
    from gpuwatch.demo.history import DemoHistory

    history = DemoHistory(
        nvml,
        hostname,
        proc_root,
        end_ms=clock.now_ms(),
        days=DEMO_HISTORY_DAYS,
        idle_below=settings.usage_idle_below,
        max_gap_s=max(60.0, 3 * settings.sample_interval),
        fine_s=settings.sample_interval,
        run_gpus=run_gpus,
    )
    imported = history.write(store, clock)
    gpu.resume(imported.last_ms, imported.last)
    gpu.assign_runs(runs_by_gpu(imported.last))
    log.info(
        "demo: imported %g days of history (%d series, %d samples) in %.1f s",
        DEMO_HISTORY_DAYS,
        imported.series,
        imported.samples,
        imported.seconds,
    )
    return imported.run_step


def _config_dir(settings: Settings) -> Path | None:
    return settings.config_file.parent if settings.config_file is not None else None


def configured_rule_groups(settings: Settings) -> list[Group]:
    """Return the built-in groups (as `builtin_rules` and `language` say) and those of `rule_files`."""
    return configured_groups(
        settings.builtin_rules, settings.language, settings.rule_files, _config_dir(settings)
    )


def build_manager(
    settings: Settings,
    store: RuleStore,
    clock: Clock,
    queryable: Any,
    *,
    remote: Query | None = None,
    hostname: str = "",
) -> RuleManager:
    """Return the rule manager for `settings`; raise ConfigError naming every bad rule file.

    With `remote` (storage.remote's instant query) the rules are evaluated there, as vmalert evaluates them: what they
    record and their ALERTS go to the local store and from it by remote write, and pending alerts'
    `for` state is restored from the remote's ALERTS_FOR_STATE at start."""
    try:
        groups = configured_rule_groups(settings)
    except RuleFileError as e:
        raise ConfigError("config error: rule_files: " + "; ".join(e.errors)) from None
    if remote is not None:
        sent = dict(sent_labels(settings.external_labels, hostname))
        return RuleManager(
            store,
            remote,
            clock,
            groups,
            default_interval_s=settings.evaluation_interval,
            loader=lambda: configured_rule_groups(settings),
            restorer=ForStateRestorer(remote, sent),
        )
    cache = RoundCache(queryable)
    engine = Engine.configured(cache, settings, clock.monotonic)
    return RuleManager(
        store,
        engine.instant,
        clock,
        groups,
        default_interval_s=settings.evaluation_interval,
        loader=lambda: configured_rule_groups(settings),
        cache=cache,
    )


def external_url(settings: Settings, hostname: str) -> str:
    """Return the URL gpuwatch is reached at, for `externalURL` and `generatorURL` in notifications."""
    host = settings.host if settings.host not in ("0.0.0.0", "::", "") else hostname
    return f"http://{host}:{settings.port}"


def build_notifier(
    settings: Settings, store: NotifyStore, clock: Clock, hostname: str, *, muted_by: MutedBy = no_silences
) -> Notifier | None:
    """Return the notifier for `settings`, or None when neither `notify` nor `alerting` is configured.

    `muted_by(labels, now_ms)` returns the ids of the silences that mute an alert (none by default).
    """
    if settings.notify.route is None and not settings.alerting.alertmanagers:
        return None
    for key in settings.notify.ignored:
        log.warning("notify: %s is not used: gpuwatch's Slack messages have no such part", key)
    return Notifier(
        load_templates(settings.notify, _config_dir(settings)),
        settings.alerting,
        store,
        clock,
        external_url=external_url(settings, hostname),
        muted_by=muted_by,
    )
