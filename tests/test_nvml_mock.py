"""The NVML mock (tests/nvmlmock) behind the real nvidia-ml-py: identities, gpuwatch's collector, the
535.43-535.86 process-struct layout, MIG, XID events. Each test runs a short Python subprocess that loads
the mock as libnvidia-ml.so.1, once per binding ("installed", and "floor" where configured)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.nvmlmock import run
from tests.nvmlmock.fixtures import binding, binding_dirs, mock_lib

__all__ = ["binding_dirs", "mock_lib"]  # fixtures, used by name

BINDINGS = pytest.mark.parametrize("which", ["installed", "floor"])
H200_BUSES = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]

PRELUDE = """
import ctypes, json, sys, threading, time
from pathlib import Path
import pynvml
from tests.nvmlmock.control import MockDriver

def s(v):
    return v.decode() if isinstance(v, bytes) else v

def addr(h):
    return ctypes.cast(h, ctypes.c_void_p).value

pynvml.nvmlInit()
mock = MockDriver()
out = {"binding": pynvml.__file__}
"""


def run_mock(
    script: str, libs: dict[str, Path], scenario: str, folder: Path | None, variant: str = "current"
) -> Any:
    return run(PRELUDE + script, lib_dir=libs[variant], scenario=scenario, binding_dir=folder, timeout=30)


def by_gpu(samples: list[list[Any]], name: str) -> dict[str, float]:
    return {labels["gpu"]: value for n, labels, value in samples if n == name and len(labels) == 5}


HEALTHY = """
devices = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    pci = pynvml.nvmlDeviceGetPciInfo(h)
    devices.append([s(pynvml.nvmlDeviceGetName(h)), s(pynvml.nvmlDeviceGetUUID(h)), s(pci.busId),
                    s(pci.busIdLegacy), pynvml.nvmlDeviceGetIndex(h)])
out["devices"] = devices
out["driver"] = s(pynvml.nvmlSystemGetDriverVersion())
out["cuda"] = pynvml.nvmlSystemGetCudaDriverVersion()
out["nvml"] = s(pynvml.nvmlSystemGetNVMLVersion())
h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
out["cc"] = list(pynvml.nvmlDeviceGetCudaComputeCapability(h0))
try:
    pynvml.nvmlDeviceGetFanSpeed(h0)
except pynvml.NVMLError_NotSupported:
    out["fan"] = "NotSupported"
pynvml.nvmlShutdown()

from gpuwatch.collect.nvml import GpuCollector
try:
    c = GpuCollector(pynvml, hostname="h", proc_root=Path("/nonexistent"))
except AttributeError as exc:
    out["collector_error"] = f"AttributeError: {exc}"
    print(json.dumps(out)); sys.exit(0)
