"""Durations as people write them: ISO 8601 (``PT6H``, ``P2D``, ``P1DT12H``) or short forms
(``6h``, ``90m``, ``2d``, ``30s``, ``1h30m``).

Shared by every text format opendws reads (scenario files, request messages), so that a duration
means the same everywhere. Only whole numbers of fixed-length units are accepted: weeks, days,
hours, minutes and seconds. Years and months have no fixed length and are refused.
"""

from __future__ import annotations

import re
from datetime import timedelta

# ISO 8601 duration restricted to fixed-length units: P[nW][nD][T[nH][nM][nS]].
_ISO = re.compile(
    r"^P(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+)S)?)?$"
)
# The date part of an ISO duration that names years or months (before any "T").
_ISO_CALENDAR_UNITS = re.compile(r"^P[^T]*[YM]")
# Short form: whole numbers with d, h, m, s, largest unit first, each at most once.
_SHORT = re.compile(
    r"^(?:(?P<days>\d+)\s*d)?\s*(?:(?P<hours>\d+)\s*h)?\s*"
    r"(?:(?P<minutes>\d+)\s*m)?\s*(?:(?P<seconds>\d+)\s*s)?$"
)
_EXAMPLES = "such as '6h', '90m', '2d', '1h30m' or ISO 8601 'PT6H', 'P2D'"


def parse_duration(text: str) -> timedelta:
    """The ``timedelta`` that ``text`` names; ValueError saying what is wrong if it names none."""
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"empty duration; give one {_EXAMPLES}")
    if stripped[0] in "Pp":
        return _parse_iso(stripped.upper(), text)
    match = _SHORT.match(stripped)
    if match is None or not any(match.groupdict().values()):
        raise ValueError(
            f"{text!r} is not a duration; give one {_EXAMPLES} "
            "(whole numbers, units d, h, m, s in that order)"
        )
    return _timedelta(match, text)


def format_duration(value: timedelta) -> str:
    """The short form of ``value`` that :func:`parse_duration` reads back: ``1d2h30m``, ``0s``
    for zero, a leading ``-`` when negative; microseconds are dropped."""
    sign = "-" if value < timedelta(0) else ""
    seconds = int(abs(value).total_seconds())
    days, rest = divmod(seconds, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    text = "".join(f"{amount}{unit}" for amount, unit in parts if amount)
    return sign + (text or "0s")


def _parse_iso(upper: str, original: str) -> timedelta:
    match = _ISO.match(upper)
    if match is not None and any(match.groupdict().values()):
        return _timedelta(match, original)
    if _ISO_CALENDAR_UNITS.match(upper):
        raise ValueError(
            f"{original!r} uses years or months, which have no fixed length; use days (P30D)"
        )
    raise ValueError(
        f"{original!r} is not an ISO 8601 duration; give one {_EXAMPLES} "
        "(whole numbers of W, D, H, M, S)"
    )


def _timedelta(match: re.Match[str], original: str) -> timedelta:
    amounts = {unit: int(value) for unit, value in match.groupdict().items() if value is not None}
    try:
        return timedelta(**amounts)
    except OverflowError:
        raise ValueError(f"{original!r} is too long a duration") from None
