"""HostCollector: CPU, memory, network, disk, data-directory filesystem and InfiniBand figures of this host.

Samples are named as node_exporter names them (`host_metrics.HOST_METRICS`, docs/metrics.md), so a
cluster page or a Grafana dashboard can draw network bandwidth and storage IOPS with the usual queries
(`rate(node_network_receive_bytes_total[1m])`, `rate(node_disk_reads_completed_total[1m])`).
psutil is injectable (tests pass a fake module); `/proc/meminfo` and `/sys/class/infiniband` are read
under injectable roots, so tests use a fake tree.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from gpuwatch.collect.host_metrics import CPU_MODES, HOST_METRICS, MEMINFO_FIELDS
from gpuwatch.core.model import Batch, Labels, Sample, make_labels

__all__ = ["DISK_IGNORE", "HOST_METRICS", "HostCollector"]

# node_exporter's default --collector.diskstats.device-exclude: partitions, loop, ram and floppy devices.
DISK_IGNORE = re.compile(r"^(z?ram|loop|fd|(h|s|v|xv)d[a-z]|nvme\d+n\d+p)\d+$")
# Interfaces left out (node_exporter keeps `lo`; its traffic says nothing about the cluster network).
NET_IGNORE = frozenset({"lo"})

_NET_FIELDS: tuple[tuple[str, str], ...] = (
    ("node_network_receive_bytes_total", "bytes_recv"),
    ("node_network_transmit_bytes_total", "bytes_sent"),
    ("node_network_receive_packets_total", "packets_recv"),
    ("node_network_transmit_packets_total", "packets_sent"),
    ("node_network_receive_errs_total", "errin"),
    ("node_network_transmit_errs_total", "errout"),
    ("node_network_receive_drop_total", "dropin"),
    ("node_network_transmit_drop_total", "dropout"),
)
_DISK_FIELDS: tuple[tuple[str, str, float], ...] = (
    ("node_disk_reads_completed_total", "read_count", 1.0),
    ("node_disk_writes_completed_total", "write_count", 1.0),
    ("node_disk_read_bytes_total", "read_bytes", 1.0),
    ("node_disk_written_bytes_total", "write_bytes", 1.0),
    ("node_disk_io_time_seconds_total", "busy_time", 0.001),  # ms; Linux only
)
# (metric, counter file, factor): port_rcv_data / port_xmit_data count 4-byte words.
_IB_COUNTERS: tuple[tuple[str, str, int], ...] = (
    ("node_infiniband_port_data_received_bytes_total", "port_rcv_data", 4),
    ("node_infiniband_port_data_transmitted_bytes_total", "port_xmit_data", 4),
    ("node_infiniband_port_packets_received_total", "port_rcv_packets", 1),
    ("node_infiniband_port_packets_transmitted_total", "port_xmit_packets", 1),
)
_MEMINFO_WANTED = frozenset(MEMINFO_FIELDS)
# psutil fallback for the memory figures where /proc/meminfo is absent (not Linux): (field, call, attr).
_MEMORY_FALLBACK: tuple[tuple[str, str, str], ...] = (
    ("MemTotal", "virtual_memory", "total"),
    ("MemAvailable", "virtual_memory", "available"),
    ("MemFree", "virtual_memory", "free"),
    ("Buffers", "virtual_memory", "buffers"),
    ("Cached", "virtual_memory", "cached"),
    ("SwapTotal", "swap_memory", "total"),
    ("SwapFree", "swap_memory", "free"),
)
_MOUNT_REFRESH_MS = 60_000


class _Mount:
    """The filesystem that holds the data directory, as node_exporter labels it."""

    __slots__ = ("device", "fstype", "mountpoint")

    def __init__(self, device: str, mountpoint: str, fstype: str) -> None:
        self.device, self.mountpoint, self.fstype = device, mountpoint, fstype


class HostCollector:
    """Samples this host's figures; `collect` is cheap enough to run every few seconds."""

    def __init__(
        self,
        *,
        instance: str,
        data_dir: Path,
        psutil_module: ModuleType | Any = psutil,
        sys_root: Path = Path("/sys"),
        proc_root: Path = Path("/proc"),
        logger: logging.Logger | None = None,
    ) -> None:
        self._instance = instance
        self._data_dir = data_dir
        self._ps = psutil_module
        self._ib_root = str(sys_root / "class" / "infiniband")
        self._meminfo = proc_root / "meminfo"
        self._log = logger or logging.getLogger(__name__)
        ps_error = getattr(psutil_module, "Error", None)
        extra = (ps_error,) if isinstance(ps_error, type) and issubclass(ps_error, BaseException) else ()
        # What one section may raise without taking the others down: files vanish, psutil lacks a call.
        self._errors: tuple[type[BaseException], ...] = (
            OSError,
            ValueError,
            NotImplementedError,
            AttributeError,
            *extra,
        )
        self._warned: set[str] = set()
        self._labels: dict[tuple[tuple[str, str], ...], Labels] = {}
        self._mount: _Mount | None = None
        self._mount_checked_ms: int | None = None

    def collect(self, timestamp_ms: int) -> Batch:
        """Return one batch of every host figure; a section that fails is left out and logged once."""
        out: list[Sample] = []
        sections: tuple[tuple[str, Callable[[], Iterator[Sample]]], ...] = (
            ("cpu", self._cpu),
            ("load", self._load),
            ("memory", self._memory),
            ("network", self._network),
            ("disk", self._disk),
            ("filesystem", lambda: self._filesystem(timestamp_ms)),
            ("infiniband", self._infiniband),
        )
        for name, section in sections:
            try:
                out.extend(list(section()))  # all or nothing per section
            except self._errors as e:
                if name not in self._warned:
                    self._warned.add(name)
                    self._log.warning("host figures: %s left out: %s: %s", name, type(e).__name__, e)
        return Batch(timestamp_ms, out)

    # -- sections ---------------------------------------------------------------------------------

    def _label(self, *pairs: tuple[str, str]) -> Labels:
        labels = self._labels.get(pairs)
        if labels is None:
            labels = self._labels[pairs] = make_labels({"instance": self._instance, **dict(pairs)})
        return labels

    def _cpu(self) -> Iterator[Sample]:
        for i, times in enumerate(self._ps.cpu_times(percpu=True)):
            cpu = str(i)
            for mode in CPU_MODES:
                value = getattr(times, mode, None)
                if value is not None:
                    yield Sample(
                        "node_cpu_seconds_total", self._label(("cpu", cpu), ("mode", mode)), float(value)
                    )

    def _load(self) -> Iterator[Sample]:
        one, five, fifteen = self._ps.getloadavg()
        labels = self._label()
        yield Sample("node_load1", labels, float(one))
        yield Sample("node_load5", labels, float(five))
        yield Sample("node_load15", labels, float(fifteen))

    def _memory(self) -> Iterator[Sample]:
        labels = self._label()
        try:
            text = self._meminfo.read_bytes()
        except FileNotFoundError:
            text = None
        if text is not None:
            # As node_exporter: the exact /proc/meminfo fields (psutil's `cached` adds SReclaimable).
            for line in text.splitlines():
                key, _, rest = line.partition(b":")
                field = key.decode("ascii", "replace")
                if field in _MEMINFO_WANTED:
                    parts = rest.split()
                    value = float(parts[0]) * (1024.0 if len(parts) > 1 and parts[1] == b"kB" else 1.0)
                    yield Sample(f"node_memory_{field}_bytes", labels, value)
            return
        calls: dict[str, Any] = {}
        for field, call, attr in _MEMORY_FALLBACK:
            if call not in calls:
                calls[call] = getattr(self._ps, call)()
            got = getattr(calls[call], attr, None)  # `buffers`, `cached`: Linux and BSD only
            if got is not None:
                yield Sample(f"node_memory_{field}_bytes", labels, float(got))

    def _network(self) -> Iterator[Sample]:
        for nic, counters in sorted(self._ps.net_io_counters(pernic=True, nowrap=True).items()):
            if nic in NET_IGNORE:
                continue
            labels = self._label(("device", nic))
            for name, attr in _NET_FIELDS:
                value = getattr(counters, attr, None)
                if value is not None:
                    yield Sample(name, labels, float(value))

    def _disk(self) -> Iterator[Sample]:
        for disk, counters in sorted(self._ps.disk_io_counters(perdisk=True, nowrap=True).items()):
            if DISK_IGNORE.match(disk):
                continue
            labels = self._label(("device", disk))
            for name, attr, factor in _DISK_FIELDS:
                value = getattr(counters, attr, None)
                if value is not None:
                    yield Sample(name, labels, float(value) * factor)

    def _filesystem(self, timestamp_ms: int) -> Iterator[Sample]:
        path = self._existing_data_dir()
        if self._mount_checked_ms is None or timestamp_ms - self._mount_checked_ms >= _MOUNT_REFRESH_MS:
            # Mounts rarely change; reading the mount table every tick would cost more than the rest.
            self._mount = self._find_mount(path)
            self._mount_checked_ms = timestamp_ms
        st = os.statvfs(path)
        m = self._mount or _Mount("", "/", "")
        labels = self._label(("device", m.device), ("fstype", m.fstype), ("mountpoint", m.mountpoint))
        yield Sample("node_filesystem_size_bytes", labels, float(st.f_blocks * st.f_frsize))
        yield Sample("node_filesystem_free_bytes", labels, float(st.f_bfree * st.f_frsize))
        yield Sample("node_filesystem_avail_bytes", labels, float(st.f_bavail * st.f_frsize))

    def _existing_data_dir(self) -> Path:
        path = self._data_dir.resolve()
        while not path.exists() and path != path.parent:
            path = path.parent
        return path

    def _find_mount(self, path: Path) -> _Mount | None:
        best: _Mount | None = None
        for part in self._ps.disk_partitions(all=True):
            mp = Path(part.mountpoint)
            if (mp == path or mp in path.parents) and (
                best is None or len(part.mountpoint) > len(best.mountpoint)
            ):
                best = _Mount(part.device, part.mountpoint, part.fstype)
        return best

    def _infiniband(self) -> Iterator[Sample]:
        # Plain string paths: this runs 5 reads per port, and pathlib would double its cost.
        root = self._ib_root
        try:
            devices = sorted(os.listdir(root))
        except FileNotFoundError:
            return
        for device in devices:
            ports_dir = f"{root}/{device}/ports"
            try:
                ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for port in ports:
                labels = self._label(("device", device), ("port", port))
                state = _read_text(f"{ports_dir}/{port}/state")
                if state is not None:
                    head = state.partition(":")[0].strip()  # "4: ACTIVE"
                    if head.isdigit():
                        yield Sample("node_infiniband_state_id", labels, float(head))
                for name, file, factor in _IB_COUNTERS:
                    text = _read_text(f"{ports_dir}/{port}/counters/{file}")
                    if text is not None and text.strip().isdigit():
                        yield Sample(name, labels, float(int(text) * factor))


def _read_text(path: str) -> str | None:
    """Return a sysfs file's text, or None where it is absent or unreadable (some counters are)."""
    try:
        with open(path, "rb") as f:
            return f.read().decode("ascii", "replace")
    except OSError:
        return None
