"""The exposition parser: small valid and invalid cases, the prometheus_client traps, format guessing."""

from __future__ import annotations

import math

import pytest

from gpuwatch.promtext.formats import is_openmetrics_content_type, looks_like_openmetrics
from gpuwatch.promtext.parser import Parser, parse
from gpuwatch.promtext.result import FamilyMeta


def samples(text: str | bytes, **kw: object) -> list[tuple]:
    result = parse(text, **kw)  # type: ignore[arg-type]
    assert result.errors == [], result.errors
    return result.samples


def errors(text: str | bytes, **kw: object) -> list[tuple[int, str]]:
    return [(e.line_no, e.message) for e in parse(text, **kw).errors]  # type: ignore[arg-type]


# -- valid text format ---------------------------------------------------------------------------------


def test_plain_and_labelled_samples() -> None:
    text = '# HELP g A gauge.\n# TYPE g gauge\ng 1\ng{b="2",a="1"} 2.5\n'
    assert samples(text) == [("g", (), None, 1.0), ("g", (("a", "1"), ("b", "2")), None, 2.5)]


def test_label_escapes_decoded_other_bytes_raw() -> None:
    text = 'm{a="q\\"uote",b="back\\\\slash",c="new\\nline",d="tab\\tx",e="cr\rx",f="\u2028",g="}{,# x"} 1\n'
    [(_, labels, _, _)] = samples(text)
    assert dict(labels) == {
        "a": 'q"uote',
        "b": "back\\slash",
        "c": "new\nline",
        "d": "tab\\tx",  # unknown escapes are kept as written, as Prometheus's scraper does
        "e": "cr\rx",
        "f": "\u2028",
        "g": "}{,# x",
    }


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("NaN", math.nan),
        ("nan", math.nan),
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
        ("Inf", math.inf),
        ("inf", math.inf),
        ("+Infinity", math.inf),
        ("-infinity", -math.inf),
        ("1", 1.0),
        ("-0", -0.0),
        ("1.", 1.0),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("1.5E-3", 0.0015),
        ("18446744073709551615", 18446744073709551615.0),
        ("0.00015000000000000001", 0.00015000000000000001),
    ],
)
def test_values_as_go_parses_them(token: str, expected: float) -> None:
    [(_, _, _, value)] = samples(f"m {token}\n")
    assert isinstance(value, float)
    assert (math.isnan(value) and math.isnan(expected)) or value == expected


@pytest.mark.parametrize(
    "token", ["0x10", "1_000", "0x1p3", "1e", "abc", "+nan", "1e999", "--1", "1,5", "Infinit"]
)
def test_values_go_rejects(token: str) -> None:
    assert errors(f"ok 1\nm {token}\nok 2\n") == [(2, errors(f"ok 1\nm {token}\n")[0][1])]
    assert len(parse(f"ok 1\nm {token}\nok 2\n").samples) == 2


def test_timestamps_are_int_milliseconds_in_text() -> None:
    assert samples("m 1 1700000000123\nm 2 -5\n") == [("m", (), 1700000000123, 1.0), ("m", (), -5, 2.0)]
    assert errors("m 1 1700000000.5\n") == [
        (1, "invalid timestamp '1700000000.5': expected integer milliseconds")
    ]


def test_default_timestamp_applies_only_to_samples_without_one() -> None:
    got = samples("a 1\nb 2 5\n", default_timestamp_ms=99)
    assert [s[2] for s in got] == [99, 5]


def test_blanks_tabs_trailing_comma_and_empty_braces() -> None:
    text = 'g\t{ a = "1" , }\t5\n  h {} 6  \nk{a="1"}7\n\n   \n'
    assert samples(text) == [
        ("g", (("a", "1"),), None, 5.0),
        ("h", (), None, 6.0),
        ("k", (("a", "1"),), None, 7.0),
    ]


