"""The usage meter: each holder's allocated, busy and idle-but-held GPU seconds and energy as counters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwatch.collect.allocation import (
    ALLOCATED,
    BUSY,
    ENERGY,
    GPU_SECONDS,
    GPUS_ALLOCATED,
    IDLE_HELD,
    AllocationMeter,
    GpuUse,
    Holder,
)
from gpuwatch.collect.nvml import GpuCollector
from gpuwatch.collect.processes import user_name
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Sample
from gpuwatch.demo.nvml import FakeNvml

CGROUPS = Path(__file__).parent / "data" / "cgroup"
ALICE = Holder("alice")
BOB = Holder("bob", slurm_job="7")
KWH_MJ = 3.6e9


def of(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and dict(s.labels) == labels]
    assert len(found) == 1, (name, labels, [s for s in samples if s.name == name])
    return found[0]


def gpu_a(util: float | None, energy_mj: float | None, *holders: Holder) -> GpuUse:
    return GpuUse("h", "0", "GPU-a", util, energy_mj, frozenset(holders))


def test_holders_share_a_gpu_busy_or_idle_as_its_utilization_says() -> None:
    meter = AllocationMeter(idle_below=5.0)
    free = GpuUse("h", "1", "GPU-b", 0.0, 0.0)
    meter.observe(0, [gpu_a(50, 0.0, ALICE), free])
    meter.observe(1000, [gpu_a(50, KWH_MJ, ALICE), free])  # 1 s busy, 1 kWh: all alice's
    meter.observe(3000, [gpu_a(2, 2 * KWH_MJ, ALICE, BOB), free])  # 2 s idle, 1 kWh: shared
    meter.observe(4000, [gpu_a(None, 2 * KWH_MJ, ALICE, BOB), free])  # no utilization (MIG): allocated only
    got = meter.samples()
    a = {"user": "alice", "Hostname": "h", "gpu": "0", "UUID": "GPU-a"}
    b = {**a, "user": "bob", "slurm_job": "7"}
    assert (of(got, ALLOCATED, **a), of(got, BUSY, **a), of(got, IDLE_HELD, **a)) == (2.5, 1.0, 1.0)
    assert (of(got, ALLOCATED, **b), of(got, BUSY, **b), of(got, IDLE_HELD, **b)) == (1.5, 0.0, 1.0)
    assert of(got, ENERGY, **a) == pytest.approx(1.5) and of(got, ENERGY, **b) == pytest.approx(0.5)
    # the holders add up to the GPU: 4 s allocated of the host's 8 GPU seconds; one GPU allocated now
    assert of(got, GPU_SECONDS, Hostname="h") == 8.0
    assert of(got, GPUS_ALLOCATED, Hostname="h") == 1.0
    assert not any(dict(s.labels).get("gpu") == "1" for s in got)  # nobody held GPU 1


def test_a_gap_is_charged_to_nobody_and_a_driver_reload_counts_from_zero() -> None:
    meter = AllocationMeter(max_gap_s=60)
    meter.observe(0, [gpu_a(90, 5 * KWH_MJ, ALICE)])
    meter.observe(120_000, [gpu_a(90, 6 * KWH_MJ, ALICE)])  # two minutes without a sample
    meter.observe(121_000, [gpu_a(90, 0.25 * KWH_MJ, ALICE)])  # the counter restarted
    got = meter.samples()
    a = {"user": "alice", "Hostname": "h", "gpu": "0", "UUID": "GPU-a"}
    assert of(got, ALLOCATED, **a) == 1.0 and of(got, ENERGY, **a) == pytest.approx(0.25)
    assert of(got, GPU_SECONDS, Hostname="h") == 1.0


def test_a_gpu_of_a_run_is_charged_to_the_run_and_gone_holders_are_forgotten() -> None:
    meter = AllocationMeter(forget_ms=600_000)
    meter.observe(0, [gpu_a(90, None, ALICE)])
    meter.assign_runs({("h", "0", "GPU-a"): ["sft", "a-run"]})  # two runs name it: the first by name
    meter.observe(1000, [gpu_a(90, None, ALICE)])
    meter.observe(2000, [gpu_a(90, None, ALICE)])
    got = meter.samples()
    a = {"user": "alice", "Hostname": "h", "gpu": "0", "UUID": "GPU-a"}
    assert of(got, ALLOCATED, **a, run="a-run") == 2.0
    assert of(got, ALLOCATED, **a) == 0.0  # before the run was known: its series stays, unchanged
    for t in range(60_000, 720_000, 60_000):  # alice's process ends
        meter.observe(t, [gpu_a(0, None)])
    got = meter.samples()
    assert not [s for s in got if s.name == ALLOCATED]
    assert of(got, GPUS_ALLOCATED, Hostname="h") == 0.0


def _proc(root: Path, pid: int, cgroup: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text("python\n")
    (d / "status").write_text("Uid:\t1000\t1000\t1000\t1000\n")
    (d / "cgroup").write_text(cgroup)


def test_recorded_slurm_and_kubernetes_cgroups_name_the_job_and_the_pod(tmp_path: Path) -> None:
    """Two simulated GPU processes in recorded cgroups: a Slurm job (v1) and a pod (v2, systemd driver,
    its name from containerd's bundle under the host root)."""
    clock = FakeClock(1_700_000_000.0)
    fake = FakeNvml(gpu_count=8, clock=clock)
    host = tmp_path / "host"
    slurm_gpu, pod_gpu = 0, 4  # training GPUs: busy
    _proc(host / "proc", fake.workload.pid_of(slurm_gpu), (CGROUPS / "slurm-v1").read_text())
    _proc(host / "proc", fake.workload.pid_of(pod_gpu), (CGROUPS / "k8s-v2-systemd").read_text())
    cid = "3f4e5d6c7b8a99001122334455667788aabbccddeeff00112233445566778899"
    bundle = host / f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{cid}/config.json"
    bundle.parent.mkdir(parents=True)
    notes = {"io.kubernetes.cri.sandbox-name": "trainer-0", "io.kubernetes.cri.sandbox-namespace": "ml"}
    bundle.write_text(json.dumps({"annotations": notes}))
    collector = GpuCollector(fake, hostname="h", proc_root=host / "proc")
    collector.open()
    try:
        clock.advance(100)
        for _ in range(11):
            collector.collect(clock.now_ms())
            clock.advance(1)
        got = collector.usage_samples()
    finally:
        collector.close()
    jobs = {dict(s.labels).get("slurm_job"): s.value for s in got if s.name == ALLOCATED}
    pods = {
        (dict(s.labels).get("namespace"), dict(s.labels).get("pod")): s.value for s in got if s.name == BUSY
    }
    assert jobs["4242"] == 10.0 and ("ml", "trainer-0") in pods and pods[("ml", "trainer-0")] == 10.0
    (job,) = [dict(s.labels) for s in got if s.name == ALLOCATED and dict(s.labels).get("slurm_job")]
    assert job["user"] == user_name(1000) and job["gpu"] == str(slurm_gpu) and "pid" not in job
    assert of(got, GPUS_ALLOCATED, Hostname="h") == 8.0  # every GPU of the mixed demo runs a process
