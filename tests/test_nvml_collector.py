"""GpuCollector against the simulated NVML: names, labels, units, and every fault it must survive."""

from __future__ import annotations

import logging
import pwd
import threading
from collections.abc import Iterator
from pathlib import Path

import pynvml
import pytest

from gpuwatch.collect.gpu_metrics import GPU_LABELS, GPU_METRICS, render_markdown_table
from gpuwatch.collect.nvml import GpuCollector, GpuIdentity, XidEvent
from gpuwatch.collect.processes import parse_container_id, parse_uid, read_process_info
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.errors import NvmlUnavailable
from gpuwatch.core.model import Batch
from gpuwatch.demo.incidents import IncidentSchedule
from gpuwatch.demo.nvml import FakeNvml

ROOT = Path(__file__).resolve().parent.parent
NAMES = {m.name for m in GPU_METRICS}
CID = "4f3c2b1a" * 8


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake(clock: FakeClock) -> FakeNvml:
    return FakeNvml(clock=clock, seed=1)


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    return tmp_path / "proc"


@pytest.fixture
def collector(fake: FakeNvml, proc_root: Path) -> Iterator[GpuCollector]:
    c = GpuCollector(fake, hostname="node-1", proc_root=proc_root)
    c.open()
    yield c
    c.close()


def tick(collector: GpuCollector, clock: FakeClock, seconds: float = 1.0) -> Batch:
    clock.advance(seconds)
    return collector.collect(clock.now_ms())


def values(batch: Batch, name: str, **match: str) -> dict[str, float]:
    """Map GPU index -> value of `name` for samples whose labels include `match`."""
    out = {}
    for s in batch.samples:
        labels = dict(s.labels)
        if s.name == name and all(labels.get(k) == v for k, v in match.items()):
            out[labels["gpu"]] = s.value
    return out


