"""`gpuwatch doctor`: what a user runs first on a new GPU box and pastes into a bug report.

One line per check. The binding and driver versions; each NVML call gpuwatch makes, once per GPU,
with its outcome; then gpuwatch's own sampler over a few seconds, its figures checked against each
other (used + free + reserved = total; the energy counter's rise against the mean power) and against
`nvidia-smi` where it exists (memory, power, the process list); XID events, GPM, the MIG layout;
and, in a container, whether `--gpus all`, `--pid=host` or a host `/proc` are in effect.
Exit 0 when nothing failed, 1 otherwise.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from gpuwatch.app.config import Settings
from gpuwatch.cli.doctor_calls import Check, Outcome, audit_calls, summarize
from gpuwatch.cli.doctor_env import ContainerFacts, container_checks, read_container_facts
from gpuwatch.collect.nvml import GpuCollector
from gpuwatch.core.bindings import binding_problem
from gpuwatch.core.errors import NvmlUnavailable

STATUSES = ("ok", "skip", "warn", "fail")
_MIB = 1 << 20


@dataclass(frozen=True)
class DoctorEnv:
    """What the doctor reads besides NVML, injectable for tests."""

    monotonic: Callable[[], float]
    sleep: Callable[[float], None]
    nvidia_smi: Callable[[Sequence[str]], str | None]  # output, or None where nvidia-smi is absent
    container: ContainerFacts | None  # None: not checked (simulated GPUs)
    proc_root: Path = Path("/proc")
    seconds: float = 3.0  # the sampling window of the energy and GPM checks
    # The sampler's own log lines repeat what the checks say; the report is the output.
    logger: logging.Logger = field(default_factory=lambda: _quiet_logger())


def _quiet_logger() -> logging.Logger:
    log = logging.getLogger("gpuwatch.doctor.sampler")
    log.propagate = False
    if not log.handlers:
        log.addHandler(logging.NullHandler())
    return log


def binding_check(nvml: Any) -> Check:
    """Which nvidia-ml-py (or simulated NVML) answers, and whether gpuwatch can use it."""
    if not hasattr(nvml, "__file__"):
        return Check("ok", "binding", "simulated NVML (--demo)", {"version": "demo"})
    try:
        version = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        version = "unknown"
    where = str(getattr(nvml, "__file__", ""))
    data = {"version": version, "module": where}
    problem = binding_problem(nvml)
    if problem is not None:
        return Check("fail", "binding", problem, data)
    return Check("ok", "binding", f"nvidia-ml-py {version} ({where})", data)


def _system(nvml: Any) -> Check:
    def ask(name: str) -> Any:
        fn = getattr(nvml, name, None)
        if fn is None:
            return None
        try:
            return fn()
        except nvml.NVMLError:
            return None

    driver = ask("nvmlSystemGetDriverVersion")
    cuda = ask("nvmlSystemGetCudaDriverVersion")
    nvml_version = ask("nvmlSystemGetNVMLVersion")
    cuda_text = f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}" if cuda else "unknown"
    data = {"driver": driver, "cuda": cuda_text, "nvml": nvml_version}
    return Check(
        "ok" if driver else "warn",
        "driver",
        f"driver {driver or 'unknown'}, CUDA {cuda_text}, NVML {nvml_version or 'unknown'}",
        data,
    )


def run(nvml: Any, *, hostname: str, env: DoctorEnv) -> list[Check]:
    """Every check, in the order printed."""
    checks = [binding_check(nvml)]
    if checks[0].status == "fail":
        return checks
    collector = GpuCollector(nvml, hostname=hostname, proc_root=env.proc_root, logger=env.logger)
    try:
        gpus = collector.open()
    except NvmlUnavailable as exc:
        checks.append(Check("fail", "nvml", str(exc)))
        return checks + container_checks(
            env.container, gpus_found=False, processes=[], proc_root=env.proc_root
        )
    try:
        checks.append(_system(nvml))
        unavailable = collector.unavailable()
        names = sorted({g.name for g in gpus if g.name})
        checks.append(
            Check(
                "fail" if unavailable else "ok",
                "gpus",
                f"{len(gpus)} found: {', '.join(names) or 'unnamed'}"
                + "".join(f"; GPU {i} cannot be opened ({why})" for i, why in unavailable.items()),
                {"count": len(gpus), "gpus": [asdict(g) for g in gpus], "unavailable": unavailable},
            )
        )
        audit = audit_calls(nvml, collector.handles(), collector.field_table)
        for (
            gpu
        ) in collector.mig_layout():  # a MIG parent's list needs privileges; gpuwatch asks each instance
            audit["nvmlDeviceGetComputeRunningProcesses"] = [
                Outcome(o.gpu, "unsupported", "read per compute instance under MIG")
                if o.gpu == gpu and o.kind == "no_permission"
                else o
                for o in audit["nvmlDeviceGetComputeRunningProcesses"]
            ]
        for name, outcomes in audit.items():
            status, detail = summarize(outcomes)
            checks.append(Check(status, name, detail, {"outcomes": [asdict(o) for o in outcomes]}))
        checks += _sampling(collector, env)
    finally:
        collector.close()
    return checks


def _series(batch_samples: Sequence[Any], name: str) -> dict[str, float]:
    return {
        dict(s.labels)["gpu"]: s.value
        for s in batch_samples
        if s.name == name and "GPU_I_ID" not in dict(s.labels)
    }


def _sampling(collector: GpuCollector, env: DoctorEnv) -> list[Check]:
    """gpuwatch's own sampler over `env.seconds`, and its figures checked."""
    checks: list[Check] = []
    t0 = env.monotonic()
    ticks = []
    steps = max(2, int(env.seconds / 0.5) + 1)
    for k in range(steps):
        if k:
            env.sleep(env.seconds / (steps - 1))
        now = env.monotonic()
        ticks.append((now, collector.collect(int(now * 1000)).samples))
    took = ticks[-1][0] - t0
    last = ticks[-1][1]
    lost = [g for g, v in _series(last, "gpuwatch_gpu_lost").items() if v]
    checks.append(
        Check(
            "fail" if lost else "ok",
            "sampling",
            f"{len(ticks)} ticks over {took:.1f} s; {len(last)} samples in the last"
            + (f"; lost: GPU {','.join(lost)}" if lost else "; no GPU lost"),
            {"samples": len(last), "lost": lost},
        )
    )
    checks.append(_memory_check(last))
    checks.append(_energy_check(ticks))
    checks.append(_gpm_check(last, collector))
    checks += _smi_checks(last, env)
    checks.append(_process_check(last, collector, env))
    events = collector.events_state
    checks.append(Check("ok" if events.startswith("registered") else "warn", "xid events", events))
    layout = collector.mig_layout()
    checks.append(
        Check(
            "ok",
            "mig",
            "; ".join(f"GPU {g}: {', '.join(parts) or 'no instances'}" for g, parts in layout.items())
            or "MIG is off on every GPU",
            {"layout": {str(k): v for k, v in layout.items()}},
        )
    )
    pids = [dict(s.labels)["pid"] for s in last if s.name == "gpuwatch_process_gpu_memory_bytes"]
    checks += container_checks(env.container, gpus_found=True, processes=pids, proc_root=env.proc_root)
    return checks


