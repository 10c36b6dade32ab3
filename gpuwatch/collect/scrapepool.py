"""Schedule every scrape target: one scheduler thread, scrapes on a bounded pool, file_sd re-read.

Each target is scraped every `scrape_interval`, never twice at once; a slow or hanging target holds
only its own worker (there are as many workers as targets, up to `MAX_WORKERS`), so it never delays
the others. Idle workers block without waking up. Target files (`file_sd_configs`) are re-read
when their modification time or size changes; removed targets get staleness markers.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from gpuwatch.collect.fetch import Fetch, HttpFetcher
from gpuwatch.collect.scrape import Target
from gpuwatch.collect.scrapeconfig import ScrapeConfig, StaticGroup, targets_group
from gpuwatch.collect.targetspec import TargetSpec, target_specs
from gpuwatch.core.clock import Clock
from gpuwatch.core.errors import ConfigError
from gpuwatch.core.model import (
    DEFAULT_LABEL_LIMITS,
    DEFAULT_SERIES_LIMITS,
    Batch,
    LabelLimits,
    Labels,
    SeriesLimits,
)

log = logging.getLogger("gpuwatch.scrape")

MAX_WORKERS = 64
FILE_SD_CHECK_S = 5.0

Sink = Callable[[Batch], None]


def read_target_file(path: Path) -> tuple[StaticGroup, ...]:
    """Read one file_sd file (JSON, or YAML for .yml/.yaml): a list of {targets, labels} groups."""
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text) if path.suffix in (".yml", ".yaml") else json.loads(text)
    except (yaml.YAMLError, ValueError) as e:
        raise ConfigError(
            f"config error: {path}: not valid {'YAML' if path.suffix != '.json' else 'JSON'}: {e}"
        ) from None
    if data is None:
        return ()
    if not isinstance(data, list):
        raise ConfigError(f"config error: {path}: expected a list of target groups")
    return tuple(targets_group(f"{path}[{i}]", g) for i, g in enumerate(data))


def phase(spec: TargetSpec) -> float:
    """Return the target's fixed offset within its scrape interval (from a hash of its URL and labels)."""
    key = f"{spec.url}|{spec.labels}".encode()
    return zlib.crc32(key) / 2**32 * spec.interval_s


