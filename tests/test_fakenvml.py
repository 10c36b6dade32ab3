"""The simulated NVML: same call surface as pynvml, a workload that moves with the clock, faults on demand."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pynvml
import pytest

from gpuwatch.core.clock import FakeClock
from gpuwatch.demo.incidents import THROTTLE, XID, IncidentSchedule
from gpuwatch.demo.nvml import MODELS, FakeNvml

COLLECTOR_SOURCES = [
    Path(__file__).resolve().parent.parent / "gpuwatch" / "collect" / name
    for name in ("nvml.py", "nvml_device.py", "nvml_events.py", "gpm.py", "mig.py")
]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def nvml(clock: FakeClock) -> FakeNvml:
    fake = FakeNvml(clock=clock)
    fake.nvmlInit()
    return fake


def _collector_names() -> set[str]:
    names: set[str] = set()
    for path in COLLECTOR_SOURCES:
        names |= set(re.findall(r"\bnvml\.((?:nvml|NVML|c_nvml)\w+)", path.read_text()))
    return names


def test_every_name_the_collector_uses_exists_in_pynvml_and_the_fake() -> None:
    names = _collector_names()
    assert {"nvmlInit", "nvmlDeviceGetFieldValues", "nvmlEventSetWait_v2", "NVMLError_GpuIsLost"} <= names
    fake = FakeNvml()
    missing_real = sorted(n for n in names if not hasattr(pynvml, n))
    missing_fake = sorted(n for n in names if not hasattr(fake, n))
    assert missing_real == [] and missing_fake == []


def test_fake_functions_take_pynvml_arguments() -> None:
    """Same parameter names, order and defaults as pynvml, for every nvml* method of the fake."""
    for name, method in inspect.getmembers(FakeNvml, inspect.isfunction):
        if not name.startswith("nvml"):
            continue
        real = inspect.signature(getattr(pynvml, name))
        params = list(inspect.signature(method).parameters.values())[1:]  # drop self
        assert [(p.name, p.kind, p.default) for p in params] == [
            (p.name, p.kind, p.default) for p in real.parameters.values()
        ], name


def test_constants_and_exceptions_are_pynvmls(nvml: FakeNvml) -> None:
    assert nvml.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert nvml.NVMLLibraryMismatchError is pynvml.NVMLLibraryMismatchError
    assert nvml.NVML_FI_DEV_MEMORY_TEMP == 82
    assert nvml.nvmlEventTypeXidCriticalError == 0x8
    with pytest.raises(AttributeError, match="does not simulate"):
        _ = nvml.nvmlDeviceGetBAR1MemoryInfo


def test_calls_before_init_raise_uninitialized(clock: FakeClock) -> None:
    fake = FakeNvml(clock=clock)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    assert fake.nvmlDeviceGetCount() == 8
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetHandleByIndex(0)


def test_no_driver_raises_library_not_found() -> None:
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml.no_driver().nvmlInit()


def test_return_shapes(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    assert re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", nvml.nvmlDeviceGetUUID(h))
    assert nvml.nvmlDeviceGetPciInfo(h).busId == "00000000:18:00.0"
    assert nvml.nvmlDeviceGetIndex(h) == 0
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.total == 81559 * 2**20 and mem.used + mem.free == mem.total
    v2 = nvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert v2.reserved + v2.used + v2.free == v2.total and v2.used == mem.used - v2.reserved
    util = nvml.nvmlDeviceGetUtilizationRates(h)
    assert isinstance(util.gpu, int) and 0 <= util.gpu <= 100 and 0 <= util.memory <= 100
    assert isinstance(nvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU), int)
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert nvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    assert nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 2619
    values = nvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]
    )
    assert [v.nvmlReturn for v in values] == [pynvml.NVML_SUCCESS, pynvml.NVML_SUCCESS]
    assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT and values[0].value.uiVal > 20
    assert values[1].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG and values[1].value.ullVal > 0
    assert values[1].timestamp == 1_700_000_000 * 10**6
    [bogus] = nvml.nvmlDeviceGetFieldValues(h, [9999])
    assert bogus.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    [proc] = nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert proc.pid > 0 and proc.usedGpuMemory > 60 * 2**30
    assert nvml.nvmlSystemGetProcessName(proc.pid) == "python"
    assert nvml.nvmlSystemGetDriverVersion() == "570.133.20"


def test_models() -> None:
    assert set(MODELS) >= {"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA H200"}
    for model, total_mib, limit_mw in (
        ("NVIDIA A100-SXM4-80GB", 81920, 400_000),
        ("NVIDIA H200", 143771, 700_000),
    ):
        fake = FakeNvml(gpu_count=2, model=model)
        fake.nvmlInit()
        h = fake.nvmlDeviceGetHandleByIndex(1)
        assert fake.nvmlDeviceGetName(h) == model
        assert fake.nvmlDeviceGetMemoryInfo(h).total == total_mib * 2**20
        assert fake.nvmlDeviceGetEnforcedPowerLimit(h) == limit_mw
    with pytest.raises(ValueError, match="unknown GPU model"):
        FakeNvml(model="NVIDIA GeForce 256")
    with pytest.raises(ValueError, match="unknown workload"):
        FakeNvml(workload="crypto")


def test_fan_unsupported_on_datacenter_boards_only(nvml: FakeNvml) -> None:
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetFanSpeed(nvml.nvmlDeviceGetHandleByIndex(0))
    consumer = FakeNvml(gpu_count=1, model="NVIDIA GeForce RTX 4090")
    consumer.nvmlInit()
    h = consumer.nvmlDeviceGetHandleByIndex(0)
    assert 0 <= consumer.nvmlDeviceGetFanSpeed(h) <= 100
    [ecc] = consumer.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL])
    assert ecc.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def _series(nvml: FakeNvml, clock: FakeClock, i: int, seconds: int, read: str) -> list[float]:
    h = nvml.nvmlDeviceGetHandleByIndex(i)
    out = []
    for _ in range(seconds):
        out.append(
            float(getattr(nvml, read)(h) if read != "util" else nvml.nvmlDeviceGetUtilizationRates(h).gpu)
        )
        clock.advance(1)
    return out


def test_mixed_workload_roles(nvml: FakeNvml, clock: FakeClock) -> None:
    assert nvml.workload.roles == [
        "training",
        "inference",
        "notebook",
        "warmup",
        "training",
        "training",
        "inference",
        "training",
    ]
    clock.advance(400)  # past the warm-up
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    total = 81559 * 2**20
    # notebook: light interactive load (never under GPUUtilizationLow's 10 %), a quarter of the memory
    notebook = _series(nvml, clock, 2, 300, "util")
    assert min(notebook) >= 15 and max(notebook) <= 60
    assert 0.2 <= nvml.nvmlDeviceGetMemoryInfo(handles[2]).used / total <= 0.32
    assert nvml.nvmlDeviceGetPerformanceState(handles[2]) == 0
    # training: busy, 62-87 % memory (under GPUMemoryHigh's 90 %), warm, high power
    train = handles[0]
    utils = _series(nvml, clock, 0, 60, "util")
    assert min(utils) >= 85 and max(utils) <= 100
    for h in handles:
        assert nvml.nvmlDeviceGetMemoryInfo(h).used / total < 0.9
    assert 0.62 <= nvml.nvmlDeviceGetMemoryInfo(train).used / total <= 0.87
    assert nvml.nvmlDeviceGetPowerUsage(train) > 500_000
    assert 55 < nvml.nvmlDeviceGetTemperatureV(train, pynvml.NVML_TEMPERATURE_GPU) < 80
    # inference: bursty over a steady floor
    bursts = _series(nvml, clock, 1, 240, "util")
    assert 25 <= min(bursts) < 40 and max(bursts) > 60
    assert (
        nvml.nvmlSystemGetProcessName(nvml.nvmlDeviceGetComputeRunningProcesses(handles[1])[0].pid) == "vllm"
    )


def test_inference_gpus_report_the_serving_pid_given(clock: FakeClock, tmp_path: Path) -> None:
    fake = FakeNvml(clock=clock, serving_pid=4242)
    fake.nvmlInit()
    clock.advance(60)
    pids = {
        i: [p.pid for p in fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetHandleByIndex(i))]
        for i in range(8)
    }
    serving = [i for i, role in enumerate(fake.workload.roles) if role == "inference"]
    assert serving == [1, 6] and pids[1] == pids[6] == [4242]
    assert all(4242 not in p for i, p in pids.items() if i not in serving)
    assert fake.nvmlSystemGetProcessName(4242) == "vllm"
    fake.write_proc_root(tmp_path)
    assert (tmp_path / "4242" / "comm").read_text() == "vllm\n"


def test_idle_workload(clock: FakeClock) -> None:
    fake = FakeNvml(gpu_count=1, workload="idle", clock=clock)
    fake.nvmlInit()
    idle = fake.nvmlDeviceGetHandleByIndex(0)
    clock.advance(60)
    assert fake.nvmlDeviceGetUtilizationRates(idle).gpu == 0
    assert fake.nvmlDeviceGetPerformanceState(idle) == 8
    assert 0.01 <= fake.nvmlDeviceGetMemoryInfo(idle).used / (81559 * 2**20) <= 0.02
    assert fake.nvmlDeviceGetPowerUsage(idle) < 100_000
    assert fake.nvmlDeviceGetComputeRunningProcesses(idle) == []


def test_training_dips_every_half_hour(nvml: FakeNvml, clock: FakeClock) -> None:
    clock.advance(1500)
    utils = _series(nvml, clock, 0, 600, "util")
    assert min(utils) < 50 and sorted(utils)[30] >= 85


def test_warmup_ramps_over_the_first_minutes(nvml: FakeNvml, clock: FakeClock) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(3)
    start = (
        nvml.nvmlDeviceGetUtilizationRates(h).gpu,
        nvml.nvmlDeviceGetMemoryInfo(h).used,
        nvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
    )
    assert start[0] == 0 and nvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    clock.advance(150)
    mid = nvml.nvmlDeviceGetUtilizationRates(h).gpu
    clock.advance(450)
    end = (
        nvml.nvmlDeviceGetUtilizationRates(h).gpu,
        nvml.nvmlDeviceGetMemoryInfo(h).used,
        nvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
    )
    assert 0 < mid < end[0] and end[0] >= 85
    assert end[1] > 0.7 * 81559 * 2**20 > start[1]
    assert end[2] > start[2] + 20


def test_figures_depend_only_on_seed_and_time(clock: FakeClock) -> None:
    a, b, c = FakeNvml(clock=clock), FakeNvml(clock=clock), FakeNvml(clock=clock, seed=7)
    for fake in (a, b, c):
        fake.nvmlInit()

    def figures(fake: FakeNvml) -> list[int]:
        return [fake.nvmlDeviceGetPowerUsage(fake.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]

    clock.advance(123.0)
    first = figures(a)
    assert first == figures(b) != figures(c)
    clock.advance(1.0)
    assert figures(a) != first


def test_uuids_stable_per_hostname_and_distinct_between_hosts(clock: FakeClock) -> None:
    def uuids(hostname: str = "") -> list[str]:
        fake = FakeNvml(clock=clock, hostname=hostname)
        fake.nvmlInit()
        return [fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]

    a, b = uuids(hostname="node-a"), uuids(hostname="node-b")
    assert a == uuids(hostname="node-a") and len(set(a)) == 8
    assert not set(a) & set(b) and not set(a) & set(uuids())
    assert all(
        re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", u) for u in a
    )


def test_counters_rise_with_power(nvml: FakeNvml, clock: FakeClock) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    fields = [pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES]
    energy, tx = (v.value.ullVal for v in nvml.nvmlDeviceGetFieldValues(h, fields))
    clock.advance(100)
    energy2, tx2 = (v.value.ullVal for v in nvml.nvmlDeviceGetFieldValues(h, fields))
    assert 400 < (energy2 - energy) / 1000 / 100 < 700  # mean W of a training GPU
    assert tx2 > tx
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(h) == energy2
    clock.advance(30 * 86400)  # a month later, cheaply
    energy3 = nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    assert 400 < (energy3 - energy2) / 1000 / (30 * 86400) < 700


def test_lose_and_recover_gpu(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(2)
    nvml.lose_gpu(2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetUtilizationRates(h)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(1)).gpu >= 0
    nvml.recover_gpu(2)
    assert nvml.nvmlDeviceGetHandleByIndex(2) is h


def test_set_unsupported_call_and_field(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.set_unsupported(1, "nvmlDeviceGetPowerUsage")
    nvml.set_unsupported(1, pynvml.NVML_FI_DEV_MEMORY_TEMP)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerUsage(h)
    [temp] = nvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert temp.nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0)) > 0  # other GPUs unaffected


def test_ecc_errors(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(4)
    nvml.add_ecc_errors(4, 3, double_bit=False)
    nvml.add_ecc_errors(4, 2)
    ids = [
        pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        pynvml.NVML_FI_DEV_REMAPPED_UNC,
    ]
    sbe, dbe, unc = nvml.nvmlDeviceGetFieldValues(h, ids)
    assert (sbe.value.ullVal, dbe.value.ullVal, unc.value.uiVal) == (3, 2, 2)
    assert (
        nvml.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        )
        == 2
    )
    assert nvml.nvmlDeviceGetRemappedRows(h) == (0, 2, 1, 0)


def test_throttle(nvml: FakeNvml, clock: FakeClock) -> None:
    clock.advance(30)
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    sm = nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    nvml.throttle(0, pynvml.nvmlClocksEventReasonHwThermalSlowdown)
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) < 0.6 * sm
    assert nvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU) >= 89
    nvml.throttle(0, 0)
    assert nvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == sm


def test_xid_events(nvml: FakeNvml) -> None:
    es = nvml.nvmlEventSetCreate()
    nvml.inject_xid(5, 13)  # nobody registered yet: lost, as in NVML
    h = nvml.nvmlDeviceGetHandleByIndex(5)
    nvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(es, 0)
    nvml.inject_xid(5, 79)
    data = nvml.nvmlEventSetWait_v2(es, 0)
    assert (data.device, data.eventType, data.eventData) == (h, pynvml.nvmlEventTypeXidCriticalError, 79)
    nvml.nvmlEventSetFree(es)


def test_event_wait_returns_at_once_when_not_blocking(clock: FakeClock) -> None:
    fake = FakeNvml(clock=clock, blocking_event_wait=False)
    fake.nvmlInit()
    es = fake.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(es, 60_000)  # would hang the test for a minute if it blocked


def test_process_list_error(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.set_process_list_error(0, pynvml.NVMLLibraryMismatchError("no _v3"))
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        nvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert len(nvml.nvmlDeviceGetComputeRunningProcesses_v2(h)) == 1


def test_write_proc_root(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.write_proc_root(tmp_path)
    pid = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(1))[0].pid
    assert (tmp_path / str(pid) / "comm").read_text() == "vllm\n"
    assert "docker-" in (tmp_path / str(pid) / "cgroup").read_text()


def test_gpm_and_mig_calls(clock: FakeClock) -> None:
    fake = FakeNvml(gpu_count=2, clock=clock, mig={1: ("4g.40gb", "1g.10gb")})
    fake.nvmlInit()
    h0, h1 = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(1)
    assert fake.nvmlGpmQueryDeviceSupport(h0).isSupportedDevice == 1
    assert fake.nvmlDeviceGetMigMode(h0) == [0, 0]
    assert fake.nvmlDeviceGetMigMode(h1) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    assert fake.nvmlDeviceGetMaxMigDeviceCount(h1) == 7
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(h1, 1)
    assert fake.nvmlDeviceGetGpuInstanceId(mig) == 2
    assert fake.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(h1, 2)  # an empty slot
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(h0, 0)  # MIG is off
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetUtilizationRates(h1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlGpmSampleGet(h1, fake.nvmlGpmSampleAlloc())  # per GPU instance under MIG
    a, b, c = fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc(), fake.nvmlGpmSampleAlloc()
    fake.nvmlGpmSampleGet(h0, a)
    clock.advance(1)
    fake.nvmlGpmSampleGet(h0, b)
    fake.nvmlGpmMigSampleGet(h1, 2, c)
    mg = fake.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics, mg.sample1, mg.sample2 = pynvml.NVML_GPM_METRICS_GET_VERSION, 2, a, b
    mg.metrics[0].metricId, mg.metrics[1].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL, 98  # 98: unknown
    fake.nvmlGpmMetricsGet(mg)
    assert mg.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS and 0 < mg.metrics[0].value <= 100
    assert mg.metrics[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    mg.sample2 = c  # samples of different devices
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlGpmMetricsGet(mg)
    a100 = FakeNvml(gpu_count=1, model="NVIDIA A100-SXM4-80GB", clock=clock)
    a100.nvmlInit()
    assert a100.nvmlGpmQueryDeviceSupport(a100.nvmlDeviceGetHandleByIndex(0)).isSupportedDevice == 0
    with pytest.raises(ValueError, match="MIG"):
        FakeNvml(gpu_count=1, model="NVIDIA GeForce RTX 4090", mig={0: ("1g.10gb",)})


def test_scheduled_incidents_on_the_gpus(clock: FakeClock) -> None:
    schedule = IncidentSchedule(clock.now(), 8)
    fake = FakeNvml(clock=clock, incidents=schedule, blocking_event_wait=False)
    fake.nvmlInit()
    es = fake.nvmlEventSetCreate()
    for i in range(8):
        fake.nvmlDeviceRegisterEvents(
            fake.nvmlDeviceGetHandleByIndex(i), pynvml.nvmlEventTypeXidCriticalError, es
        )
    hot, xid = [i for i in schedule.hour(0) if i.kind in (THROTTLE, XID)]
    h = fake.nvmlDeviceGetHandleByIndex(hot.gpu)

    def at(t: float) -> tuple[int, int]:
        clock.advance(t - (clock.now() - schedule.start))
        return (
            fake.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
            fake.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonHwThermalSlowdown,
        )

    before, rising, hottest, after = (
        at(hot.start_s - 10),
        at(hot.start_s + 30),
        at(hot.start_s + 120),
        at(hot.end_s + 150),
    )
    assert before[0] < 80 and before[1] == 0
    assert before[0] < rising[0] < hottest[0] and rising[1] == 0  # heating, not yet slowed down
    assert hottest[0] >= 89 and hottest[1] != 0
    assert after[0] < 80 and after[1] == 0
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait_v2(es, 0)  # no XID before its time
    clock.advance(xid.start_s + 1 - (clock.now() - schedule.start))
    event = fake.nvmlEventSetWait_v2(es, 0)
    assert (event.device.index, event.eventData) == (xid.gpu, 79)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):  # XID 79: fallen off the bus for a while
        fake.nvmlDeviceGetHandleByIndex(xid.gpu)
    clock.advance(xid.end_s - xid.start_s)
    assert fake.nvmlDeviceGetUUID(fake.nvmlDeviceGetHandleByIndex(xid.gpu)).startswith("GPU-")
