"""Request states and the one table of allowed transitions.

Every state change in opendws goes through :func:`transition`, so an edge that is not in
:data:`TRANSITIONS` cannot happen anywhere: it raises :class:`IllegalTransition` naming both
states.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class RequestState(StrEnum):
    """Where a request is in its life cycle."""

    PENDING = "PENDING"  # accepted, waiting for admission (flex) or confirmation (calendar)
    BOOKED = "BOOKED"  # calendar block confirmed, its start not yet reached
    PROVISIONING = "PROVISIONING"  # admitted; the cloud is creating the capacity
    ACTIVE = "ACTIVE"  # the whole gang is running
    RELEASED = "RELEASED"  # given back by the user, early or on time
    EXPIRED = "EXPIRED"  # its run time (or calendar block) ended and the timer released it
    TIMED_OUT = "TIMED_OUT"  # max_wait passed before it could be admitted
    CANCELLED = "CANCELLED"  # withdrawn by its tenant before it became active
    REJECTED = "REJECTED"  # invalid, refused, or can never fit

    @property
    def is_final(self) -> bool:
        """True once nothing can happen to the request any more."""
        return not TRANSITIONS[self]


_S = RequestState

TRANSITIONS: Mapping[RequestState, frozenset[RequestState]] = {
    _S.PENDING: frozenset(
        {
            _S.PROVISIONING,  # flex: admitted by the reconciler (admit)
            # a job into a calendar block: the block runs with its VMs up, no other run is on
            # them and it is next in line (it holds no capacity of its own: never admitted)
            _S.ACTIVE,
            _S.BOOKED,  # calendar: the block fits and is confirmed
            _S.TIMED_OUT,  # flex: max_wait passed before admission (sweep)
            _S.CANCELLED,  # the tenant cancelled
            _S.REJECTED,  # the gang can never fit, a calendar block was refused, or the
            # block a job waits for ended before it could run
        }
    ),
    _S.BOOKED: frozenset(
        {
            _S.PROVISIONING,  # the block's start was reached (sweep)
            _S.CANCELLED,  # the tenant cancelled before the start
            _S.EXPIRED,  # the block's end passed before it could be provisioned (sweep)
        }
    ),
    _S.PROVISIONING: frozenset(
        {
            _S.ACTIVE,  # the provider reports the whole gang ready
            _S.PENDING,  # flex: stockout or provisioning timeout; try the next pool
            _S.TIMED_OUT,  # flex: stockout after max_wait passed; no retry is allowed
            _S.CANCELLED,  # the tenant cancelled while the cloud was still creating
            _S.EXPIRED,  # calendar: the block's end passed while still provisioning
        }
    ),
    _S.ACTIVE: frozenset(
        {
            _S.RELEASED,  # the tenant released it (early or on time), or its job ended
            _S.EXPIRED,  # the run-time timer fired, or the sweep found it overdue (a job into
            # a block: the block's end)
        }
    ),
    _S.RELEASED: frozenset(),  # final
    _S.EXPIRED: frozenset(),  # final
    _S.TIMED_OUT: frozenset(),  # final
    _S.CANCELLED: frozenset(),  # final
    _S.REJECTED: frozenset(),  # final
}


class IllegalTransition(ValueError):
    """A state change that the life cycle does not allow."""

    def __init__(self, current: RequestState, target: RequestState) -> None:
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing (it is final)"
        super().__init__(
            f"a request cannot go from {current} to {target}; from {current} it may go to {allowed}"
        )
        self.current = current
        self.target = target


# The edges only a job into a calendar block takes: it holds no capacity of its own, so it
# goes from waiting to running without being admitted or provisioned.
BLOCK_JOB_EDGES: frozenset[tuple[RequestState, RequestState]] = frozenset({(_S.PENDING, _S.ACTIVE)})


class BlockJobOnly(IllegalTransition):
    """An edge of :data:`BLOCK_JOB_EDGES` asked of a request that is not a job into a block."""

    def __init__(self, current: RequestState, target: RequestState) -> None:
        super().__init__(current, target)
        self.args = (
            f"a request cannot go from {current} to {target}: only a job into a calendar block "
            f"does (it holds no capacity of its own); from {current} it may go to "
            + ", ".join(sorted(TRANSITIONS[current] - {target})),
        )


def can_transition(current: RequestState, target: RequestState, *, block_job: bool = False) -> bool:
    """True if the life cycle allows ``current`` → ``target`` (``block_job``: for a job into a
    calendar block, which alone takes :data:`BLOCK_JOB_EDGES`)."""
    if (current, target) in BLOCK_JOB_EDGES and not block_job:
        return False
    return target in TRANSITIONS[current]


def transition(
    current: RequestState, target: RequestState, *, block_job: bool = False
) -> RequestState:
    """Return ``target`` if ``current`` → ``target`` is allowed (see :func:`can_transition`),
    else raise IllegalTransition."""
    if (current, target) in BLOCK_JOB_EDGES and not block_job:
        raise BlockJobOnly(current, target)
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(current, target)
    return target