def test_crlf_tolerated_in_text_format() -> None:
    text = '# HELP m help\r\n# TYPE m counter\r\nm{a="1"} 3\r\nm 4 1000\r\n'
    result = parse(text)
    assert result.errors == []
    assert result.samples == [("m", (("a", "1"),), None, 3.0), ("m", (), 1000, 4.0)]
    assert result.metadata["m"] == FamilyMeta("m", "counter", "help")


def test_utf8_bom_at_start_is_skipped() -> None:
    assert samples("\ufeffm 1\n".encode()) == [("m", (), None, 1.0)]


def test_no_final_newline_is_fine() -> None:
    assert samples("m 1") == [("m", (), None, 1.0)]


def test_quoted_utf8_names() -> None:
    text = '# TYPE "my.metric" gauge\n{"my.metric", "my.label"="x", a="1"} 1\n{"only.name"} 2\n'
    result = parse(text)
    assert result.errors == []
    assert result.samples == [
        ("my.metric", (("a", "1"), ("my.label", "x")), None, 1.0),
        ("only.name", (), None, 2.0),
    ]
    assert result.metadata["my.metric"].type == "gauge"


def test_help_escapes_and_plain_comments() -> None:
    text = '# just a comment\n# HELP m a \\\\ b\\nc "q"\n#TYPE m gauge\nm 1\n'
    result = parse(text)
    assert result.errors == []
    assert result.metadata["m"] == FamilyMeta("m", "gauge", 'a \\ b\nc "q"')


def test_help_after_samples_is_fine_in_text() -> None:
    result = parse("m 1\n# HELP m late help\n")
    assert result.errors == []
    assert result.metadata["m"].help == "late help"


# -- invalid lines: reported with their line number, the rest still parsed ----------------------------


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1abc 1", "invalid metric name"),
        ('@x{a="b"} 1', "invalid metric name"),
        ("m", "missing value"),
        ('m{a="1"}', "missing value"),
        ('m{a="1",a="2"} 1', "duplicate label name 'a'"),
        ('m{__name__="x"} 1', "label name '__name__' is reserved"),
        ('m{1a="x"} 1', "invalid label name"),
        ('m{a="x} 1', "unterminated"),
        ('m{a="x"', "unterminated"),
        ("m{a=x} 1", "expected '\"'"),
        ('m{a="1" b="2"} 1', "expected ',' or '}'"),
        ("m{,} 1", "invalid label name"),
        ("m 1 2 3", "unexpected text after the timestamp"),
        ('m 1 # {trace_id="a"} 0.5 123', "exemplars"),
        ("m 1 abc", "invalid timestamp"),
        ("m 1 99999999999999999999", "timestamp out of range"),
    ],
)
def test_invalid_sample_lines(line: str, message: str) -> None:
    result = parse(f"# TYPE ok gauge\nok 1\n{line}\nok 2\n")
    assert [e.line_no for e in result.errors] == [3], result.errors
    assert message in result.errors[0].message
    assert result.errors[0].line == line
    assert [s[3] for s in result.samples] == [1.0, 2.0]


def test_every_bad_line_is_reported() -> None:
    text = "a 1\nb x\nc 2\nd{ 3\ne 4\n5 f\n"
    assert [n for n, _ in errors(text)] == [2, 4, 6]


def test_bad_utf8_line_is_an_error_and_others_survive() -> None:
    data = b'a 1\nb{x="\xff\xfe"} 2\nc 3\n'
    result = parse(data)
    assert [(e.line_no, e.message) for e in result.errors] == [(2, "not valid UTF-8")]
    assert [s[0] for s in result.samples] == ["a", "c"]


def test_long_line_text_is_truncated_in_issue() -> None:
    line = 'm{a="' + "x" * 1000 + '"} oops'
    [issue] = parse(line + "\n").errors
    assert issue.line.endswith("...") and len(issue.line) < 300


