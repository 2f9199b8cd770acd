"""Which timers a request has: a release timer while ACTIVE (its run's end), a start timer while
BOOKED (its block's start), an expiry timer while a flex request is PENDING (its max_wait).

Each is named from (request, kind, generation), the generation being the provisioning attempt
of the run it ends, so arming one twice makes one task and a timer of an older run is known
for what it is when it fires.
"""

from __future__ import annotations

from datetime import datetime

from opendws.domain.model import Mode
from opendws.domain.states import RequestState
from opendws.ports import RequestRecord, Timer, TimerKind

S = RequestState


def timers_of(record: RequestRecord) -> list[Timer]:
    """The timers a request in its current state may have armed."""
    request = record.request
    if record.state is S.ACTIVE and record.since is not None:
        return [release_timer(record, record.since)]
    if record.state is S.BOOKED and request.start_at is not None:
        return [start_timer(record)]
    if record.state is S.PENDING and request.deadline is not None:
        return [expiry_timer(record)]
    return []


def timers_to_disarm(record: RequestRecord) -> list[Timer]:
    """Every timer that may still be armed for ``record`` once it ends: those of its state,
    and a flex request's expiry timer (armed at intake, whatever the state since)."""
    timers = timers_of(record)
    if record.request.deadline is not None and record.state is not S.PENDING:
        timers.append(expiry_timer(record))
    return timers


def start_timer(record: RequestRecord) -> Timer:
    """The timer that starts a booked calendar block."""
    start_at = record.request.start_at
    assert start_at is not None  # calendar blocks have one
    return Timer(request_id=record.request_id, kind=TimerKind.START, generation=1, fire_at=start_at)


def release_timer(record: RequestRecord, active_since: datetime) -> Timer:
    """The timer that ends ``record``'s run: a block at its end, a flex run its run duration
    after it became ACTIVE."""
    request = record.request
    start = request.start_at if request.mode is Mode.CALENDAR and request.start_at else active_since
    return Timer(
        request_id=request.request_id, kind=TimerKind.RELEASE, generation=record.attempt,
        fire_at=start + request.run_duration,
    )  # fmt: skip


def expiry_timer(record: RequestRecord) -> Timer:
    """The timer that times a flex request out at ``submitted_at + max_wait``."""
    deadline = record.request.deadline
    assert deadline is not None  # flex requests have one
    return Timer(
        request_id=record.request_id, kind=TimerKind.EXPIRY, generation=0, fire_at=deadline
    )
