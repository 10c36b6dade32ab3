"""A GPU in MIG mode: its GPU instances, their compute instances, memory, GPM and processes.

Under MIG, NVML's whole-GPU utilization and process list are not given (the parent's process list
needs privileges most gpuwatch installs lack), so each GPU instance is read through its MIG device
handles: one handle per compute instance, `nvmlDeviceGetMigDeviceHandleByIndex`. Compute instances of
one GPU instance share its memory, so figures are per GPU instance, labelled `GPU_I_ID` and
`GPU_I_PROFILE` as dcgm-exporter does; processes are read from every compute instance's handle. The
layout is read again every `reprobe_interval_s`: instances are created and destroyed while a GPU runs.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

from gpuwatch.collect.gpm import GpmSampler, Query
from gpuwatch.core.model import Labels, make_labels

MIB = 1 << 20
MIG_LABELS: tuple[str, ...] = ("GPU_I_ID", "GPU_I_PROFILE")
# The GPU instance's profile at the end of a MIG device's name: "... MIG 3g.40gb", or "... MIG
# 1c.3g.40gb" for one compute instance of it (the GPU instance is still 3g.40gb).
_PROFILE = re.compile(r"(\d+g\.\d+gb(?:\+\w+)?)\s*$")


class MigDevice(NamedTuple):
    """One compute instance's MIG device handle."""

    ci_id: int
    handle: Any


class MigInstance:
    """One GPU instance of a GPU in MIG mode, with the MIG devices of its compute instances."""

    def __init__(self, gi_id: int, profile: str, devices: list[MigDevice], labels: Labels) -> None:
        self.gi_id = gi_id
        self.profile = profile
        self.devices = devices
        self.labels = labels
        self.gpm = GpmSampler(gi_id)

    @property
    def layout(self) -> tuple[int, str, tuple[int, ...]]:
        return (self.gi_id, self.profile, tuple(d.ci_id for d in self.devices))


def add_memory(f: dict[str, float], mem: Any) -> None:
    """NVML's memory struct (v2 has `reserved`, which v1 counts as used) as dcgm-exporter's MiB figures."""
    if mem is None:
        return
    f["DCGM_FI_DEV_FB_USED"] = mem.used // MIB
    f["DCGM_FI_DEV_FB_FREE"] = mem.free // MIB
    f["DCGM_FI_DEV_FB_TOTAL"] = mem.total // MIB
    if hasattr(mem, "reserved"):
        f["DCGM_FI_DEV_FB_RESERVED"] = mem.reserved // MIB


def mig_profile(name: str) -> str:
    """The GPU instance profile ("3g.40gb") at the end of a MIG device's name."""
    found = _PROFILE.search(name)
    return found.group(1) if found else ""


def find_instances(
    nvml: Any, query: Query, handle: Any, label_map: dict[str, str], warn: Callable[[str], None]
) -> list[MigInstance] | None:
    """The GPU instances of a GPU in MIG mode, by GPU instance id; None when MIG is off or unsupported."""
    mode = query("mig_mode", nvml.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return None
    count = query("mig_count", nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    found: dict[int, tuple[str, list[MigDevice]]] = {}
    for slot in range(int(count)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except nvml.NVMLError_NotFound:  # an empty slot
            continue
        except nvml.NVMLError as exc:
            warn(f"MIG device {slot}: {type(exc).__name__}: {exc}")
            continue
        gi_id = query("mig_gi_id", nvml.nvmlDeviceGetGpuInstanceId, mig, sticky=False)
        if gi_id is None:
            continue
        ci_id = query("mig_ci_id", nvml.nvmlDeviceGetComputeInstanceId, mig, sticky=False)
        name = query("mig_name", nvml.nvmlDeviceGetName, mig, sticky=False)
        _, devices = found.setdefault(int(gi_id), (mig_profile(str(name or "")), []))
        devices.append(MigDevice(int(ci_id if ci_id is not None else 0), mig))
    return [
        MigInstance(
            gi_id,
            profile,
            sorted(devices, key=lambda d: d.ci_id),
            make_labels({**label_map, "GPU_I_ID": str(gi_id), "GPU_I_PROFILE": profile}),
        )
        for gi_id, (profile, devices) in sorted(found.items())
    ]


def read_instance(
    nvml: Any,
    query: Query,
    memory: Callable[[Any], Any],
    parent: Any,
    inst: MigInstance,
    gpm: bool,
    now_ms: int,
) -> dict[str, float]:
    """Memory (MiB; through `memory(handle)`, as the whole GPU's) and, where GPM answers, GPM figures."""
    f: dict[str, float] = {}
    add_memory(f, memory(inst.devices[0].handle))
    if gpm:
        inst.gpm.read(nvml, query, parent, f, now_ms)
    return f
