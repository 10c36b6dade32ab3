"""What real drivers do, through the real nvidia-ml-py over the mock driver library (tests/nvmlmock):
each test is a defect a real GPU box met, and fails on the collector before its fix.

Each test runs one short subprocess per binding ("installed", and "floor" = 12.535.77 where
configured); times are the collector's injected tick timestamps, never waited for.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tests.nvmlmock import run
from tests.nvmlmock.fixtures import binding, binding_dirs, mock_lib

__all__ = ["binding_dirs", "mock_lib"]  # fixtures, used by name

BINDINGS = pytest.mark.parametrize("which", ["installed", "floor"])
GIB = 1 << 30

PRELUDE = """
import json, logging, threading
from pathlib import Path
import pynvml
from tests.nvmlmock.control import MockDriver
from gpuwatch.collect.nvml import GpuCollector

mock = MockDriver()
logs = []

class Keep(logging.Handler):
    def emit(self, record):
        logs.append([record.levelname, record.getMessage()])

log = logging.getLogger("gpuwatch.test")
log.addHandler(Keep())
log.setLevel(logging.DEBUG)
log.propagate = False

def collector(**kw):
    return GpuCollector(pynvml, hostname="h", proc_root=Path("/nonexistent"), logger=log, **kw)

def rows(batch):
    return [[s.name, dict(s.labels), s.value] for s in batch.samples]

out = {"logs": logs}
"""


def go(
    script: str, libs: dict[str, Path], scenario: str, folder: Path | None, variant: str = "current"
) -> Any:
    return run(
        PRELUDE + script + "\nprint(json.dumps(out))\n",
        lib_dir=libs[variant],
        scenario=scenario,
        binding_dir=folder,
    )


def gpu_values(samples: list[list[Any]], name: str) -> dict[str, float]:
    """Whole-GPU samples of `name` by gpu label (no GPU instance, process or reason labels)."""
    return {labels["gpu"]: value for n, labels, value in samples if n == name and len(labels) == 5}


def warnings(out: dict[str, Any]) -> list[str]:
    return [msg for level, msg in out["logs"] if level == "WARNING"]


@BINDINGS
def test_unknown_from_one_figure_leaves_the_gpu_sampled(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    """An RTX 4090 answers Unknown for its fan and power limit (nvidia-smi's ERR!): those two are
    absent, the GPU is not lost, nothing flaps at the re-probe, and each is warned about once."""
    out = go(
        """
c = collector()
c.open()
out["ticks"] = [rows(c.collect(ts)) for ts in (1000, 2000, 40000, 80000)]
c.close()
""",
        mock_lib,
        "consumer",
        binding(binding_dirs, which),
    )
    for samples in out["ticks"]:
        assert gpu_values(samples, "gpuwatch_gpu_lost") == {"0": 0.0}
        assert "0" in gpu_values(samples, "DCGM_FI_DEV_POWER_USAGE")
        assert "0" in gpu_values(samples, "DCGM_FI_DEV_FB_USED")
        assert gpu_values(samples, "DCGM_FI_DEV_FAN_SPEED") == {}
        assert gpu_values(samples, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT") == {}
    unknown = [w for w in warnings(out) if "NVMLError_Unknown" in w]
    assert len(unknown) == 2 and any("fan" in w for w in unknown) and any("power_limit" in w for w in unknown)
    assert not any("is lost" in w for w in warnings(out))


@BINDINGS
def test_no_permission_at_the_handle_is_not_a_lost_gpu(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    """GPU 1's handle says NoPermission (a container given one GPU's device node): GPU 1 reports
    nothing, no GPULost, one warning; once it may be opened, it is sampled at the next re-probe."""
    out = go(
        """
c = collector()
c.open()
out["before"] = [rows(c.collect(ts)) for ts in (1000, 2000, 31500)]
mock.set_handle_error(1, 0)
out["after"] = rows(c.collect(63000))
out["unavailable"] = c.unavailable()
c.close()
""",
        mock_lib,
        "noperm",
        binding(binding_dirs, which),
    )
    for samples in out["before"]:
        assert gpu_values(samples, "gpuwatch_gpu_lost") == {"0": 0.0}
        assert {labels["gpu"] for _, labels, _ in samples} == {"0"}
    assert gpu_values(out["after"], "gpuwatch_gpu_lost") == {"0": 0.0, "1": 0.0}
    assert "1" in gpu_values(out["after"], "DCGM_FI_DEV_POWER_USAGE")
    assert sum("GPU 1 cannot be opened" in w and "NoPermission" in w for w in warnings(out)) == 1
    assert out["unavailable"] == {}


def test_a_gpu_that_falls_off_the_bus_and_comes_back(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    out = go(
        """