class ScrapePool:
    """Every configured target, its scrapes and its state; feeds each scrape's batches to `sink`."""

    def __init__(
        self,
        configs: Sequence[ScrapeConfig],
        *,
        default_interval_s: float,
        sink: Sink,
        clock: Clock,
        fetch: Fetch | None = None,
        base_dir: Path | None = None,
        label_limits: LabelLimits = DEFAULT_LABEL_LIMITS,
        series_limits: SeriesLimits = DEFAULT_SERIES_LIMITS,
    ) -> None:
        self.configs = tuple(configs)
        self.label_limits = label_limits
        self.series_limits = series_limits
        self.default_interval_s = default_interval_s
        self._sink = sink
        self._clock = clock
        self._fetch = fetch or HttpFetcher(clock)
        self._base_dir = base_dir or Path.cwd()
        self._files: dict[Path, tuple[tuple[int, int], tuple[StaticGroup, ...]]] = {}
        self.file_errors: dict[str, str] = {}
        self._targets: dict[TargetSpec, Target] = {}
        self.dropped: list[dict[str, str]] = []  # discovered labels of targets relabel_configs dropped
        self._due: dict[TargetSpec, float] = {}
        self._unphased: set[TargetSpec] = set()  # scraped once at start, not yet moved to their phase
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self.refresh()

    # -- targets ---------------------------------------------------------------------------------
    def _groups(self, config: ScrapeConfig) -> tuple[StaticGroup, ...]:
        groups = list(config.static_configs)
        for pattern in config.file_sd_files:
            full = pattern if os.path.isabs(pattern) else str(self._base_dir / pattern)
            for name in sorted(glob.glob(full)):
                groups.extend(self._file_groups(Path(name)))
        return tuple(groups)

    def _file_groups(self, path: Path) -> tuple[StaticGroup, ...]:
        try:
            st = path.stat()
        except OSError:
            return ()
        stamp = (st.st_mtime_ns, st.st_size)
        known = self._files.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        try:
            groups = read_target_file(path)
        except (ConfigError, OSError, UnicodeDecodeError) as e:
            self.file_errors[str(path)] = str(e)
            log.warning("scrape: %s; keeping its previous targets", e)
            return known[1] if known is not None else ()
        self.file_errors.pop(str(path), None)
        self._files[path] = (stamp, groups)
        return groups

    def refresh(self) -> None:
        """Re-read target files; start new targets, and mark removed ones' series stale."""
        specs: list[TargetSpec] = []
        dropped: list[dict[str, str]] = []
        for config in self.configs:
            specs.extend(
                target_specs(
                    config,
                    self._groups(config),
                    self.default_interval_s,
                    dropped,
                    self.label_limits,
                    self.series_limits,
                )
            )
        self.dropped = dropped
        now = self._clock.monotonic()
        removed: list[Target] = []
        with self._lock:
            wanted = dict.fromkeys(specs)
            for spec in list(self._targets):
                if spec not in wanted:
                    target = self._targets.pop(spec)
                    self._due.pop(spec, None)
                    self._unphased.discard(spec)
                    # A scrape in flight holds the lock; it sees the removal and writes the markers.
                    if target.lock.acquire(blocking=False):
                        removed.append(target)
            for spec in wanted:
                if spec not in self._targets:
                    self._targets[spec] = Target(spec, self._fetch, self._clock)
                    self._due[spec] = now
                    self._unphased.add(spec)
        for target in removed:
            self._retire(target)

    def _retire(self, target: Target) -> None:
        """Write staleness markers for a removed target whose lock the caller holds, then release it."""
        try:
            if target.scrapes:
                self._sink(target.stale_batch(self._clock.now_ms()))
        finally:
            target.lock.release()

    def targets(self) -> list[Target]:
        with self._lock:
            return list(self._targets.values())

    def federation_filter(self) -> Callable[[str, Labels], bool] | None:
        """Return a test of whether a series came from one of this pool's `/federate` targets (so a node
        does not hand back what it got from another server's store), or None without such targets.

        A series counts when a current federation target's scrapes made it, or when it carries the
        `job` of a federation job (its report series, and what the node sent without a job). After a
        restart, series a federation target sent with their own job (kept by honor_labels) count only
        from that target's first scrape on."""
        targets = [t for t in self.targets() if t.spec.is_federation]
        if not targets:
            return None
        jobs = frozenset(t.spec.job for t in targets)

        def is_federated(name: str, labels: Labels) -> bool:
            for k, v in labels:
                if k == "job":
                    if v in jobs:
                        return True
                    break
            return any(t.has_series(name, labels) for t in targets)

        return is_federated

    def states(self) -> list[dict[str, Any]]:
        """Return every target as Prometheus's /api/v1/targets `activeTargets` entries."""
        return [t.state() for t in self.targets()]

    def dropped_states(self) -> list[dict[str, Any]]:
        """Return the targets `relabel_configs` dropped, as /api/v1/targets `droppedTargets` entries."""
        return [{"discoveredLabels": labels} for labels in self.dropped]

    def metadata(self) -> dict[str, list[dict[str, str]]]:
        """Return the scraped families' HELP/TYPE/UNIT as /api/v1/metadata shapes them (distinct entries)."""
        out: dict[str, list[dict[str, str]]] = {}
        for target in self.targets():
            for name, meta in list(target.metadata.items()):
                entry = {"type": meta.type, "help": meta.help, "unit": meta.unit}
                entries = out.setdefault(name, [])
                if entry not in entries:
                    entries.append(entry)
        return out

    # -- scraping --------------------------------------------------------------------------------
    def scrape(self, target: Target) -> bool:
        """Scrape `target` now and hand its batches to the sink; False if a scrape of it is running."""
        if not target.lock.acquire(blocking=False):
            return False
        scraped = False
        try:
            with self._lock:
                is_removed = self._targets.get(target.spec) is not target
            if not is_removed:
                for batch in target.scrape():
                    self._sink(batch)
                scraped = True
        finally:
            # Checking for removal and releasing happen under the pool lock, so that either this
            # scrape or refresh() writes a removed target's staleness markers.
            with self._lock:
                is_removed = self._targets.get(target.spec) is not target
                if not is_removed:
                    target.lock.release()
            if is_removed:
                self._retire(target)
        return scraped

    def scrape_all(self) -> None:
        """Scrape every target once, one after another (tests and one-shot use)."""
        for target in self.targets():
            self.scrape(target)

    def _run(self, target: Target) -> None:
        try:
            self.scrape(target)
        except Exception:  # a worker must survive anything one target does
            log.exception("scrape of %s failed unexpectedly", target.spec.url)

    def _tick(self, executor: ThreadPoolExecutor) -> float:
        """Submit every due target; return seconds until the next one is due."""
        now = self._clock.monotonic()
        with self._lock:
            due = list(self._due.items())
        next_at = now + FILE_SD_CHECK_S
        for spec, at in due:
            if at <= now:
                target = self._targets.get(spec)
                if target is not None and not target.lock.locked():
                    executor.submit(self._run, target)
                at = at + spec.interval_s
                if at <= now:
                    at = now + spec.interval_s  # missed rounds are skipped, not caught up
                if spec in self._unphased:
                    # Every target is scraped at once at start (data at once); after that each keeps
                    # its own phase in the interval, as Prometheus spreads targets, so that 20 targets
                    # of one job do not all parse and store in the same instant.
                    self._unphased.discard(spec)
                    at = now + phase(spec)
                    if at - now < min(1.0, spec.interval_s / 2):
                        at += spec.interval_s
                with self._lock:
                    if spec in self._due:
                        self._due[spec] = at
            next_at = min(next_at, at)
        return max(next_at - now, 0.005)

    def _loop(self) -> None:
        assert self._executor is not None
        next_refresh = self._clock.monotonic() + FILE_SD_CHECK_S
        while not self._stop.is_set():
            if any(c.file_sd_files for c in self.configs) and self._clock.monotonic() >= next_refresh:
                try:
                    self.refresh()
                except Exception:  # a bad target file must not end scraping
                    log.exception("scrape: re-reading target files failed")
                next_refresh = self._clock.monotonic() + FILE_SD_CHECK_S
            wait = self._tick(self._executor)
            self._stop.wait(wait)

    def start(self) -> None:
        """Start the scheduler thread (only `gpuwatch serve` calls this)."""
        if self._thread is not None or not self.configs:
            return
        self._stop.clear()
        self._executor = ThreadPoolExecutor(MAX_WORKERS, thread_name_prefix="gpuwatch-scrape")
        self._thread = threading.Thread(target=self._loop, name="gpuwatch-scrape-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop scheduling; wait briefly for running scrapes (a hanging one is abandoned). Safe twice."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        close = getattr(self._fetch, "close", None)
        if close is not None:
            close()  # connections kept for the next scrape