def test_every_metric_and_label_for_eight_gpus(
    collector: GpuCollector, clock: FakeClock, fake: FakeNvml
) -> None:
    tick(collector, clock)
    batch = tick(collector, clock)
    assert batch.timestamp_ms == clock.now_ms()
    assert {s.name for s in batch.samples} <= NAMES
    per_gpu = [
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_FB_RESERVED", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_PENDING", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", "gpuwatch_pcie_tx_bytes_total",
        "gpuwatch_pcie_rx_bytes_total", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_PSTATE", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_XID_ERRORS",
        "gpuwatch_gpu_lost",
    ]  # fmt: skip
    for name in per_gpu:
        assert sorted(values(batch, name)) == [str(i) for i in range(8)], name
    assert "DCGM_FI_DEV_FAN_SPEED" not in {s.name for s in batch.samples}  # passive board: absent, never 0
    ids = {g.index: g for g in collector.gpus}
    for s in batch.samples:
        labels = dict(s.labels)
        assert list(s.labels) == sorted(s.labels)
        gpu = ids[int(labels["gpu"])]
        base = {"gpu": str(gpu.index), "UUID": gpu.uuid, "modelName": "NVIDIA H100 80GB HBM3",
                "Hostname": "node-1", "pci_bus_id": gpu.pci_bus_id}  # fmt: skip
        assert {k: labels[k] for k in GPU_LABELS} == base
        extra = set(labels) - set(GPU_LABELS)
        # no /proc entries here, so no user or container labels
        by_name = {
            "gpuwatch_clock_throttled": {"reason"},
            "gpuwatch_process_gpu_memory_bytes": {"pid", "process_name"},
        }
        assert extra == by_name.get(s.name, set()), s.name
    # units as dcgm-exporter's
    assert values(batch, "DCGM_FI_DEV_FB_TOTAL")["0"] == 81559  # MiB
    fb = {
        n: values(batch, n)["0"]
        for n in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED")
    }
    assert 81559 - 2 <= sum(fb.values()) <= 81559
    assert 500 < values(batch, "DCGM_FI_DEV_POWER_USAGE")["0"] <= 700  # W
    assert values(batch, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT")["0"] == 700.0
    assert values(batch, "DCGM_FI_DEV_POWER_USAGE")["3"] < 100  # warming up: not loaded yet
    assert values(batch, "DCGM_FI_DEV_PSTATE")["3"] == 8
    assert values(batch, "DCGM_FI_DEV_SM_CLOCK")["0"] > 1500  # MHz
    assert values(batch, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")["0"] > 1e9  # mJ
    assert 1e6 < values(batch, "DCGM_FI_PROF_PCIE_RX_BYTES")["0"] < 1e11  # B/s
    assert values(batch, "gpuwatch_gpu_lost") == dict.fromkeys(map(str, range(8)), 0.0)
    assert len(values(batch, "gpuwatch_clock_throttled", reason="hw_thermal_slowdown")) == 8
    assert sorted(values(batch, "gpuwatch_process_gpu_memory_bytes")) == ["0", "1", "2", "4", "5", "6", "7"]


def test_every_gpu_metric_is_emitted_somewhere(clock: FakeClock) -> None:
    seen: set[str] = set()
    for model in ("NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"):
        fake = FakeNvml(gpu_count=2, model=model, clock=clock)
        c = GpuCollector(fake, hostname="h")
        c.open()
        fake.inject_xid(0, 31)
        c.wait_events(0)
        tick(c, clock)
        seen |= {s.name for s in tick(c, clock).samples}
        c.close()
    assert seen == NAMES


def test_metric_table_in_docs() -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert render_markdown_table() in doc, "regenerate: python -m gpuwatch.collect.gpu_metrics"
    for m in GPU_METRICS:
        assert f"`{m.name}`" in doc


def test_unsupported_call_is_absent_logged_once_and_not_asked_again(
    collector: GpuCollector, clock: FakeClock, fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    fake.set_unsupported(3, "nvmlDeviceGetPowerUsage")
    fake.set_unsupported(3, pynvml.NVML_FI_DEV_MEMORY_TEMP)
    before = fake.calls.get("nvmlDeviceGetPowerUsage", 0)
    for _ in range(4):
        batch = tick(collector, clock)
    assert "3" not in values(batch, "DCGM_FI_DEV_POWER_USAGE") and "3" not in values(
        batch, "DCGM_FI_DEV_MEMORY_TEMP"
    )
    assert "2" in values(batch, "DCGM_FI_DEV_POWER_USAGE") and "2" in values(batch, "DCGM_FI_DEV_MEMORY_TEMP")
    assert values(batch, "DCGM_FI_DEV_GPU_UTIL").keys() == {str(i) for i in range(8)}
    assert fake.calls["nvmlDeviceGetPowerUsage"] - before == 4 * 8 - 3  # GPU 3 asked once, then never
    power_logs = [r for r in caplog.records if "GPU 3: power is not available" in r.getMessage()]
    temp_logs = [r for r in caplog.records if "GPU 3: DCGM_FI_DEV_MEMORY_TEMP" in r.getMessage()]
    assert len(power_logs) == 1 and len(temp_logs) == 1


def test_fan_absent_on_passive_boards_and_present_on_consumer_cards(clock: FakeClock) -> None:
    fake = FakeNvml(gpu_count=1, model="NVIDIA GeForce RTX 4090", clock=clock)
    c = GpuCollector(fake, hostname="desk")
    c.open()
    batch = tick(c, clock)
    assert 0 <= values(batch, "DCGM_FI_DEV_FAN_SPEED")["0"] <= 100
    assert values(batch, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") == {}  # ECC off: absent, never 0
    assert values(batch, "DCGM_FI_DEV_MEMORY_TEMP") == {}
    c.close()


def test_lost_gpu_others_keep_coming_and_it_is_reprobed(
    collector: GpuCollector, clock: FakeClock, fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    tick(collector, clock)
    fake.lose_gpu(5)
    batch = tick(collector, clock)
    assert values(batch, "gpuwatch_gpu_lost")["5"] == 1.0
    assert values(batch, "gpuwatch_gpu_lost")["4"] == 0.0
    gpu5 = {s.name for s in batch.samples if dict(s.labels)["gpu"] == "5"}
    assert gpu5 == {"gpuwatch_gpu_lost", "DCGM_FI_DEV_XID_ERRORS"}
    assert sorted(values(batch, "DCGM_FI_DEV_GPU_UTIL")) == ["0", "1", "2", "3", "4", "6", "7"]
    assert sum("GPU 5" in r.getMessage() and "lost" in r.getMessage() for r in caplog.records) == 1
    handles = fake.calls["nvmlDeviceGetHandleByIndex"]
    for _ in range(5):
        batch = tick(collector, clock)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == handles  # not re-probed every tick
    batch = tick(collector, clock, 30)  # re-probed, still lost: not announced again
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == handles + 1
    assert values(batch, "gpuwatch_gpu_lost")["5"] == 1.0
    assert sum("GPU 5" in r.getMessage() and "lost" in r.getMessage() for r in caplog.records) == 1
    fake.recover_gpu(5)
    batch = tick(collector, clock, 30)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == handles + 2
    assert values(batch, "gpuwatch_gpu_lost")["5"] == 0.0 and "5" in values(batch, "DCGM_FI_DEV_GPU_UTIL")


def test_gpu_lost_before_open_and_unknown_error(clock: FakeClock, fake: FakeNvml) -> None:
    fake.nvmlInit()  # so lose_gpu's effect is visible from the start
    fake.lose_gpu(2)
    c = GpuCollector(fake, hostname="h")
    gpus = c.open()
    assert gpus[2] == GpuIdentity(2, "", "", "")
    batch = tick(c, clock)
    lost = [s for s in batch.samples if s.name == "gpuwatch_gpu_lost" and s.value == 1.0]
    assert [dict(s.labels) for s in lost] == [{"gpu": "2", "Hostname": "h"}]
    fake.recover_gpu(2)
    fake.set_call_error(6, "nvmlDeviceGetUtilizationRates", pynvml.NVMLError_Unknown())
    batch = tick(c, clock, 31)
    assert c.gpus[2].uuid.startswith("GPU-") and values(batch, "gpuwatch_gpu_lost")["2"] == 0.0
    # Unknown from one figure of a working GPU (nvidia-smi's ERR!) leaves that figure out, not the GPU
    assert values(batch, "gpuwatch_gpu_lost")["6"] == 0.0
    assert "6" not in values(batch, "DCGM_FI_DEV_GPU_UTIL") and "6" in values(
        batch, "DCGM_FI_DEV_POWER_USAGE"
    )
    c.close()


def test_transient_error_is_absent_for_one_tick(
    collector: GpuCollector, clock: FakeClock, fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake.set_call_error(1, "nvmlDeviceGetPowerUsage", pynvml.NVMLError_NoData())
    tick(collector, clock)
    batch = tick(collector, clock)
    assert "1" not in values(batch, "DCGM_FI_DEV_POWER_USAGE")
    assert sum("GPU 1: power failed" in r.getMessage() for r in caplog.records) == 1
    fake.set_call_error(1, "nvmlDeviceGetPowerUsage", None)
    assert "1" in values(tick(collector, clock), "DCGM_FI_DEV_POWER_USAGE")


def test_process_list_library_mismatch_falls_back_then_gives_up(
    collector: GpuCollector, clock: FakeClock, fake: FakeNvml
) -> None:
    fake.set_process_list_error(0, pynvml.NVMLLibraryMismatchError("use _v2"))
    batch = tick(collector, clock)
    assert "0" in values(batch, "gpuwatch_process_gpu_memory_bytes")  # through _v2
    fake.set_process_list_error(4, pynvml.NVMLLibraryMismatchError("use _v2"))
    fake.set_call_error(4, "nvmlDeviceGetComputeRunningProcesses_v2", pynvml.NVMLError_FunctionNotFound())
    for _ in range(3):
        batch = tick(collector, clock)
    assert "4" not in values(batch, "gpuwatch_process_gpu_memory_bytes")
    assert "4" in values(batch, "DCGM_FI_DEV_GPU_UTIL") and values(batch, "gpuwatch_gpu_lost")["4"] == 0.0


def test_memory_v2_and_temperature_v_fall_back(
    collector: GpuCollector, clock: FakeClock, fake: FakeNvml
) -> None:
    fake.set_call_error(0, "nvmlDeviceGetMemoryInfo_v2", pynvml.NVMLError_FunctionNotFound())
    fake.set_call_error(0, "nvmlDeviceGetTemperatureV", pynvml.NVMLError_FunctionNotFound())
    tick(collector, clock)
    batch = tick(collector, clock)
    assert "0" not in values(batch, "DCGM_FI_DEV_FB_RESERVED")
    v1_used = fake.nvmlDeviceGetMemoryInfo(fake.handles[0]).used
    assert values(batch, "DCGM_FI_DEV_FB_USED")["0"] == v1_used // 2**20  # v1 counts reserved memory as used
    assert values(batch, "DCGM_FI_DEV_GPU_TEMP")["0"] == fake.nvmlDeviceGetTemperature(fake.handles[0], 0)
    assert fake.calls["nvmlDeviceGetTemperature"] >= 2


def test_ecc_counters_rise(collector: GpuCollector, clock: FakeClock, fake: FakeNvml) -> None:
    assert values(tick(collector, clock), "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")["3"] == 0
    fake.add_ecc_errors(3, 2)
    fake.add_ecc_errors(3, 5, double_bit=False)
    batch = tick(collector, clock)
    assert values(batch, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")["3"] == 2
    assert values(batch, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")["3"] == 5
    assert values(batch, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")["3"] == 2
    assert values(batch, "DCGM_FI_DEV_ROW_REMAP_PENDING")["3"] == 1
    assert values(batch, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")["2"] == 0
    fake.add_ecc_errors(3, 1)
    assert values(tick(collector, clock), "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")["3"] == 3


def test_throttling_is_reflected(collector: GpuCollector, clock: FakeClock, fake: FakeNvml) -> None:
    before = tick(collector, clock)
    fake.throttle(0, pynvml.nvmlClocksEventReasonHwThermalSlowdown)
    after = tick(collector, clock)
    assert int(values(after, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")["0"]) & 0x40
    assert values(after, "gpuwatch_clock_throttled", reason="hw_thermal_slowdown")["0"] == 1.0
    assert values(after, "gpuwatch_clock_throttled", reason="hw_thermal_slowdown")["1"] == 0.0
    assert values(after, "gpuwatch_clock_throttled", reason="sw_power_cap")["0"] in (0.0, 1.0)
    assert values(after, "DCGM_FI_DEV_GPU_TEMP")["0"] >= 89
    assert values(after, "DCGM_FI_DEV_SM_CLOCK")["0"] < 0.6 * values(before, "DCGM_FI_DEV_SM_CLOCK")["0"]


def test_xid_event_reaches_the_next_batch(collector: GpuCollector, clock: FakeClock, fake: FakeNvml) -> None:
    assert collector.wait_events(0) == []
    fake.inject_xid(4, 79)
    assert collector.wait_events(0) == [XidEvent(4, 79)]
    batch = tick(collector, clock)
    assert values(batch, "DCGM_FI_DEV_XID_ERRORS") == {**dict.fromkeys(map(str, range(8)), 0.0), "4": 79.0}
    assert values(batch, "gpuwatch_xid_errors_total", xid="79") == {"4": 1.0}
    fake.inject_xid(4, 79)
    fake.inject_xid(4, 48)
    assert collector.wait_events(0) == [XidEvent(4, 79), XidEvent(4, 48)]
    batch = tick(collector, clock)
    assert values(batch, "DCGM_FI_DEV_XID_ERRORS")["4"] == 48.0
    assert values(batch, "gpuwatch_xid_errors_total", xid="79") == {"4": 2.0}
    assert values(batch, "gpuwatch_xid_errors_total", xid="48") == {"4": 1.0}


def test_wait_events_on_a_thread_wakes_on_an_event(collector: GpuCollector, fake: FakeNvml) -> None:
    got: list[XidEvent] = []
    thread = threading.Thread(target=lambda: got.extend(collector.wait_events(30_000)), daemon=True)
    thread.start()
    fake.inject_xid(1, 94)  # the wait returns as soon as the event is queued, not after 30 s
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert got == [XidEvent(1, 94)]


def test_pcie_rate_from_counters(collector: GpuCollector, clock: FakeClock) -> None:
    first = collector.collect(clock.now_ms())
    assert values(first, "DCGM_FI_PROF_PCIE_TX_BYTES") == {}  # a rate needs two samples
    second = tick(collector, clock, 2.0)
    for direction in ("tx", "rx"):
        c1 = values(first, f"gpuwatch_pcie_{direction}_bytes_total")
        c2 = values(second, f"gpuwatch_pcie_{direction}_bytes_total")
        rate = values(second, f"DCGM_FI_PROF_PCIE_{direction.upper()}_BYTES")
        assert rate.keys() == c2.keys()
        for gpu in rate:
            assert rate[gpu] == pytest.approx((c2[gpu] - c1[gpu]) / 2.0)
    assert values(second, "DCGM_FI_PROF_PCIE_RX_BYTES")["2"] < 1e5  # idle GPU


def test_container_user_and_name_from_proc(clock: FakeClock, fake: FakeNvml, proc_root: Path) -> None:
    fake.write_proc_root(proc_root)
    c = GpuCollector(fake, hostname="h", proc_root=proc_root)
    c.open()
    batch = tick(c, clock)
    procs = {
        dict(s.labels)["gpu"]: dict(s.labels)
        for s in batch.samples
        if s.name == "gpuwatch_process_gpu_memory_bytes"
    }
    assert procs["1"]["process_name"] == "vllm" and procs["1"]["user"] == pwd.getpwuid(0).pw_name
    assert len(procs["1"]["container_id"]) == 64 and procs["1"]["pid"] == str(fake.workload.pid_of(1))
    assert procs["0"]["process_name"] == "python" and len(procs["0"]["container_id"]) == 64
    try:
        expected_user = pwd.getpwuid(1000).pw_name
    except KeyError:
        expected_user = "1000"
    assert procs["0"]["user"] == expected_user
    [status] = [s for s in c.snapshot() if s.index == 1]
    assert status.processes[0].container_id == procs["1"]["container_id"]
    c.close()


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        (f"12:memory:/docker/{CID}\n11:cpu:/docker/{CID}\n", CID),
        (f"0::/system.slice/docker-{CID}.scope\n", CID),
        (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b_3c4d.slice/cri-containerd-{CID}.scope\n", CID),
        (f"0::/kubepods/besteffort/pod0f1e2d3c-0000-1111-2222-333344445555/{CID}\n", CID),
        (f"0::/system.slice/containerd.service/kubepods-pod1.slice:cri-containerd:{CID}\n", CID),
        (f"0::/kubepods.slice/crio-{CID}.scope\n", CID),
        (f"0::/machine.slice/libpod-{CID}.scope/container\n", CID),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", ""),
        ("", ""),
    ],
)  # fmt: skip
def test_parse_container_id(cgroup: str, expected: str) -> None:
    assert parse_container_id(cgroup) == expected


def test_proc_parsing_tolerates_vanished_and_partial_pids(tmp_path: Path) -> None:
    assert parse_uid("Name:\tx\nUid:\t1001\t1001\t1001\t1001\n") == 1001
    assert parse_uid("Name:\tx\n") is None
    info = read_process_info(tmp_path, 424242)
    assert (info.name, info.user, info.container_id) == ("", "", "")
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "comm").write_text("torchrun\n")
    (tmp_path / "7" / "status").write_text("Uid:\t4294967294\t0\t0\t0\n")
    info = read_process_info(tmp_path, 7)
    assert (info.name, info.user, info.container_id) == ("torchrun", "4294967294", "")


def test_process_name_falls_back_to_nvml(collector: GpuCollector, clock: FakeClock) -> None:
    names = {s.processes[0].name for s in collector.snapshot() if s.processes}
    assert names == {"python", "vllm"}  # nothing under proc_root: NVML named them


def test_snapshot(collector: GpuCollector, fake: FakeNvml) -> None:
    fake.lose_gpu(7)
    statuses = collector.snapshot()
    assert [s.index for s in statuses] == list(range(8))
    assert statuses[7].is_lost and statuses[7].figures == {} and statuses[7].processes == []
    s0 = statuses[0]
    assert not s0.is_lost and s0.name == "NVIDIA H100 80GB HBM3" and s0.uuid.startswith("GPU-")
    assert s0.figures["DCGM_FI_DEV_FB_TOTAL"] == 81559 and "DCGM_FI_DEV_FAN_SPEED" not in s0.figures
    assert set(s0.figures) <= NAMES
    assert s0.processes[0].used_memory_bytes > 0
    assert statuses[3].processes == []  # warming up: no process yet


def test_no_driver_is_one_clear_line() -> None:
    c = GpuCollector(FakeNvml.no_driver(), hostname="h")
    with pytest.raises(NvmlUnavailable) as err:
        c.open()
    assert str(err.value) == (
        "no NVIDIA GPU found (NVML: driver library not found); "
        "run `gpuwatch serve --demo` to try gpuwatch with simulated GPUs"
    )
    with pytest.raises(NvmlUnavailable, match=r"^no NVIDIA GPU found \(NVML reports 0 GPUs\); run"):
        GpuCollector(FakeNvml(gpu_count=0), hostname="h").open()


def test_close_shuts_nvml_down(fake: FakeNvml, clock: FakeClock) -> None:
    c = GpuCollector(fake, hostname="h")
    with pytest.raises(RuntimeError):
        c.collect(clock.now_ms())
    c.open()
    c.close()
    c.close()  # twice is fine
    assert fake.calls["nvmlShutdown"] == 1
    assert c.wait_events(10_000) == []  # returns at once after close
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_sixty_four_gpus(clock: FakeClock) -> None:
    fake = FakeNvml(gpu_count=64, clock=clock)
    c = GpuCollector(fake, hostname="big")
    c.open()
    tick(c, clock)
    batch = tick(c, clock)
    assert len(values(batch, "DCGM_FI_DEV_GPU_UTIL")) == 64
    assert len({dict(s.labels)["pci_bus_id"] for s in batch.samples}) == 64
    c.close()


GPM_RATIOS = (
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
)


def test_gpm_activity_from_the_second_tick(collector: GpuCollector, clock: FakeClock) -> None:
    first = tick(collector, clock)
    assert not [s for s in first.samples if s.name.startswith("DCGM_FI_PROF_SM")]  # needs two samples
    batch = tick(collector, clock)
    for name in GPM_RATIOS:
        got = values(batch, name)
        assert sorted(got) == [str(i) for i in range(8)], name
        assert all(0.0 <= v <= 1.0 for v in got.values()), name
    util, sm = values(batch, "DCGM_FI_DEV_GPU_UTIL"), values(batch, "DCGM_FI_PROF_SM_ACTIVE")
    assert 0.6 < sm["0"] < util["0"] / 100  # a training GPU: busy SMs, a bit under "a kernel ran"
    assert values(batch, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")["0"] > 0.3
    assert values(batch, "DCGM_FI_PROF_NVLINK_TX_BYTES")["0"] > 1e9  # B/s of all-reduce traffic


def test_gpm_absent_before_hopper_and_where_unsupported(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuwatch")
    fake = FakeNvml(gpu_count=2, model="NVIDIA A100-SXM4-80GB", clock=clock)
    c = GpuCollector(fake, hostname="h", logger=logging.getLogger("gpuwatch.test"))
    c.open()
    for _ in range(3):
        batch = tick(c, clock)
    assert not [s for s in batch.samples if s.name.startswith("DCGM_FI_PROF_") and "PCIE" not in s.name]
    assert sum("GPM" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO) == 1
    assert fake.calls.get("nvmlGpmSampleGet", 0) == 0
    c.close()
    h100 = FakeNvml(gpu_count=2, clock=clock)
    h100.set_unsupported(1, "nvmlGpmSampleGet")
    c = GpuCollector(h100, hostname="h")
    c.open()
    for _ in range(3):
        batch = tick(c, clock)
    assert sorted(values(batch, "DCGM_FI_PROF_SM_ACTIVE")) == ["0"]
    assert h100.calls["nvmlGpmSampleGet"] == 3 + 1  # GPU 0 every tick, GPU 1 once
    c.close()


def test_stalled_training_busy_by_utilization_idle_by_sm_activity(clock: FakeClock) -> None:
    schedule = IncidentSchedule(clock.now(), 8)
    (stall,) = [i for i in schedule.hour(0) if i.kind == "training_stall"]
    fake = FakeNvml(clock=clock, incidents=schedule, blocking_event_wait=False)
    c = GpuCollector(fake, hostname="h")
    c.open()
    clock.advance(stall.start_s + 60)
    tick(c, clock)
    batch = tick(c, clock)
    assert values(batch, "DCGM_FI_DEV_GPU_UTIL")["0"] == 100
    assert values(batch, "DCGM_FI_PROF_SM_ACTIVE")["0"] < 0.05
    assert values(batch, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")["0"] == 0.0
    c.close()


def test_mig_instances_memory_and_gpm_with_dcgm_labels(clock: FakeClock) -> None:
    fake = FakeNvml(gpu_count=2, clock=clock, mig={1: ("3g.40gb", "2g.20gb", "1g.10gb")})
    c = GpuCollector(fake, hostname="h")
    c.open()
    tick(c, clock)
    batch = tick(c, clock)
    assert sorted(values(batch, "DCGM_FI_DEV_GPU_UTIL")) == ["0"]  # NVML gives none under MIG: absent
    whole = [s for s in batch.samples if dict(s.labels)["gpu"] == "1" and "GPU_I_ID" not in dict(s.labels)]
    assert "DCGM_FI_DEV_FB_TOTAL" in {s.name for s in whole}
    assert not [s for s in whole if s.name.startswith("DCGM_FI_PROF_") and "PCIE" not in s.name]
    inst: dict[tuple[str, str], dict[str, float]] = {}
    for s in batch.samples:
        labels = dict(s.labels)
        if "GPU_I_ID" in labels:
            assert labels["gpu"] == "1" and labels["UUID"] == c.gpus[1].uuid and labels["Hostname"] == "h"
            inst.setdefault((labels["GPU_I_ID"], labels["GPU_I_PROFILE"]), {})[s.name] = s.value
    assert sorted(inst) == [("1", "3g.40gb"), ("2", "2g.20gb"), ("3", "1g.10gb")]
    totals = [inst[k]["DCGM_FI_DEV_FB_TOTAL"] for k in sorted(inst)]
    assert totals[0] > totals[1] > totals[2] > 9000 and sum(totals) < 81559
    for figures in inst.values():
        assert (
            figures["DCGM_FI_DEV_FB_USED"] + figures["DCGM_FI_DEV_FB_FREE"] == figures["DCGM_FI_DEV_FB_TOTAL"]
        )
        assert 0 < figures["DCGM_FI_PROF_SM_ACTIVE"] <= 1 and "DCGM_FI_PROF_NVLINK_TX_BYTES" not in figures
    c.close()
    assert len(fake.gpm_samples) == 2 * (1 + 3) and all(b.is_freed for b in fake.gpm_samples)
