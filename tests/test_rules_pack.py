"""The built-in rule pack: every rule fires on the trouble it names and resolves when it is over.

Each scenario feeds samples minute by minute into a real store on a FakeClock and evaluates the one
rule under test (the pack's recording rules included) every minute, as the `rules` job would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Sample, make_labels
from gpuwatch.query import Engine
from gpuwatch.rules.evaluate import FIRING
from gpuwatch.rules.load import Group, load_builtin
from gpuwatch.rules.manager import RuleManager
from gpuwatch.rules.roundcache import RoundCache
from gpuwatch.store import Store

T0 = 1_800_000_000.0
GPU = {"gpu": "0", "UUID": "GPU-0", "Hostname": "n1", "modelName": "H100", "pci_bus_id": "00000000:01:00.0"}
MODEL = {"job": "vllm", "instance": "10.0.0.5:8000", "model_name": "llama-3-8b", "engine": "vllm"}
RUN = {"run": "sft-1", "job": "training"}
PROC = {**GPU, "pid": "4242", "process_name": "python3", "user": "alice", "container_id": ""}

Feed = Callable[[int], list[tuple[str, dict[str, str], float]]]


def pack_groups(rule_name: str) -> list[Group]:
    """Return the built-in groups cut down to the rule `rule_name` and every recording rule."""
    out = []
    for g in load_builtin():
        rules = tuple(r for r in g.rules if r.kind == "record" or r.name == rule_name)
        if rules:
            out.append(Group(g.name, g.file, g.interval_s, rules))
    assert any(r.name == rule_name for g in out for r in g.rules), f"no built-in rule {rule_name}"
    return out


@dataclass
class Pack:
    store: Store
    clock: FakeClock
    manager: RuleManager
    minute: int = 0

    def run(self, minutes: int, feed: Feed) -> None:
        """Feed and evaluate once a minute for `minutes` minutes."""
        for _ in range(minutes):
            samples = [Sample(n, make_labels(labels), v) for n, labels, v in feed(self.minute)]
            if samples:
                self.store.append(Batch(self.clock.now_ms(), samples))
            self.store.flush()
            self.manager.run_due()
            self.clock.advance(60)
            self.minute += 1

    def alerts(self) -> dict[str, dict[str, str]]:
        """Return the active alerts' state by a short key, with their labels and annotations."""
        out = {}
        for _, a in self.manager.active_alerts():
            labels = dict(a.labels)
            key = ",".join(
                f"{k}={labels[k]}" for k in ("gpu", "run", "model_name", "job", "xid", "kind") if k in labels
            )
            out[key] = {**labels, **{f"@{k}": v for k, v in a.annotations}, "@state": a.state}
        return out

    def firing(self) -> list[dict[str, str]]:
        return [a for a in self.alerts().values() if a["@state"] == FIRING]

    def errors(self) -> list[str]:
        return [s.last_error for g in self.manager.groups() for s in g.status if s.health == "err"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[Store, FakeClock]]:
    clock = FakeClock(T0)
    s = Store.open(tmp_path / "data", clock=clock)
    yield s, clock
    s.close()


def make_pack(store: tuple[Store, FakeClock], rule: str) -> Pack:
    s, clock = store
    cache = RoundCache(s)  # as `gpuwatch serve` builds it
    m = RuleManager(s, Engine(cache).instant, clock, pack_groups(rule), default_interval_s=60, cache=cache)
    return Pack(s, clock, m)


def const(*series: tuple[str, dict[str, str], float]) -> Feed:
    return lambda m: list(series)


def counter(name: str, labels: dict[str, str], per_minute: float, start: float = 0.0) -> Feed:
    """A counter that grows by `per_minute` each minute from the scenario's current minute."""
    state = {"v": start}

    def feed(m: int) -> list[tuple[str, dict[str, str], float]]:
        state["v"] += per_minute
        return [(name, labels, state["v"])]

    return feed


