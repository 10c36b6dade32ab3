"""The training pages' data: TensorBoard smoothing (debiased, spikes kept), run states, one run's
curves, checkpoints, GPUs and log events, through a real store and the JSON twins."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flask.testing import FlaskClient

from gpuwatch.app.runtime import Runtime
from gpuwatch.collect.logs import detect_event
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, LogLine, Sample, stable_labels
from gpuwatch.web.dash import trainingdata
from gpuwatch.web.dash.smoothing import ema, reduce_indices, smooth_and_reduce
from gpuwatch.web.dash.trainingdata import gpu_matchers, parse_compare, run_state


def tensorboard_ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard's smoothing as its scalar dashboard writes it (vz_line_chart's resmoothDataset)."""
    last, n, out = 0.0, 0, []
    for v in values:
        if not math.isfinite(v):
            out.append(v)
            continue
        last = last * weight + (1 - weight) * v
        n += 1
        out.append(last / (1 - weight**n))
    return out


def test_ema_is_debiased_and_matches_tensorboard() -> None:
    values = [10.0, 8.0, 9.0, 4.0, 5.0, float("nan"), 3.0]
    got = ema(values, 0.6)
    assert got[0] == pytest.approx(10.0)  # debiased: the first point is itself, not 0.4 * 10
    want = tensorboard_ema(values, 0.6)
    for a, b in zip(got, want, strict=True):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)
    assert math.isnan(got[5])  # a NaN loss stays visible and does not poison what follows
    assert math.isfinite(got[6])


def test_ema_weight_zero_is_the_raw_curve_and_a_constant_stays_constant() -> None:
    assert list(ema([3.0, 1.0, 2.0], 0.0)) == [3.0, 1.0, 2.0]
    assert list(ema([2.5] * 5, 0.99)) == [2.5] * 5
    with pytest.raises(ValueError, match="weight"):
        ema([1.0], 1.0)


