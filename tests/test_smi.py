"""format_smi: a pure function from GpuStatus data to an nvidia-smi-like table."""

from __future__ import annotations

from gpuwatch.cli.smi import LOST_TEXT, format_smi
from gpuwatch.collect.gpu_status import GpuProcess, GpuStatus

CID = "0123456789ab" + "c" * 52

BUSY = GpuStatus(
    index=0,
    uuid="GPU-0000",
    name="NVIDIA H100 80GB HBM3",
    pci_bus_id="00000000:18:00.0",
    is_lost=False,
    figures={
        "DCGM_FI_DEV_GPU_UTIL": 97.0,
        "DCGM_FI_DEV_FB_USED": 70123.0,
        "DCGM_FI_DEV_FB_TOTAL": 81559.0,
        "DCGM_FI_DEV_GPU_TEMP": 71.0,
        "DCGM_FI_DEV_POWER_USAGE": 652.418,
        "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": 700.0,
        "DCGM_FI_DEV_PSTATE": 0.0,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": float(0x4 | 0x40),
    },
    processes=[
        GpuProcess(31337, "python", "alice", CID, 70000 * 2**20),
        GpuProcess(31338, "", "", "", None),
    ],
)
SPARSE = GpuStatus(
    1, "GPU-0001", "NVIDIA A100-SXM4-80GB", "00000000:2A:00.0", False, {"DCGM_FI_DEV_GPU_UTIL": 0.0}
)
LOST = GpuStatus(2, "GPU-0002", "NVIDIA H100 80GB HBM3", "00000000:3A:00.0", True)


def test_gpu_table() -> None:
    text = format_smi([BUSY, SPARSE, LOST], driver_version="570.133.20")
    lines = text.splitlines()
    assert lines[0] == "gpuwatch smi    driver 570.133.20"
    header = lines[2]
    for column in ("GPU", "Name", "Util", "Memory used / total", "Temp", "Power / limit", "Perf", "Throttle"):
        assert column in header
    busy = lines[3]
    for cell in ("NVIDIA H100 80GB HBM3", "97 %", "70123 / 81559 MiB", "71 C", "652 / 700 W", "P0"):
        assert cell in busy
    assert busy.endswith("sw_power_cap,hw_thermal_slowdown")
    sparse = lines[4]
    assert "0 %" in sparse and "- / - MiB" in sparse and "- / - W" in sparse
    assert lines[5].split() == ["2", "NVIDIA", "H100", "80GB", "HBM3", "lost", "(fell", "off", "the", "bus)"]
    assert LOST_TEXT in lines[5]
    # columns line up: every GPU row starts its name where the header does
    assert busy.index("NVIDIA") == header.index("Name") == sparse.index("NVIDIA")


def test_process_table() -> None:
    text = format_smi([BUSY, SPARSE])
    lines = text.splitlines()
    start = lines.index("Processes")
    assert lines[start + 1].split() == ["GPU", "PID", "User", "Container", "Process", "Memory"]
    assert lines[start + 2].split() == ["0", "31337", "alice", "0123456789ab", "python", "70000", "MiB"]
    assert lines[start + 3].split() == ["0", "31338", "-", "-", "-", "-"]
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_no_processes_no_driver_version_no_colour() -> None:
    text = format_smi([SPARSE, LOST])
    assert text.splitlines()[0] == "gpuwatch smi"
    assert "No running compute processes." in text
    assert "\x1b" not in text


def test_no_gpus() -> None:
    assert format_smi([]).splitlines()[2].startswith("GPU")
