"""The clocks: the only place in opendws that reads the wall clock.

Two implementations of the Clock port (:class:`opendws.ports.Clock`), standard library only,
so that every layer that needs one — adapters, the simulated cloud, the replay, the
emulators and the tests — uses the same two:

- :class:`SystemClock`, now in UTC: what production runs on;
- :class:`ManualClock`, a clock that moves when it is told to. Frozen (the default), only
  :meth:`~ManualClock.advance` and :meth:`~ManualClock.set` move it: tests and the trace replay
  drive time this way, so nothing waits on real time. Running, it is wall time plus an offset
  that the same calls move: the simulated cloud behind the local stack's emulator runs so,
  in real time that an operator may still step forward.

Invariant of both: timezone-aware UTC, and never backwards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC; ValueError for a naive one (whose zone nobody knows)."""
    if moment.tzinfo is None:
        raise ValueError(f"a clock's time must be timezone-aware, not {moment!r}")
    return moment.astimezone(UTC)


class SystemClock:
    """Now, timezone-aware UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only forward, and (frozen) only when told.

    ``start`` defaults to the wall clock's now. Listeners (:meth:`on_move`) are called after
    every move, outside the lock, with the new instant: a dispatcher waiting for a due time
    wakes up on them instead of polling.
    """

    def __init__(self, start: datetime | None = None, *, running: bool = False) -> None:
        wall = datetime.now(UTC)
        begin = wall if start is None else utc(start)
        self._lock = threading.Lock()
        self._running = running
        self._frozen_at = begin
        self._offset = begin - wall
        self._listeners: list[Callable[[datetime], None]] = []

    def now(self) -> datetime:
        with self._lock:
            if self._running:
                return datetime.now(UTC) + self._offset
            return self._frozen_at

    def advance(self, delta: timedelta) -> datetime:
        """Move forward by ``delta``; returns the new now. ValueError for a negative delta."""
        if delta < timedelta(0):
            raise ValueError(f"the clock only moves forward, not by {delta}")
        with self._lock:
            self._frozen_at += delta
            self._offset += delta
            moved = datetime.now(UTC) + self._offset if self._running else self._frozen_at
            listeners = list(self._listeners)
        for listener in listeners:
            listener(moved)
        return moved

    def set(self, moment: datetime) -> datetime:
        """Move forward to ``moment``; returns the new now. ValueError if it lies in the past."""
        return self.advance(utc(moment) - self.now())

    def set_at_least(self, moment: datetime) -> datetime:
        """Move forward to ``moment`` if it lies ahead; otherwise stay. Returns the new now."""
        return self.advance(max(utc(moment) - self.now(), timedelta(0)))

    def on_move(self, listener: Callable[[datetime], None]) -> None:
        """Call ``listener`` with the new instant after every move."""
        with self._lock:
            self._listeners.append(listener)
