"""Time: the timers that end runs, expire waits and start blocks (Cloud Tasks), and the
Clock port."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Protocol


class TimerKind(StrEnum):
    """What a timer ends or starts."""

    RELEASE = "release"  # the run time of an ACTIVE request is up
    EXPIRY = "expiry"  # a PENDING flex request's max_wait has passed
    START = "start"  # a BOOKED calendar block starts


# Cloud Tasks schedules at most 30 days ahead; a later timer is armed as a chain of hops.
TIMER_HORIZON = timedelta(days=29)
_TASK_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class Timer:
    """A timer for one request: fires at ``fire_at`` (or, for one beyond the horizon, at an
    intermediate ``hop`` that re-arms the next one)."""

    request_id: str
    kind: TimerKind
    generation: int  # which run (the record's attempt) it belongs to: an older one is ignored
    fire_at: datetime  # when the timer is meant to act
    hop: int = 0  # 0 for the first task of a chain; each re-arm adds one

    @property
    def name(self) -> str:
        """The deterministic task name: the same timer armed twice is one task."""
        slug = _TASK_UNSAFE.sub("-", self.request_id)[:60]
        digest = hashlib.sha256(self.request_id.encode()).hexdigest()[:12]
        return f"{slug}-{digest}-{self.kind.value}-g{self.generation}-h{self.hop}"

    def due_at(self, armed_at: datetime) -> datetime:
        """When this hop's task is scheduled: ``fire_at``, or the horizon if that is sooner."""
        return min(self.fire_at, armed_at + TIMER_HORIZON)

    def to_json(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "kind": self.kind.value,
            "generation": self.generation,
            "fire_at": _iso(self.fire_at),
            "hop": self.hop,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timer:
        """Read back what :meth:`to_json` wrote; ValueError/KeyError/TypeError if malformed."""
        fire_at = datetime.fromisoformat(str(data["fire_at"]))
        if fire_at.tzinfo is None:
            raise ValueError("fire_at: needs a time zone")
        return cls(
            request_id=str(data["request_id"]),
            kind=TimerKind(data["kind"]),
            generation=int(data["generation"]),
            fire_at=fire_at,
            hop=int(data.get("hop", 0)),
        )


class TimerQueue(Protocol):
    """Where timers wait (Cloud Tasks): each calls the ``timer`` function when due."""

    def arm(self, timer: Timer, now: datetime) -> None:
        """Schedule ``timer`` (its hop, if it lies beyond the horizon). Arming the same timer
        again changes nothing."""
        ...

    def disarm(self, timer: Timer) -> None:
        """Delete ``timer``'s task so it never fires; nothing to do if it is gone."""
        ...


class Clock(Protocol):
    """The only source of "now" outside tests."""

    def now(self) -> datetime:
        """The current instant, timezone-aware UTC."""
        ...


def _iso(at: datetime) -> str:
    return at.isoformat()
