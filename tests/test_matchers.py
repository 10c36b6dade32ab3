"""Alertmanager's label matchers (gpuwatch/notify/matchers.py): both textual forms, matching as Alertmanager
matches (checked against Debian's amtool where installed), and the round trip through `str()`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import assume, given
from hypothesis import strategies as st

from gpuwatch.core import regex
from gpuwatch.notify.config import parse_notify
from gpuwatch.notify.matchers import (
    LabelMatcher,
    MatcherError,
    format_matcher,
    format_matchers,
    matches_all,
    parse_matcher,
    parse_matchers,
    sort_matchers,
)
from tests.conftest import require_tool

# -- the single-matcher form (amtool, API filter) -----------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("alertname=GPUHot", LabelMatcher.of("alertname", "GPUHot")),
        ('alertname = "GPU Hot"', LabelMatcher.of("alertname", "GPU Hot")),
        ("gpu!=0", LabelMatcher.of("gpu", "0", is_equal=False)),
        ('job=~"vllm|sglang"', LabelMatcher.of("job", "vllm|sglang", is_regex=True)),
        ("instance!~node-[12]", LabelMatcher.of("instance", "node-[12]", is_regex=True, is_equal=False)),
        (r'summary="say \"hi\"\n"', LabelMatcher.of("summary", 'say "hi"\n')),
        ("empty=", LabelMatcher.of("empty", "")),
        (r'path="C:\temp"', LabelMatcher.of("path", "C:\\temp")),  # a spurious escape stays a backslash
        ("path=C:\\", LabelMatcher.of("path", "C:\\")),  # so does a last one
        (r"a=x\\y", LabelMatcher.of("a", "x\\y")),  # unquoted values are unescaped too
        ("a:b=c", LabelMatcher.of("a:b", "c")),  # Alertmanager's parser allows colons in names
    ],
)
def test_one_matcher_parses_as_amtool_parses_it(text: str, expected: LabelMatcher) -> None:
    assert parse_matcher(text) == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("GPUHot", "bad matcher format: GPUHot"),
        ('a="b', 'matcher value contains unescaped double quote: "b'),
        ('a=b"c', 'matcher value contains unescaped double quote: b"c'),
        ("a=~(", "invalid regular expression '(': missing ): ("),
        ("a=~x{1001}", "invalid regular expression 'x{1001}': invalid repetition size: {1001}"),
        ("0gpu=1", "bad matcher format: 0gpu=1"),
    ],
)
def test_bad_matchers_are_one_line_errors(text: str, error: str) -> None:
    with pytest.raises(MatcherError) as e:
        parse_matcher(text)
    assert str(e.value) == error and e.value.http_status == 400


# -- the list form (routes' and inhibit rules' `matchers:`) -------------------------------------------


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ('{foo = "bar", dings != "bums", }', [("foo", "=", "bar"), ("dings", "!=", "bums")]),
        ("foo=bar,dings!=bums", [("foo", "=", "bar"), ("dings", "!=", "bums")]),
        (r'{quote="She said: \"Hi, all\""}', [("quote", "=", 'She said: "Hi, all"')]),
        ('{a="b"', [("a", "=", "b")]),  # braces are trimmed one by one (the old code wanted both)
        ("", []),
    ],
)
def test_matcher_lists_parse_as_alertmanager_parses_them(
    text: str, parsed: list[tuple[str, str, str]]
) -> None:
    assert [(m.name, m.op, m.value) for m in parse_matchers(text)] == parsed


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("a=b,,c=d", 'expected a matcher like alertname="GPULost" or severity=~"warn|crit", got \'\''),
        (
            ' {a="b"} ',
            'expected a matcher like alertname="GPULost" or severity=~"warn|crit", got \'{a="b"}\'',
        ),
        ('a="x, b=y', "a quoted value is not closed"),
        ('a=b"c"d', 'matcher value contains unescaped double quote: b"c"d'),
    ],
)
def test_bad_matcher_lists_say_why(text: str, error: str) -> None:
    with pytest.raises(MatcherError) as e:
        parse_matchers(text)
    assert str(e.value) == error


# -- matching -----------------------------------------------------------------------------------------

# (matchers as a route writes them, the alert's labels, whether Alertmanager routes the alert there);
# test_the_table_is_what_amtool_says checks the last column against the real Alertmanager code.
CASES: list[tuple[str, dict[str, str], bool]] = [
    ('a=~"1"', {"a": "10"}, False),  # anchored at both ends
    ('a=~"a.b"', {"a": "axb"}, True),
    ('a=~"a.b"', {"a": "a\nb"}, False),  # RE2's `.` stops at a newline (the old notify code matched)
    ('a=~"(?s)a.b"', {"a": "a\nb"}, True),
    ('a=~"(?i)warn"', {"a": "WARNING"}, False),
    ('a=~"(?i)warn.*"', {"a": "WARNING"}, True),
    ('a=~"a)|(b"', {"a": "xb"}, True),  # the anchors wrap the text as written: ^(?:a)|(b)$
    ('a=~"a)|(b"', {"a": "ax"}, True),
    ('a=~"a)|(b"', {"a": "xa"}, False),
    ('a!=""', {"b": "1"}, False),  # an absent label is the empty string
    ('a=~"|x"', {"b": "1"}, True),
    ('a!~"x"', {"b": "1"}, True),
    ('a="x\\ty"', {"a": "x\\ty"}, True),  # `\t` is no escape: a backslash and a t (the old code: a tab)
    ('{a:b="c"}', {"a:b": "c"}, True),
    ('a="1", b=~"2|3"', {"a": "1", "b": "3"}, True),
    ('a="1", b=~"2|3"', {"a": "1", "b": "4"}, False),
]


def _config(matchers: str) -> dict[str, Any]:
    return {
        "route": {"receiver": "miss", "routes": [{"receiver": "hit", "matchers": [matchers]}]},
        "receivers": [{"name": "miss"}, {"name": "hit"}],
    }


@pytest.mark.parametrize(("matchers", "labels", "expected"), CASES)
def test_routes_match_as_alertmanager_does(matchers: str, labels: dict[str, str], expected: bool) -> None:
    route = parse_notify(_config(matchers)).route
    assert route is not None
    assert [r.receiver for r in route.match(labels)] == ["hit" if expected else "miss"]
    assert matches_all(parse_matchers(matchers), labels) is expected


def test_the_table_is_what_amtool_says(tmp_path: Path) -> None:
    amtool = require_tool("amtool")
    got = []
    for i, (matchers, labels, _) in enumerate(CASES):
        conf = tmp_path / f"am{i}.yml"
        conf.write_text(yaml.safe_dump(_config(matchers)))
        args = [format_matcher(k, v) for k, v in labels.items()]
        run = subprocess.run(
            [amtool, "config", "routes", "test", f"--config.file={conf}", *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        got.append(run.stdout.strip() == "hit")
    assert got == [expected for _, _, expected in CASES]


@pytest.mark.parametrize(
    ("matchers", "accepted"),
    [
        ('{a="b"', True),
        ("a=b,", True),
        ("a=b\\", True),
        ("a=b,,c=d", False),
        ('a="x', False),
        ("0a=1", False),
    ],
)
def test_alertmanager_accepts_the_same_matcher_lists(tmp_path: Path, matchers: str, accepted: bool) -> None:
    try:
        parse_matchers(matchers)
        ours = True
    except MatcherError:
        ours = False
    assert ours is accepted
    amtool = require_tool("amtool")
    conf = tmp_path / "am.yml"
    conf.write_text(yaml.safe_dump(_config(matchers)))
    run = subprocess.run([amtool, "check-config", str(conf)], capture_output=True, text=True, timeout=30)
    assert (run.returncode == 0) is accepted, run.stdout


def test_route_keys_write_matchers_as_alertmanager_does() -> None:
    route = parse_notify(_config('b=~"x|y", a="tab\there\\\\ \\"q\\"\\n"')).route
    assert route is not None
    # sorted by name; only `\`, `"` and newlines are escaped (the old code escaped the tab as JSON does)
    assert route.routes[0].key == '{}/{a="tab\there\\\\ \\"q\\"\\n",b=~"x|y"}'


def test_matchers_sort_by_name_value_then_operator() -> None:
    ms = [parse_matcher(t) for t in ("b=1", "a!~2", "a=~2", "a!=2", "a=2", "a=1")]
    assert [str(m) for m in sort_matchers(ms)] == ['a="1"', 'a="2"', 'a!="2"', 'a=~"2"', 'a!~"2"', 'b="1"']


def test_api_json_form() -> None:
    m = LabelMatcher.of("job", "vllm|sglang", is_regex=True, is_equal=False)
    assert m.op == "!~" and str(m) == 'job!~"vllm|sglang"'
    assert m.to_json() == {"name": "job", "value": "vllm|sglang", "isRegex": True, "isEqual": False}
    with pytest.raises(MatcherError, match="unknown matcher operator '=='"):
        LabelMatcher("a", "==", "b")


# -- round trips --------------------------------------------------------------------------------------

names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,10}", fullmatch=True)


@st.composite
def matchers(draw: st.DrawFn) -> LabelMatcher:
    name, op, value = draw(names), draw(st.sampled_from(["=", "!=", "=~", "!~"])), draw(st.text(max_size=20))
    if op in ("=~", "!~"):
        try:
            regex.check(value)
        except regex.RegexError:
            assume(False)
    try:
        return LabelMatcher(name, op, value)
    except MatcherError:
        assume(False)
        raise


@given(matchers())
def test_a_matcher_parses_back_from_its_text(m: LabelMatcher) -> None:
    assert parse_matcher(str(m)) == m


@given(st.lists(matchers(), max_size=4))
def test_a_matcher_list_parses_back_from_its_text(ms: list[LabelMatcher]) -> None:
    assert parse_matchers(format_matchers(ms)) == ms
    assert parse_matchers(", ".join(str(m) for m in ms)) == ms
