"""The real NVML path (opt-in: `pytest -m gpu`); skipped where no NVIDIA driver and GPU answer."""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from gpuwatch.cli.doctor_calls import audit_calls
from gpuwatch.cli.smi import format_smi
from gpuwatch.collect.gpu_metrics import GPU_METRICS
from gpuwatch.collect.nvml import GpuCollector, load_nvml

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nvml():  # type: ignore[no-untyped-def]
    pynvml = load_nvml()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip(f"no NVIDIA driver: {exc}")
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            pytest.skip("NVML reports no GPU")
    finally:
        pynvml.nvmlShutdown()
    return pynvml


def test_real_gpus(nvml, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    collector = GpuCollector(nvml, hostname="test-host")
    gpus = collector.open()
    try:
        assert gpus and all(g.uuid.startswith(("GPU-", "MIG-")) for g in gpus)
        now_ms = int(time.time() * 1000)
        collector.collect(now_ms)
        started = time.perf_counter()
        batch = collector.collect(now_ms + 1000)
        took_ms = (time.perf_counter() - started) * 1000
        names = {m.name for m in GPU_METRICS}
        assert {s.name for s in batch.samples} <= names
        for metric in (
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_TOTAL",
            "DCGM_FI_DEV_POWER_USAGE",
            "gpuwatch_gpu_lost",
        ):
            got = {dict(s.labels)["gpu"] for s in batch.samples if s.name == metric}
            assert got == {str(g.index) for g in gpus}, metric
        util = {dict(s.labels)["gpu"]: s.value for s in batch.samples if s.name == "DCGM_FI_DEV_GPU_UTIL"}
        assert all(0 <= v <= 100 for v in util.values())  # absent on MIG-enabled GPUs
        assert all(s.value == 0.0 for s in batch.samples if s.name == "gpuwatch_gpu_lost")
        collector.wait_events(0)  # registering for XID events and polling must not raise
        statuses = collector.snapshot()
        assert [s.index for s in statuses] == [g.index for g in gpus]
        text = format_smi(statuses, driver_version=collector.driver_version)
        assert all(g.name in text for g in gpus)
        with capsys.disabled():
            print(f"\n{text}collect() for {len(gpus)} GPU(s): {took_ms:.2f} ms, {len(batch.samples)} samples")
    finally:
        collector.close()


def _gpm_supported(nvml, handle) -> bool:  # type: ignore[no-untyped-def]
    try:
        return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except nvml.NVMLError:
        return False


def _mig_on(nvml, handle) -> bool:  # type: ignore[no-untyped-def]
    try:
        return bool(nvml.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE)
    except nvml.NVMLError:
        return False


def test_real_gpm_and_mig(nvml) -> None:  # type: ignore[no-untyped-def]
    """GPM figures where the device has GPM (Hopper+), GPU instances where MIG is on; absent elsewhere."""
    collector = GpuCollector(nvml, hostname="test-host")
    gpus = collector.open()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(g.index) for g in gpus]
        gpm = {str(g.index) for g, h in zip(gpus, handles, strict=True) if _gpm_supported(nvml, h)}
        mig = {str(g.index) for g, h in zip(gpus, handles, strict=True) if _mig_on(nvml, h)}
        if not gpm and not mig:
            pytest.skip("no GPU here has GPM (Hopper and later) or MIG on")
        now_ms = int(time.time() * 1000)
        collector.collect(now_ms)
        time.sleep(1.0)  # GPM compares two samples; give the second one a real interval
        batch = collector.collect(now_ms + 1000)
        whole = [s for s in batch.samples if "GPU_I_ID" not in dict(s.labels)]
        active = {dict(s.labels)["gpu"]: s.value for s in whole if s.name == "DCGM_FI_PROF_SM_ACTIVE"}
        assert set(active) == gpm - mig  # whole-GPU GPM where supported and MIG is off, absent elsewhere
        for name in ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE"):  # fmt: skip
            assert all(0.0 <= s.value <= 1.0 for s in batch.samples if s.name == name), name
        util = {dict(s.labels)["gpu"] for s in whole if s.name == "DCGM_FI_DEV_GPU_UTIL"}
        assert not util & mig  # NVML gives no utilization under MIG: absent, not zero
        instances = [dict(s.labels) for s in batch.samples if s.name == "DCGM_FI_DEV_FB_TOTAL" and "GPU_I_ID" in dict(s.labels)]  # fmt: skip
        assert {i["gpu"] for i in instances} == mig
        assert all(i["GPU_I_PROFILE"] and i["GPU_I_ID"].isdigit() for i in instances)
    finally:
        collector.close()


# -- values and units under a real load (needs torch with CUDA in the same Python) ------------------