@pytest.mark.parametrize(
    ("text", "line_no", "message"),
    [
        ("# TYPE m gauge\n# TYPE m counter\nm 1\n", 2, "second TYPE line for metric name 'm'"),
        ("m 1\n# TYPE m gauge\n", 2, "TYPE line for metric name 'm' after its samples"),
        ('h_bucket{le="1"} 1\n# TYPE h histogram\n', 2, "after its samples"),
        ("# TYPE m gauges\nm 1\n", 1, "unknown metric type 'gauges'"),
        ("# TYPE m unknown\nm 1\n", 1, "unknown metric type"),
        ("# TYPE m\nm 1\n", 1, "unknown metric type ''"),
        ("# HELP m one\n# HELP m two\nm 1\n", 2, "second HELP line"),
        ("# HELP 1m x\n", 1, "without a valid metric name"),
        ('# TYPE h histogram\nh_bucket{le="bla"} 1\nh_sum 1\n', 2, "histogram bucket without a float 'le'"),
        ("# TYPE h histogram\nh_bucket 1\n", 2, "histogram bucket without a float 'le'"),
        ('# TYPE s summary\ns{quantile="x"} 1\n', 2, "'quantile' label that is not a float"),
    ],
)
def test_invalid_metadata(text: str, line_no: int, message: str) -> None:
    got = errors(text)
    assert len(got) == 1 and got[0][0] == line_no and message in got[0][1], got


def test_histogram_le_spellings_accepted() -> None:
    text = (
        "# TYPE h histogram\n"
        'h_bucket{le="1"} 1\nh_bucket{le="1.0"} 1\nh_bucket{le="0.00015000000000000001"} 1\n'
        'h_bucket{le="+Inf"} 2\nh_sum 3\nh_count 2\n'
    )
    assert len(samples(text)) == 6


# -- the prometheus_client traps (METRICS.md 5.2): names and values exactly as exposed -------------------


def test_counter_without_total_keeps_its_name() -> None:
    text = (
        "# HELP tgi_request_count Requests\n# TYPE tgi_request_count counter\ntgi_request_count 3\n"
        '# TYPE DCGM_FI_DEV_XID_ERRORS counter\nDCGM_FI_DEV_XID_ERRORS{gpu="0"} 0\n'
    )
    result = parse(text)
    assert [s[0] for s in result.samples] == ["tgi_request_count", "DCGM_FI_DEV_XID_ERRORS"]
    assert result.metadata["tgi_request_count"].type == "counter"


def test_untyped_series_stay_one_family() -> None:
    result = parse('u{a="1"} 1\nu{a="2"} 2\n# TYPE v untyped\nv 3\n')
    assert result.errors == []
    assert [s[0] for s in result.samples] == ["u", "u", "v"]
    assert result.metadata == {"v": FamilyMeta("v", "unknown")}


def test_om_exemplar_is_not_a_timestamp() -> None:
    text = '# TYPE c counter\nc_total 3 # {trace_id="abc"} 0.5 123\n# EOF\n'
    result = parse(text, keep_exemplars=True)
    assert result.errors == []
    assert result.samples == [("c_total", (), None, 3.0)]
    [ex] = result.exemplars
    assert (ex.sample_index, ex.labels, ex.value, ex.timestamp_ms) == (0, (("trace_id", "abc"),), 0.5, 123000)


def test_vllm_colon_names_kept() -> None:
    result = parse('# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 2\n')
    assert result.samples == [("vllm:num_requests_running", (("model_name", "m"),), None, 2.0)]
    assert "vllm:num_requests_running" in result.metadata


def test_om_style_metadata_in_text_keeps_sample() -> None:
    result = parse("# TYPE c counter\nc_total 3\n")
    assert result.errors == [] and result.samples == [("c_total", (), None, 3.0)]


def test_duplicate_series_both_kept() -> None:
    assert len(samples("m 1\nm 2\n")) == 2


# -- OpenMetrics ------------------------------------------------------------------------------------------


