"""What the planner decides: the verdict types of a plan.

:class:`Plan` holds one :class:`Decision` per pending request (its :class:`Outcome` and
:class:`Reason`), the :class:`Race` lanes that grow, and the flex requests' policy order; a
refused calendar block is offered :class:`Alternative` starts (:func:`offered` names them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from datetime import datetime
from enum import StrEnum
from functools import cached_property

from opendws.domain.reasons import Expiry


class Outcome(StrEnum):
    """What the plan decided for one pending request."""

    ADMIT = "ADMIT"  # flex: starts now in pool_id → PROVISIONING
    HOLD = "HOLD"  # flex: a slot is held from start_at (its ETA); stays PENDING
    WAIT = "WAIT"  # flex: no slot opens inside its window as things stand; stays PENDING
    CONFIRM = "CONFIRM"  # calendar: the block is booked in pool_id → BOOKED
    REFUSE = "REFUSE"  # calendar: the block does not fit as asked; see alternatives → REJECTED
    REJECT = "REJECT"  # can never be admitted as asked → REJECTED
    TIME_OUT = "TIME_OUT"  # flex: max_wait passed before admission → TIMED_OUT


class Reason(StrEnum):
    """Why a request was not admitted now (machine-readable)."""

    NO_CAPACITY_UNTIL = "NO_CAPACITY_UNTIL"  # the pool is committed to others until the ETA
    QUOTA = "QUOTA"  # the tenant's (or its cohort's) quota is in use until the ETA / in the block
    POOL_SHORT_UNTIL = "POOL_SHORT_UNTIL"  # the pool stocked out and cools down until the ETA
    FIFO_BLOCKED = "FIFO_BLOCKED"  # strict-FIFO tenant: an earlier request of its own goes first
    WINDOW_TOO_SHORT = "WINDOW_TOO_SHORT"  # no slot opens before max_wait passes, as things stand
    NO_CAPACITY = "NO_CAPACITY"  # calendar: the block collides with committed capacity
    NEVER_FITS = "NEVER_FITS"  # no allowed pool of this shape, or the gang exceeds every one
    EXCEEDS_QUOTA = "EXCEEDS_QUOTA"  # the gang exceeds what the tenant may ever hold at once
    UNKNOWN_TENANT = "UNKNOWN_TENANT"  # the tenant is not configured
    START_PASSED = "START_PASSED"  # calendar: the whole block lies in the past


def rebuild(value: object) -> tuple[object, ...]:
    """How a frozen dataclass of the planner is pickled and copied: built again from its
    fields by its constructor. (The default way makes a blank object and sets each field on
    it, which a frozen class compiled by mypyc refuses: see setup.py.)"""
    assert is_dataclass(value)
    values = {item.name: getattr(value, item.name) for item in fields(value)}
    return (_built, (type(value), values))


def _built(kind: type[object], values: dict[str, object]) -> object:
    """``kind`` built from ``values`` by its constructor (see :func:`rebuild`)."""
    return kind(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class Alternative:
    """A start time at which a refused calendar block would fit, and where; ``advised`` when
    Google's Advice API recommends it too (Google is then likely to approve it)."""

    start_at: datetime
    pool_id: str
    advised: bool = False

    def __reduce__(self) -> tuple[object, ...]:
        return rebuild(self)


