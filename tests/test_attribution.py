"""Processes attributed to a Slurm job or a Kubernetes pod from their cgroup and the runtime's bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuwatch.collect.attribution import NONE, Attribution, parse_cgroup, read_pod_names
from gpuwatch.collect.nvml import GpuCollector
from gpuwatch.collect.processes import read_process_info, user_name
from gpuwatch.core.clock import FakeClock
from gpuwatch.demo.nvml import FakeNvml

CGROUPS = Path(__file__).parent / "data" / "cgroup"
CID = "3f4e5d6c7b8a99001122334455667788aabbccddeeff00112233445566778899"
POD_UID = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
CONTAINERD = "run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json"
CRIO = "run/containers/storage/overlay-containers/{id}/userdata/config.json"


@pytest.mark.parametrize(
    ("recorded", "want"),
    [
        ("slurm-v1", Attribution(slurm_job="4242", slurm_uid=1000)),
        ("slurm-v2", Attribution(slurm_job="4243")),
        ("slurm-v2-multi", Attribution(slurm_job="17")),
        ("k8s-v1-cgroupfs", Attribution(pod_uid=POD_UID)),
        ("k8s-v1-guaranteed", Attribution(pod_uid=POD_UID)),
        ("k8s-v2-systemd", Attribution(pod_uid=POD_UID)),
        ("k8s-v2-guaranteed-crio", Attribution(pod_uid=POD_UID)),
        ("docker", NONE),
        ("host-session", NONE),
    ],
)
def test_the_cgroup_names_the_job_or_the_pod(recorded: str, want: Attribution) -> None:
    assert parse_cgroup((CGROUPS / recorded).read_text()) == want


def test_look_alike_paths_name_nothing() -> None:
    for text in [
        "0::/user.slice/slurm_notes/job_1\n",  # not a Slurm cgroup
        "0::/system.slice/slurmd.service\n",  # the daemon itself
        "0::/kubepods/burstable/podnot-a-uid/abc\n",
        "garbage without colons\n",
        "",
    ]:
        assert parse_cgroup(text) == NONE, text


def bundle(root: Path, template: str, annotations: object) -> None:
    path = root / template.format(id=CID)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"ociVersion": "1.1.0", "annotations": annotations}))


@pytest.mark.parametrize(
    ("template", "keys"),
    [
        (CONTAINERD, ("io.kubernetes.cri.sandbox-name", "io.kubernetes.cri.sandbox-namespace",
                      "io.kubernetes.cri.container-name")),
        (CRIO, ("io.kubernetes.pod.name", "io.kubernetes.pod.namespace", "io.kubernetes.container.name")),
    ],
)  # fmt: skip
def test_the_runtimes_bundle_names_the_pod(tmp_path: Path, template: str, keys: tuple[str, str, str]) -> None:
    bundle(tmp_path, template, dict(zip(keys, ["trainer-0", "ml-team", "pytorch"], strict=True)))
    found = read_pod_names(tmp_path, CID, Attribution(pod_uid=POD_UID))
    assert found == Attribution(pod_uid=POD_UID, pod="trainer-0", namespace="ml-team", container="pytorch")
    assert found.labels() == {
        "slurm_job": "",
        "pod_uid": POD_UID,
        "pod": "trainer-0",
        "namespace": "ml-team",
        "container": "pytorch",
    }


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"annotations": [1]}', "x" * (5 << 20)])
def test_an_unreadable_bundle_leaves_the_pod_uid_alone(tmp_path: Path, content: str) -> None:
    path = tmp_path / CONTAINERD.format(id=CID)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    assert read_pod_names(tmp_path, CID, Attribution(pod_uid=POD_UID)) == Attribution(pod_uid=POD_UID)
    assert read_pod_names(tmp_path / "nowhere", CID, Attribution(pod_uid=POD_UID)) == Attribution(
        pod_uid=POD_UID
    )


def proc(root: Path, pid: int, cgroup: str, status: str | None = "Uid:\t1000\t1000\t1000\t1000\n") -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "comm").write_text("python\n")
    if status is not None:
        (d / "status").write_text(status)
    (d / "cgroup").write_text(cgroup)


def test_a_slurm_jobs_user_comes_from_its_cgroup_when_status_is_unreadable(tmp_path: Path) -> None:
    proc(tmp_path / "proc", 7, (CGROUPS / "slurm-v1").read_text(), status=None)
    info = read_process_info(tmp_path / "proc", 7)
    assert (info.attribution.slurm_job, info.user) == ("4242", user_name(1000))


def test_gpu_process_series_carry_the_job_and_the_pod(tmp_path: Path) -> None:
    """Under a host root mounted at /host: /host/proc for PIDs, /host/run for containerd's bundles."""
    clock = FakeClock(1_700_000_000.0)
    fake = FakeNvml(gpu_count=8, clock=clock)
    host = tmp_path / "host"
    pids = {fake.workload.pid_of(i) for i in range(8)}
    slurm_pid, pod_pid = sorted(pids)[:2]
    proc(host / "proc", slurm_pid, (CGROUPS / "slurm-v2").read_text())
    proc(host / "proc", pod_pid, (CGROUPS / "k8s-v2-systemd").read_text())
    bundle(host, CONTAINERD, {"io.kubernetes.cri.sandbox-name": "vllm-7b-0",
                              "io.kubernetes.cri.sandbox-namespace": "serving",
                              "io.kubernetes.cri.container-name": "vllm"})  # fmt: skip
    collector = GpuCollector(fake, hostname="h", proc_root=host / "proc")
    collector.open()
    try:
        batch = collector.collect(clock.now_ms())
    finally:
        collector.close()
    procs = {
        dict(s.labels)["pid"]: dict(s.labels)
        for s in batch.samples
        if s.name == "gpuwatch_process_gpu_memory_bytes"
    }
    slurm, pod = procs[str(slurm_pid)], procs[str(pod_pid)]
    assert slurm["slurm_job"] == "4243" and not {"pod_uid", "pod", "namespace", "container"} & slurm.keys()
    assert (pod["pod_uid"], pod["pod"], pod["namespace"], pod["container"]) == (
        POD_UID,
        "vllm-7b-0",
        "serving",
        "vllm",
    )
    assert pod["container_id"] == CID and "slurm_job" not in pod
