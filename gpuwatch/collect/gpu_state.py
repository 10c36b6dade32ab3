"""What the GPU collector keeps per GPU between ticks."""

from __future__ import annotations

from typing import Any

from gpuwatch.collect.gpm import GpmSampler
from gpuwatch.collect.gpu_metrics import THROTTLE_REASONS
from gpuwatch.collect.gpu_status import GpuIdentity
from gpuwatch.collect.mig import MigInstance
from gpuwatch.core.model import Labels, make_labels


class GpuState:
    """One GPU's handle, health, call support and counters (mutable; guarded by the collector's lock)."""

    def __init__(self, index: int, hostname: str) -> None:
        self.index = index
        self.hostname = hostname
        self.handle: Any = None
        self.is_lost = False
        self.is_probing = False  # re-probing a lost GPU: do not announce the loss again
        # Why the GPU cannot be opened (NoPermission, InsufficientPower at its handle): it is not lost,
        # emits nothing, and is asked again every re-probe interval.
        self.unavailable: str | None = None
        self.next_probe_ms = 0
        self.skipped: set[str] = set()  # calls found unsupported; never asked again
        self.warned: set[tuple[str, str]] = set()
        self.fields: dict[int, str] = {}  # field id -> metric name, minus unsupported ones
        self.prev_counters: dict[str, tuple[int, float]] = {}  # raw PCIe counters: (ms, value)
        self.pcie_ms: int | None = None  # the last tick's time, for the PCIe byte totals
        self.pcie_totals: dict[str, float] = {}  # bytes since gpuwatch started, per direction
        self.last_xid = 0
        self.xid_counts: dict[int, int] = {}
        self.gpm: GpmSampler | None = None  # GPM of the whole GPU (Hopper and later, not in MIG mode)
        self.has_gpm = False  # GPM answers on this GPU (whole, or per GPU instance under MIG)
        self.mig: list[MigInstance] | None = None  # the GPU instances, when the GPU is in MIG mode
        self.mig_next_ms = 0  # when to read the MIG layout again
        self.mig_readings: list[tuple[Labels, dict[str, float]]] = []
        self.set_identity(GpuIdentity(index, "", "", ""))

    @property
    def is_sampled(self) -> bool:
        return not self.is_lost and self.unavailable is None

    def set_identity(self, identity: GpuIdentity) -> None:
        self.identity = identity
        self.label_map = {
            "gpu": str(identity.index),
            "UUID": identity.uuid,
            "modelName": identity.name,
            "Hostname": self.hostname,
            "pci_bus_id": identity.pci_bus_id,
        }
        self.labels: Labels = make_labels(self.label_map)
        self.throttle_labels = [
            (bit, make_labels({**self.label_map, "reason": r})) for bit, r in THROTTLE_REASONS
        ]
        self.extra_labels: dict[tuple[str, str], Labels] = {}

    def labels_with(self, key: str, value: str) -> Labels:
        labels = self.extra_labels.get((key, value))
        if labels is None:
            labels = self.extra_labels[(key, value)] = make_labels({**self.label_map, key: value})
        return labels