c.open()
first = c.collect(1000)
time.sleep(0.05)
second = c.collect(2000)
c.close()
out["first"] = [[x.name, dict(x.labels), x.value] for x in first.samples]
out["second"] = [[x.name, dict(x.labels), x.value] for x in second.samples]
out["gpm_in_use"] = mock.gpm_samples_in_use()
print(json.dumps(out))
"""


@BINDINGS
def test_healthy_eight_h200_through_pynvml_and_the_collector(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    out = run_mock(HEALTHY, mock_lib, "healthy", binding(binding_dirs, which))
    devices = out["devices"]
    assert [d[0] for d in devices] == ["NVIDIA H200"] * 8
    assert [d[4] for d in devices] == list(range(8))
    uuids = [d[1] for d in devices]
    assert len(set(uuids)) == 8
    for uuid in uuids:
        assert uuid.startswith("GPU-") and [len(p) for p in uuid[4:].split("-")] == [8, 4, 4, 4, 12]
    assert [d[2] for d in devices] == [f"00000000:{b}:00.0" for b in H200_BUSES]
    assert [d[3] for d in devices] == [f"0000:{b}:00.0" for b in H200_BUSES]
    assert (out["driver"], out["cuda"], out["nvml"]) == ("570.133.20", 12080, "12.570.133.20")
    assert out["cc"] == [9, 0]
    assert out["fan"] == "NotSupported"

    assert "collector_error" not in out  # every name newer than the floor binding has a fallback
    second = out["second"]
    assert by_gpu(second, "DCGM_FI_DEV_FB_TOTAL") == {str(i): 143771.0 for i in range(8)}
    assert by_gpu(second, "DCGM_FI_DEV_FB_RESERVED") == {str(i): 570.0 for i in range(8)}
    power = by_gpu(second, "DCGM_FI_DEV_POWER_USAGE")
    assert sorted(power) == [str(i) for i in range(8)]
    assert all(120.0 <= w <= 700.0 for w in power.values())
    assert by_gpu(second, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT") == {str(i): 700.0 for i in range(8)}
    assert by_gpu(second, "gpuwatch_gpu_lost") == {str(i): 0.0 for i in range(8)}
    assert by_gpu(second, "DCGM_FI_DEV_MEMORY_TEMP")["0"] == 40.0
    energy0, energy1 = (by_gpu(b, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") for b in (out["first"], second))
    assert all(energy1[g] > energy0[g] for g in energy0)  # mJ, rising at the power drawn
    assert sorted(by_gpu(second, "DCGM_FI_PROF_PCIE_RX_BYTES")) == [str(i) for i in range(8)]
    assert "DCGM_FI_DEV_FAN_SPEED" not in {n for n, _, _ in second}
    procs = {
        (labels["gpu"], labels["pid"], labels["process_name"]): value
        for n, labels, value in second
        if n == "gpuwatch_process_gpu_memory_bytes"
    }
    assert procs == {
        ("0", "4242", "python3"): 20480 * 2.0**20,
        ("0", "4343", "python3"): 8192 * 2.0**20,
        ("3", "4545", "python3"): 30720 * 2.0**20,
    }
    sm_active = by_gpu(second, "DCGM_FI_PROF_SM_ACTIVE")  # GPM, from the second tick on
    assert sm_active == {str(i): pytest.approx((60 + i) / 100) for i in range(8)}
    assert out["gpm_in_use"] == 0  # close() freed every GPM sample


PROCESSES = """
from ctypes import Structure, byref, c_uint, c_ulonglong

class ProcessInfo(Structure):  # nvmlProcessInfo_v2_t / _v3_t of current drivers: 24 bytes
    _fields_ = [("pid", c_uint), ("usedGpuMemory", c_ulonglong), ("gpuInstanceId", c_uint),
                ("computeInstanceId", c_uint)]

class ProcessInfoCc(Structure):  # drivers 535.43-535.86: _v3 wrote a fifth field, 32 bytes
    _fields_ = [*ProcessInfo._fields_, ("usedGpuCcProtectedMemory", c_ulonglong)]