_LOAD = r"""
import os, sys, time, torch
kind, seconds = sys.argv[1], float(sys.argv[2])
dev = torch.device("cuda:0")
if kind == "matmul":
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    (a @ b).sum().item()
    print("ready", os.getpid(), flush=True)
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            c = a @ b
        torch.cuda.synchronize()
elif kind == "hold":
    x = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    x.fill_(1)
    torch.cuda.synchronize()
    print("ready", os.getpid(), flush=True)
    time.sleep(seconds)
elif kind == "copy":
    host = torch.empty(4 << 30, dtype=torch.uint8).pin_memory()
    gpu = torch.empty(4 << 30, dtype=torch.uint8, device=dev)
    print("ready", os.getpid(), flush=True)
    moved, start, t0, t1 = 0, time.time(), torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    while time.time() < start + seconds:
        gpu.copy_(host, non_blocking=True)
        host.copy_(gpu, non_blocking=True)
        torch.cuda.synchronize()
        moved += 4 << 30
    t1.record()
    torch.cuda.synchronize()
    print("rate", moved / (t0.elapsed_time(t1) / 1000.0), flush=True)
"""


def _torch_cuda() -> bool:
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120).returncode == 0


def _start(kind: str, seconds: float) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOAD, kind, str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "ready", f"{kind} child did not start"
    return proc, int(line[1])


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _smi(*args: str) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=30, check=True).stdout


def _gpu0(batch, name: str):  # type: ignore[no-untyped-def]
    return next(
        (s.value for s in batch.samples if s.name == name and dict(s.labels).get("gpu") == "0" and "GPU_I_ID" not in dict(s.labels)),
        None,
    )  # fmt: skip


@pytest.fixture(scope="module")
def torch_cuda(nvml):  # type: ignore[no-untyped-def]
    if not _torch_cuda():
        pytest.skip("no torch with CUDA in this Python")
    return nvml


