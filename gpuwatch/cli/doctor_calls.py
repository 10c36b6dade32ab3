"""The NVML calls gpuwatch makes, each tried once per GPU for `gpuwatch doctor`, with its outcome.

The table names every per-GPU call of `gpuwatch/collect/` (a test keeps it complete), so a bug report
shows which of them a driver refuses and how.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

# (name shown, pynvml function it needs, call(nvml, handle))
_Probe = tuple[str, str, Callable[[Any, Any], Any]]

PER_GPU_CALLS: tuple[_Probe, ...] = (
    ("nvmlDeviceGetUUID", "nvmlDeviceGetUUID", lambda n, h: n.nvmlDeviceGetUUID(h)),
    ("nvmlDeviceGetName", "nvmlDeviceGetName", lambda n, h: n.nvmlDeviceGetName(h)),
    ("nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo", lambda n, h: n.nvmlDeviceGetPciInfo(h).busId),
    ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetUtilizationRates", lambda n, h: n.nvmlDeviceGetUtilizationRates(h).gpu),
    ("nvmlDeviceGetMemoryInfo_v2", "nvmlMemory_v2", lambda n, h: n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2).used),
    ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo", lambda n, h: n.nvmlDeviceGetMemoryInfo(h).used),
    ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperatureV", lambda n, h: n.nvmlDeviceGetTemperatureV(h, n.NVML_TEMPERATURE_GPU)),
    ("nvmlDeviceGetTemperature", "nvmlDeviceGetTemperature", lambda n, h: n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
    ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetPowerUsage", lambda n, h: n.nvmlDeviceGetPowerUsage(h)),
    ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetEnforcedPowerLimit", lambda n, h: n.nvmlDeviceGetEnforcedPowerLimit(h)),
    ("nvmlDeviceGetClockInfo(SM)", "nvmlDeviceGetClockInfo", lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM)),
    ("nvmlDeviceGetClockInfo(MEM)", "nvmlDeviceGetClockInfo", lambda n, h: n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM)),
    ("nvmlDeviceGetFanSpeed", "nvmlDeviceGetFanSpeed", lambda n, h: n.nvmlDeviceGetFanSpeed(h)),
    ("nvmlDeviceGetPerformanceState", "nvmlDeviceGetPerformanceState", lambda n, h: n.nvmlDeviceGetPerformanceState(h)),
    ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksEventReasons", lambda n, h: n.nvmlDeviceGetCurrentClocksEventReasons(h)),
    ("nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetCurrentClocksThrottleReasons", lambda n, h: n.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
    ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetComputeRunningProcesses", lambda n, h: len(n.nvmlDeviceGetComputeRunningProcesses(h))),
    ("nvmlDeviceGetPcieThroughput", "nvmlDeviceGetPcieThroughput", lambda n, h: n.nvmlDeviceGetPcieThroughput(h, n.NVML_PCIE_UTIL_TX_BYTES)),
    ("nvmlDeviceGetMigMode", "nvmlDeviceGetMigMode", lambda n, h: n.nvmlDeviceGetMigMode(h)[0]),
    ("nvmlGpmQueryDeviceSupport", "nvmlGpmQueryDeviceSupport", lambda n, h: n.nvmlGpmQueryDeviceSupport(h).isSupportedDevice),
    ("nvmlDeviceGetSupportedEventTypes", "nvmlDeviceGetSupportedEventTypes", lambda n, h: n.nvmlDeviceGetSupportedEventTypes(h)),
)  # fmt: skip


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report: `status` is ok, skip (not supported here), warn or fail."""

    status: str
    name: str
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    """One call on one GPU: `kind` is ok, unsupported, missing (not in this binding), no_permission, lost, error."""

    gpu: int
    kind: str
    detail: str  # the value (ok) or the error's name and text


def classify(nvml: Any, exc: BaseException) -> tuple[str, str]:
    """The outcome kind of an NVML exception, and its words."""
    name = type(exc).__name__
    text = f"{name}: {exc}"
    if isinstance(exc, nvml.NVMLError_NotSupported):
        return "unsupported", text
    if isinstance(exc, nvml.NVMLError_NoPermission):
        return "no_permission", text
    if isinstance(exc, nvml.NVMLError_GpuIsLost):
        return "lost", text
    if isinstance(exc, nvml.NVMLError_FunctionNotFound) or name == "NVMLLibraryMismatchError":
        return "missing", text
    return "error", text


def try_call(nvml: Any, gpu: int, call: Callable[[], Any]) -> Outcome:
    mismatch = getattr(nvml, "NVMLLibraryMismatchError", nvml.NVMLError)
    try:
        return Outcome(gpu, "ok", str(call()))
    except (nvml.NVMLError, mismatch) as exc:
        kind, text = classify(nvml, exc)
        return Outcome(gpu, kind, text)


def audit_calls(
    nvml: Any, handles: Sequence[tuple[int, Any]], fields: dict[int, str]
) -> dict[str, list[Outcome]]:
    """Each per-GPU call once on each GPU handle, and each field id gpuwatch reads (`fields`: id ->
    metric name, the collector's table); keyed by the call's name."""
    out: dict[str, list[Outcome]] = {}
    for name, needs, fn in PER_GPU_CALLS:
        if not hasattr(nvml, needs):
            out[name] = [Outcome(i, "missing", "not in this nvidia-ml-py") for i, _ in handles]
            continue
        out[name] = [try_call(nvml, i, partial(fn, nvml, h)) for i, h in handles]
    for field_id, what in fields.items():
        key = f"field {field_id} {what}"
        out[key] = []
        for i, h in handles:
            got = try_call(nvml, i, partial(nvml.nvmlDeviceGetFieldValues, h, [field_id]))
            if got.kind == "ok":
                got = _field_outcome(nvml, i, h, field_id)
            out[key].append(got)
    return out


def _field_outcome(nvml: Any, gpu: int, handle: Any, field_id: int) -> Outcome:
    fv = nvml.nvmlDeviceGetFieldValues(handle, [field_id])[0]
    ret = int(fv.nvmlReturn)
    if ret == 0:
        attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(
            int(fv.valueType)
        )
        return Outcome(gpu, "ok", str(getattr(fv.value, attr)) if attr else f"value type {fv.valueType}")
    try:
        raise nvml.NVMLError(ret)
    except nvml.NVMLError as exc:
        kind, text = classify(nvml, exc)
    return Outcome(gpu, kind, text)


def summarize(outcomes: Sequence[Outcome]) -> tuple[str, str]:
    """One line's status and words for a call's outcomes on every GPU."""
    kinds = {o.kind for o in outcomes}
    n = len(outcomes)

    def gpus(kind: str) -> str:
        return ",".join(str(o.gpu) for o in outcomes if o.kind == kind)

    if kinds == {"ok"}:
        return "ok", f"ok on {n}/{n} GPU(s)" + (f" ({outcomes[0].detail})" if n == 1 else "")
    if kinds <= {"unsupported", "missing"}:
        first = next(o for o in outcomes)
        return (
            "skip",
            f"{'not supported' if first.kind == 'unsupported' else 'not in this driver or binding'} on {n}/{n}",
        )
    parts = []
    for kind in ("ok", "unsupported", "missing", "no_permission", "error", "lost"):
        if kind in kinds:
            detail = next(o.detail for o in outcomes if o.kind == kind)
            parts.append(
                f"{kind.replace('_', ' ')} on GPU {gpus(kind)}" + ("" if kind == "ok" else f" ({detail})")
            )
    status = "fail" if "lost" in kinds else "warn" if kinds & {"no_permission", "error"} else "ok"
    return status, "; ".join(parts)