def _memory_check(samples: Sequence[Any]) -> Check:
    used, free = _series(samples, "DCGM_FI_DEV_FB_USED"), _series(samples, "DCGM_FI_DEV_FB_FREE")
    total, reserved = _series(samples, "DCGM_FI_DEV_FB_TOTAL"), _series(samples, "DCGM_FI_DEV_FB_RESERVED")
    if not total:
        return Check("warn", "memory", "no memory figures")
    off = {
        g: used[g] + free[g] + reserved.get(g, 0.0) - t for g, t in total.items() if g in used and g in free
    }
    bad = {g: d for g, d in off.items() if abs(d) > 2}
    detail = "used + free + reserved = total on every GPU (MiB, within 2)"
    if bad:
        detail = "; ".join(f"GPU {g}: used + free + reserved - total = {d:+.0f} MiB" for g, d in bad.items())
    return Check("fail" if bad else "ok", "memory", detail, {"difference_mib": off})


def _energy_check(ticks: Sequence[tuple[float, Sequence[Any]]]) -> Check:
    """The energy counter's rise over the window (mJ -> W) against the mean of the power readings."""
    (t0, s0), (t1, s1) = ticks[0], ticks[-1]
    e0, e1 = (
        _series(s0, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
        _series(s1, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
    )
    if not e0 or t1 <= t0:
        return Check("skip", "energy", "no energy counter (field 83) on these GPUs")
    result: dict[str, dict[str, float]] = {}
    bad = []
    for g in e0:
        powers = [v for _, s in ticks for k, v in _series(s, "DCGM_FI_DEV_POWER_USAGE").items() if k == g]
        if g not in e1 or not powers:
            continue
        from_counter = (e1[g] - e0[g]) / 1000.0 / (t1 - t0)
        mean = sum(powers) / len(powers)
        result[g] = {"counter_w": round(from_counter, 1), "power_w": round(mean, 1)}
        if e1[g] < e0[g] or not math.isclose(from_counter, mean, rel_tol=0.3, abs_tol=5.0):
            bad.append(f"GPU {g}: counter {from_counter:.0f} W against power {mean:.0f} W")
    detail = "; ".join(bad) or "counter rise matches mean power on every GPU (within 30 %): " + ", ".join(
        f"GPU {g} {r['counter_w']:.0f}/{r['power_w']:.0f} W" for g, r in result.items()
    )
    return Check("fail" if bad else "ok", "energy", detail, {"gpus": result})


def _gpm_check(samples: Sequence[Any], collector: GpuCollector) -> Check:
    active = _series(samples, "DCGM_FI_PROF_SM_ACTIVE")
    mig_active = [
        s.value for s in samples if s.name == "DCGM_FI_PROF_SM_ACTIVE" and "GPU_I_ID" in dict(s.labels)
    ]
    if not active and not mig_active:
        return Check(
            "skip", "gpm", "no GPM figures (Hopper and later; not while a profiler holds the counters)"
        )
    values = list(active.values()) + mig_active
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    detail = f"DCGM_FI_PROF_SM_ACTIVE read on {len(values)} GPU(s) or instance(s)" + (
        f"; out of [0, 1]: {bad}" if bad else ""
    )
    return Check("fail" if bad else "ok", "gpm", detail, {"sm_active": active})


def _smi_checks(samples: Sequence[Any], env: DoctorEnv) -> list[Check]:
    text = env.nvidia_smi(["--query-gpu=index,memory.used,power.draw", "--format=csv,noheader,nounits"])
    if text is None:
        return [Check("skip", "nvidia-smi", "nvidia-smi not found; figures not compared with it")]
    used, power = _series(samples, "DCGM_FI_DEV_FB_USED"), _series(samples, "DCGM_FI_DEV_POWER_USAGE")
    bad, compared = [], 0
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 3 or cells[0] not in used:
            continue
        compared += 1
        g = cells[0]
        try:
            smi_used, smi_power = float(cells[1]), float(cells[2])
        except ValueError:
            continue  # "[N/A]"
        if abs(smi_used - used[g]) > 64:
            bad.append(f"GPU {g}: memory used {used[g]:.0f} MiB, nvidia-smi {smi_used:.0f}")
        if g in power and abs(smi_power - power[g]) > max(20.0, 0.1 * smi_power):
            bad.append(f"GPU {g}: power {power[g]:.0f} W, nvidia-smi {smi_power:.0f}")
    detail = "; ".join(bad) or f"memory used and power match nvidia-smi on {compared} GPU(s)"
    return [Check("fail" if bad else "ok", "nvidia-smi", detail)]


def _process_check(samples: Sequence[Any], collector: GpuCollector, env: DoctorEnv) -> Check:
    procs = [
        dict(s.labels) | {"bytes": s.value} for s in samples if s.name == "gpuwatch_process_gpu_memory_bytes"
    ]
    pids = sorted({int(p["pid"]) for p in procs})
    detail = f"{len(pids)} process(es) through {collector.process_layout}"
    data: dict[str, Any] = {"pids": pids, "layout": collector.process_layout}
    bad = [p for p in pids if p <= 0 or p >= 1 << 22]
    if bad:
        return Check(
            "fail", "processes", f"{detail}; impossible pids {bad} (a scrambled process table)", data
        )
    text = env.nvidia_smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    if text is None:
        return Check("ok", "processes", detail, data)
    smi: dict[int, float] = {}
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[0].isdigit():
            try:
                smi[int(cells[0])] = float(cells[1])
            except ValueError:
                smi[int(cells[0])] = math.nan
    data["nvidia_smi_pids"] = sorted(smi)
    if set(smi) != set(pids):
        return Check("fail", "processes", f"{detail}; nvidia-smi lists pids {sorted(smi)}", data)
    off = [
        f"pid {p['pid']}: {p['bytes'] / _MIB:.0f} MiB, nvidia-smi {smi[int(p['pid'])]:.0f}"
        for p in procs
        if not math.isnan(p["bytes"])
        and not math.isnan(smi[int(p["pid"])])
        and not math.isclose(p["bytes"] / _MIB, smi[int(p["pid"])], rel_tol=0.1, abs_tol=8)
    ]
    return Check(
        "fail" if off else "ok",
        "processes",
        detail + ("; " + "; ".join(off) if off else "; same as nvidia-smi"),
        data,
    )


def format_report(checks: Sequence[Check]) -> str:
    width = max((len(c.name) for c in checks), default=10)
    return "".join(f"{c.status:<5} {c.name:<{width}}  {c.detail}\n" for c in checks)


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == "fail" for c in checks) else 0


def nvidia_smi(args: Sequence[str]) -> str | None:
    """Run nvidia-smi with `args`; None where it is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def run_command(settings: Settings, hostname: str, *, as_json: bool, seconds: float) -> int:
    """`gpuwatch doctor`: print the report (or JSON) and return the exit code."""
    with tempfile.TemporaryDirectory(prefix="gpuwatch-doctor-") as tmp:
        proc_root = settings.proc_root
        if settings.demo:
            from gpuwatch.demo.nvml import FakeNvml

            nvml: Any = FakeNvml(gpu_count=settings.demo_gpus, model=settings.demo_model, hostname=hostname)
            proc_root = Path(tmp)
            nvml.write_proc_root(proc_root)
        else:
            import pynvml  # as load_nvml does, but a binding problem becomes the report's first line

            nvml = pynvml
        env = DoctorEnv(
            monotonic=time.monotonic,
            sleep=time.sleep,
            nvidia_smi=(lambda _args: None) if settings.demo else nvidia_smi,
            container=None if settings.demo else read_container_facts(),
            proc_root=proc_root,
            seconds=seconds,
        )
        checks = run(nvml, hostname=hostname, env=env)
    code = exit_code(checks)
    if as_json:
        print(
            json.dumps(
                {"ok": code == 0, "hostname": hostname, "checks": [asdict(c) for c in checks]}, indent=1
            )
        )
    else:
        print(format_report(checks), end="")
    return code
