"""The host collector: node_exporter names over a fake psutil and a fake /sys and /proc; the real psutil; wiring."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from gpuwatch.app.build import build_runtime
from gpuwatch.app.config import load
from gpuwatch.app.runtime import Runtime
from gpuwatch.collect.host import DISK_IGNORE, HostCollector
from gpuwatch.collect.host_metrics import CPU_MODES, HOST_METRIC_TABLE, HOST_METRICS
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Matcher
from gpuwatch.demo.nvml import FakeNvml

ROOT = Path(__file__).resolve().parent.parent

# Shaped like psutil's namedtuples on Linux.
scputimes = namedtuple(
    "scputimes", "user nice system idle iowait irq softirq steal guest guest_nice"
)  # fmt: skip
svmem = namedtuple(
    "svmem", "total available percent used free active inactive buffers cached shared slab"
)  # fmt: skip
sswap = namedtuple("sswap", "total used free percent sin sout")
snetio = namedtuple("snetio", "bytes_sent bytes_recv packets_sent packets_recv errin errout dropin dropout")
sdiskio = namedtuple(
    "sdiskio",
    "read_count write_count read_bytes write_bytes read_time write_time read_merged_count "
    "write_merged_count busy_time",
)
sdiskpart = namedtuple("sdiskpart", "device mountpoint fstype opts")


class FakePsutil(SimpleNamespace):
    """The psutil calls the collector makes, with fixed answers."""

    Error = type("Error", (Exception,), {})

    def __init__(self, mountpoint: str = "/") -> None:
        super().__init__()
        self.mountpoint = mountpoint
        self.load_error: BaseException | None = None

    def cpu_times(self, percpu: bool = False) -> list[Any]:
        assert percpu
        return [
            scputimes(100.0, 1.0, 50.0, 1000.0, 5.0, 0.5, 0.25, 0.125, 0.0, 0.0),
            scputimes(200.0, 2.0, 60.0, 900.0, 6.0, 0.5, 0.25, 0.0, 0.0, 0.0),
        ]

    def getloadavg(self) -> tuple[float, float, float]:
        if self.load_error is not None:
            raise self.load_error
        return (1.5, 1.25, 1.0)

    def virtual_memory(self) -> Any:
        return svmem(16 << 30, 12 << 30, 25.0, 4 << 30, 8 << 30, 0, 0, 1 << 20, 2 << 30, 0, 0)

    def swap_memory(self) -> Any:
        return sswap(4 << 30, 1 << 30, 3 << 30, 25.0, 0, 0)

    def net_io_counters(self, pernic: bool = False, nowrap: bool = True) -> dict[str, Any]:
        assert pernic
        return {
            "lo": snetio(9, 9, 9, 9, 0, 0, 0, 0),
            "eth0": snetio(1000, 2000, 10, 20, 1, 2, 3, 4),
            "ib0": snetio(5, 6, 7, 8, 0, 0, 0, 0),
        }

    def disk_io_counters(self, perdisk: bool = False, nowrap: bool = True) -> dict[str, Any]:
        assert perdisk
        disks = ["sda", "sda1", "nvme0n1", "nvme0n1p2", "loop3", "ram0", "zram0", "dm-0", "md0", "vdb"]
        return {d: sdiskio(10, 20, 4096, 8192, 1, 2, 0, 0, 1500) for d in disks}

    def disk_partitions(self, all: bool = False) -> list[Any]:
        return [
            sdiskpart("rootfs", "/", "rootfs", "rw"),
            sdiskpart("/dev/sda2", self.mountpoint, "ext4", "rw"),
            sdiskpart("tmpfs", "/nonexistent-elsewhere", "tmpfs", "rw"),
        ]


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def fake_sys(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    port = root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
    write(port / "state", "4: ACTIVE\n")
    write(port / "counters" / "port_rcv_data", "1000\n")
    write(port / "counters" / "port_xmit_data", "2500\n")
    write(port / "counters" / "port_rcv_packets", "77\n")
    write(port / "counters" / "port_xmit_packets", "88\n")
    other = root / "class" / "infiniband" / "mlx5_1" / "ports" / "1"
    write(other / "state", "1: DOWN\n")
    write(other / "counters" / "port_rcv_data", "0\n")  # the other counters are absent
    return root


@pytest.fixture
def fake_proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    write(
        root / "meminfo",
        "MemTotal:       16318412 kB\nMemFree:         1000000 kB\nMemAvailable:   12000000 kB\n"
        "Buffers:           2048 kB\nCached:          3000000 kB\nSwapCached:            0 kB\n"
        "SReclaimable:     50000 kB\nSwapTotal:       4194300 kB\nSwapFree:        4194300 kB\n"
        "HugePages_Total:       0\n",
    )
    return root


def values(batch: Batch) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {(s.name, s.labels): s.value for s in batch.samples}
    assert len(out) == len(batch.samples), "no duplicate series in one batch"
    return out


def find(batch: Batch, name: str, **labels: str) -> float:
    matches = [s.value for s in batch.samples if s.name == name and labels.items() <= dict(s.labels).items()]
    assert len(matches) == 1, f"{name}{labels}: {len(matches)} samples"
    return matches[0]


def collector(
    tmp_path: Path, ps: Any, sys_root: Path | None = None, proc_root: Path | None = None
) -> HostCollector:
    data_dir = tmp_path / "data"
    data_dir.mkdir(exist_ok=True)
    return HostCollector(
        instance="node-1",
        data_dir=data_dir,
        psutil_module=ps,
        sys_root=sys_root or tmp_path / "no-sys",
        proc_root=proc_root or tmp_path / "no-proc",
    )


def test_fake_psutil_gives_node_exporter_names(tmp_path: Path, fake_sys: Path) -> None:
    batch = collector(tmp_path, FakePsutil(), fake_sys).collect(1_790_000_000_000)
    assert batch.timestamp_ms == 1_790_000_000_000
    values(batch)
    assert all(dict(s.labels)["instance"] == "node-1" for s in batch.samples)
    assert {s.name for s in batch.samples} <= {m.name for m in HOST_METRICS}
    # CPU: per CPU and mode, guest modes left out as node_exporter's node_cpu_seconds_total does.
    assert find(batch, "node_cpu_seconds_total", cpu="1", mode="user") == 200.0
    assert find(batch, "node_cpu_seconds_total", cpu="0", mode="steal") == 0.125
    modes = {dict(s.labels)["mode"] for s in batch.samples if s.name == "node_cpu_seconds_total"}
    assert modes == set(CPU_MODES)
    assert find(batch, "node_load5") == 1.25
    # Memory from psutil where /proc/meminfo is absent.
    assert find(batch, "node_memory_MemTotal_bytes") == 16 << 30
    assert find(batch, "node_memory_MemAvailable_bytes") == 12 << 30
    assert find(batch, "node_memory_Buffers_bytes") == 1 << 20
    assert find(batch, "node_memory_SwapFree_bytes") == 3 << 30
    # Network: lo left out.
    nics = {dict(s.labels)["device"] for s in batch.samples if s.name == "node_network_receive_bytes_total"}
    assert nics == {"eth0", "ib0"}
    assert find(batch, "node_network_receive_bytes_total", device="eth0") == 2000
    assert find(batch, "node_network_transmit_bytes_total", device="eth0") == 1000
    assert find(batch, "node_network_receive_errs_total", device="eth0") == 1
    assert find(batch, "node_network_transmit_drop_total", device="eth0") == 4
    # Disks: node_exporter's default exclude pattern.
    disks = {dict(s.labels)["device"] for s in batch.samples if s.name == "node_disk_reads_completed_total"}
    assert disks == {"sda", "nvme0n1", "dm-0", "md0", "vdb"}
    assert find(batch, "node_disk_writes_completed_total", device="sda") == 20
    assert find(batch, "node_disk_written_bytes_total", device="sda") == 8192
    assert find(batch, "node_disk_io_time_seconds_total", device="sda") == 1.5
    # InfiniBand: data counters are 4-byte words.
    assert find(batch, "node_infiniband_port_data_received_bytes_total", device="mlx5_0", port="1") == 4000
    assert find(batch, "node_infiniband_port_data_transmitted_bytes_total", device="mlx5_0") == 10000
    assert find(batch, "node_infiniband_port_packets_received_total", device="mlx5_0") == 77
    assert find(batch, "node_infiniband_port_packets_transmitted_total", device="mlx5_0") == 88
    assert find(batch, "node_infiniband_state_id", device="mlx5_0") == 4
    assert find(batch, "node_infiniband_state_id", device="mlx5_1") == 1
    assert find(batch, "node_infiniband_port_data_received_bytes_total", device="mlx5_1") == 0
    assert not [
        s
        for s in batch.samples
        if s.name.endswith("packets_received_total") and ("device", "mlx5_1") in s.labels
    ]


def test_filesystem_of_the_data_directory(tmp_path: Path) -> None:
    ps = FakePsutil(mountpoint=str(tmp_path.resolve()))
    batch = collector(tmp_path, ps).collect(0)
    st = os.statvfs(tmp_path / "data")
    labels = {"device": "/dev/sda2", "mountpoint": str(tmp_path.resolve()), "fstype": "ext4"}
    assert find(batch, "node_filesystem_size_bytes", **labels) == st.f_blocks * st.f_frsize
    assert find(batch, "node_filesystem_avail_bytes", **labels) == pytest.approx(
        st.f_bavail * st.f_frsize, rel=0.05
    )
    assert find(batch, "node_filesystem_free_bytes", **labels) == pytest.approx(
        st.f_bfree * st.f_frsize, rel=0.05
    )


def test_missing_data_directory_uses_its_nearest_parent(tmp_path: Path) -> None:
    c = HostCollector(
        instance="n", data_dir=tmp_path / "not" / "yet", psutil_module=FakePsutil(), sys_root=tmp_path
    )
    assert find(c.collect(0), "node_filesystem_size_bytes", mountpoint="/") > 0


def test_meminfo_is_read_as_node_exporter_reads_it(tmp_path: Path, fake_proc: Path) -> None:
    batch = collector(tmp_path, FakePsutil(), proc_root=fake_proc).collect(0)
    assert find(batch, "node_memory_MemTotal_bytes") == 16318412 * 1024
    assert find(batch, "node_memory_Cached_bytes") == 3000000 * 1024, "without psutil's SReclaimable"
    assert find(batch, "node_memory_Buffers_bytes") == 2048 * 1024
    assert find(batch, "node_memory_SwapFree_bytes") == 4194300 * 1024
    assert not [
        s for s in batch.samples if s.name in ("node_memory_SwapCached_bytes", "node_memory_HugePages_Total")
    ]


def test_a_failing_section_is_left_out_and_logged_once(
    tmp_path: Path, fake_sys: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ps = FakePsutil()
    ps.load_error = ps.Error("no load average here")
    c = collector(tmp_path, ps, fake_sys)
    with caplog.at_level(logging.WARNING):
        first = c.collect(0)
        second = c.collect(5000)
    for batch in (first, second):
        names = {s.name for s in batch.samples}
        assert "node_load1" not in names
        assert {
            "node_cpu_seconds_total",
            "node_disk_reads_completed_total",
            "node_infiniband_state_id",
        } <= names
    assert [r.getMessage() for r in caplog.records if "load" in r.getMessage()] == [
        "host figures: load left out: Error: no load average here"
    ]


def test_no_infiniband_no_samples(tmp_path: Path) -> None:
    batch = collector(tmp_path, FakePsutil()).collect(0)
    assert not [s for s in batch.samples if s.name.startswith("node_infiniband_")]


@pytest.mark.parametrize(
    ("device", "ignored"),
    [("sda", False), ("sda1", True), ("xvda", False), ("xvda1", True), ("nvme0n1", False), ("nvme0n1p1", True),
     ("loop0", True), ("ram0", True), ("zram1", True), ("fd0", True), ("dm-0", False), ("md127", False)],
)  # fmt: skip
def test_disk_ignore_pattern(device: str, ignored: bool) -> None:
    assert bool(DISK_IGNORE.match(device)) is ignored


def test_real_psutil_on_this_machine(tmp_path: Path) -> None:
    c = HostCollector(instance="here", data_dir=tmp_path)
    first = c.collect(1000)
    second = c.collect(2000)
    names = {s.name for s in first.samples}
    expected = {
        "node_cpu_seconds_total", "node_load1", "node_load5", "node_load15", "node_memory_MemTotal_bytes",
        "node_memory_MemAvailable_bytes", "node_memory_MemFree_bytes", "node_memory_SwapTotal_bytes",
        "node_filesystem_size_bytes", "node_filesystem_avail_bytes", "node_filesystem_free_bytes",
    }  # fmt: skip
    assert expected <= names
    assert names <= {m.name for m in HOST_METRICS}
    cpus = {dict(s.labels)["cpu"] for s in first.samples if s.name == "node_cpu_seconds_total"}
    assert len(cpus) == len(psutil.cpu_times(percpu=True))
    assert all(s.value >= 0 for s in first.samples)
    total = find(first, "node_memory_MemTotal_bytes")
    assert 0 < find(first, "node_memory_MemAvailable_bytes") <= total
    assert total == pytest.approx(psutil.virtual_memory().total, rel=0.01)
    assert 0 <= find(first, "node_filesystem_avail_bytes") <= find(first, "node_filesystem_size_bytes")
    before, after = values(first), values(second)
    for key, value in before.items():
        if key[0].endswith("_total") and key in after:
            assert after[key] >= value, f"{key} went backwards"


def test_every_host_metric_is_in_the_docs() -> None:
    table = subprocess.run(
        [sys.executable, "-m", "gpuwatch.collect.host_metrics"], capture_output=True, text=True, check=True
    ).stdout
    docs = (ROOT / "docs" / "metrics.md").read_text()
    assert table in docs, "docs/metrics.md's host metric table is stale"
    for m in HOST_METRICS:
        assert f"`{m.name}`" in docs
    assert len({m.name for m in HOST_METRIC_TABLE}) == len(HOST_METRIC_TABLE)
    assert all(m.type in ("gauge", "counter") and m.help for m in HOST_METRICS)
    assert all(m.name.endswith("_total") == (m.type == "counter") for m in HOST_METRICS)


# -- wiring -----------------------------------------------------------------------------------------


@pytest.fixture
def runtime(tmp_path: Path) -> Iterator[Runtime]:
    clock = FakeClock(1_790_000_000)
    settings = load(None, {}, {"data_dir": str(tmp_path / "data"), "demo": True, "host_interval": "10s"})
    rt = build_runtime(settings, "node-7", clock=clock, nvml=FakeNvml(gpu_count=1, clock=clock))
    yield rt
    rt.close()


def test_host_job_stores_and_exposes(runtime: Runtime) -> None:
    assert "host" in runtime.jobs.names() and runtime.jobs.interval("host") == 10.0
    assert runtime.jobs.run("sample") and runtime.jobs.run("host")
    runtime.store.flush()
    (mem,) = runtime.store.select([Matcher("__name__", "=", "node_memory_MemTotal_bytes")], 0, 2**62)
    assert dict(mem.labels) == {"instance": "node-7"} and mem.values[0] > 0
    text = runtime.exposition()
    assert "# TYPE node_cpu_seconds_total counter" in text
    assert 'node_memory_MemTotal_bytes{instance="node-7"}' in text
    assert "DCGM_FI_DEV_GPU_UTIL{" in text, "GPU figures stay on /metrics"
    assert runtime.metric_metadata()["node_disk_reads_completed_total"][0]["type"] == "counter"


def test_host_interval_setting() -> None:
    assert load(None, {}, {}).host_interval == 5.0
    assert load(None, {"GPUWATCH_HOST_INTERVAL": "15s"}, {}).host_interval == 15.0