c = collector()
c.open()
c.collect(1000)
mock.set_lost(1, True)
out["lost"] = rows(c.collect(2000))
mock.set_lost(1, False)
out["early"] = rows(c.collect(10000))
out["back"] = rows(c.collect(33000))
c.close()
""",
        mock_lib,
        "lost",
        binding(binding_dirs, "installed"),
    )
    assert gpu_values(out["lost"], "gpuwatch_gpu_lost") == {"0": 0.0, "1": 1.0}
    assert "1" not in gpu_values(out["lost"], "DCGM_FI_DEV_POWER_USAGE")
    assert gpu_values(out["early"], "gpuwatch_gpu_lost")["1"] == 1.0  # re-probed after 30 s, not before
    assert gpu_values(out["back"], "gpuwatch_gpu_lost") == {"0": 0.0, "1": 0.0}
    assert "1" in gpu_values(out["back"], "DCGM_FI_DEV_POWER_USAGE")
    assert sum("answers again" in w for w in warnings(out)) == 1


PROCESSES = """
c = collector()
c.open()
out["layout"] = c.process_layout
out["samples"] = rows(c.collect(1000))
c.close()
"""


def processes(samples: list[list[Any]], gpu: str = "0") -> dict[int, float]:
    return {
        int(labels["pid"]): value
        for name, labels, value in samples
        if name == "gpuwatch_process_gpu_memory_bytes" and labels["gpu"] == gpu
    }


@BINDINGS
def test_process_table_of_a_535_43_to_535_86_driver(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    """Those drivers write 32-byte process records; every binding since 12.535.161 reads 24."""
    out = go(PROCESSES, mock_lib, "r535_54", binding(binding_dirs, which), variant="r535_54")
    assert processes(out["samples"]) == {100: 1.0 * GIB, 200: 2.0 * GIB, 300: 3.0 * GIB}
    assert "32 bytes" in out["layout"]


@BINDINGS
def test_process_table_of_a_current_driver(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    """Current drivers write 24-byte records; nvidia-ml-py 12.535.77 reads 32."""
    out = go(PROCESSES, mock_lib, "healthy", binding(binding_dirs, which))
    got = processes(out["samples"])
    assert sorted(got) == [4242, 4343] and all(v >= GIB for v in got.values())
    assert sorted(processes(out["samples"], "3")) == [4545]
    assert "24 bytes" in out["layout"]


@BINDINGS
def test_mig_instances_processes_and_layout_changes(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    """An A100 in MIG mode: one series set per GPU instance (GI 1 is split into two compute
    instances), memory without the reserved part, processes from the compute instances (the parent
    says NoPermission), unknown memory as NaN, and instances created and destroyed while running."""
    out = go(
        """