h = pynvml.nvmlDeviceGetHandleByIndex(0)
fn = mock.lib.nvmlDeviceGetComputeRunningProcesses_v3
count = c_uint(0)
out["first_call"] = [fn(h, byref(count), None), count.value]
raw = ((ProcessInfoCc if LAYOUT == "cc" else ProcessInfo) * count.value)()
out["second_call"] = fn(h, byref(count), raw)
out["raw"] = [[p.pid, p.usedGpuMemory] for p in raw]
struct = getattr(pynvml, "c_nvmlProcessInfo_v3_t", None) or pynvml.c_nvmlProcessInfo_t
out["binding_struct_size"] = ctypes.sizeof(struct)
out["binding"] = [[p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
out["driver"] = s(pynvml.nvmlSystemGetDriverVersion())
out["exports"] = {n: hasattr(mock.lib, n) for n in
                  ("nvmlDeviceGetConfComputeMemSizeInfo", "nvmlDeviceGetRunningProcessDetailList")}
print(json.dumps(out))
"""

GIB = 1 << 30
R535_PROCS = [[100, GIB], [200, 2 * GIB], [300, 3 * GIB]]


@BINDINGS
def test_r535_54_writes_the_five_field_process_struct(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    script = 'LAYOUT = "cc"\n' + PROCESSES
    out = run_mock(script, mock_lib, "r535_54", binding(binding_dirs, which), variant="r535_54")
    assert out["first_call"] == [7, 3]  # NVML_ERROR_INSUFFICIENT_SIZE, and the count
    assert out["second_call"] == 0
    assert out["raw"] == R535_PROCS
    assert out["driver"] == "535.54.03"
    assert out["exports"] == {
        "nvmlDeviceGetConfComputeMemSizeInfo": True,
        "nvmlDeviceGetRunningProcessDetailList": False,
    }
    if out["binding_struct_size"] == 32:  # nvidia-ml-py 12.535.77 declares the same five fields
        assert out["binding"] == R535_PROCS
    else:  # the 24-byte struct of later bindings reads the 32-byte records out of step
        assert out["binding_struct_size"] == 24
        assert [pid for pid, _ in out["binding"]] != [100, 200, 300]


@BINDINGS
def test_current_driver_writes_the_four_field_process_struct(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    script = 'LAYOUT = "v2"\n' + PROCESSES
    out = run_mock(script, mock_lib, "r535_54", binding(binding_dirs, which))
    assert out["first_call"] == [7, 3]
    assert out["raw"] == R535_PROCS
    assert out["driver"] == "570.133.20"
    assert out["exports"] == {
        "nvmlDeviceGetConfComputeMemSizeInfo": True,
        "nvmlDeviceGetRunningProcessDetailList": True,
    }
    if out["binding_struct_size"] == 24:
        assert out["binding"] == R535_PROCS
    else:  # 12.535.77's 32-byte struct against a driver that writes 24-byte records
        assert out["binding_struct_size"] == 32
        assert [pid for pid, _ in out["binding"]] != [100, 200, 300]


MIG = """
parent = pynvml.nvmlDeviceGetHandleByIndex(0)
out["name"] = s(pynvml.nvmlDeviceGetName(parent))
out["mode"] = list(pynvml.nvmlDeviceGetMigMode(parent))
out["max"] = pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)
for call in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetUtilizationRates"):
    try:
        getattr(pynvml, call)(parent)
    except pynvml.NVMLError as exc:
        out[call] = type(exc).__name__
slots = []
for i in range(out["max"]):
    try:
        mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
    except pynvml.NVMLError_NotFound:
        slots.append(None)
        continue
    v1 = pynvml.nvmlDeviceGetMemoryInfo(mig)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(mig, version=pynvml.nvmlMemory_v2)
    slots.append({
        "name": s(pynvml.nvmlDeviceGetName(mig)),
        "uuid": s(pynvml.nvmlDeviceGetUUID(mig)),
        "gi": pynvml.nvmlDeviceGetGpuInstanceId(mig),
        "ci": pynvml.nvmlDeviceGetComputeInstanceId(mig),
        "is_mig": pynvml.nvmlDeviceIsMigDeviceHandle(mig).value,
        "parent": addr(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == addr(parent),
        "procs": [[p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId]
                  for p in pynvml.nvmlDeviceGetComputeRunningProcesses(mig)],
        "mem": [v1.total, v1.used, v1.free, v2.total, v2.reserved, v2.used, v2.free],
    })
out["slots"] = slots
mock.mig_destroy(0, 1, 1)
mock.mig_create(0, 3, "1g.10gb", 0)
after = []
for i in range(out["max"]):
    try:
        after.append(s(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i))))
    except pynvml.NVMLError_NotFound:
        after.append(None)