@dataclass
class Case:
    rule: str
    setup: Feed | None  # fed first, for `setup_minutes`, with no alert expected
    setup_minutes: int
    trouble: Feed
    fire_minutes: (
        int  # after this many minutes of trouble the alert fires (and not one minute earlier when `exact`)
    )
    recover: Feed
    resolve_minutes: int
    want: dict[str, str]  # labels/annotations the firing alert has
    exact: bool = True


def remote_write(caught_up: bool) -> Feed:
    """A destination's figures: sent up to this minute and nothing pending, or stuck at minute 3."""
    labels = {"remote_name": "hub", "url": "http://hub:9842/api/v1/write"}

    def feed(m: int) -> list[tuple[str, dict[str, str], float]]:
        sent = T0 + 60 * (m if caught_up else 3)
        return [
            ("prometheus_remote_storage_queue_highest_sent_timestamp_seconds", labels, float(sent)),
            ("prometheus_remote_storage_samples_pending", labels, 0.0 if caught_up else 500.0),
        ]

    return feed


def xid(code: str) -> dict[str, str]:
    return {**GPU, "xid": code}


def flat_then(
    value_before: float, value_after: float, name: str, labels: dict[str, str]
) -> tuple[Feed, Feed]:
    return const((name, labels, value_before)), const((name, labels, value_after))


LOG = {"run": "sft-1", "file": "/data/sft-1.log"}


def log_event(kind: str) -> tuple[Feed, Feed]:
    """Return (trouble, recover): a log counter that appears at 1 with its first event, then stays."""
    labels = {**LOG, "kind": kind}
    return const(("gpuwatch_log_events_total", labels, 1.0)), const(
        ("gpuwatch_log_events_total", labels, 1.0)
    )


def ramp_loss(start: float, per_minute: float) -> Feed:
    return lambda m: [
        ("training_loss", RUN, start - per_minute * m),
        ("gpuwatch_training_run_running", {"run": "sft-1"}, 1.0),
    ]


def run_running(m: int) -> list[tuple[str, dict[str, str], float]]:
    return [("gpuwatch_training_run_running", {"run": "sft-1"}, 1.0)]


def with_running(feed: Feed) -> Feed:
    return lambda m: feed(m) + run_running(m)