@dataclass(frozen=True, slots=True, kw_only=True, init=False)
class Decision:
    """The plan's verdict on one pending request, with its reason as data.

    Its constructor is written out (the defaults are there): a pass builds a decision for
    every request it places or renumbers, and compiled, this one costs half of the one
    ``dataclass`` generates (which runs as plain Python even in a compiled module)."""

    request_id: str
    outcome: Outcome
    reason: Reason | Expiry | None  # None only for ADMIT and CONFIRM
    pool_id: str | None  # ADMIT, HOLD, CONFIRM: where
    start_at: datetime | None  # ADMIT, CONFIRM: the start; HOLD: the ETA
    # ADMIT, HOLD, CONFIRM: when the slot ends (start + the pool's serve wait + run_duration
    # for flex, see Pool.serve_wait; start + run_duration for a block)
    end_at: datetime | None
    position: int | None  # HOLD: 1-based place in line for its pool, by ETA
    alternatives: tuple[Alternative, ...]  # REFUSE: nearest starts that would fit
    lanes: tuple[str, ...]  # ADMIT: more pools raced at once besides pool_id, preferred first
    detail: str  # what exactly was wrong, for REJECT, REFUSE and TIME_OUT

    def __init__(
        self, *, request_id: str, outcome: Outcome, reason: Reason | Expiry | None = None,
        pool_id: str | None = None, start_at: datetime | None = None,
        end_at: datetime | None = None, position: int | None = None,
        alternatives: tuple[Alternative, ...] = (), lanes: tuple[str, ...] = (),
        detail: str = "",
    ) -> None:  # fmt: skip
        put = object.__setattr__  # frozen: set once, here
        put(self, "request_id", request_id)
        put(self, "outcome", outcome)
        put(self, "reason", reason)
        put(self, "pool_id", pool_id)
        put(self, "start_at", start_at)
        put(self, "end_at", end_at)
        put(self, "position", position)
        put(self, "alternatives", alternatives)
        put(self, "lanes", lanes)
        put(self, "detail", detail)

    def __reduce__(self) -> tuple[object, ...]:
        return rebuild(self)

    @property
    def eta(self) -> datetime | None:
        """When the request is expected to start: now if admitted, the held slot if held."""
        return self.start_at if self.outcome in (Outcome.ADMIT, Outcome.HOLD) else None

    @property
    def message(self) -> str:
        """One human-readable line for events and the CLI (a refusal names its
        alternatives)."""
        if self.outcome is Outcome.REFUSE and self.reason is not Reason.START_PASSED:
            return self.detail + offered(self.alternatives)
        if self.detail:
            return self.detail
        where = f" in {self.pool_id}" if self.pool_id else ""
        when = self.start_at.isoformat() if self.start_at else ""
        match self.outcome:
            case Outcome.ADMIT:
                return f"admitted{where}"
            case Outcome.CONFIRM:
                return f"block confirmed{where} from {when}"
            case Outcome.HOLD:
                return f"waiting ({self.reason}); slot held{where} from {when}"
            case _:
                return f"waiting ({self.reason}); no slot opens before max_wait passes yet"


def offered(alternatives: Sequence[Alternative]) -> str:
    """The clause naming the starts a refused block is offered (those Google's Advice API
    recommends marked so)."""
    if not alternatives:
        return "; no start that fits was found"
    nearest = ", ".join(
        f"{alternative.start_at.isoformat()} in {alternative.pool_id}"
        + (" (Google recommends)" if alternative.advised else "")
        for alternative in alternatives
    )
    return f"; nearest starts that fit: {nearest}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Race:
    """More pools a request already waiting at Google is offered to, preferred first."""

    request_id: str
    pools: tuple[str, ...]

    def __reduce__(self) -> tuple[object, ...]:
        return rebuild(self)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Everything one admission pass decided: one decision per pending request, the races
    that grow (requests already admitted, offered to more pools), and the flex requests that
    were planned, in policy order.

    A request's rank (its place in that order) is read from ``order``, not kept in its
    decision: one arrival near the front of a long queue moves every rank behind it, and a
    planner that re-plans only what a change reaches must not rewrite every decision for it."""

    now: datetime
    decisions: tuple[Decision, ...]  # sorted by request_id
    races: tuple[Race, ...] = ()  # sorted by request_id
    order: tuple[str, ...] = ()  # the planned flex requests' ids, in policy order

    def __reduce__(self) -> tuple[object, ...]:
        return rebuild(self)

    @cached_property
    def _index(self) -> dict[str, Decision]:
        return {decision.request_id: decision for decision in self.decisions}

    @cached_property
    def _ranks(self) -> dict[str, int]:
        return {request_id: rank for rank, request_id in enumerate(self.order, start=1)}

    def rank(self, request_id: str) -> int | None:
        """1-based place of a flex request in policy order this pass; None for a calendar
        block and for a request decided at screening."""
        return self._ranks.get(request_id)

    def decision(self, request_id: str) -> Decision:
        """The decision for ``request_id`` (KeyError if it was not pending)."""
        return self._index[request_id]

    def having(self, *outcomes: Outcome) -> tuple[Decision, ...]:
        """Decisions with any of ``outcomes``, sorted by request_id."""
        return tuple(decision for decision in self.decisions if decision.outcome in outcomes)

    @property
    def admissions(self) -> tuple[Decision, ...]:
        """Flex requests that start now."""
        return self.having(Outcome.ADMIT)

    @property
    def confirmations(self) -> tuple[Decision, ...]:
        """Calendar blocks booked by this pass."""
        return self.having(Outcome.CONFIRM)
