"""The text format we write is what prometheus_client's parser reads back."""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.core.model import MetricInfo, Sample, make_labels
from gpuwatch.promtext.writer import format_text, format_value


def test_round_trip_through_prometheus_client_parser() -> None:
    meta = {
        "DCGM_FI_DEV_GPU_UTIL": MetricInfo("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "%")
    }
    samples = [
        Sample(
            "DCGM_FI_DEV_GPU_UTIL",
            make_labels({"gpu": "0", "UUID": "GPU-1", "modelName": 'odd "name"\\x\n'}),
            97,
        ),
        Sample("DCGM_FI_DEV_GPU_UTIL", make_labels({"gpu": "1", "UUID": "GPU-2"}), 0.5),
        Sample("weird_value", (), float("nan")),
        Sample("weird_value", make_labels({"k": "v"}), float("inf")),
    ]
    text = format_text(samples, meta)
    assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
    families = list(text_string_to_metric_families(text))
    fams = {f.name: f for f in families}
    util = fams["DCGM_FI_DEV_GPU_UTIL"]
    assert util.type == "gauge" and util.documentation == "GPU utilization (in %)."
    by_gpu = {s.labels["gpu"]: s for s in util.samples}
    assert by_gpu["0"].labels["modelName"] == 'odd "name"\\x\n'
    assert by_gpu["0"].value == 97 and by_gpu["1"].value == 0.5
    weird = [s for f in families for s in f.samples if s.name == "weird_value"]
    assert any(math.isnan(s.value) for s in weird) and any(s.value == math.inf for s in weird)


def test_format_value() -> None:
    assert format_value(1.0) == "1"
    assert format_value(-2.5) == "-2.5"
    assert format_value(float("-inf")) == "-Inf"
    assert format_value(1e20) == "1e+20"
    assert format_value(0.1) == "0.1"


def test_empty() -> None:
    assert format_text([], {}) == ""
