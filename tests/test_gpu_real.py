"""The real NVML path (opt-in: `pytest -m gpu`); skipped where no NVIDIA driver and GPU answer."""

from __future__ import annotations

import time

import pytest

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
