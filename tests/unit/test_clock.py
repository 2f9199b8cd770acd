"""The clocks of :mod:`opendws.clock`: the system clock, and the manual clock that the simulated
cloud, the trace replay and the tests move — frozen or running, and never backwards."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from opendws.clock import ManualClock, SystemClock

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def test_the_system_clock_is_now_in_utc() -> None:
    now = SystemClock().now()
    assert now.tzinfo is not None
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)


def test_a_frozen_clock_moves_only_when_told() -> None:
    clock = ManualClock(START)
    assert clock.now() == START
    clock.advance(timedelta(minutes=3))
    assert clock.now() == START + timedelta(minutes=3)
    clock.set(START + timedelta(hours=1))
    assert clock.now() == START + timedelta(hours=1)
    with pytest.raises(ValueError, match="forward"):
        clock.advance(timedelta(seconds=-1))
    with pytest.raises(ValueError, match="timezone-aware"):
        ManualClock(datetime(2026, 1, 1))  # noqa: DTZ001 - the point of the test


def test_a_running_clock_follows_wall_time_plus_its_offset() -> None:
    clock = ManualClock(START, running=True)
    first = clock.now()
    clock.advance(timedelta(days=1))
    assert clock.now() - first >= timedelta(days=1)
    assert clock.now().tzinfo is not None
    assert abs(ManualClock(running=True).now() - datetime.now(UTC)) < timedelta(seconds=5)


def test_it_never_moves_backwards() -> None:
    clock = ManualClock(START)
    with pytest.raises(ValueError, match="forward"):
        clock.set(START - timedelta(seconds=1))
    assert clock.set_at_least(START - timedelta(hours=1)) == START
    assert clock.set_at_least(START + timedelta(hours=1)) == START + timedelta(hours=1)
    assert clock.now() == START + timedelta(hours=1)


def test_listeners_hear_every_move() -> None:
    clock = ManualClock(START)
    heard: list[datetime] = []
    clock.on_move(heard.append)
    clock.advance(timedelta(minutes=1))
    clock.set(START + timedelta(minutes=5))
    assert heard == [START + timedelta(minutes=1), START + timedelta(minutes=5)]
