"""The exposition parser over public test corpora: the OpenMetrics parser suite and prometheus/common's
expfmt data (vendored under tests/data/, see tests/data/README.md for where from and which commit).

Valid inputs parse without an invalid line and to the expected names, labels, values and timestamps
(for OpenMetrics: what prometheus_client's OpenMetrics parser reads, which passes the whole suite).
Invalid inputs are reported as invalid lines, except the listed ones whose fault is in what a value
means for its type or in a family's shape rather than in a line's syntax: gpuwatch keeps their samples.
Nothing raises.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families

from gpuwatch.promtext.parser import parse
from gpuwatch.promtext.result import ParseResult

DATA = Path(__file__).parent / "data"
OM = DATA / "openmetrics-parsers"
EXPFMT = DATA / "expfmt"

OM_CASES = sorted(p.name for p in OM.iterdir() if p.is_dir())

# Invalid OpenMetrics that gpuwatch stores anyway: the fault is in what a value means for its type or
# in a family's shape (missing buckets, order across lines), or metadata without its text, not in the
# syntax of a sample line. Prometheus would reject the whole scrape; gpuwatch keeps what the lines say.
OM_ACCEPTED_INVALID = {
    "bad_clashing_names_2": "TYPE a_created next to counter a (no samples)",
    "bad_counter_values_0": "NaN counter",
    "bad_counter_values_1": "negative counter",
    "bad_counter_values_2": "NaN histogram _sum",
    "bad_exemplars_on_unallowed_metric_types_0": "exemplar on a gauge",
    "bad_exemplars_on_unallowed_metric_types_1": "exemplar on an info",
    "bad_exemplars_on_unallowed_metric_types_2": "exemplar on a stateset",
    "bad_exemplars_on_unallowed_samples_0": "exemplar on a histogram _sum",
    "bad_exemplars_on_unallowed_samples_1": "exemplar on a gaugehistogram _sum",
    "bad_exemplars_on_unallowed_samples_2": "exemplar on a gauge named like a bucket",
    "bad_grouping_or_ordering_0": "one histogram's series interleaved",
    "bad_grouping_or_ordering_2": "gaugehistogram series interleaved",
    "bad_help_2": "HELP without text",
    "bad_histograms_0": "histogram without buckets",
    "bad_histograms_1": "histogram with _sum but no _count",
    "bad_histograms_2": "histogram with _count but no _sum",
    "bad_info_and_stateset_values_0": "info value 2",
    "bad_info_and_stateset_values_1": "stateset value 2",
    "bad_missing_or_invalid_labels_for_a_type_0": "summary sample without quantile",
    "bad_missing_or_invalid_labels_for_a_type_1": "summary quantile -1",
    "bad_stateset_info_values_0": "stateset value 2",
    "bad_stateset_info_values_1": "info value 2",
    "bad_stateset_info_values_2": "stateset value 2.0",
    "bad_unit_2": "UNIT without text",
}


def case(name: str) -> tuple[bytes, bool]:
    spec = json.loads((OM / name / "test.json").read_text())
    assert spec["type"] == "text"
    return (OM / name / spec["file"]).read_bytes(), bool(spec["shouldParse"])


def same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def test_the_vendored_subset_is_there() -> None:
    valid = [n for n in OM_CASES if case(n)[1]]
    assert len(valid) == 44 and len(OM_CASES) - len(valid) >= 70
    assert set(OM_ACCEPTED_INVALID) <= set(OM_CASES)
    assert (OM / "LICENSE").exists() and (EXPFMT / "LICENSE").exists() and (EXPFMT / "NOTICE").exists()


@pytest.mark.parametrize("name", OM_CASES)
def test_openmetrics_suite(name: str) -> None:
    data, should_parse = case(name)
    result = parse(data, openmetrics=True)
    if not should_parse:
        if name in OM_ACCEPTED_INVALID:
            assert result.errors == [], "now reported: take it off OM_ACCEPTED_INVALID"
        else:
            assert result.errors, f"{name} should be reported as invalid"
            assert all(e.line_no >= 1 and e.message for e in result.errors)
        return
    assert result.errors == []
    assert result.is_openmetrics
    want = [
        (s.name, dict(s.labels), float(s.value), s.timestamp)
        for family in om_families(data.decode())
        for s in family.samples
    ]
    got = [(n, dict(labels), v, ts) for n, labels, ts, v in result.samples]
    if name.startswith("duplicate_timestamps"):
        # prometheus_client drops a repeated series silently; gpuwatch keeps every line.
        assert len(got) == 5 and [v for *_, v, _ in got] == [1, 2, 3, 4, 5]
        return
    assert [(n, labels) for n, labels, _, _ in got] == [(n, labels) for n, labels, _, _ in want]
    for (n, _, value, ts), (_, _, want_value, want_ts) in zip(got, want, strict=True):
        assert same(value, want_value), (n, value, want_value)
        if want_ts is None:
            assert ts is None, n
        else:
            assert ts == pytest.approx(float(want_ts) * 1000, rel=1e-12), (n, ts, want_ts)


def test_openmetrics_spot_checks() -> None:
    def sample(name: str, metric: str, **labels: str) -> tuple[int | None, float]:
        result = parse(case(name)[0], openmetrics=True)
        (hit,) = [(ts, v) for n, lab, ts, v in result.samples if n == metric and dict(lab) == labels]
        return hit

    assert sample("label_escaping", "a7_total", foo="\\\n", bar="baz") == (None, 1.0)
    assert sample("label_escaping", "a9_total", foo='\\"', bar="baz") == (None, 1.0)
    assert sample("uint64_counter", "a_total") == (None, 9223372036854775808.0)
    assert sample("timestamps", "b_total") == (1_234_567_890_000, 2.0)
    assert sample("timestamps", "a_total", foo="5") == (1_500_000, 1.0)
    data = case("help_escaping")[0]
    helps = [m.help for m in parse(data, openmetrics=True).metadata.values()]
    assert helps == [f.documentation for f in om_families(data.decode())]
    assert helps[:5] == ["foo", "\\foo", "\\foo", "foo\\", "\\"]  # `\\foo` is `\foo`


# -- prometheus/common expfmt -------------------------------------------------------------------------

FUZZ_VALID = ["from_test_parse_0", "from_test_parse_1", "from_test_parse_2", "from_test_parse_3",
              "from_test_parse_4", "minimal"]  # fmt: skip
FUZZ_ERRORS = sorted(
    p.name for p in (EXPFMT / "fuzz").iterdir() if p.name.startswith("from_test_parse_error")
)
# Inputs Prometheus's Go parser rejects and gpuwatch takes: the last line without its newline, and an
# unknown escape in a label value (kept as written, as prometheus_client does).
EXPFMT_LENIENT = {"from_test_parse_error_0": ("bla", {}, 3.14), "from_test_parse_error_1": ("metric", {"label": "\\t"}, 3.14)}  # fmt: skip


def fuzz(name: str) -> ParseResult:
    return parse((EXPFMT / "fuzz" / name).read_bytes(), openmetrics=False)


@pytest.mark.parametrize("name", FUZZ_VALID)
def test_expfmt_valid_inputs_have_no_invalid_lines(name: str) -> None:
    assert fuzz(name).errors == []


def test_expfmt_valid_inputs_values() -> None:
    got = [(n, dict(lab), ts, v) for n, lab, ts, v in fuzz("from_test_parse_1").samples]
    assert got == [
        ("minimal_metric", {}, None, 1.234),
        ("another_metric", {}, 103948, -3000.0),
        ("no_labels", {}, None, 3.0),
    ]
    two = fuzz("from_test_parse_2")
    assert [(n, dict(lab), ts) for n, lab, ts, _ in two.samples] == [
        ("name", {"labelname": "val1", "basename": "basevalue"}, None),
        ("name", {"labelname": "val2", "basename": 'base"v\\al\nue'}, 1234567890),
        ("name2", {"labelname": "val2", "basename": "basevalue2"}, 54321),
        ("name2", {"labelname": "val1"}, None),
    ]
    assert math.isnan(two.samples[0][3]) and [s[3] for s in two.samples[1:]] == [0.23, math.inf, -math.inf]
    assert two.metadata["name"].type == "counter" and two.metadata["name"].help == "two-line\n doc  str\\ing"
    assert two.metadata["name2"].type == "gauge" and two.metadata["name2"].help == 'doc str"ing 2'
    three = fuzz("from_test_parse_3")
    assert len(three.samples) == 12 and three.metadata["my_summary"].type == "summary"
    assert ("my_summary_sum", (("n1", "val2"),), 15, 8.0) in three.samples  # "08" is 8
    assert ("decoy", (), -2, -1.0) in three.samples
    four = fuzz("from_test_parse_4")
    buckets = [(dict(lab)["le"], v) for n, lab, _, v in four.samples if n.endswith("_bucket")]
    assert buckets == [("100", 123), ("120", 412), ("144", 592), ("172.8", 1524), ("+Inf", 2693)]
    assert four.metadata["request_duration_microseconds"].type == "histogram"


@pytest.mark.parametrize("name", FUZZ_ERRORS)
def test_expfmt_invalid_inputs_are_reported(name: str) -> None:
    result = fuzz(name)
    if name in EXPFMT_LENIENT:
        metric, labels, value = EXPFMT_LENIENT[name]
        assert result.errors == [] and [(n, dict(lab), v) for n, lab, _, v in result.samples] == [
            (metric, labels, value)
        ]
    else:
        assert result.errors, f"{name} should be reported as invalid"


def test_expfmt_realistic_page() -> None:
    text = (EXPFMT / "text").read_bytes()
    result = parse(text)
    assert result.errors == [] and not result.is_openmetrics
    assert result.lines == 322 and len(result.samples) == 248 and len(result.metadata) == 37
    types = {m.type for m in result.metadata.values()}
    assert types == {"counter", "gauge", "summary"}
    quantiles = [
        dict(lab)["quantile"] for n, lab, _, _ in result.samples if n == "http_request_duration_microseconds"
    ]
    assert quantiles and set(quantiles) == {"0.5", "0.9", "0.99"}