out["after"] = after
print(json.dumps(out))
"""


@BINDINGS
def test_mig_devices_and_their_processes(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    out = run_mock(MIG, mock_lib, "mig", binding(binding_dirs, which))
    a100 = "NVIDIA A100-SXM4-80GB"
    assert out["name"] == a100
    assert out["mode"] == [1, 1]
    assert out["max"] == 7
    assert out["nvmlDeviceGetComputeRunningProcesses"] == "NVMLError_NoPermission"
    assert out["nvmlDeviceGetUtilizationRates"] == "NVMLError_NotSupported"
    slots = out["slots"]
    assert slots[3:] == [None] * 4
    assert [(m["name"], m["gi"], m["ci"]) for m in slots[:3]] == [
        (f"{a100} MIG 1c.3g.40gb", 1, 0),
        (f"{a100} MIG 1c.3g.40gb", 1, 1),
        (f"{a100} MIG 3g.40gb", 2, 0),
    ]
    assert all(m["is_mig"] == 1 and m["parent"] and m["uuid"].startswith("MIG-") for m in slots[:3])
    assert len({m["uuid"] for m in slots[:3]}) == 3
    assert [m["procs"] for m in slots[:3]] == [
        [[5001, 5000 << 20, 1, 0]],
        [[5002, None, 1, 1]],  # usedGpuMemory NOT_AVAILABLE: the binding gives None
        [[5003, 7000 << 20, 2, 0]],
    ]
    for m in slots[:3]:
        v1_total, v1_used, v1_free, v2_total, v2_reserved, v2_used, v2_free = m["mem"]
        assert v1_total == v2_total
        assert v1_used == v2_used + v2_reserved and v2_reserved > 0
        assert v1_free == v2_free == v2_total - v2_reserved - v2_used
    assert out["after"] == [
        f"{a100} MIG 1c.3g.40gb",
        f"{a100} MIG 1g.10gb",
        f"{a100} MIG 3g.40gb",
        None,
        None,
        None,
        None,
    ]


EVENTS = """
h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
xid = pynvml.nvmlEventTypeXidCriticalError
out["supported"] = pynvml.nvmlDeviceGetSupportedEventTypes(h0) & xid
es = pynvml.nvmlEventSetCreate()
pynvml.nvmlDeviceRegisterEvents(h0, xid, es)

def wait(ms, on=None):
    try:
        d = pynvml.nvmlEventSetWait_v2(on or es, ms)
    except pynvml.NVMLError_Timeout:
        return "timeout"
    except pynvml.NVMLError as exc:
        return type(exc).__name__
    return [addr(d.device) == addr(h0), addr(d.device) == addr(h1), d.eventType, d.eventData]

mock.inject_xid(0, 31)
mock.inject_xid(0, 79)
out["coalesced"] = [wait(100), wait(100), wait(10)]

# A wait on another thread, then RegisterEvents on the same set: NVML forbids it.
done = []
waiter = threading.Thread(target=lambda: done.append(wait(5000)))
before = mock.call_count("nvmlEventSetWait_v2")
waiter.start()
deadline = time.monotonic() + 5
while mock.call_count("nvmlEventSetWait_v2") == before and time.monotonic() < deadline:
    time.sleep(0.001)
out["violations_before"] = mock.violations()
pynvml.nvmlDeviceRegisterEvents(h1, xid, es)
out["violations_during"] = mock.violations()
mock.inject_xid(1, 43)
waiter.join(5)
out["woken_by"] = done
pynvml.nvmlDeviceRegisterEvents(h1, xid, es)  # nobody waits now: allowed
pynvml.nvmlEventSetFree(es)
out["violations_after"] = mock.violations()

# freeing a set another thread waits on: a violation too; the wait ends
es2 = pynvml.nvmlEventSetCreate()
freed = []
waiter = threading.Thread(target=lambda: freed.append(wait(5000, es2)))
before = mock.call_count("nvmlEventSetWait_v2")
waiter.start()
deadline = time.monotonic() + 5
while mock.call_count("nvmlEventSetWait_v2") == before and time.monotonic() < deadline:
    time.sleep(0.001)