def test_spike_survives_reduction_in_raw_and_smoothed() -> None:
    n = 100_000
    v = np.full(n, 2.0) + np.sin(np.arange(n) / 500.0) * 0.1
    v[54_321] = 50.0  # a one-step loss spike
    full = ema(v, 0.6)
    idx, smoothed = smooth_and_reduce(v, 0.6, max_points=1000)
    assert len(idx) <= 1000
    assert 54_321 in idx  # the raw spike is kept
    assert max(smoothed) == pytest.approx(full.max())  # the smoothed bump is its full-resolution height
    # smoothing after reducing would have missed it: the reduced-then-smoothed peak is lower
    stride = v[:: n // 1000]
    assert ema(stride, 0.6).max() < full.max() - 1


def test_reduce_keeps_short_series_whole_and_first_last() -> None:
    assert list(reduce_indices(np.arange(10.0), 100)) == list(range(10))
    idx = reduce_indices(np.arange(10_000.0), 100)
    assert idx[0] == 0 and idx[-1] == 9_999 and len(idx) <= 100


@pytest.mark.parametrize(
    ("status", "stalled", "state"),
    [
        ("running", False, "running"),
        ("running", True, "stalled"),
        ("ok", False, "finished"),
        ("failed", False, "failed"),
    ],
)
def test_run_state(status: str, stalled: bool, state: str) -> None:
    assert run_state({"status": status, "is_stalled": stalled}) == state


def test_events_and_gpu_matchers_and_compare() -> None:
    assert detect_event("RuntimeError: CUDA out of memory. Tried to allocate 2 GiB") == "cuda_oom"
    assert detect_event("host:123 NCCL WARN NET/IB : Got completion with error") == "nccl_error"
    assert detect_event("step 10 loss: nan") == "nan_loss"
    assert detect_event("step 10 loss 2.31") is None
    assert gpu_matchers({"gpus": ["0", "3"], "hosts": ["node-1"]}) == 'Hostname=~"node\\\\-1", gpu=~"0|3"'
    assert gpu_matchers({"gpus": ["GPU-ab"], "hosts": []}) == 'UUID=~"GPU\\\\-ab"'
    assert gpu_matchers({"gpus": [], "hosts": ["x"]}) == 'Hostname=~"x"'  # every GPU of the run's host
    assert gpu_matchers({"gpus": [], "hosts": []}) is None
    assert parse_compare("b, a,,c,b", "a") == ["a", "b", "c"]


def _push_run(
    client: FlaskClient, clock: FakeClock, run: str, steps: int, spike_at: int | None = None
) -> None:
    r = client.post(
        "/api/v1/runs",
        json={"run": run, "action": "init", "total_steps": steps * 2, "host": "node-1", "gpus": [0, 1]},
    )
    assert r.status_code == 200, r.get_data(as_text=True)
    body = []
    t0 = clock.now()
    for i in range(steps):
        loss = 4.0 - i * 0.001
        if i == spike_at:
            loss = 40.0
        metrics = {"loss": loss, "lr": 3e-4, "grad_norm": 1.0, "tokens_per_second": 1000.0}
        if i == 100:
            metrics["checkpoint_seconds"] = 12.5
        body.append({"run": run, "step": i, "time": t0 + i, "metrics": metrics})
    r = client.post("/api/v1/push", json=body)
    assert r.status_code == 200, r.get_data(as_text=True)
    clock.advance(steps)


def test_run_page_json_has_full_resolution_smoothed_curves(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    _push_run(client, clock, "sft-a", 3000, spike_at=1234)
    _push_run(client, clock, "sft-b", 50)
    runtime.store.append_log_lines(
        [LogLine(clock.now_ms() - 5000, "/x.log", "sft-a", "ERROR", "RuntimeError: CUDA out of memory.")], []
    )
    runtime.store.flush()
    r = client.get("/api/ui/training/sft-a?smoothing=0.9&max_points=500&compare=sft-b")
    assert r.status_code == 200, r.get_data(as_text=True)
    data = r.get_json()["data"]
    run = data["runs"][0]
    loss = run["curves"]["loss"]
    assert loss["points"] == 3000 and loss["reduced"] and len(loss["t"]) <= 500
    assert 40.0 in loss["raw"]  # the spike is in the reduced raw line
    assert loss["step"][0] == 0 and loss["step"][-1] == 2999
    full = ema([4.0 - i * 0.001 if i != 1234 else 40.0 for i in range(3000)], 0.9)
    assert max(v for v in loss["smoothed"] if v is not None) == pytest.approx(full.max())
    assert run["checkpoints"] == [{"t": run["checkpoints"][0]["t"], "step": 100.0, "seconds": 12.5}]
    assert run["run"]["state"] == "running" and run["run"]["progress"] == pytest.approx(2999 / 6000)
    assert run["gpus"]["source"] == "run" and run["gpus"]["matchers"] == 'Hostname=~"node\\\\-1", gpu=~"0|1"'
    assert [x["run"]["run"] for x in data["runs"]] == ["sft-a", "sft-b"]
    assert [e["event"] for e in run["logs"]["events"]] == ["cuda_oom"]
    assert [x["event"] for x in client.get("/api/v1/logs?run=sft-a").get_json()["data"]] == ["cuda_oom"]
    assert client.get("/api/ui/training/nope").status_code == 404
    assert client.get("/api/ui/training/sft-a?smoothing=1.5").status_code == 400


def test_runs_list_json_states(runtime: Runtime, client: FlaskClient, clock: FakeClock) -> None:
    _push_run(client, clock, "done", 10)
    client.post("/api/v1/runs", json={"run": "done", "action": "finish", "status": "failed", "step": 9})
    _push_run(client, clock, "live", 10)
    runtime.store.flush()
    rows = {r["run"]: r for r in client.get("/api/ui/training").get_json()["data"]["runs"]}
    assert rows["done"]["state"] == "failed"
    assert rows["live"]["state"] == "running"
    assert rows["live"]["last_loss"] == pytest.approx(4.0 - 9 * 0.001)
    clock.advance(11 * 60)
    rows = {r["run"]: r for r in client.get("/api/ui/training").get_json()["data"]["runs"]}
    assert rows["live"]["state"] == "stalled"


def test_a_huge_range_keeps_the_newest_raw_points(
    client: FlaskClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trainingdata, "MAX_RAW_POINTS", 1000)
    _push_run(client, clock, "long", 3000)
    loss = client.get("/api/ui/training/long").get_json()["data"]["runs"][0]["curves"]["loss"]
    assert loss["skipped_before"] == 2000 and loss["points"] == 1000 and loss["step"][0] == 2000


def test_a_run_gpu_info_series_names_the_gpus(
    runtime: Runtime, client: FlaskClient, clock: FakeClock
) -> None:
    _push_run(client, clock, "sdk-run", 10)
    labels = stable_labels({"run": "sdk-run", "Hostname": "node-7", "gpu": "3", "UUID": "GPU-33"})
    runtime.store.append(Batch(clock.now_ms(), [Sample("gpuwatch_run_gpu_info", labels, 1.0)]))
    runtime.store.flush()
    gpus = client.get("/api/ui/training/sdk-run").get_json()["data"]["runs"][0]["gpus"]
    assert gpus["source"] == "info" and gpus["gpus"] == ["GPU-33"] and gpus["hostname"] == "node-7"
    assert gpus["matchers"] == 'Hostname=~"node\\\\-7", UUID=~"GPU\\\\-33"'