c = collector()
c.open()
out["first"] = rows(c.collect(1000))
mock.mig_create(0, 3, "1g.10gb", 0)
mock.mig_destroy(0, 2, 0)
out["soon"] = rows(c.collect(2000))
out["later"] = rows(c.collect(3000))
out["layout"] = c.mig_layout()
c.close()
""",
        mock_lib,
        "mig",
        binding(binding_dirs, which),
    )
    assert not any("is lost" in w for w in warnings(out))

    def instances(samples: list[list[Any]], name: str) -> list[dict[str, str]]:
        return [
            labels for n, labels, _ in samples if n == name and "GPU_I_ID" in labels and "pid" not in labels
        ]

    first = out["first"]
    gis = instances(first, "DCGM_FI_DEV_FB_TOTAL")
    assert sorted((g["GPU_I_ID"], g["GPU_I_PROFILE"]) for g in gis) == [("1", "3g.40gb"), ("2", "3g.40gb")]
    reserved = {
        labels["GPU_I_ID"]: v
        for n, labels, v in first
        if n == "DCGM_FI_DEV_FB_RESERVED" and "GPU_I_ID" in labels
    }
    assert set(reserved) == {"1", "2"}  # v2 on the MIG handles: `used` without the reserved part
    procs = {
        int(labels["pid"]): (labels["GPU_I_ID"], value)
        for n, labels, value in first
        if n == "gpuwatch_process_gpu_memory_bytes"
    }
    assert sorted(procs) == [5001, 5002, 5003]
    assert procs[5001][0] == "1" and procs[5002][0] == "1" and procs[5003][0] == "2"
    assert math.isnan(procs[5002][1]) and procs[5001][1] > 0
    assert "0" not in gpu_values(first, "DCGM_FI_DEV_GPU_UTIL")  # not given under MIG: absent
    # GI 2's handle is gone at once (its figures with it); GI 3 is found when the layout is read again
    assert [g["GPU_I_ID"] for g in instances(out["soon"], "DCGM_FI_DEV_FB_TOTAL")] == ["1"]
    later = sorted(g["GPU_I_ID"] for g in instances(out["later"], "DCGM_FI_DEV_FB_TOTAL"))
    assert later == ["1", "3"]
    assert out["layout"] == {
        "0": ["GI 1 3g.40gb: 2 compute instance(s)", "GI 3 1g.10gb: 1 compute instance(s)"]
    }


@BINDINGS
def test_xid_events_are_matched_to_their_gpu_by_handle(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]], which: str
) -> None:
    """Each event's device is a new pointer object: matched by address, without nvmlDeviceGetIndex;
    NVML reports the last XID for every event still queued; a wait error is warned about once."""
    out = go(
        """
c = collector()
c.open()
mock.inject_xid(3, 79)
first = c.wait_events(100)
mock.inject_xid(2, 31)
mock.inject_xid(2, 43)
second = c.wait_events(100)
out["events"] = [[e.gpu_index, e.xid] for e in first + second]
out["index_calls"] = mock.call_count("nvmlDeviceGetIndex")
samples = rows(c.collect(1000))
out["xid"] = {l["gpu"]: [v, l.get("xid")] for n, l, v in samples if n == "gpuwatch_xid_errors_total"}
mock.set_error(-1, "nvmlEventSetWait", 999)
for _ in range(4):
    c.wait_events(5)
c.close()
out["violations"] = mock.violations()
""",
        mock_lib,
        "healthy",
        binding(binding_dirs, which),
    )
    assert out["events"] == [[3, 79], [2, 43], [2, 43]]
    assert out["index_calls"] == 0
    assert out["xid"] == {"3": [1.0, "79"], "2": [2.0, "43"]}
    assert sum("waiting for XID events failed" in w for w in warnings(out)) == 1
    assert out["violations"] == 0


def test_pcie_byte_counters_wrap_at_32_bits(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    """Without GPM the rate comes from fields 197/198, unsigned ints that wrap every 4 GiB (an H200
    on driver 580 answers so): a wrap between two ticks is a rate, and the totals never go down."""
    out = go(
        """
mock.set_gpm(0, False, 0, 0, 0)
mock.set_pcie_rates(0, 0, 0)
c = collector()
c.open()
mock.set_pcie_counters(0, (1 << 32) - 1000, (1 << 32) - 3000)
a = rows(c.collect(1000))
mock.set_pcie_counters(0, 5000, 7000)
b = rows(c.collect(2000))
out["ticks"] = [a, b]
c.close()
""",
        mock_lib,
        "healthy",
        binding(binding_dirs, "installed"),
    )
    a, b = out["ticks"]
    tx, rx = (
        gpu_values(b, "DCGM_FI_PROF_PCIE_TX_BYTES")["0"],
        gpu_values(b, "DCGM_FI_PROF_PCIE_RX_BYTES")["0"],
    )
    assert (tx, rx) == (6000.0, 10000.0)  # bytes in the 1 s between the ticks, across the wrap
    for name in ("gpuwatch_pcie_tx_bytes_total", "gpuwatch_pcie_rx_bytes_total"):
        assert gpu_values(b, name)["0"] >= gpu_values(a, name)["0"]


def test_pcie_rates_come_from_gpm_where_it_answers(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    out = go(
        """