def test_real_identity_and_idle_figures(nvml, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """Identity as nvidia-smi prints it; memory adds up; power and clocks in their units."""
    collector = GpuCollector(nvml, hostname="test-host")
    gpus = collector.open()
    try:
        g = gpus[0]
        assert re.fullmatch(r"GPU-[0-9a-f-]{36}", g.uuid), g.uuid
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", g.pci_bus_id), g.pci_bus_id
        batch = collector.collect(int(time.time() * 1000))
        used, free = _gpu0(batch, "DCGM_FI_DEV_FB_USED"), _gpu0(batch, "DCGM_FI_DEV_FB_FREE")
        total, reserved = _gpu0(batch, "DCGM_FI_DEV_FB_TOTAL"), _gpu0(batch, "DCGM_FI_DEV_FB_RESERVED") or 0.0
        assert abs(used + free + reserved - total) <= 2
        power, limit = (
            _gpu0(batch, "DCGM_FI_DEV_POWER_USAGE"),
            _gpu0(batch, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
        )
        assert 10 <= power <= 1500 and 50 <= limit <= 1500  # watts, not milliwatts
        assert _gpu0(batch, "DCGM_FI_DEV_SM_CLOCK") > 0 and 0 <= _gpu0(batch, "DCGM_FI_DEV_PSTATE") <= 15
        assert 10 <= _gpu0(batch, "DCGM_FI_DEV_GPU_TEMP") <= 100
        smi = _smi(
            "--query-gpu=pci.bus_id,driver_version,memory.used,power.draw", "--format=csv,noheader,nounits"
        )
        if smi is not None:
            bus, driver, smi_used, smi_power = (c.strip() for c in smi.splitlines()[0].split(","))
            assert bus == g.pci_bus_id and driver == collector.driver_version
            assert abs(float(smi_used) - used) <= 64 and abs(float(smi_power) - power) <= 20
        with capsys.disabled():
            print(
                f"\nidle GPU 0: used {used} + free {free} + reserved {reserved} = total {total} MiB, {power} W"
            )
    finally:
        collector.close()


def test_real_calls_answer_without_errors(nvml) -> None:  # type: ignore[no-untyped-def]
    """Each NVML call gpuwatch makes answers, or says unsupported: no Unknown, no lost GPU."""
    collector = GpuCollector(nvml, hostname="test-host")
    collector.open()
    try:
        audit = audit_calls(nvml, collector.handles(), collector.field_table)
        bad = {name: o.detail for name, outs in audit.items() for o in outs if o.kind in ("error", "lost")}
        assert bad == {}
    finally:
        collector.close()


def test_real_figures_under_load(torch_cuda, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """A bf16 matmul and a 2 GiB holder: utilization, GPM, energy against power, the process table."""
    nvml = torch_cuda
    collector = GpuCollector(nvml, hostname="test-host")
    collector.open()
    matmul, matmul_pid = _start("matmul", 14)
    holder, holder_pid = _start("hold", 14)
    try:
        ticks = []
        for _ in range(7):
            now = time.time()
            ticks.append((now, collector.collect(int(now * 1000))))
            time.sleep(1.0)
        batch = ticks[-1][1]
        assert _gpu0(batch, "DCGM_FI_DEV_GPU_UTIL") >= 90
        sm, tensor = _gpu0(batch, "DCGM_FI_PROF_SM_ACTIVE"), _gpu0(batch, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
        dram = _gpu0(batch, "DCGM_FI_PROF_DRAM_ACTIVE")
        if sm is not None:  # GPM answers here
            assert 0.5 < sm <= 1.0 and 0.2 < tensor <= 1.0 and 0.0 < dram <= 1.0
        ratios = [s.value for _, b in ticks for s in b.samples if s.name.startswith("DCGM_FI_PROF_") and s.name.endswith("_ACTIVE")]  # fmt: skip
        assert all(0.0 <= r <= 1.0 for r in ratios)
        (t0, b0), (t1, b1) = ticks[1], ticks[-1]
        e0, e1 = (
            _gpu0(b0, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
            _gpu0(b1, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
        )
        powers = [_gpu0(b, "DCGM_FI_DEV_POWER_USAGE") for _, b in ticks[1:]]
        from_counter = (e1 - e0) / 1000.0 / (t1 - t0)
        assert abs(from_counter - sum(powers) / len(powers)) <= 0.3 * max(powers)
        throttled = [
            s for s in batch.samples if s.name == "gpuwatch_clock_throttled" and dict(s.labels)["gpu"] == "0"
        ]
        assert len(throttled) == 5 and {s.value for s in throttled} <= {0.0, 1.0}
        procs = {
            int(dict(s.labels)["pid"]): s.value
            for s in batch.samples
            if s.name == "gpuwatch_process_gpu_memory_bytes" and dict(s.labels)["gpu"] == "0"
        }
        assert all(0 < pid < 1 << 22 for pid in procs)
        assert {matmul_pid, holder_pid} <= set(procs), (
            f"NVML pids {sorted(procs)}, ours {matmul_pid}, {holder_pid}"
        )
        assert 2 << 30 <= procs[holder_pid] < _gpu0(batch, "DCGM_FI_DEV_FB_TOTAL") * (1 << 20)
        smi = _smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        if smi is not None:
            listed = {int(p): float(m) for p, m in (line.split(",") for line in smi.strip().splitlines())}
            for pid in (matmul_pid, holder_pid):
                assert abs(procs[pid] / (1 << 20) - listed[pid]) <= 0.1 * listed[pid] + 8
        with capsys.disabled():
            print(f"\nunder load GPU 0: util {_gpu0(batch, 'DCGM_FI_DEV_GPU_UTIL')}, SM {sm}, tensor {tensor}, DRAM {dram}, "
                  f"energy {from_counter:.0f} W vs power {sum(powers) / len(powers):.0f} W, processes {procs}")  # fmt: skip
    finally:
        for proc in (matmul, holder):
            _stop(proc)
        collector.close()


def test_real_pcie_rates_under_copy(torch_cuda, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """Pinned H2D/D2H copies: the B/s rates match torch's, the byte totals only go up."""
    nvml = torch_cuda
    collector = GpuCollector(nvml, hostname="test-host")
    collector.open()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    copier, _ = _start("copy", 7)
    try:
        types = [fv.valueType for fv in nvml.nvmlDeviceGetFieldValues(handle, [197, 198])]
        ticks = []
        for _ in range(5):
            now = time.time()
            ticks.append(collector.collect(int(now * 1000)))
            time.sleep(1.0)
        assert copier.stdout is not None
        measured = float(copier.stdout.read().split()[-1])  # bytes each way per second
        rates = [
            (_gpu0(b, "DCGM_FI_PROF_PCIE_TX_BYTES"), _gpu0(b, "DCGM_FI_PROF_PCIE_RX_BYTES")) for b in ticks
        ]
        totals = [
            (_gpu0(b, "gpuwatch_pcie_tx_bytes_total"), _gpu0(b, "gpuwatch_pcie_rx_bytes_total"))
            for b in ticks
        ]
        with capsys.disabled():
            print(
                f"\nPCIe: field value types {types}, rates {rates[1:]}, totals {totals[-1]}, torch {measured:.3g} B/s"
            )
        assert all(b[0] >= a[0] and b[1] >= a[1] for a, b in itertools.pairwise(totals))
        tx, rx = rates[-2]
        assert tx is not None and rx is not None
        assert 0.5 * measured <= rx <= 1.5 * measured and 0.5 * measured <= tx <= 1.5 * measured
    finally:
        _stop(copier)
        collector.close()


def test_real_reprobe_while_waiting_for_events(nvml) -> None:  # type: ignore[no-untyped-def]
    """A lost GPU re-probed while another thread waits on the event set: no error, events still on."""
    collector = GpuCollector(nvml, hostname="test-host", reprobe_interval_s=0.0)
    collector.open()
    errors: list[BaseException] = []
    done = threading.Event()

    def waiter() -> None:
        try:
            while not done.is_set():
                collector.wait_events(500)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=waiter)
    thread.start()
    try:
        assert collector.events_state.startswith("registered")
        now = int(time.time() * 1000)
        collector.collect(now)
        collector._dev.mark_lost(collector._gpus[0], "test")  # as a GpuIsLost would
        batch = collector.collect(now + 1000)  # re-probes: the GPU answers again
        assert _gpu0(batch, "gpuwatch_gpu_lost") == 0.0
        time.sleep(1.2)  # the waiter registers it again between two waits
        assert errors == [] and collector.events_state.startswith("registered")
    finally:
        done.set()
        started = time.monotonic()
        collector.close()
        thread.join(5)
        closed = time.monotonic() - started
    assert not thread.is_alive() and closed < 3
