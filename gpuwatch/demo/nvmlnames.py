"""The pynvml names the simulated NVML reads that some supported binding lacks, each with NVML's own value.

gpuwatch supports nvidia-ml-py from 12.535.77 (pyproject.toml). Names the binding gained later
(`nvmlTemperature_v1`: not yet in 12.560.30; the PCIe byte-counter field ids: not in 12.535.x) and
the clock-event-reason masks (the old `pynvml` 11.x package spells them `nvmlClocksThrottleReason*`) are
read here once, from the installed binding where it has them, else as the value NVML's ABI fixes
(nvml.h): the demo then imports and runs on every binding, and a real start never depends on it.
"""

from __future__ import annotations

import pynvml

# name -> the value in nvml.h (the same in every binding that has the name)
FALLBACKS: dict[str, int] = {
    "nvmlTemperature_v1": 0x100000C,
    "NVML_FI_DEV_POWER_AVERAGE": 185,
    "NVML_FI_DEV_POWER_INSTANT": 186,
    "NVML_FI_DEV_POWER_CURRENT_LIMIT": 190,
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 197,
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 198,
    "nvmlClocksEventReasonGpuIdle": 0x1,
    "nvmlClocksEventReasonSwPowerCap": 0x4,
    "nvmlClocksEventReasonHwSlowdown": 0x8,
    "nvmlClocksEventReasonSwThermalSlowdown": 0x20,
    "nvmlClocksEventReasonHwThermalSlowdown": 0x40,
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": 0x80,
}


def _value(name: str) -> int:
    return int(getattr(pynvml, name, FALLBACKS[name]))


TEMPERATURE_V1 = _value("nvmlTemperature_v1")
FI_POWER_AVERAGE = _value("NVML_FI_DEV_POWER_AVERAGE")
FI_POWER_INSTANT = _value("NVML_FI_DEV_POWER_INSTANT")
FI_POWER_CURRENT_LIMIT = _value("NVML_FI_DEV_POWER_CURRENT_LIMIT")
FI_PCIE_COUNT_TX_BYTES = _value("NVML_FI_DEV_PCIE_COUNT_TX_BYTES")
FI_PCIE_COUNT_RX_BYTES = _value("NVML_FI_DEV_PCIE_COUNT_RX_BYTES")
REASON_GPU_IDLE = _value("nvmlClocksEventReasonGpuIdle")
REASON_SW_POWER_CAP = _value("nvmlClocksEventReasonSwPowerCap")
REASON_HW_SLOWDOWN = _value("nvmlClocksEventReasonHwSlowdown")
REASON_SW_THERMAL_SLOWDOWN = _value("nvmlClocksEventReasonSwThermalSlowdown")
REASON_HW_THERMAL_SLOWDOWN = _value("nvmlClocksEventReasonHwThermalSlowdown")
REASON_HW_POWER_BRAKE_SLOWDOWN = _value("nvmlClocksEventReasonHwPowerBrakeSlowdown")
