"""The one duration parser and the one time parser, as config, CLIs, APIs and rules read them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuwatch.core.units import (
    GO_ZERO_TIME,
    format_duration,
    format_rfc3339,
    format_rfc3339_millis,
    parse_duration,
    parse_duration_ms,
    parse_rfc3339_ms,
    parse_time_ms,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("15s", 15),
        ("1m30s", 90),
        ("500ms", 0.5),
        ("30d", 30 * 86400),
        ("2", 2),
        (3, 3),
        ("1.5", 1.5),
        ("1.5h", 5400),
        ("1h", 3600),
        (" 2w ", 14 * 86400),
        ("1y", 365 * 86400),
    ],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["fast", "", "s", "1x", "-5s", "-1", "1s2", "inf", "nan", float("inf"), True, None, [1]]
)
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_parse_duration_ms_rounds_to_milliseconds() -> None:
    assert parse_duration_ms("1m30s") == 90_000
    assert parse_duration_ms("0.0004") == 0
    assert parse_duration_ms("250ms") == 250


@given(st.integers(min_value=1, max_value=10**7).map(lambda ms: ms * 1000 if ms % 2 else ms))
def test_format_duration_parses_back(ms: int) -> None:
    assert parse_duration_ms(format_duration(ms / 1000)) == ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1714564800", 1714564800_000),
        ("1714564800.25", 1714564800_250),
        ("2024-05-01T12:00:00Z", 1714564800_000),
        ("2024-05-01T12:00:00.5Z", 1714564800_500),
        ("2024-05-01T14:00:00+02:00", 1714564800_000),
        ("2024-05-01t12:00:00.123456z", 1714564800_123),
        ("0001-01-01T00:00:00Z", -62135596800_000),
    ],
)
def test_parse_time_ms(text: str, ms: int) -> None:
    assert parse_time_ms(text) == ms


@pytest.mark.parametrize(
    "text",
    ["", "yesterday", "2024-05-01", "2024-05-01T12:00:00", "2024-13-01T00:00:00Z", "inf", "nan", "1e400"],
)
def test_parse_time_ms_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="time"):
        parse_time_ms(text)


@given(st.integers(min_value=-62135596800_000, max_value=253402300799_999))
def test_rfc3339_texts_parse_back(ms: int) -> None:
    assert parse_rfc3339_ms(format_rfc3339(ms)) == ms
    assert parse_rfc3339_ms(format_rfc3339_millis(ms)) == ms


def test_rfc3339_texts_as_go_and_alertmanager_write_them() -> None:
    assert format_rfc3339(1714564800_500) == "2024-05-01T12:00:00.5Z"
    assert format_rfc3339(1714564800_000) == "2024-05-01T12:00:00Z"
    assert format_rfc3339(None) == GO_ZERO_TIME
    assert format_rfc3339_millis(1714564800_000) == "2024-05-01T12:00:00.000Z"


@pytest.mark.parametrize("text", ["1e20", "-1e20", "5e15", "1e300"])
def test_times_beyond_what_milliseconds_hold_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="time out of range"):
        parse_time_ms(text)


def test_the_furthest_times_parse() -> None:
    assert parse_time_ms("4.6e15") == 4_600_000_000_000_000_000
    assert parse_time_ms("-4.6e15") == -4_600_000_000_000_000_000