pynvml.nvmlEventSetFree(es2)
waiter.join(5)
out["freed"] = [freed, mock.violations()]
out["wait_calls"] = [mock.call_count("nvmlEventSetWait_v2"), mock.call_count("nvmlEventSetWait")]
print(json.dumps(out))
"""


@BINDINGS
def test_xid_events_coalesce_and_concurrent_registration_is_counted(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    out = run_mock(EVENTS, mock_lib, "lost", binding(binding_dirs, which))
    assert out["supported"] == 8
    # both queued XID events report the last XID injected, as NVML does
    assert out["coalesced"] == [[True, False, 8, 79], [True, False, 8, 79], "timeout"]
    assert out["violations_before"] == 0
    assert out["violations_during"] == 1
    assert out["woken_by"] == [[False, True, 8, 43]]
    assert out["violations_after"] == 1
    assert out["freed"] == [["NVMLError_Uninitialized"], 2]
    assert out["wait_calls"] == [5, 5]


CONTROLS = """
def err(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except pynvml.NVMLError as exc:
        return type(exc).__name__
    return "ok"

h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
out["bogus_handle"] = err(pynvml.nvmlDeviceGetName, pynvml.c_nvmlDevice_t())
mock.set_util(0, 91, 17)
mock.set_power(0, 345678)
mock.set_memory(0, 100 << 30, 1 << 30, 9 << 30)
mock.set_pcie_counters(0, 10**6, 2 * 10**6)
mem = pynvml.nvmlDeviceGetMemoryInfo(h0, version=pynvml.nvmlMemory_v2)
util = pynvml.nvmlDeviceGetUtilizationRates(h0)
fv = pynvml.nvmlDeviceGetFieldValues(h0, [197, 198, 83, 9999])
out["set"] = [util.gpu, util.memory, pynvml.nvmlDeviceGetPowerUsage(h0), mem.total, mem.reserved, mem.used,
              mem.free, fv[0].valueType, fv[0].value.ullVal, fv[1].value.ullVal, fv[3].nvmlReturn]
mock.clear_processes(0)
mock.add_process(0, 7, None)
out["procs"] = [[p.pid, p.usedGpuMemory] for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h0)]
out["process_name"] = [s(pynvml.nvmlSystemGetProcessName(7)), err(pynvml.nvmlSystemGetProcessName, 8)]
mock.set_error(0, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN)
mock.set_error(1, "nvmlDeviceGetTemperature", pynvml.NVML_ERROR_NOT_SUPPORTED)
out["set_error"] = [err(pynvml.nvmlDeviceGetPowerUsage, h0), err(pynvml.nvmlDeviceGetTemperature, h0, 0)]
mock.set_error(0, "nvmlDeviceGetPowerUsage", 0)
out["cleared"] = err(pynvml.nvmlDeviceGetPowerUsage, h0)
mock.fail_after("nvmlGpmSampleAlloc", 1, pynvml.NVML_ERROR_MEMORY)
first = pynvml.nvmlGpmSampleAlloc()
out["fail_after"] = [err(pynvml.nvmlGpmSampleAlloc), mock.gpm_samples_in_use()]
pynvml.nvmlGpmSampleFree(first)
mock.set_lost(0, True)
lost = pynvml.nvmlDeviceGetFieldValues(h0, [82])
out["lost"] = [err(pynvml.nvmlDeviceGetHandleByIndex, 0), err(pynvml.nvmlDeviceGetName, h0), lost[0].nvmlReturn]
out["counts"] = [mock.call_count("nvmlDeviceGetHandleByIndex_v2"), mock.call_count("nvmlDeviceGetHandleByIndex")]

mock.reset_scenario("consumer")
h = pynvml.nvmlDeviceGetHandleByIndex(0)
out["consumer"] = [pynvml.nvmlDeviceGetCount(), s(pynvml.nvmlDeviceGetName(h)), err(pynvml.nvmlDeviceGetFanSpeed, h),
                   err(pynvml.nvmlDeviceGetEnforcedPowerLimit, h), err(pynvml.nvmlDeviceGetMigMode, h),
                   pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice,
                   pynvml.nvmlDeviceGetFieldValues(h, [197])[0].nvmlReturn]
