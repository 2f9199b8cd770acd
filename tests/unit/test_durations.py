"""parse_duration and format_duration: the duration syntax every opendws text format shares."""

from datetime import timedelta

import pytest

from opendws.durations import format_duration, parse_duration

H = timedelta(hours=1)
M = timedelta(minutes=1)
S = timedelta(seconds=1)
D = timedelta(days=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("6h", 6 * H, id="hours"),
        pytest.param("90m", 90 * M, id="minutes"),
        pytest.param("2d", 2 * D, id="days"),
        pytest.param("30s", 30 * S, id="seconds"),
        pytest.param("1h30m", H + 30 * M, id="hours-minutes"),
        pytest.param("1d2h3m4s", D + 2 * H + 3 * M + 4 * S, id="all-units"),
        pytest.param("1h 30m", H + 30 * M, id="spaced"),
        pytest.param("  6h ", 6 * H, id="surrounding-blanks"),
        pytest.param("0s", timedelta(0), id="zero"),
        pytest.param("PT6H", 6 * H, id="iso-hours"),
        pytest.param("P2D", 2 * D, id="iso-days"),
        pytest.param("P1DT12H", D + 12 * H, id="iso-days-hours"),
        pytest.param("PT90M", 90 * M, id="iso-minutes"),
        pytest.param("PT1H30M15S", H + 30 * M + 15 * S, id="iso-time-all"),
        pytest.param("P1W", 7 * D, id="iso-week"),
        pytest.param("pt6h", 6 * H, id="iso-lower-case"),
    ],
)
def test_parse_duration_reads(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "empty duration", id="empty"),
        pytest.param("   ", "empty duration", id="blank"),
        pytest.param("6", "is not a duration", id="no-unit"),
        pytest.param("6x", "is not a duration", id="unknown-unit"),
        pytest.param("h", "is not a duration", id="no-number"),
        pytest.param("1.5h", "whole numbers", id="fraction"),
        pytest.param("30m1h", "in that order", id="units-out-of-order"),
        pytest.param("1h1h", "is not a duration", id="unit-twice"),
        pytest.param("-1h", "is not a duration", id="negative"),
        pytest.param("6H", "is not a duration", id="short-form-upper-case"),
        pytest.param("P", "is not an ISO 8601 duration", id="iso-empty"),
        pytest.param("PT", "is not an ISO 8601 duration", id="iso-empty-time"),
        pytest.param("P1DT", "is not an ISO 8601 duration", id="iso-dangling-t"),
        pytest.param("PT6", "is not an ISO 8601 duration", id="iso-no-designator"),
        pytest.param("PT1.5H", "is not an ISO 8601 duration", id="iso-fraction"),
        pytest.param("P1Y", "years or months", id="iso-years"),
        pytest.param("P1M", "years or months", id="iso-months"),
        pytest.param("P1Y2M3DT4H", "years or months", id="iso-full-calendar"),
        pytest.param("99999999999d", "too long", id="overflow"),
    ],
)
def test_parse_duration_refuses(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_duration(text)


def test_parse_duration_error_shows_examples() -> None:
    with pytest.raises(ValueError, match=r"'6h'.*'PT6H'"):
        parse_duration("six hours")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(timedelta(0), "0s", id="zero"),
        pytest.param(6 * H, "6h", id="hours"),
        pytest.param(90 * M, "1h30m", id="minutes-carry"),
        pytest.param(D + 2 * H + 3 * M + 4 * S, "1d2h3m4s", id="all-units"),
        pytest.param(-30 * M, "-30m", id="negative"),
        pytest.param(timedelta(seconds=1, microseconds=500), "1s", id="drops-microseconds"),
    ],
)
def test_format_duration(value: timedelta, expected: str) -> None:
    assert format_duration(value) == expected


@pytest.mark.parametrize("value", [timedelta(0), 10 * M, 6 * H, 2 * D + 1 * S, 90 * D], ids=str)
def test_format_duration_reads_back(value: timedelta) -> None:
    assert parse_duration(format_duration(value)) == value
