"""Regexes are RE2, as in Prometheus and Alertmanager: Go's syntax, linear time, one-line errors.

A backtracking engine stops the process on `(a+)+$` against a few dozen characters; each of these
patterns would run for years under Python's `re`, so a test that finishes shows the engine is linear.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from flask.testing import FlaskClient

from gpuwatch.app.runtime import Runtime
from gpuwatch.core import regex
from gpuwatch.core.clock import FakeClock
from gpuwatch.core.model import Batch, Sample

HOSTILE = ["(a+)+$", "(.*.*)*z", "(x+x+)+y", "(a|aa)+$", "((a*)*)*b"]


@pytest.mark.parametrize("pattern", HOSTILE)
def test_hostile_patterns_match_in_linear_time(pattern: str) -> None:
    text = "a" * 50_000 + "!"
    assert regex.compile_anchored(pattern).search(text) is None
    assert regex.compile(pattern).search("x" * 50_000) is None


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [("(?<=a)b", "invalid perl operator: (?<="), ("(a)\\1", "invalid escape sequence: \\1"), ("a{1001}", "")],
)
def test_patterns_re2_rejects_are_one_line_errors(pattern: str, reason: str) -> None:
    with pytest.raises(regex.RegexError) as e:
        regex.compile(pattern)
    assert str(e.value).startswith(f"invalid regular expression {pattern!r}: ") and reason in str(e.value)
    assert "\n" not in str(e.value)


def test_anchoring_as_prometheus_and_alertmanager() -> None:
    assert regex.compile_anchored("a.c").search("a\nc") is not None  # PromQL: (?s:...)
    assert regex.compile_anchored("a.c", dot_all=False).search("a\nc") is None  # Alertmanager
    assert regex.compile_anchored("ab").search("xab") is None
    assert regex.compile_anchored("a|b").search("b") is not None
    assert regex.compile_anchored("a)|(b").search("axyz") is not None  # the anchors wrap the text as Go's do
    assert regex.compile_anchored("x(?i)y").search("xY") is not None  # RE2's mid-pattern flags
    assert regex.compile_anchored("\\pL+").search("Größe") is not None


def test_expand_as_go_does() -> None:
    m = regex.compile_anchored("(?P<host>[a-z]+)-(\\d+)(x)?").search("node-12")
    assert m is not None
    assert regex.expand("$host:$2", m) == "node:12"
    assert regex.expand("${1}_${host}$$", m) == "node_node$"
    assert regex.expand("[$3][$9][${nope}][$]", m) == "[][][][$]"


@pytest.fixture
def marker(runtime: Runtime, clock: FakeClock) -> None:
    """One series `marker` with a 5 001-character label value."""
    labels = (("__name__", "marker"), ("v", "a" * 5000 + "!"))
    runtime.store.append(Batch(clock.now_ms(), [Sample("marker", labels, 1.0)]))
    runtime.store.flush()


@pytest.mark.parametrize("pattern", HOSTILE)
def test_a_hostile_selector_is_answered(client: FlaskClient, marker: None, pattern: str) -> None:
    r = client.get("/api/v1/query", query_string={"query": f'marker{{v=~"{pattern}"}}'})
    assert r.status_code == 200 and r.get_json()["data"]["result"] == []
    r = client.get("/api/v1/series", query_string={"match[]": f'{{__name__=~"{pattern}"}}'})
    assert r.status_code == 200 and r.get_json()["data"] == []


def test_a_selector_re2_rejects_is_a_400_naming_it(client: FlaskClient, marker: None) -> None:
    r = client.get("/api/v1/query", query_string={"query": 'marker{v=~"(?<=a)b"}'})
    body = r.get_json()
    assert r.status_code == 400 and body["errorType"] == "bad_data" and "(?<=a)b" in body["error"]


def test_label_replace_is_re2(client: FlaskClient, marker: None) -> None:
    q = 'label_replace(marker, "short", "$1", "v", "(a{3})(a+)+!")'
    r = client.get("/api/v1/query", query_string={"query": q})
    assert r.status_code == 200 and r.get_json()["data"]["result"][0]["metric"]["short"] == "aaa"


def test_silences_with_hostile_regexes_are_stored_and_alerts_stay_answerable(
    client: FlaskClient, clock: FakeClock, tmp_path: Path
) -> None:
    now = clock.now_ms()
    body = {
        "matchers": [{"name": "alertname", "value": "(.*.*)*z", "isRegex": True, "isEqual": True}],
        "startsAt": f"{now // 1000}",
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "test",
        "comment": "hostile",
    }
    body["startsAt"] = "2020-01-01T00:00:00Z"
    r = client.post("/api/v2/silences", json=body)
    assert r.status_code == 200, r.get_data(as_text=True)
    r = client.post("/api/v2/alerts", json=[{"labels": {"alertname": "x" * 4000 + "!"}, "annotations": {}}])
    assert r.status_code == 200
    alerts = client.get("/api/v2/alerts").get_json()
    assert [a["status"]["silencedBy"] for a in alerts] == [[]]


def test_a_silence_re2_rejects_is_refused_naming_it(client: FlaskClient) -> None:
    body = {
        "matchers": [{"name": "alertname", "value": "(a)\\1", "isRegex": True, "isEqual": True}],
        "startsAt": "2020-01-01T00:00:00Z",
        "endsAt": "2099-01-01T00:00:00Z",
        "createdBy": "test",
        "comment": "backreference",
    }
    r = client.post("/api/v2/silences", json=body)
    assert r.status_code == 400 and "invalid regular expression '(a)\\\\1'" in r.get_json()
    assert client.get("/api/v2/silences").get_json() == []


def test_a_lone_surrogate_matches_as_go_matches_invalid_utf8() -> None:
    # JSON's "\udcff" is kept in a label value; RE2 could not encode it and every regex selector that
    # met the value answered 500 (found by tests/test_fuzz_e2e.py). Go sees such a byte as U+FFFD.
    rx = regex.compile_anchored("a.b")
    assert rx.search("a\udcffb") is not None and rx.search("a\udcffc") is None
    assert regex.compile("(x)").sub(lambda m: "y", "\udcffx") == "\ufffdy"
    with pytest.raises(regex.RegexError, match="invalid UTF-8"):
        regex.compile("a\udcff")
