"""Which scheduler's work a process is: a Slurm job, or a Kubernetes pod and container.

Both schedulers put a process in a cgroup whose path names the job or the pod:

- Slurm, cgroup v1: `4:memory:/slurm/uid_1000/job_4242/step_0/task_0` (`/slurm_<node>/...` where several
  slurmd run on one host); cgroup v2 (Slurm 22.05+): `0::/system.slice/slurmstepd.scope/job_4242/step_0/
  user/task_0` (`<node>_slurmstepd.scope` likewise).
- Kubernetes, cgroupfs driver: `/kubepods/burstable/pod<uid>/<container id>` (no QoS level for a
  Guaranteed pod); systemd driver: `/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<id>.scope`.

The pod's name, namespace and container name are not in the cgroup path; the container runtime keeps
them as annotations of the container's OCI bundle (`config.json`), readable by root on the host:
containerd under `/run/containerd/io.containerd.runtime.v2.task/k8s.io/<id>/`, CRI-O under
`/run/containers/storage/overlay-containers/<id>/userdata/`. Labels follow dcgm-exporter's
(`pod`, `namespace`, `container`, `pod_uid`), so dashboards written for it group the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

_SLURM_V1 = re.compile(r"/slurm(?:_[^/]+)?/uid_(\d+)/job_(\d+)(?:/|$)")
_SLURM_V2 = re.compile(r"/(?:[^/]+_)?slurmstepd\.scope/job_(\d+)(?:/|$)")
_POD_CGROUPFS = re.compile(r"/kubepods(?:/(?:burstable|besteffort|guaranteed))?/pod([0-9a-fA-F-]{36})(?:/|$)")
_POD_SYSTEMD = re.compile(r"kubepods(?:-(?:burstable|besteffort|guaranteed))?-pod([0-9a-fA-F_]{36})\.slice")

# Where each runtime keeps a container's OCI bundle, relative to the host's root, and the annotations
# naming its pod, namespace and container.
_BUNDLES: tuple[tuple[str, tuple[str, str, str]], ...] = (
    (
        "run/containerd/io.containerd.runtime.v2.task/k8s.io/{id}/config.json",
        (
            "io.kubernetes.cri.sandbox-name",
            "io.kubernetes.cri.sandbox-namespace",
            "io.kubernetes.cri.container-name",
        ),
    ),
    (
        "run/containers/storage/overlay-containers/{id}/userdata/config.json",
        ("io.kubernetes.pod.name", "io.kubernetes.pod.namespace", "io.kubernetes.container.name"),
    ),
)
_MAX_BUNDLE_BYTES = 4 << 20  # an OCI config.json is tens of KiB; refuse anything absurd


@dataclass(frozen=True)
class Attribution:
    """The Slurm job or Kubernetes pod a process runs in; "" where it runs in neither."""

    slurm_job: str = ""
    slurm_uid: int | None = None  # the job's user, where the cgroup v1 path names it
    pod_uid: str = ""
    pod: str = ""
    namespace: str = ""
    container: str = ""

    def labels(self) -> dict[str, str]:
        """The labels a process series carries (empty values are dropped by the series' labels)."""
        return {
            "slurm_job": self.slurm_job,
            "pod_uid": self.pod_uid,
            "pod": self.pod,
            "namespace": self.namespace,
            "container": self.container,
        }


NONE = Attribution()


def _paths(cgroup_text: str) -> list[str]:
    """The cgroup paths of a `/proc/<pid>/cgroup` text, the v2 line (`0::`) first."""
    lines = cgroup_text.splitlines()
    lines.sort(key=lambda line: not line.startswith("0::"))
    return [line.split(":", 2)[-1] for line in lines if line.count(":") >= 2]


def parse_cgroup(cgroup_text: str) -> Attribution:
    """Return the Slurm job or Kubernetes pod uid that a `/proc/<pid>/cgroup` text names."""
    for path in _paths(cgroup_text):
        if m := _SLURM_V1.search(path):
            return Attribution(slurm_job=m.group(2), slurm_uid=int(m.group(1)))
        if m := _SLURM_V2.search(path):
            return Attribution(slurm_job=m.group(1))
        if m := _POD_CGROUPFS.search(path):
            return Attribution(pod_uid=m.group(1).lower())
        if m := _POD_SYSTEMD.search(path):
            return Attribution(pod_uid=m.group(1).replace("_", "-").lower())
    return NONE


def read_pod_names(host_root: Path, container_id: str, found: Attribution) -> Attribution:
    """Add the pod's name, namespace and container name from the runtime's bundle of `container_id`,
    where one is readable under `host_root`; `found` as it is otherwise."""
    if not found.pod_uid or not container_id:
        return found
    for template, keys in _BUNDLES:
        path = host_root / template.format(id=container_id)
        try:
            with path.open("rb") as f:
                raw = f.read(_MAX_BUNDLE_BYTES + 1)
        except OSError:  # no such runtime here, or not ours to read
            continue
        if len(raw) > _MAX_BUNDLE_BYTES:
            continue
        try:
            notes = json.loads(raw).get("annotations")
        except (ValueError, AttributeError):
            continue
        if not isinstance(notes, dict):
            continue
        pod, namespace, container = (notes.get(k) for k in keys)
        return Attribution(
            pod_uid=found.pod_uid,
            pod=pod if isinstance(pod, str) else "",
            namespace=namespace if isinstance(namespace, str) else "",
            container=container if isinstance(container, str) else "",
        )
    return found
