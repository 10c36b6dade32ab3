"""Deterministic synthetic data for bench/bench_query.py: dcgm-exporter GPUs plus vLLM/inference metrics.

`generate(gpus, days)` returns a list of `Series` (name, label dict, int64 ms timestamps, float64 values),
grouped by metric name, every series sampled every 15 s (`step_ms`) over [T0_MS, T0_MS + days] (both ends).

GPU part (12 metrics per GPU, labels gpu, UUID, modelName, Hostname, pci_bus_id, instance, job):
utilisation moves in job phases of 20 min - 2 h (a third of them idle) with noise; memory in use follows
the phases, and every fourth GPU (gpu 1, 5, ...) runs jobs that fill 86-98% of its 80 GB, so
`FB_USED / FB_TOTAL > 0.9` holds part of the time; temperatures and power follow utilisation;
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION (mJ) integrates power; DCGM_FI_DEV_ECC_DBE_VOL_TOTAL is 0 except on
every sixteenth GPU (global index 3, 19, ...), which gets 3 double-bit errors a day at random times.

Inference part (2 models, the same at every size): per 15 s, Poisson request counts with a diurnal
rate (about 20 and 5 requests/s), 0.5% errors plus a 20-minute 20% error burst a day; latencies are
log-normal with a load-dependent median, and the cumulative histogram buckets are the expected counts
(rounded), so they are monotone in time and in `le`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

T0_MS = 1_793_491_200_000  # 2026-11-01T00:00:00Z
STEP_MS = 15_000
DAY_MS = 86_400_000
FB_TOTAL = 81_559.0

GPU_METRICS = [
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_TOTAL",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
]
MODELS = [("meta-llama/Llama-3.1-8B-Instruct", 20.0, 0.12), ("Qwen/Qwen2.5-72B-Instruct", 5.0, 0.45)]
INFERENCE_LE = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0]
VLLM_E2E_LE = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0]
FINISHED = [("stop", 0.9), ("length", 0.08), ("abort", 0.02)]


@dataclass(frozen=True)
class Series:
    name: str
    labels: dict[str, str]
    timestamps_ms: np.ndarray
    values: np.ndarray


def timestamps(days: float, step_ms: int = STEP_MS) -> np.ndarray:
    return np.arange(T0_MS, T0_MS + int(days * DAY_MS) + 1, step_ms, dtype=np.int64)


def _step_ms(t: np.ndarray) -> int:
    return int(t[1] - t[0]) if t.size > 1 else STEP_MS


def gpu_labels(g: int) -> dict[str, str]:
    node = f"node{g // 8:02d}"
    return {
        "gpu": str(g % 8),
        "UUID": f"GPU-{g:08x}-5f1e-4c3a-9b1d-{g * 7919:012x}",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": node,
        "pci_bus_id": f"00000000:{0x18 + 16 * (g % 8):02X}:00.0",
        "instance": f"{node}:9400",
        "job": "dcgm-exporter",
    }


def _phases(rng: np.random.Generator, n: int, step_ms: int) -> tuple[np.ndarray, np.ndarray]:
    """Return per-step phase level (utilisation %, 0 when idle) and a per-phase uniform draw."""
    scale = max(1, STEP_MS // step_ms)
    lens = rng.integers(80, 480, size=n // (80 * scale) + 2) * scale  # 20 min - 2 h
    busy = rng.random(lens.size) > 1 / 3
    level = np.where(busy, rng.uniform(35, 100, lens.size), 0.0)
    draw = rng.random(lens.size)
    return np.repeat(level, lens)[:n], np.repeat(draw, lens)[:n]


def gpu_series(g: int, t: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng([7, g])
    n = t.size
    level, draw = _phases(rng, n, _step_ms(t))
    busy = level > 0
    util = np.clip(np.round(level + np.where(busy, rng.normal(0, 4, n), 0)), 0, 100)
    copy = np.clip(np.round(util * 0.4 + np.where(busy, rng.normal(0, 3, n), 0)), 0, 100)
    hot = g % 4 == 1
    lo, hi = (0.86, 0.98) if hot else (0.30, 0.85)
    frac = np.where(busy, lo + (hi - lo) * draw, 0.006)
    used = np.round(frac * FB_TOTAL + np.where(busy, rng.normal(0, 150, n), 0))
    used = np.clip(used, 0, FB_TOTAL - 400)
    temp = np.round(32 + util * 0.45 + rng.normal(0, 0.7, n))
    mem_temp = np.round(36 + util * 0.35 + rng.normal(0, 0.7, n))
    power = np.round(72 + util * 6.2 + np.where(busy, rng.normal(0, 12, n), rng.normal(0, 1, n)), 2)
    sm = np.where(util > 5, 1980.0, 345.0)
    energy = 4.0e9 + g * 1.37e8 + np.floor(np.cumsum(power * _step_ms(t)))
    ecc = np.zeros(n)
    if g % 16 == 3:
        days = max(1, round((t[-1] - t[0]) / DAY_MS))
        for at in np.sort(rng.integers(n // 20, n, size=3 * days)):
            ecc[at:] += 1
    return {
        "DCGM_FI_DEV_GPU_UTIL": util,
        "DCGM_FI_DEV_MEM_COPY_UTIL": copy,
        "DCGM_FI_DEV_FB_USED": used,
        "DCGM_FI_DEV_FB_FREE": FB_TOTAL - used,
        "DCGM_FI_DEV_FB_TOTAL": np.full(n, FB_TOTAL),
        "DCGM_FI_DEV_GPU_TEMP": temp,
        "DCGM_FI_DEV_MEMORY_TEMP": mem_temp,
        "DCGM_FI_DEV_POWER_USAGE": power,
        "DCGM_FI_DEV_SM_CLOCK": sm,
        "DCGM_FI_DEV_MEM_CLOCK": np.full(n, 2619.0),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ecc,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": energy,
    }


def _norm_cdf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 for erf (|error| < 1.5e-7), vectorised.
    z = np.abs(x) / math.sqrt(2.0)
    k = 1.0 / (1.0 + 0.3275911 * z)
    poly = k * (0.254829592 + k * (-0.284496736 + k * (1.421413741 + k * (-1.453152027 + k * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


def _histogram(
    name: str, labels: dict[str, str], t: np.ndarray, n: np.ndarray, median: np.ndarray, les: list[float]
) -> Iterator[Series]:
    sigma = 0.6
    total = np.cumsum(n)
    for le in les:
        frac = _norm_cdf((math.log(le) - np.log(median)) / sigma)
        yield Series(f"{name}_bucket", {**labels, "le": repr(le)}, t, np.round(np.cumsum(n * frac)))
    yield Series(f"{name}_bucket", {**labels, "le": "+Inf"}, t, total.astype(np.float64))
    mean = median * math.exp(sigma * sigma / 2)
    yield Series(f"{name}_sum", labels, t, np.round(np.cumsum(n * mean), 3))
    yield Series(f"{name}_count", labels, t, total.astype(np.float64))


def inference_series(t: np.ndarray) -> list[Series]:
    out: list[Series] = []
    hist_inf: list[Series] = []
    hist_vllm: list[Series] = []
    success: list[Series] = []
    req: list[Series] = []
    err: list[Series] = []
    day_phase = 2 * np.pi * ((t - T0_MS) % DAY_MS) / DAY_MS
    step = _step_ms(t)
    burst = 20 * 60_000 // step  # a 20-minute error burst a day
    for m, (model, rate, median) in enumerate(MODELS):
        rng = np.random.default_rng([11, m])
        load = 1.0 + 0.6 * np.sin(day_phase - np.pi / 2 + m)
        n = rng.poisson(rate * load * step / 1000).astype(np.float64)
        n[0] = 0.0
        p_err = np.full(t.size, 0.005)
        for d in range(0, t.size, DAY_MS // step):
            at = d + int(rng.integers(0, DAY_MS // step - burst))
            p_err[at : at + burst] = 0.2
        errors = rng.binomial(n.astype(np.int64), np.minimum(p_err, 1.0)).astype(np.float64)
        lat = median * (0.7 + 0.5 * load) * np.exp(rng.normal(0, 0.05, t.size))
        inf_labels = {"model_name": model, "instance": "router:9000", "job": "inference"}
        vllm_labels = {"model_name": model, "instance": f"vllm-{m}:8000", "job": "vllm"}
        hist_inf += _histogram("inference_latency_seconds", inf_labels, t, n, lat, INFERENCE_LE)
        hist_vllm += _histogram("vllm:e2e_request_latency_seconds", vllm_labels, t, n, lat * 12, VLLM_E2E_LE)
        total = np.cumsum(n)
        for reason, share in FINISHED:
            success.append(
                Series(
                    "vllm:request_success_total",
                    {**vllm_labels, "finished_reason": reason},
                    t,
                    np.floor(total * share),
                )
            )
        req.append(Series("requests_total", inf_labels, t, total))
        err.append(Series("errors_total", inf_labels, t, np.cumsum(errors)))
    for group in (hist_inf, hist_vllm, success, req, err):
        out += sorted(group, key=lambda s: s.name)  # stable: keeps model, then le order
    return out


def generate(gpus: int, days: float, step_ms: int = STEP_MS) -> list[Series]:
    """All series of the data set, grouped by metric name, a sample every `step_ms`."""
    t = timestamps(days, step_ms)
    per_gpu = [gpu_series(g, t) for g in range(gpus)]
    out = [Series(name, gpu_labels(g), t, per_gpu[g][name]) for name in GPU_METRICS for g in range(gpus)]
    return out + inference_series(t)


def _fmt(values: np.ndarray) -> list[str] | list[int]:
    if np.all(values == np.round(values)) and np.all(np.abs(values) < 2**53):
        return values.astype(np.int64).tolist()  # type: ignore[no-any-return]
    return values.tolist()  # type: ignore[no-any-return]


def _label_text(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def text_lines(s: Series, *, seconds: bool) -> str:
    """One series as exposition lines `name{labels} value timestamp` (seconds or milliseconds)."""
    prefix = f"{s.name}{{{_label_text(s.labels)}}} "
    ts = (s.timestamps_ms // 1000).tolist() if seconds else s.timestamps_ms.tolist()
    return "".join([f"{prefix}{v} {t}\n" for v, t in zip(_fmt(s.values), ts, strict=True)])


def write_openmetrics(series: list[Series], path: str) -> int:
    """Write OpenMetrics text (timestamps in seconds, `# EOF`) for promtool; return bytes written."""
    size = 0
    with open(path, "w", encoding="utf-8") as f:
        for s in series:
            size += f.write(text_lines(s, seconds=True))
        size += f.write("# EOF\n")
    return size
