"""The host metric table: name, type, unit, labels and source of every sample the host collector emits.

Names, units, labels and help texts are node_exporter's, so node_exporter dashboards (Grafana's
"Node Exporter Full") and rules work unchanged; every sample also carries `instance`.
"""

from __future__ import annotations

from typing import NamedTuple

from gpuwatch.core.model import MetricInfo

# Modes of `node_cpu_seconds_total`, as node_exporter's cpu collector names them.
CPU_MODES: tuple[str, ...] = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
# `/proc/meminfo` fields exported as `node_memory_<field>_bytes`.
MEMINFO_FIELDS: tuple[str, ...] = (
    "MemTotal",
    "MemAvailable",
    "MemFree",
    "Buffers",
    "Cached",
    "SwapTotal",
    "SwapFree",
)


class HostMetric(NamedTuple):
    """One row of the metric table."""

    name: str
    type: str
    unit: str
    labels: tuple[str, ...]
    help: str
    source: str

    @property
    def info(self) -> MetricInfo:
        return MetricInfo(self.name, self.type, self.help, self.unit, ("instance", *self.labels))


_NET = "psutil.net_io_counters(pernic=True)"
_DISK = "psutil.disk_io_counters(perdisk=True)"
_FS = "os.statvfs(data_dir); mount from psutil.disk_partitions(all=True)"
_IB = "/sys/class/infiniband/<device>/ports/<port>/counters/"
_DEV = ("device",)
_FS_LABELS = ("device", "mountpoint", "fstype")
_IB_LABELS = ("device", "port")


def _memory(field: str) -> HostMetric:
    return HostMetric(
        f"node_memory_{field}_bytes", "gauge", "bytes", (), f"Memory information field {field}_bytes.",
        f"/proc/meminfo {field} (psutil.virtual_memory() / swap_memory() where it is absent)",
    )  # fmt: skip


def _net(stat: str, attr: str) -> HostMetric:
    return HostMetric(
        f"node_network_{stat}_total", "counter", "bytes" if stat.endswith("bytes") else "", _DEV,
        f"Network device statistic {stat}.", f"{_NET}.{attr}",
    )  # fmt: skip


HOST_METRIC_TABLE: tuple[HostMetric, ...] = (
    HostMetric("node_cpu_seconds_total", "counter", "seconds", ("cpu", "mode"),
               "Seconds the CPUs spent in each mode.", "psutil.cpu_times(percpu=True)"),
    HostMetric("node_load1", "gauge", "", (), "1m load average.", "psutil.getloadavg()[0]"),
    HostMetric("node_load5", "gauge", "", (), "5m load average.", "psutil.getloadavg()[1]"),
    HostMetric("node_load15", "gauge", "", (), "15m load average.", "psutil.getloadavg()[2]"),
    *(_memory(f) for f in MEMINFO_FIELDS),
    _net("receive_bytes", "bytes_recv"),
    _net("transmit_bytes", "bytes_sent"),
    _net("receive_packets", "packets_recv"),
    _net("transmit_packets", "packets_sent"),
    _net("receive_errs", "errin"),
    _net("transmit_errs", "errout"),
    _net("receive_drop", "dropin"),
    _net("transmit_drop", "dropout"),
    HostMetric("node_disk_reads_completed_total", "counter", "", _DEV,
               "The total number of reads completed successfully.", f"{_DISK}.read_count"),
    HostMetric("node_disk_writes_completed_total", "counter", "", _DEV,
               "The total number of writes completed successfully.", f"{_DISK}.write_count"),
    HostMetric("node_disk_read_bytes_total", "counter", "bytes", _DEV,
               "The total number of bytes read successfully.", f"{_DISK}.read_bytes"),
    HostMetric("node_disk_written_bytes_total", "counter", "bytes", _DEV,
               "The total number of bytes written successfully.", f"{_DISK}.write_bytes"),
    HostMetric("node_disk_io_time_seconds_total", "counter", "seconds", _DEV,
               "Total seconds spent doing I/Os.", f"{_DISK}.busy_time / 1000 (Linux)"),
    HostMetric("node_filesystem_size_bytes", "gauge", "bytes", _FS_LABELS,
               "Filesystem size in bytes.", f"{_FS}: f_blocks * f_frsize"),
    HostMetric("node_filesystem_free_bytes", "gauge", "bytes", _FS_LABELS,
               "Filesystem free space in bytes.", f"{_FS}: f_bfree * f_frsize"),
    HostMetric("node_filesystem_avail_bytes", "gauge", "bytes", _FS_LABELS,
               "Filesystem space available to non-root users in bytes.", f"{_FS}: f_bavail * f_frsize"),
    HostMetric("node_infiniband_port_data_received_bytes_total", "counter", "bytes", _IB_LABELS,
               "Number of data octets received on all links", f"{_IB}port_rcv_data * 4"),
    HostMetric("node_infiniband_port_data_transmitted_bytes_total", "counter", "bytes", _IB_LABELS,
               "Number of data octets transmitted on all links", f"{_IB}port_xmit_data * 4"),
    HostMetric("node_infiniband_port_packets_received_total", "counter", "", _IB_LABELS,
               "Number of packets received on all VLs by this port (including errors)",
               f"{_IB}port_rcv_packets"),
    HostMetric("node_infiniband_port_packets_transmitted_total", "counter", "", _IB_LABELS,
               "Number of packets transmitted on all VLs from this port (including errors)",
               f"{_IB}port_xmit_packets"),
    HostMetric("node_infiniband_state_id", "gauge", "", _IB_LABELS,
               "State of the InfiniBand port (0: no change, 1: down, 2: init, 3: armed, 4: active, 5: act defer)",
               "/sys/class/infiniband/<device>/ports/<port>/state"),
)  # fmt: skip

HOST_METRICS: tuple[MetricInfo, ...] = tuple(m.info for m in HOST_METRIC_TABLE)


def render_markdown_table() -> str:
    """Return the metric table as Markdown, as README.md and docs/metrics.md carry it."""
    rows = [
        "| Metric | Type | Unit | Labels (besides `instance`) | Source |",
        "| --- | --- | --- | --- | --- |",
    ]
    for m in HOST_METRIC_TABLE:
        labels = ", ".join(f"`{label}`" for label in m.labels) or "-"
        rows.append(f"| `{m.name}` | {m.type} | {m.unit or '-'} | {labels} | {m.source} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render_markdown_table(), end="")