def test_openmetrics_guessed_from_eof() -> None:
    assert looks_like_openmetrics("a 1\n# EOF\n") and looks_like_openmetrics("a 1\n# EOF")
    assert not looks_like_openmetrics("a 1\n# EOFX\n") and not looks_like_openmetrics("a 1\n")
    assert is_openmetrics_content_type("application/openmetrics-text; version=1.0.0") is True
    assert is_openmetrics_content_type("text/plain; version=0.0.4") is False
    assert is_openmetrics_content_type("application/octet-stream") is None


def test_openmetrics_timestamps_are_float_seconds_and_unit() -> None:
    text = (
        "# TYPE t_seconds gauge\n# UNIT t_seconds seconds\n# HELP t_seconds Time.\n"
        "t_seconds 1 1700000000.123\nt_seconds 2 1.7e9\n# EOF"
    )
    result = parse(text)
    assert result.is_openmetrics and result.errors == []
    assert [s[2] for s in result.samples] == [1700000000123, 1700000000000]
    assert result.metadata["t_seconds"] == FamilyMeta("t_seconds", "gauge", "Time.", "seconds")


@pytest.mark.parametrize(
    ("text", "line_no", "message"),
    [
        ("a 1\n", 1, "missing '# EOF'"),
        ("a 1\n# EOF\nb 2\n", 3, "text after '# EOF'"),
        ("a 1\n\nb 2\n# EOF\n", 2, "blank line"),
        ("# comment\na 1\n# EOF\n", 1, "comments other than"),
        ("a 1\r\n# EOF\n", 1, "carriage return"),
        ('a{x="1",} 1\n# EOF\n', 1, "trailing comma"),
        ('a{x="1", y="2"} 1\n# EOF\n', 1, "unexpected space"),
        ("a  1\n# EOF\n", 1, "exactly one space"),
        ("# TYPE a untyped\n# EOF\n", 1, "unknown metric type 'untyped'"),
        ("# TYPE a gauge\n# TYPE a gauge\n# EOF\n", 2, "second TYPE"),
        ("a 1\n# HELP a late\n# EOF\n", 2, "after its samples"),
        ("# TYPE a_seconds gauge\n# UNIT a_seconds bytes\n# EOF\n", 2, "must end with its unit"),
        ("a 1 NaN\n# EOF\n", 1, "invalid timestamp"),
        ('a 1 # {x="1"} zz\n# EOF\n', 1, "invalid exemplar"),
        ('a 1 # {x="' + "y" * 130 + '"} 1\n# EOF\n', 1, "128"),
    ],
)
def test_invalid_openmetrics(text: str, line_no: int, message: str) -> None:
    got = errors(text, openmetrics=True)
    assert len(got) == 1 and got[0][0] == line_no and message in got[0][1], got


def test_openmetrics_text_after_eof_drops_those_samples() -> None:
    result = parse("a 1\n# EOF\nb 2\nc 3\n", openmetrics=True)
    assert [s[0] for s in result.samples] == ["a"]
    assert [e.line_no for e in result.errors] == [3, 4]


def test_openmetrics_empty_brackets_and_escapes() -> None:
    text = 'a{} 1\nb{x="a\\"b\\\\c\\nd"} 2\n# EOF\n'
    assert samples(text) == [("a", (), None, 1.0), ("b", (("x", 'a"b\\c\nd'),), None, 2.0)]


def test_line_numbers_count_from_one_and_lines_total() -> None:
    result = parse("a 1\nb 2\n")
    assert result.lines == 2
    assert parse("").lines == 0 and parse("").samples == []


def test_parser_cache_reused_across_calls() -> None:
    p = Parser()
    first = p.parse('m{a="1"} 1\n')
    second = p.parse('m{a="1"} 2\n')
    assert first.samples[0][1] is second.samples[0][1]


def test_series_grouping() -> None:
    result = parse('m{a="1"} 1 10\nm{a="1"} 2 20\nn 3\n')
    assert result.series() == {("m", (("a", "1"),)): ([10, 20], [1.0, 2.0]), ("n", ()): ([None], [3.0])}