CASES = [
    Case("GPUUtilizationLow", None, 0, const(("DCGM_FI_DEV_GPU_UTIL", GPU, 3)), 30,
         const(("DCGM_FI_DEV_GPU_UTIL", GPU, 60)), 1, {"severity": "warning", "gpu": "0"}),
    Case("GPUMemoryHigh", None, 0,
         const(("DCGM_FI_DEV_FB_USED", GPU, 76000), ("DCGM_FI_DEV_FB_TOTAL", GPU, 80000)), 5,
         const(("DCGM_FI_DEV_FB_USED", GPU, 1000), ("DCGM_FI_DEV_FB_TOTAL", GPU, 80000)), 1,
         {"severity": "critical", "@description": "GPU 0 on n1 has used 95% of its memory for 5 minutes."}),
    Case("GPUTemperatureHigh", None, 0, const(("DCGM_FI_DEV_GPU_TEMP", GPU, 90)), 10,
         const(("DCGM_FI_DEV_GPU_TEMP", GPU, 60)), 1, {"severity": "critical"}),
    Case("GPUECCError", const(("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU, 0)), 5,
         const(("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU, 2)), 0,
         const(("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU, 2)), 61, {"severity": "critical"}),
    Case("GPUXidErrorCritical", const(("gpuwatch_xid_errors_total", xid("13"), 1)), 5,
         const(("gpuwatch_xid_errors_total", xid("79"), 1)), 0,
         const(("gpuwatch_xid_errors_total", xid("79"), 1)), 61,
         {"severity": "critical", "xid": "79", "@summary": "GPU 0 on n1 reported XID 79"}),
    Case("GPUXidError", const(("gpuwatch_xid_errors_total", xid("79"), 1)), 5,
         counter("gpuwatch_xid_errors_total", xid("13"), 1), 0,
         const(("gpuwatch_xid_errors_total", xid("13"), 3)), 61, {"severity": "warning", "xid": "13"}),
    Case("GPULost", const(("gpuwatch_gpu_lost", GPU, 0)), 3, const(("gpuwatch_gpu_lost", GPU, 1)), 1,
         const(("gpuwatch_gpu_lost", GPU, 0)), 1, {"severity": "critical"}),
    Case("GPUThrottled", None, 0,
         const(("gpuwatch_clock_throttled", {**GPU, "reason": "hw_thermal_slowdown"}, 1), ("DCGM_FI_DEV_GPU_UTIL", GPU, 95)), 10,
         const(("gpuwatch_clock_throttled", {**GPU, "reason": "hw_thermal_slowdown"}, 1), ("DCGM_FI_DEV_GPU_UTIL", GPU, 5)), 1,
         {"severity": "warning", "reason": "hw_thermal_slowdown"}),
    Case("GPURowRemapFailure", const(("DCGM_FI_DEV_ROW_REMAP_FAILURE", GPU, 0)), 2,
         const(("DCGM_FI_DEV_ROW_REMAP_FAILURE", GPU, 1)), 0, const(("DCGM_FI_DEV_ROW_REMAP_FAILURE", GPU, 0)), 1,
         {"severity": "critical"}),
    Case("GPURowRemapPending", const(("DCGM_FI_DEV_ROW_REMAP_PENDING", GPU, 0)), 2,
         const(("DCGM_FI_DEV_ROW_REMAP_PENDING", GPU, 1)), 0, const(("DCGM_FI_DEV_ROW_REMAP_PENDING", GPU, 0)), 1,
         {"severity": "warning"}),
    Case("GPUPCIeReplays", const(("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", GPU, 0)), 20,
         counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", GPU, 6), 2,
         const(("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", GPU, 12)), 16, {"severity": "warning"}, exact=False),
    Case("GPUMemoryTemperatureHigh", None, 0, const(("DCGM_FI_DEV_MEMORY_TEMP", GPU, 96)), 5,
         const(("DCGM_FI_DEV_MEMORY_TEMP", GPU, 70)), 1, {"severity": "warning"}),
    Case("GPUMemoryHeldIdle", None, 0,
         const(("gpuwatch_process_gpu_memory_bytes", PROC, 20 * 2**30), ("DCGM_FI_DEV_GPU_UTIL", GPU, 0),
               ("DCGM_FI_DEV_FB_USED", GPU, 20480), ("DCGM_FI_DEV_FB_TOTAL", GPU, 81920)), 30,
         const(("gpuwatch_process_gpu_memory_bytes", PROC, 20 * 2**30), ("DCGM_FI_DEV_GPU_UTIL", GPU, 80),
               ("DCGM_FI_DEV_FB_USED", GPU, 20480), ("DCGM_FI_DEV_FB_TOTAL", GPU, 81920)), 1,
         {"user": "alice", "process_name": "python3", "pid": "4242",
          "@summary": "alice's python3 holds GPU 0 on n1 without using it"}),
    Case("TargetDown", const(("up", {"job": "vllm", "instance": "a:8000"}, 1)), 2,
         const(("up", {"job": "vllm", "instance": "a:8000"}, 0)), 2,
         const(("up", {"job": "vllm", "instance": "a:8000"}, 1)), 1, {"instance": "a:8000"}),
    Case("GPUMetricsAbsent", const(("gpuwatch_nvml_up", {}, 1), ("DCGM_FI_DEV_GPU_UTIL", GPU, 50)), 2,
         const(("gpuwatch_nvml_up", {}, 1)), 10,
         const(("gpuwatch_nvml_up", {}, 1), ("DCGM_FI_DEV_GPU_UTIL", GPU, 50)), 1, {"severity": "critical"},
         exact=False),
    Case("GPUCountDropped", const(("gpuwatch_gpus", {}, 8)), 5, const(("gpuwatch_gpus", {}, 7)), 0,
         const(("gpuwatch_gpus", {}, 8)), 1, {"@description": "gpuwatch now sees 7 GPU(s), fewer than in the last 6 hours; a GPU disappeared (check nvidia-smi and dmesg)."}),
    Case("NVMLUnavailable", const(("gpuwatch_nvml_up", {}, 1)), 2, const(("gpuwatch_nvml_up", {}, 0)), 0,
         const(("gpuwatch_nvml_up", {}, 1)), 1, {"severity": "warning"}),
    Case("GpuwatchNotSampling", const(("gpuwatch_build_info", {"version": "1"}, 1)), 2, const(), 5,
         const(("gpuwatch_build_info", {"version": "1"}, 1)), 1, {"severity": "critical"}, exact=False),
    Case("GpuwatchStoreWriteErrors", const(("gpuwatch_store_write_errors_total", {}, 0)), 3,
         const(("gpuwatch_store_write_errors_total", {}, 4)), 0,
         const(("gpuwatch_store_write_errors_total", {}, 4)), 11, {"severity": "critical"}),
    Case("GpuwatchRuleEvaluationFailures",
         const(("gpuwatch_rule_evaluation_failures_total", {"rule_group": "a.yml;g"}, 0)), 3,
         const(("gpuwatch_rule_evaluation_failures_total", {"rule_group": "a.yml;g"}, 1)), 0,
         const(("gpuwatch_rule_evaluation_failures_total", {"rule_group": "a.yml;g"}, 1)), 11,
         {"rule_group": "a.yml;g"}),
    Case("GpuwatchJobFailing", const(("gpuwatch_job_failures_total", {"task": "sample"}, 0)), 3,
         const(("gpuwatch_job_failures_total", {"task": "sample"}, 2)), 0,
         const(("gpuwatch_job_failures_total", {"task": "sample"}, 2)), 11, {"task": "sample"}),
    # caught up (the newest sent sample is the minute's), then stuck: 5 min behind at minute 9, firing 5 min later
    Case("RemoteWriteBehind", remote_write(caught_up=True), 3, remote_write(caught_up=False), 12,
         remote_write(caught_up=True), 1, {"severity": "warning", "remote_name": "hub"}, exact=False),
    Case("InferenceLatencyHigh", None, 0, const(("gpuwatch:inference_latency_seconds:p99", MODEL, 3.5)), 10,
         const(("gpuwatch:inference_latency_seconds:p99", MODEL, 0.8)), 1,
         {"severity": "warning", "model_name": "llama-3-8b", "engine": "vllm"}),
    Case("InferenceErrorRateHigh", None, 0, const(("gpuwatch:inference_error_ratio", MODEL, 0.05)), 5,
         const(("gpuwatch:inference_error_ratio", MODEL, 0.001)), 1,
         {"severity": "critical", "@summary": "llama-3-8b on 10.0.0.5:8000 fails 5% of requests"}),
    Case("InferenceQueueBacklog", None, 0, const(("gpuwatch:inference_queue_length", MODEL, 250)), 5,
         const(("gpuwatch:inference_queue_length", MODEL, 3)), 1, {"severity": "warning"}),
    Case("InferenceTTFTHigh", None, 0, const(("gpuwatch:inference_ttft_seconds:p99", MODEL, 2.5)), 10,
         const(("gpuwatch:inference_ttft_seconds:p99", MODEL, 0.2)), 1, {"severity": "warning"}),
    Case("InferenceKVCacheFull", None, 0, const(("gpuwatch:inference_kv_cache_usage_ratio", MODEL, 0.99)), 5,
         const(("gpuwatch:inference_kv_cache_usage_ratio", MODEL, 0.5)), 1, {"severity": "warning"}),
    Case("InferencePreemptions", const(("vllm:num_preemptions_total", {**MODEL, "engine": "0"}, 0)), 6,
         counter("vllm:num_preemptions_total", {**MODEL, "engine": "0"}, 30), 11,
         const(("vllm:num_preemptions_total", {**MODEL, "engine": "0"}, 330)), 6,
         {"model_name": "llama-3-8b", "instance": "10.0.0.5:8000"}, exact=False),
    Case("TrainingLossNaN", with_running(const(("training_loss", RUN, 2.0))), 2,
         const(("training_loss", RUN, math.nan)), 0, const(("training_loss", RUN, 1.9)), 1,
         {"severity": "critical", "run": "sft-1"}),
    Case("TrainingLossNotDecreasing", ramp_loss(3.0, 0.02), 70, with_running(const(("training_loss", RUN, 1.6))), 150,
         ramp_loss(1.7, 0.005), 1, {"run": "sft-1"}, exact=False),
    Case("TrainingGradNormExploding", with_running(const(("training_grad_norm", RUN, 1.0))), 70,
         with_running(const(("training_grad_norm", RUN, 40.0))), 1,
         with_running(const(("training_grad_norm", RUN, 1.0))), 5, {"run": "sft-1"}, exact=False),
    Case("TrainingThroughputDrop", with_running(const(("training_throughput_tokens_per_second", RUN, 1000))), 60,
         with_running(const(("training_throughput_tokens_per_second", RUN, 500))), 10,
         with_running(const(("training_throughput_tokens_per_second", RUN, 1000))), 1, {"run": "sft-1"}),
    Case("TrainingRunStalled",
         lambda m: [("gpuwatch_training_run_last_seen_timestamp_seconds", {"run": "sft-1"}, T0 + m * 60), *run_running(m)], 5,
         lambda m: [("gpuwatch_training_run_last_seen_timestamp_seconds", {"run": "sft-1"}, T0 + 4 * 60), *run_running(m)], 10,
         lambda m: [("gpuwatch_training_run_last_seen_timestamp_seconds", {"run": "sft-1"}, T0 + m * 60), *run_running(m)], 1,
         {"run": "sft-1"}, exact=False),
    Case("TrainingCheckpointSlow", const(("training_checkpoint_seconds", RUN, 120))   , 2,
         const(("training_checkpoint_seconds", RUN, 900)), 0, const(("training_checkpoint_seconds", RUN, 150)), 1,
         {"run": "sft-1", "@summary": "Training run sft-1 took 15m 0s to save a checkpoint"}),
    Case("TrainingCUDAOutOfMemory", None, 0, *log_event("cuda_oom")[:1], 0, log_event("cuda_oom")[1], 10,
         {"severity": "critical", "file": "/data/sft-1.log"}),
    Case("TrainingNCCLError", None, 0, *log_event("nccl_error")[:1], 0, log_event("nccl_error")[1], 10,
         {"severity": "critical"}),
    Case("TrainingPythonTraceback", None, 0, *log_event("traceback")[:1], 0, log_event("traceback")[1], 10,
         {"severity": "warning"}),
    Case("TrainingLogNaNLoss", None, 0, *log_event("nan_loss")[:1], 0, log_event("nan_loss")[1], 10,
         {"severity": "critical"}),
]  # fmt: skip


def test_every_builtin_alert_has_a_case() -> None:
    names = {r.name for g in load_builtin() for r in g.rules if r.kind == "alert"}
    assert names == {c.rule for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.rule for c in CASES])
def test_rule_fires_and_resolves(store: tuple[Store, FakeClock], case: Case) -> None:
    p = make_pack(store, case.rule)
    if case.setup is not None:
        p.run(case.setup_minutes, case.setup)
        assert p.firing() == [], f"{case.rule} fired before the trouble"
    if case.exact and case.fire_minutes > 0:
        p.run(case.fire_minutes, case.trouble)
        assert p.firing() == [], f"{case.rule} fired before its `for`"
        p.run(1, case.trouble)
    else:
        p.run(case.fire_minutes + 1, case.trouble)
    firing = p.firing()
    assert len(firing) == 1, f"{case.rule} did not fire: {p.alerts()} {p.errors()}"
    (alert,) = firing
    assert alert["alertname"] == case.rule
    assert {k: alert.get(k) for k in case.want} == case.want
    assert "<error" not in alert.get("@summary", "") + alert.get("@description", "")
    p.run(case.resolve_minutes + 1, case.recover)
    assert p.firing() == [], f"{case.rule} did not resolve: {p.alerts()}"
    assert p.errors() == []