c = collector()
c.open()
out["ticks"] = [rows(c.collect(ts)) for ts in (1000, 2000, 3000)]
c.close()
""",
        mock_lib,
        "healthy",
        binding(binding_dirs, "installed"),
    )
    first, _, last = out["ticks"]
    assert "0" not in gpu_values(first, "DCGM_FI_PROF_PCIE_TX_BYTES")  # GPM needs two samples
    assert gpu_values(last, "DCGM_FI_PROF_PCIE_TX_BYTES")["0"] > 0
    assert gpu_values(last, "gpuwatch_pcie_tx_bytes_total")["0"] > 0


def test_gpm_comes_back_after_a_failed_alloc_or_sample(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    """A second nvmlGpmSampleAlloc that fails, or a NotSupported sample (a profiler holding the
    counters), pauses GPM on that GPU for a minute; then it is tried again."""
    out = go(
        """
mock.fail_after("nvmlGpmSampleAlloc", 1, 20)  # the second alloc: Insufficient Memory
c = collector()
c.open()
ticks = {ts: rows(c.collect(ts)) for ts in (1000, 2000, 3000)}
mock.fail_after("nvmlGpmSampleAlloc", 0, 0)
ticks.update({ts: rows(c.collect(ts)) for ts in (30000, 62000, 63000)})
mock.set_error(0, "nvmlGpmSampleGet", 3)  # NotSupported
ticks.update({ts: rows(c.collect(ts)) for ts in (64000, 65000)})
mock.set_error(0, "nvmlGpmSampleGet", 0)
ticks.update({ts: rows(c.collect(ts)) for ts in (100000, 124500, 125500)})
def active(samples, gpu):
    return any(n == "DCGM_FI_PROF_SM_ACTIVE" and l["gpu"] == gpu for n, l, _ in samples)
out["active"] = {ts: active(s, "0") for ts, s in ticks.items()}
out["others"] = {ts: active(s, "1") for ts, s in ticks.items()}
c.close()
out["in_use"] = mock.gpm_samples_in_use()
""",
        mock_lib,
        "healthy",
        binding(binding_dirs, "installed"),
    )
    active = {int(k): v for k, v in out["active"].items()}
    assert active == {
        1000: False, 2000: False, 3000: False, 30000: False,  # paused a minute after the failed alloc
        62000: False, 63000: True,  # allocated again, two samples
        64000: False, 65000: False,  # NotSupported: paused again
        100000: False, 124500: False, 125500: True,
    }  # fmt: skip
    # the alloc failure was every GPU's; the NotSupported sample GPU 0's alone: the others went on
    assert sorted(int(k) for k, v in out["others"].items() if v) == [
        63000,
        64000,
        65000,
        100000,
        124500,
        125500,
    ]
    assert out["in_use"] == 0


def test_a_registration_that_fails_makes_a_new_event_set(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    """After Unknown from nvmlDeviceRegisterEvents the set is undefined (nvml.h): events go off, and the
    waiting thread makes a new set and registers every GPU again once registering works."""
    out = go(
        """
mock.set_error(1, "nvmlDeviceRegisterEvents", 999)
c = collector()
c.open()
out["state"] = c.events_state
mock.set_error(1, "nvmlDeviceRegisterEvents", 0)
for _ in range(30):
    c.wait_events(1)
out["again"] = c.events_state
mock.inject_xid(1, 48)
out["events"] = [[e.gpu_index, e.xid] for e in c.wait_events(100)]
c.close()
out["violations"] = mock.violations()
""",
        mock_lib,
        "lost",
        binding(binding_dirs, "installed"),
    )
    assert out["state"].startswith("failed: registering GPU 1")
    assert out["again"] == "registered on 2 GPU(s)"
    assert out["events"] == [[1, 48]] and out["violations"] == 0


def test_gpm_per_gpu_instance_on_an_h100_in_mig_mode(
    mock_lib: dict[str, Path], binding_dirs: list[tuple[str, Path | None]]
) -> None:
    """GPM under MIG comes per GPU instance; one instance's refused sample leaves the others on."""
    out = go(
        """
c = collector()
c.open()
out["ticks"] = [rows(c.collect(ts)) for ts in (1000, 2000)]
c.close()
""",
        mock_lib,
        "mig_h100",
        binding(binding_dirs, "installed"),
    )
    last = out["ticks"][-1]
    active = {
        labels["GPU_I_ID"]: v
        for n, labels, v in last
        if n == "DCGM_FI_PROF_SM_ACTIVE" and "GPU_I_ID" in labels
    }
    assert set(active) == {"1", "2"} and all(0.0 <= v <= 1.0 for v in active.values())
    assert "0" not in gpu_values(last, "DCGM_FI_PROF_SM_ACTIVE")  # no whole-GPU figure under MIG