mock.reset_scenario("noperm")
out["noperm"] = [pynvml.nvmlDeviceGetCount(), err(pynvml.nvmlDeviceGetHandleByIndex, 1)]
mock.reset_scenario("gpm_off")
h = pynvml.nvmlDeviceGetHandleByIndex(0)
sample = pynvml.nvmlGpmSampleAlloc()
out["gpm_off"] = [pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice, err(pynvml.nvmlGpmSampleGet, h, sample)]
pynvml.nvmlGpmSampleFree(sample)
pynvml.nvmlShutdown()
out["after_shutdown"] = err(pynvml.nvmlDeviceGetCount)
print(json.dumps(out))
"""


@BINDINGS
def test_control_functions_and_small_scenarios(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    out = run_mock(CONTROLS, mock_lib, "lost", binding(binding_dirs, which))
    assert out["bogus_handle"] == "NVMLError_InvalidArgument"
    gib = 1 << 30
    # free = total - reserved - used; the PCIe counters rise from the values set (unsigned int, valueType 1,
    # as an H200 on driver 580 answers: they wrap every 4 GiB)
    util_gpu, util_mem, power, total, reserved, used, free, vtype, tx, rx, unknown_field = out["set"]
    assert [util_gpu, util_mem, power, total, reserved, used, free, vtype] == [
        91, 17, 345678, 100 * gib, gib, 9 * gib, 90 * gib, 1,
    ]  # fmt: skip
    assert 10**6 <= tx < 10**6 + 10**9 and 2 * 10**6 <= rx < 2 * 10**6 + 10**10
    assert unknown_field == 3  # NVML_ERROR_NOT_SUPPORTED for a field the mock does not know
    assert out["procs"] == [[7, None]]
    assert out["process_name"] == ["/usr/bin/python3", "NVMLError_NotFound"]
    assert out["set_error"] == ["NVMLError_Unknown", "ok"]  # the rule for GPU 1 leaves GPU 0 alone
    assert out["cleared"] == "ok"
    assert out["fail_after"] == ["NVMLError_Memory", 1]
    assert out["lost"] == ["NVMLError_GpuIsLost", "NVMLError_GpuIsLost", 15]
    assert out["counts"][0] >= 2 and out["counts"][0] == out["counts"][1]
    assert out["consumer"] == [
        1, "NVIDIA GeForce RTX 4090", "NVMLError_Unknown", "NVMLError_Unknown", "NVMLError_NotSupported", 0, 3,
    ]  # fmt: skip
    assert out["noperm"] == [2, "NVMLError_NoPermission"]
    assert out["gpm_off"] == [1, "NVMLError_NotSupported"]
    assert out["after_shutdown"] == "NVMLError_Uninitialized"


REREGISTER = """
from gpuwatch.collect.nvml import GpuCollector
c = GpuCollector(pynvml, hostname="h", proc_root=Path("/nonexistent"), reprobe_interval_s=0.001)
c.open()
stop = threading.Event()
events = []
def loop():
    while not stop.is_set():
        events.extend(c.wait_events(200))
waiter = threading.Thread(target=loop)
before = mock.call_count("nvmlEventSetWait_v2")
waiter.start()
deadline = time.monotonic() + 5
while mock.call_count("nvmlEventSetWait_v2") == before and time.monotonic() < deadline:
    time.sleep(0.001)
mock.set_lost(1, True)
c.collect(1000)
mock.set_lost(1, False)
c.collect(2000)  # re-probes GPU 1, which registers it for XID events again
mock.inject_xid(1, 79)
deadline = time.monotonic() + 5
while not events and time.monotonic() < deadline:
    time.sleep(0.005)
stop.set()
waiter.join(5)
c.close()
out["events"] = [[e.gpu_index, e.xid] for e in events]
out["violations"] = mock.violations()
print(json.dumps(out))
"""


def test_collector_never_registers_events_during_a_wait(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    out = run_mock(REREGISTER, mock_lib, "lost", binding(binding_dirs, "installed"))
    assert out["events"] == [[1, 79]]
    assert out["violations"] == 0
