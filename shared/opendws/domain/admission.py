"""The admission core: ``admit(snapshot, now) -> Plan``.

Pure and deterministic: no I/O, no clock, no randomness, no ids; the same snapshot in any input
order gives the same plan. One pass reads as numbered steps:

1. Screen every pending request: an unknown tenant, a gang no allowed pool can ever hold, a gang
   larger than the tenant may ever hold, or a flex window that already closed is decided at once.
2. Calendar blocks, first come first served, against exact step profiles of committed usage:
   each is confirmed in its most preferred pool where it fits as asked, or refused with the three
   nearest start times that would fit.
3. Flex requests in policy order against a minute grid of committed usage (grants and the blocks
   just confirmed): each gets its earliest feasible start in any of its pools within its window,
   respecting pool capacity and tenant/cohort quota. A start of "now" is an admission; a later
   start is held in the grid (conservative backfill), so no one behind it can delay it, and it
   becomes the request's ETA and queue position.
4. Racing: a request waiting at Google in pools that are all short (``snapshot.racing``) —
   and, with ``policy.race_eagerly``, each request admitted now — is offered to more of its
   pools, up to ``policy.race_width`` in all: more lanes only where the gang fits now in what
   every decision above left free, so a lane never delays anyone. Each lane holds a full grant
   (pool capacity and quota) while it races: whichever lanes Google serves, no pool and no
   tenant goes over its limit.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, is_dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from operator import itemgetter
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from opendws.domain.calendar import lead_of
from opendws.domain.model import (
    CapacityRequest,
    Commitment,
    Grant,
    Mode,
    Pool,
    Provider,
    QueueingStrategy,
    Snapshot,
    region_of,
    require_utc,
)
from opendws.domain.policy import FlexKey, calendar_key, flex_key
from opendws.domain.quotas import Limit, LimitKey, QuotaBook
from opendws.domain.reasons import Expiry
from opendws.domain.timeline import (
    MICROSECOND,
    MINUTE,
    MinuteGrid,
    StepProfile,
    ceil_cells,
    feasible_starts,
    floor_cells,
)

# How many alternative start times a refused calendar block is offered.
ALTERNATIVES = 3
# Cells a planner that plans again keeps beyond what its pass needs (see _decide_flex).
KEPT_SLACK_CELLS = 24 * 60
_NO_CELL = 1 << 62  # above every grid's cells


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


def _rebuild(value: object) -> tuple[object, ...]:
    """How a frozen dataclass of the planner is pickled and copied: built again from its
    fields by its constructor. (The default way makes a blank object and sets each field on
    it, which a frozen class compiled by mypyc refuses: see setup.py.)"""
    assert is_dataclass(value)
    values = {item.name: getattr(value, item.name) for item in fields(value)}
    return (_built, (type(value), values))


def _built(kind: type[object], values: dict[str, object]) -> object:
    """``kind`` built from ``values`` by its constructor (see :func:`_rebuild`)."""
    return kind(**values)


@dataclass(frozen=True, slots=True, kw_only=True)
class Alternative:
    """A start time at which a refused calendar block would fit, and where; ``advised`` when
    Google's Advice API recommends it too (Google is then likely to approve it)."""

    start_at: datetime
    pool_id: str
    advised: bool = False

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuild(self)


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
        return _rebuild(self)

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
        return _rebuild(self)


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
        return _rebuild(self)

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


def admit(snapshot: Snapshot, now: datetime) -> Plan:
    """Decide every pending request of ``snapshot`` at ``now`` (see the module docstring)."""
    require_utc("now", now)
    with _collector_paused():
        return _Pass(snapshot, now).run()


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Keep Python's cyclic garbage collector off for the duration, then restore its state.

    A pass allocates hundreds of thousands of small objects (keys, needs, decisions) that
    all live to its end and form no cycles: each collection would only re-scan them, and the
    oldest generation's collections re-scan everything allocated so far, so their total cost
    grows faster than the pass (about a tenth of a 100k pass). Reference counting still frees
    whatever dies; the collector, when it was on, runs again as soon as the pass returns.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Candidate(NamedTuple):
    """A screened request with the pools it may use (most preferred first) and its limits.
    (A named tuple: the planner makes one per pending request, so it must be cheap.)"""

    request: CapacityRequest
    pools: tuple[int, ...]  # indices into _Pass.pools
    limits: tuple[Limit, ...]
    strict: bool  # its tenant queues strict FIFO


class _Allowed(NamedTuple):
    """The pools one (shape, locations) combination may use, and the largest one's capacity."""

    pools: tuple[int, ...]
    largest: int


class _Entry:
    """One flex request in policy order and what its search found, kept by a planner that
    plans again (see :mod:`opendws.domain.incremental`)."""

    __slots__ = (
        "alt",
        "best",
        "candidate",
        "clear",
        "first",
        "floor",
        "key",
        "last",
        "length",
        "needs",
        "reason",
        "row",
        "stamp",
    )

    def __init__(
        self,
        key: FlexKey,
        candidate: _Candidate,
        length: int,
        first: int,
        last: int,
        floor: int,
        best: int | None,
        row: int,
        needs: tuple[tuple[int, int], ...],
        reason: Reason | None,
    ) -> None:
        self.key = key
        self.candidate = candidate
        self.length = length  # run, in cells, from a whole minute
        self.first = first  # run, in cells, from now (cell 0): at most one more
        self.last = last  # latest start cell (its deadline)
        self.floor = floor  # the strict-FIFO floor its search started from
        self.best = best  # start cell, None if no slot opens in its window
        self.row = row  # pool row it is placed in (-1 if none)
        self.needs = needs  # what it took in the grid from ``best`` for ``length`` cells
        self.reason = reason  # why it is held (None if admitted or waiting)
        # Why it would be held were its run from now a cell longer, while it takes ``length``
        # cells (``first == length``), judged in the same view: the clock moving within a
        # minute changes only ``first`` (see _longer_reason).
        self.alt = reason
        # Its place in policy order as one integer, larger later (kept by the incremental
        # planner, which compares these instead of keys where it can).
        self.stamp = 0
        # Bit ``i`` set: the pool of its ``i``-th option (see _options) alone has no room, in
        # its view, for a run of ``length`` cells from any start that could win (from that
        # option's earliest start, and its floor, up to its deadline if it has no slot, else
        # up to its slot: the slot itself included for a more preferred pool, which wins a
        # tie). Proved and kept by the incremental planner (see its _stands); none at first.
        self.clear = 0

    @property
    def span(self) -> int:
        """Cells its placement takes: from now, or from a whole minute."""
        return self.first if self.best == 0 else self.length


@dataclass(kw_only=False, slots=True)
class _FlexState:
    """What a flex step leaves for the next plan: the grid after every placement, its rows,
    and each request's entry in policy order."""

    entries: list[_Entry]
    grid: MinuteGrid
    limits: list[int]
    limit_row: dict[LimitKey, int]
    binding: list[bool]
    lowest: list[int]  # per row, its least free amount from commitments alone
    short: list[int]
    cells: int
    # Each request shape's options (see _options): binding, limit_row and short stay as they
    # are while the state lives (a change to any of them plans in full), so these hold too.
    shapes: dict[_ShapeKey, tuple[_Option, ...]]
    # The commitments held before the policy order (``_hold_commitments``), or None if one
    # was not held at its first slot. The grid holds each at its slot (``held_slots``: id →
    # its _Kept), not where the plan moved it earlier; each entry (in policy order, none of
    # ``entries``) says where the plan put it (best, row) and why it waits.
    held: list[_Entry] | None = None
    held_slots: dict[str, _Kept] = field(default_factory=dict)


_Keys = dict[str, tuple[CapacityRequest, bool, timedelta, FlexKey]]


class _Pass:
    """One admission pass; lives inside :func:`admit`, or in a planner that keeps its state
    (``keep``) to plan again."""

    def __init__(
        self, snapshot: Snapshot, now: datetime, *, keep: bool = False, keys: _Keys | None = None
    ) -> None:
        """``keys``: the policy keys a pass before worked out (see :attr:`keys`); one is used
        again only for the same request object, strictness and half-life."""
        self.snapshot = snapshot
        self.now = now
        # The flex grid's cells are the clock's whole minutes (UTC), the same in every pass:
        # cell 0 is the minute ``now`` falls in, and a start there is now; a later start is at
        # a whole minute. A slot one pass holds lies on the cell boundaries of the next.
        self.origin = now.replace(second=0, microsecond=0)
        self.keep = keep
        self.flex: _FlexState | None = None
        self.calendar: list[_Candidate] = []  # kept (``keep``) to decide them again
        self.base_grants = 0  # kept: how many of self.grants the snapshot gave (then blocks)
        self.pools: tuple[Pool, ...] = tuple(sorted(snapshot.pools, key=lambda p: p.pool_id))
        self.pool_row = {pool.pool_id: row for row, pool in enumerate(self.pools)}
        # Per pool row: Google's expected serve wait, which a flex run placed there holds
        # before its run (see Pool.serve_wait); with none anywhere, a run holds its duration.
        self.serve_waits = tuple(pool.serve_wait for pool in self.pools)
        self.waits = any(self.serve_waits)
        self.quotas = QuotaBook(sorted(snapshot.tenants, key=lambda t: t.name))
        # The snapshot's grants, then (step 2) the blocks confirmed. A kept pass's stay as its
        # own pass left them: the incremental planner keeps the later grants and bookings.
        self.grants: list[Grant] = sorted(snapshot.grants, key=_grant_key)
        self.decisions: dict[str, Decision] = {}
        self.races: dict[str, tuple[str, ...]] = {}
        self.order: list[str] = []  # the planned flex requests' ids, in policy order
        # (provider, shape, accelerator) → location (zone or region) → pool rows, ascending.
        self._pools_by_location: dict[tuple[str, str, str], dict[str, list[int]]] = {}
        for row, pool in enumerate(self.pools):
            by_location = self._pools_by_location.setdefault(
                (pool.provider, pool.shape, pool.accelerator), defaultdict(list)
            )
            by_location[pool.zone].append(row)
            by_location[region_of(pool.zone)].append(row)
        self._allowed_cache: dict[tuple[str | None, str, tuple[str, ...]], _Allowed] = {}
        # request id → (request, strict, half-life, policy key) of each flex request planned
        # and stamped by now: its key does not move with the clock (policy.flex_key), so the
        # next pass may take it from here. Kept only for a caller that passed keys in.
        self._keys_before = keys
        self.keys: _Keys = {}

    def run(self) -> Plan:
        pending = sorted(self.snapshot.pending, key=lambda r: r.request_id)
        calendar, flex = self._screen(pending)  # 1
        if self.keep:
            self.calendar = calendar
            self.base_grants = len(self.grants)
        self._decide_calendar(calendar)  # 2
        self._decide_flex(flex, self._racers())  # 3 and 4
        # Every pending request (ids unique, sorted above) has exactly one decision.
        decisions = tuple(self.decisions[request.request_id] for request in pending)
        races = tuple(Race(request_id=key, pools=self.races[key]) for key in sorted(self.races))
        return Plan(now=self.now, decisions=decisions, races=races, order=tuple(self.order))

    def holds(self, candidate: _Candidate) -> timedelta:
        """How long a flex run placed for ``candidate`` holds its pool: Google's expected
        serve wait, then its run duration. The wait is the largest of its pools' — exact for
        one pool, and never short for several (a slot in a pool that serves sooner frees
        early, so others move earlier, never later)."""
        run = candidate.request.run_duration
        if not self.waits:
            return run
        return run + max(self.serve_waits[row] for row in candidate.pools)

    def first_cells(self, run: timedelta) -> int:
        """Cells a run takes from now (inside cell 0): it may reach one further than from a
        whole minute."""
        return ceil_cells(self.now - self.origin + run)

    def last_cell(self, request: CapacityRequest) -> int:
        """The latest cell a flex request may start in: its deadline's minute (a deadline lies
        at most max_wait after now, even for a request stamped in the future, which bounds
        the grid to 14 days)."""
        return floor_cells(min(request.submitted_at, self.now) + _max_wait(request) - self.origin)

    def start_of(self, cell: int) -> datetime:
        """The instant a start in ``cell`` means: now in cell 0, else the cell's minute."""
        return self.now if cell == 0 else self.origin + cell * MINUTE

    def _racers(self) -> list[tuple[_Candidate, tuple[int, ...]]]:
        """The racing requests that may take more lanes: each with the rows it waits in."""
        if self.snapshot.policy.race_width <= 1:
            return []
        racers = []
        for racer in sorted(self.snapshot.racing, key=lambda r: r.request.request_id):
            request = racer.request
            if request.mode is not Mode.FLEX_START or not self.quotas.knows(request.tenant):
                continue
            waiting = tuple(self.pool_row[p] for p in racer.pools if p in self.pool_row)
            allowed = self._allowed_pools(request).pools
            if len(waiting) >= self.snapshot.policy.race_width or len(allowed) <= len(waiting):
                continue
            limits = self.quotas.limits(request.tenant, request.gang.accelerator)
            racers.append((_Candidate(request, allowed, limits, False), waiting))
        return racers

    # 1. Screening ---------------------------------------------------------------------------

    def _screen(
        self, pending: Iterable[CapacityRequest]
    ) -> tuple[list[_Candidate], list[_Candidate]]:
        calendar: list[_Candidate] = []
        flex: list[_Candidate] = []
        strict = {
            tenant.name
            for tenant in self.snapshot.tenants
            if tenant.queueing is QueueingStrategy.STRICT_FIFO
        }
        for request in pending:
            allowed = self._allowed_pools(request)
            verdict = self._screen_out(request, allowed)
            if verdict is not None:
                self.decisions[request.request_id] = verdict
                continue
            candidate = _Candidate(
                request,
                allowed.pools,
                self.quotas.limits(request.tenant, request.gang.accelerator),
                request.tenant in strict,
            )
            (flex if request.mode is Mode.FLEX_START else calendar).append(candidate)
        return calendar, flex

    def _screen_out(self, request: CapacityRequest, allowed: _Allowed) -> Decision | None:
        """The decision for a request that cannot be planned at all, or None if it can."""
        gang = request.gang
        if not self.quotas.knows(request.tenant):
            return _rejection(
                request, Reason.UNKNOWN_TENANT, f"tenant {request.tenant!r} is not configured"
            )
        if not allowed.pools:
            return _rejection(
                request,
                Reason.NEVER_FITS,
                f"no {gang.provider} pool of {gang.shape} ({gang.accelerator}) in "
                f"{', '.join(request.locations)}",
            )
        if gang.units > allowed.largest:
            return _rejection(
                request,
                Reason.NEVER_FITS,
                f"the gang needs {gang.units} units in one pool; the largest allowed pool "
                f"holds {allowed.largest}",
            )
        ceiling = self.quotas.ceiling(request.tenant, gang.accelerator)
        if gang.accelerator_units > ceiling:
            return _rejection(
                request,
                Reason.EXCEEDS_QUOTA,
                f"the gang needs {gang.accelerator_units} × {gang.accelerator}; tenant "
                f"{request.tenant!r} may hold at most {ceiling} at once, borrowing included",
            )
        if request.max_wait is not None and request.submitted_at + request.max_wait < self.now:
            return Decision(
                request_id=request.request_id,
                outcome=Outcome.TIME_OUT,
                reason=Expiry.MAX_WAIT_PASSED,  # the window closed before admission
                detail=(
                    f"max_wait passed at {(request.submitted_at + request.max_wait).isoformat()}"
                    " before any slot opened"
                ),
            )
        if request.start_at is not None and request.start_at + request.run_duration <= self.now:
            return Decision(
                request_id=request.request_id,
                outcome=Outcome.REFUSE,
                reason=Reason.START_PASSED,
                detail="the whole calendar block lies in the past",
            )
        return None

    def _allowed_pools(self, request: CapacityRequest) -> _Allowed:
        """Pools that serve the request, most preferred location first, then by pool_id."""
        gang = request.gang
        # The machine type (None for TPU gangs) and accelerator determine the pool shape.
        key = (gang.machine_type, gang.accelerator, request.locations)
        cached = self._allowed_cache.get(key)
        if cached is None:
            by_location = self._pools_by_location.get(
                (gang.provider, gang.shape, gang.accelerator), {}
            )
            allowed = list(
                dict.fromkeys(
                    row for location in request.locations for row in by_location.get(location, ())
                )
            )
            largest = max((self.pools[row].capacity for row in allowed), default=0)
            cached = self._allowed_cache[key] = _Allowed(tuple(allowed), largest)
        return cached

    # 2. Calendar blocks ---------------------------------------------------------------------

    def _decide_calendar(self, calendar: list[_Candidate]) -> None:
        if not calendar:
            return
        ledger = _ExactLedger(
            self.now, self.pools, self.pool_row, self.quotas, self.grants, calendar
        )
        for candidate in sorted(calendar, key=lambda c: calendar_key(c.request)):
            grant = self.decide_block(ledger, candidate)
            if grant is not None:
                ledger.commit(grant)
                self.grants.append(grant)

    def decide_block(self, ledger: _ExactLedger, candidate: _Candidate) -> Grant | None:
        """Decide one calendar block on ``ledger`` (the grants and the blocks confirmed before
        it, in calendar order) and record the decision; the grant it books if confirmed (the
        caller commits it)."""
        request = candidate.request
        assert request.start_at is not None  # a calendar request always has one
        row = ledger.first_fit(candidate)
        if row is not None:
            grant = Grant.of(request, self.pools[row].pool_id, request.start_at)
            self.decisions[request.request_id] = Decision(
                request_id=request.request_id,
                outcome=Outcome.CONFIRM,
                pool_id=grant.pool_id,
                start_at=grant.start_at,
                end_at=grant.end_at,
            )
            return grant
        quota_bound = not ledger.quota_fits(candidate)
        alternatives = ledger.alternatives(candidate)
        binding = "the tenant's quota is" if quota_bound else "the capacity is"
        self.decisions[request.request_id] = Decision(
            request_id=request.request_id,
            outcome=Outcome.REFUSE,
            reason=Reason.QUOTA if quota_bound else Reason.NO_CAPACITY,
            alternatives=alternatives,
            detail=(f"{binding} committed during the block from {request.start_at.isoformat()}"),
        )
        return None

    # 3. Flex requests -----------------------------------------------------------------------

    def _decide_flex(
        self, flex: list[_Candidate], racers: list[tuple[_Candidate, tuple[int, ...]]]
    ) -> None:
        if not flex and not racers:
            return
        now = self.now
        limits = [pool.capacity for pool in self.pools]
        limit_row: dict[LimitKey, int] = {}
        for candidate in (*flex, *(racer for racer, _ in racers)):
            for limit in candidate.limits:
                if limit.key not in limit_row:
                    limit_row[limit.key] = len(limits)
                    limits.append(limit.amount)
        # By policy key alone: keys are unique (they end in request_id), so this is the order
        # of the whole tuples, with one key comparison per step instead of two.
        queue = sorted(self._queued(flex), key=_first)
        self.order = [candidate.request.request_id for _, candidate, _, _, _ in queue]
        cells = 1 + max(
            (
                *(first + last for _, _, _, first, last in queue),
                *(self.first_cells(self.holds(racer)) for racer, _ in racers),
            )
        )
        if self.keep:
            # A kept grid reaches a day further, so that later passes can move its origin
            # with the clock (a larger grid decides nothing differently: every run searched
            # still ends by its own deadline plus its length).
            cells += KEPT_SLACK_CELLS
        grid = MinuteGrid(self.origin, cells, limits, self._commitments(limit_row))
        lowest = [grid.lowest(row) for row in range(len(limits))] if self.keep else []
        binding = self._binding_rows(
            grid, limits, limit_row, [*flex, *(racer for racer, _ in racers)]
        )
        short = [_short_cell(pool, now, self.origin) for pool in self.pools]
        fifo_floor: dict[str, int] = {}  # strict-FIFO tenant → earliest start of its next request
        shapes: dict[_ShapeKey, tuple[_Option, ...]] = {}
        placed: list[tuple[int, int, int, _Candidate, Reason | None]] = []
        entries: list[_Entry] = []
        held: list[_Entry] = []  # kept: the commitments held, in policy order
        kept, all_first = self._hold_commitments(grid, queue, binding, limit_row, short)
        floors: dict[str, int] = {}  # a strict-FIFO commitment → its tenant's floor before it
        for rank, (key, candidate, length, first, last) in enumerate(queue, start=1):
            request = candidate.request
            promise = kept.get(request.request_id)
            if promise is not None:  # held where it was promised; it may move earlier below
                cell, row, needs, _, _ = promise
                if candidate.strict:
                    floors[request.request_id] = fifo_floor.get(request.tenant, 0)
                    fifo_floor[request.tenant] = cell
                placed.append((row, cell, rank, candidate, None))  # judged at the end
                if self.keep:
                    held.append(
                        _Entry(key, candidate, length, first, last, 0, cell, row, needs, None)
                    )
                continue
            floor = fifo_floor.get(request.tenant, 0) if candidate.strict else 0
            best, best_row, needs, reason = _place(
                grid, candidate, length, first, last, floor, binding, limit_row, short, shapes
            )
            if self.keep:
                entry = _Entry(
                    key, candidate, length, first, last, floor, best, best_row, needs, reason
                )
                if best:
                    entry.alt = _longer_reason(
                        grid, best_row, request.gang.units, best, floor, short[best_row],
                        length, first, reason,
                    )  # fmt: skip
                entries.append(entry)
            if best is None:
                if candidate.strict:
                    # It starts by its deadline or times out then: either way, no later.
                    fifo_floor[request.tenant] = max(floor, last)
                self.decisions[request.request_id] = _waiting(request)
                continue
            grid.take(needs, best, first if best == 0 else length)
            if candidate.strict:
                fifo_floor[request.tenant] = best
            placed.append((best_row, best, rank, candidate, reason))
        moves: list[_Move] = []
        if kept:
            placed = self._move_earlier(grid, placed, kept, binding, limit_row, short, moves)
            placed = self._judge_commitments(grid, placed, kept, floors, binding, short)
        lanes = self._race(grid, placed, racers, binding, limit_row, short)
        self._record_placements(grid, placed, lanes)
        if self.keep:
            if held:
                # The kept grid holds each commitment where it was promised (a later pass
                # moves them earlier again from there); each entry says where it went.
                _undo(grid, moves)
                final = {candidate.request.request_id: (row, cell, reason)
                         for row, cell, _, candidate, reason in placed}  # fmt: skip
                for entry in held:
                    entry.row, entry.best, entry.reason = final[entry.candidate.request.request_id]
            self.flex = _FlexState(
                entries,
                grid,
                limits,
                limit_row,
                binding,
                lowest,
                short,
                cells,
                shapes,
                held if all_first else None,
                kept,
            )

    def _queued(
        self, flex: Iterable[_Candidate]
    ) -> Iterator[tuple[FlexKey, _Candidate, int, int, int]]:
        """Each flex candidate with its policy key and its run and window in cells: ``(key,
        candidate, length, first, last)`` (see :meth:`first_cells` and :meth:`last_cell`)."""
        now = self.now
        origin = self.origin
        into_minute = now - origin
        half_life = self.snapshot.policy.aging_half_life
        waits = self.waits
        before, keys = self._keys_before, self.keys
        for candidate in flex:
            request = candidate.request
            strict = candidate.strict
            run = self.holds(candidate) if waits else request.run_duration
            if before is None:  # admit alone: no pass plans after this one
                key = flex_key(request, strict=strict, now=now, half_life=half_life)
            elif (
                (known := before.get(request.request_id)) is not None
                and known[0] is request
                and known[1] is strict
                and known[2] == half_life
            ):
                key = known[3]
                keys[request.request_id] = known
            else:
                key = flex_key(request, strict=strict, now=now, half_life=half_life)
                if request.submitted_at <= now:  # a later stamp ages from now: not kept
                    keys[request.request_id] = (request, strict, half_life, key)
            yield (
                key,
                candidate,
                -(-run // MINUTE),  # ceil_cells(run)
                -(-(into_minute + run) // MINUTE),  # self.first_cells(run)
                self.last_cell(request),
            )

    def _hold_commitments(
        self,
        grid: MinuteGrid,
        queue: Sequence[tuple[FlexKey, _Candidate, int, int, int]],
        binding: Sequence[bool],
        limit_row: dict[LimitKey, int],
        short: Sequence[int],
    ) -> tuple[dict[str, _Kept], bool]:
        """Commitments (``policy.commit_within``): in policy order, each pending flex request
        whose announced ETA lies within the horizon takes its slot in its pool first, where it
        still fits — at the minute of its ETA, or the next when the grid's minutes fall
        between (under a minute's rounding). One that no longer fits (a stockout, a pool or a
        quota shrunk, a run that started late) is planned again like any other. Returns
        request id → :data:`_Kept`, and whether each took its first slot (see
        :meth:`commitment_slots`); why each waits is judged once the plan is finished
        (:meth:`_judge_commitments`)."""
        horizon = self.snapshot.policy.commit_within
        if horizon is None or not self.snapshot.commitments:
            return {}, True
        promised = {c.request_id: c for c in self.snapshot.commitments}
        # Per commitment, in policy order: (request id, pool row, needs, its candidate slots
        # as (cell, span), its run's cells from a whole minute and from now).
        held: list[
            tuple[str, int, tuple[tuple[int, int], ...], list[tuple[int, int]], int, int]
        ] = []
        beyond = self.now + horizon  # a start told from here on is an estimate
        for _, candidate, length, first_length, last in queue:
            request = candidate.request
            commitment = promised.get(request.request_id)
            if commitment is None or commitment.start_at >= beyond:
                continue
            found = self.commitment_slots(
                commitment, candidate, length, first_length, last, binding, limit_row, short
            )
            if found is not None:
                held.append((request.request_id, *found, length, first_length))
        # Why each waits is judged on the finished plan (_judge_commitments). Most passes
        # keep every commitment at its first slot: taken at once where they all fit so.
        if grid.take_all([(needs, *slots[0]) for _, _, needs, slots, _, _ in held]):
            return {
                key: (slots[0][0], row, needs, length, first)
                for key, row, needs, slots, length, first in held
            }, True
        kept: dict[str, _Kept] = {}
        for key, row, needs, slots, length, first in held:
            for cell, span in slots:
                if all(grid.fits(need, units, cell, span) for need, units in needs):
                    grid.take(needs, cell, span)
                    kept[key] = (cell, row, needs, length, first)
                    break
        return kept, False

    def commitment_slots(
        self,
        commitment: Commitment,
        candidate: _Candidate,
        length: int,
        first_length: int,
        last: int,
        binding: Sequence[bool],
        limit_row: dict[LimitKey, int],
        short: Sequence[int],
    ) -> tuple[int, tuple[tuple[int, int], ...], list[tuple[int, int]]] | None:
        """Where a commitment within the horizon may be held: (pool row, needs, its slots as
        (cell, span), the first preferred), or None if it cannot be (its pool is gone or not
        one of the request's, or no slot lies between the pool's cool-down and the request's
        deadline)."""
        row = self.pool_row.get(commitment.pool_id)
        if row is None or row not in candidate.pools:
            return None
        # A start told by an earlier pass lies on a whole minute, one of this pass's cell
        # boundaries; one that has come is now (cell 0).
        offset = commitment.start_at - self.origin
        first = max(0, floor_cells(offset))
        cells = [first] if first == 0 or offset % MINUTE == timedelta(0) else [first, first + 1]
        slots = [
            (cell, first_length if cell == 0 else length)
            for cell in cells
            if short[row] <= cell <= last
        ]
        if not slots:
            return None
        quota = _quota_needs(candidate, binding, limit_row)
        needs = ((row, candidate.request.gang.units), *quota) if binding[row] else quota
        return row, needs, slots

    def _move_earlier(
        self,
        grid: MinuteGrid,
        placed: list[tuple[int, int, int, _Candidate, Reason | None]],
        kept: dict[str, _Kept],
        binding: Sequence[bool],
        limit_row: dict[LimitKey, int],
        short: Sequence[int],
        moves: list[_Move] | None = None,
        settled: Mapping[str, frozenset[int]] | None = None,
        gained: dict[int, int] | None = None,
    ) -> list[tuple[int, int, int, _Candidate, Reason | None]]:
        """Each committed request, in policy order, moves to an earlier start where what the
        plan left free allows (its own slot given back first, so it never moves later).
        ``moves`` collects each move made, in order (see :func:`_undo`).

        A planner that plans again passes ``settled``: request id → the rows its search reads,
        for each commitment held where the last pass placed it, and ``gained``: per row, the
        first cell from which its free amounts may have grown since that pass's test read
        them (the slots moves made here give back are added). A start before cell ``c``
        needs room only in cells before ``c`` (from ``c`` on, the slot it holds has room for
        it: see :meth:`_may_start_before`), so one none of whose rows gained before ``c``
        cannot start earlier now either, and is not tested. (A later now adds no earlier
        start: a run from it covers every cell that one from its minute, tested before,
        would.)"""
        moved = []
        # Every test reads cells before a commitment's slot, all within the horizon: per
        # (needs, first allowed cell), one scan up to the last slot answers them all until
        # the grid changes (a move), so each is scanned once, not per request.
        reach = 1 + max(promise[0] for promise in kept.values())
        rooms: dict[tuple[tuple[tuple[int, int], ...], int], _Rooms] = {}
        skip = settled if settled is not None and gained is not None else {}
        for item in placed:  # in rank order, as placed
            row, cell, rank, candidate, reason = item
            request_id = candidate.request.request_id
            promise = kept.get(request_id)
            # A strict-FIFO tenant's requests keep their order among themselves: they stay.
            if promise is None or cell == 0 or candidate.strict:
                moved.append(item)
                continue
            reads = skip.get(request_id)
            if reads is not None:
                assert gained is not None
                for read in reads:
                    if gained.get(read, _NO_CELL) < cell:
                        break
                else:  # no row it reads gained before its slot: it cannot move
                    moved.append(item)
                    continue
            _, _, needs, length, first = promise
            # The test reads only the cells before its slot, so its own slot may stay taken
            # for it; the search may reach into the slot, so that is given back first.
            # Its needs are its pool's (where that can bind), then its quota's.
            quota = needs[1:] if binding[promise[1]] else needs
            if not self._may_start_before(
                grid, candidate, cell, length, quota, binding, short, rooms, reach
            ):
                moved.append((row, cell, rank, candidate, reason))
                continue
            grid.give(needs, cell, length)
            grid.forget()  # its slot given back raised free amounts: facts may not hold
            best, best_row, best_needs, best_reason = _place(
                grid, candidate, length, first, cell, 0, binding, limit_row, short
            )
            if best is None or best >= cell:
                best, best_row, best_needs, best_reason = cell, row, needs, reason
            else:
                rooms.clear()  # it moved: free amounts changed
                if gained is not None:  # its slot given back: those rows gained from there
                    for need, _ in needs:
                        gained[need] = min(gained.get(need, _NO_CELL), cell)
                if moves is not None:
                    moves.append(
                        (needs, cell, length, best_needs, best, first if best == 0 else length)
                    )
            grid.take(best_needs, best, first if best == 0 else length)
            moved.append((best_row, best, rank, candidate, best_reason))
        return moved

    def _judge_commitments(
        self,
        grid: MinuteGrid,
        placed: list[tuple[int, int, int, _Candidate, Reason | None]],
        kept: dict[str, _Kept],
        floors: Mapping[str, int],
        binding: Sequence[bool],
        short: Sequence[int],
        known: Mapping[str, Reason | None] | None = None,
    ) -> list[tuple[int, int, int, _Candidate, Reason | None]]:
        """Why each committed request still waits, judged on the finished plan (``known``:
        the reasons a planner that plans again knows still hold, not judged again).

        A commitment is held before anyone else is placed and moved earlier after everyone
        is, so the grid it was held on lacked most of what now keeps it waiting. Judged
        there, a pool with room at that moment read as QUOTA; judged again once the plan's
        own admissions are carried out (as grants, present from the start), the same slot read
        as NO_CAPACITY_UNTIL, and the request's reason flipped on every pass that followed an
        admission. On the finished grid, with its own slot given back, the reason is what
        keeps it from starting earlier in this plan — whether its blockers are grants or
        placements — so two passes over the same commitments name the same reason. A
        strict-FIFO tenant's commitment is judged from ``floors`` (its tenant's floor when the
        policy order reached it), as a search would be: FIFO_BLOCKED where an earlier sibling
        is what holds it."""
        if not any(cell > 0 and candidate.request.request_id in kept
                   for _, cell, _, candidate, _ in placed):  # fmt: skip
            return placed
        # What searches proved holds for the finished grid (free amounts went down since, or
        # came back where they were), not once a slot is given back: forget it.
        grid.forget()
        judged: list[tuple[int, int, int, _Candidate, Reason | None]] = []
        known = known or {}
        # A pool row's free amount in the first cell a reason compares (one of few: the
        # grid is the same for every judgement, a slot given back being taken again after).
        free_at: dict[tuple[int, int], int] = {}
        for item in placed:
            row, cell, rank, candidate, _ = item
            request = candidate.request
            request_id = request.request_id
            if request_id in known:
                reason = known[request_id]
            elif cell > 0 and (promise := kept.get(request_id)) is not None:
                units = request.gang.units
                length, first = promise[3], promise[4]
                floor = floors.get(request_id, 0)
                # The pool row lacks the gang in the first cell _hold_reason compares, a cell
                # before the slot: NO_CAPACITY_UNTIL, in one read (the slot covers no cell
                # before its start, so it need not be given back to judge it).
                lowest = _first_compared(cell, floor, short[row], length, first)
                if lowest < cell:
                    free = free_at.get((row, lowest))
                    if free is None:
                        free = free_at[row, lowest] = grid.free(row, lowest)
                    if free < units:
                        judged.append((row, cell, rank, candidate, Reason.NO_CAPACITY_UNTIL))
                        continue
                # The reason reads the pool's row from max(floor, short) over at most a run
                # from now: give back its own slot only where that reaches it.
                own = ((row, units),) if binding[row] else ()
                reaches = bool(own) and cell < max(floor, short[row]) + 1 + first
                if reaches:
                    grid.give(own, cell, length)
                reason = _hold_reason(grid, row, units, cell, floor, short[row], length, first)
                if reaches:
                    grid.take(own, cell, length)
            else:
                judged.append(item)
                continue
            judged.append((row, cell, rank, candidate, reason))
        return judged

    @staticmethod
    def _may_start_before(
        grid: MinuteGrid,
        candidate: _Candidate,
        cell: int,
        length: int,
        quota: tuple[tuple[int, int], ...],
        binding: Sequence[bool],
        short: Sequence[int],
        rooms: dict[tuple[tuple[tuple[int, int], ...], int], _Rooms],
        reach: int,
    ) -> bool:
        """False if ``candidate`` (a run of ``length`` cells, more from now; ``quota``: its
        needs of the quota rows that can bind) cannot start before ``cell`` (at most
        ``reach``) in any of its pools; True proves nothing.

        The test reads only cells before ``cell``, which its own slot (from ``cell``) leaves
        as they are: a run from ``s`` before ``cell`` needs room for all it needs in every
        cell of ``[s, min(s + run, cell))``, so in the cell just before ``cell``, or else in
        a stretch of at least ``length`` cells before that. ``rooms`` keeps, per (needs,
        first allowed cell), where there is room up to ``reach`` and the longest stretch so
        far (:meth:`MinuteGrid.room_runs`): valid while the grid is unchanged."""
        units = candidate.request.gang.units
        for pool_row in candidate.pools:
            lowest = short[pool_row]
            if lowest >= cell:
                continue
            needs = ((pool_row, units), *quota) if binding[pool_row] else quota
            if not needs:
                return True
            runs = rooms.get((needs, lowest))
            if runs is None:
                runs = rooms[needs, lowest] = grid.room_runs(needs, lowest, reach)
            room, longest = runs
            before = cell - 1 - lowest  # the cell just before the slot, in the arrays
            if before >= len(room) or room[before] or (before and longest[before - 1] >= length):
                return True
        return False

    def _race(
        self,
        grid: MinuteGrid,
        placed: list[tuple[int, int, int, _Candidate, Reason | None]],
        racers: list[tuple[_Candidate, tuple[int, ...]]],
        binding: Sequence[bool],
        limit_row: dict[LimitKey, int],
        short: Sequence[int],
    ) -> dict[str, tuple[int, ...]]:
        """Step 4: more lanes — first for requests already waiting at Google in short pools
        (they were admitted before anyone pending), then, when racing eagerly, for the
        requests admitted now in policy order — each in a pool where the whole gang and its
        quota fit now in what the plan left free. Pools cooling down after a stockout are
        never raced. Returns the new lanes of this pass's admissions; those of the racing
        requests go to ``self.races``."""
        width = self.snapshot.policy.race_width
        lanes: dict[str, tuple[int, ...]] = {}
        if width <= 1:
            return lanes
        for candidate, waiting in racers:
            extra = self._lanes(grid, candidate, waiting, width, binding, limit_row, short)
            if extra:
                self.races[candidate.request.request_id] = tuple(
                    self.pools[row].pool_id for row in extra
                )
        if not self.snapshot.policy.race_eagerly:
            return lanes
        for row, start, _, candidate, _ in sorted(placed, key=lambda entry: entry[2]):
            if start == 0 and len(candidate.pools) > 1:
                extra = self._lanes(grid, candidate, (row,), width, binding, limit_row, short)
                if extra:
                    lanes[candidate.request.request_id] = extra
        return lanes

    def _lanes(
        self,
        grid: MinuteGrid,
        candidate: _Candidate,
        taken: tuple[int, ...],
        width: int,
        binding: Sequence[bool],
        limit_row: dict[LimitKey, int],
        short: Sequence[int],
    ) -> tuple[int, ...]:
        """Up to ``width - len(taken)`` more pool rows for ``candidate``, most preferred
        first, each committed in the grid (the gang in the pool, its amount in every quota)."""
        request = candidate.request
        length = self.first_cells(self.holds(candidate))  # a lane starts now
        quota = _quota_needs(candidate, binding, limit_row)
        extra: list[int] = []
        for other in candidate.pools:
            if len(taken) + len(extra) >= width:
                break
            if other in taken or short[other] > 0:
                continue
            needs = ((other, request.gang.units), *quota) if binding[other] else quota
            if all(grid.fits(need_row, amount, 0, length) for need_row, amount in needs):
                grid.take(needs, 0, length)
                extra.append(other)
        return tuple(extra)

    def _binding_rows(
        self,
        grid: MinuteGrid,
        limits: Sequence[int],
        limit_row: dict[LimitKey, int],
        flex: Sequence[_Candidate],
    ) -> list[bool]:
        """Per grid row, whether it can bind at all this pass: a pool or quota whose peak use
        plus every pending request that could land on it stays within its limit never blocks
        anyone, so it is neither searched nor updated (an exact shortcut, not a heuristic)."""
        demand = [0] * len(limits)
        width = self.snapshot.policy.race_width
        for candidate in flex:
            gang = candidate.request.gang
            for row in candidate.pools:
                demand[row] += gang.units
            # A request may hold one lane per raced pool: its quota counts that many times.
            lanes = min(width, len(candidate.pools))
            for limit in candidate.limits:
                demand[limit_row[limit.key]] += gang.accelerator_units * lanes
        return [demand[row] > 0 and grid.lowest(row) < demand[row] for row in range(len(limits))]

    def _record_placements(
        self,
        grid: MinuteGrid,
        placed: list[tuple[int, int, int, _Candidate, Reason | None]],
        lanes: dict[str, tuple[int, ...]],
    ) -> None:
        """Admissions and held slots as decisions; held slots are numbered per pool by ETA,
        then policy rank (position 1 is next in line)."""
        # By pool row, start, then rank: ranks are unique, so the tuples never compare further.
        placed.sort()
        pool_ids = [pool.pool_id for pool in self.pools]
        starts: dict[int, datetime] = {0: self.now}  # cell → the instant a start there means
        position = 0
        previous_row = -1
        decisions = self.decisions
        for row, start, _rank, candidate, reason in placed:
            request = candidate.request
            start_at = starts.get(start)
            if start_at is None:
                start_at = starts[start] = self.start_of(start)
            if start > 0:
                position = position + 1 if row == previous_row else 1
                previous_row = row
            raced = lanes.get(request.request_id)
            decisions[request.request_id] = Decision(
                request_id=request.request_id,
                outcome=Outcome.HOLD if start else Outcome.ADMIT,
                reason=reason,
                pool_id=pool_ids[row],
                start_at=start_at,
                end_at=start_at + self.holds(candidate),
                position=position if start else None,
                lanes=tuple(pool_ids[lane] for lane in raced) if raced else (),
            )

    def _commitments(
        self, limit_row: dict[LimitKey, int]
    ) -> Iterable[tuple[int, datetime, datetime, int]]:
        """Every grant as (grid row, start, end, amount) for its pool and the limits it counts
        against; a grant on a pool no longer configured still counts against quota."""
        for grant in self.grants:
            row = self.pool_row.get(grant.pool_id)
            if row is not None:
                yield row, grant.start_at, grant.end_at, grant.units
            for limit in self.quotas.limits(grant.tenant, grant.accelerator):
                limit_row_index = limit_row.get(limit.key)
                if limit_row_index is not None:
                    yield limit_row_index, grant.start_at, grant.end_at, grant.accelerator_units


class _ExactLedger:
    """Committed usage as exact step profiles (microseconds from now), for calendar blocks."""

    def __init__(
        self,
        now: datetime,
        pools: Sequence[Pool],
        pool_row: dict[str, int],
        quotas: QuotaBook,
        grants: Iterable[Grant],
        blocks: Iterable[_Candidate] = (),
    ) -> None:
        """Profiles of ``grants``, with the start and end of each of ``blocks`` (the blocks
        that may be committed later) already breakpoints wherever it could be committed."""
        self.now = now
        self.pools = pools
        self.quotas = quotas
        self.pool_row = pool_row
        per_pool: list[list[tuple[int, int, int]]] = [[] for _ in pools]
        per_limit: dict[LimitKey, list[tuple[int, int, int]]] = defaultdict(list)
        for grant in grants:
            start, end = self.micros(grant.start_at), self.micros(grant.end_at)
            row = pool_row.get(grant.pool_id)
            if row is not None:
                per_pool[row].append((start, end, grant.units))
            for limit in quotas.limits(grant.tenant, grant.accelerator):
                per_limit[limit.key].append((start, end, grant.accelerator_units))
        pool_times: list[list[int]] = [[] for _ in pools]
        limit_times: dict[LimitKey, list[int]] = defaultdict(list)
        for block in blocks:
            request = block.request
            assert request.start_at is not None  # a calendar request always has one
            start = self.micros(request.start_at)
            edges = (start, start + request.run_duration // MICROSECOND)
            for row in block.pools:
                pool_times[row] += edges
            for limit in block.limits:
                limit_times[limit.key] += edges
        self.pool_usage = [
            StepProfile(intervals, times)
            for intervals, times in zip(per_pool, pool_times, strict=True)
        ]
        self.limit_usage: dict[LimitKey, StepProfile] = {
            key: StepProfile(per_limit.get(key, ()), limit_times.get(key, ()))
            for key in (*per_limit, *(key for key in limit_times if key not in per_limit))
        }

    def micros(self, at: datetime) -> int:
        """``at`` as integer microseconds from now."""
        return (at - self.now) // MICROSECOND

    def _limit_profile(self, key: LimitKey) -> StepProfile:
        profile = self.limit_usage.get(key)
        if profile is None:
            profile = self.limit_usage[key] = StepProfile()
        return profile

    def _window(self, request: CapacityRequest) -> tuple[int, int]:
        """The part of the block still ahead: [max(start, now), end)."""
        assert request.start_at is not None
        start = self.micros(request.start_at)
        return max(start, 0), start + request.run_duration // MICROSECOND

    def quota_fits(self, candidate: _Candidate) -> bool:
        """True if the tenant's and cohort's quota hold over the block."""
        return self._quota_fits(candidate, *self._window(candidate.request))

    def _quota_fits(self, candidate: _Candidate, start: int, end: int) -> bool:
        amount = candidate.request.gang.accelerator_units
        for limit in candidate.limits:
            if self._limit_profile(limit.key).peak(start, end) + amount > limit.amount:
                return False
        return True

    def first_fit(self, candidate: _Candidate) -> int | None:
        """The most preferred pool row where the block fits exactly as asked."""
        start, end = self._window(candidate.request)
        if not self._quota_fits(candidate, start, end):
            return None
        units = candidate.request.gang.units
        for row in candidate.pools:
            pool = self.pools[row]
            if pool.short_until is not None and self.micros(pool.short_until) > start:
                continue
            if self.pool_usage[row].peak(start, end) + units <= pool.capacity:
                return row
        return None

    def commit(self, grant: Grant) -> None:
        """Add a confirmed block to the profiles."""
        start, end = self.micros(grant.start_at), self.micros(grant.end_at)
        row = self.pool_row.get(grant.pool_id)
        if row is not None:
            self.pool_usage[row].add(start, end, grant.units)
        for limit in self.quotas.limits(grant.tenant, grant.accelerator):
            self._limit_profile(limit.key).add(start, end, grant.accelerator_units)

    def alternatives(self, candidate: _Candidate, spare: int = 0) -> tuple[Alternative, ...]:
        """The nearest start times (before or after the one asked) at which the whole block
        fits in some allowed pool, one per gap of feasible starts, at most ALTERNATIVES
        (``spare`` more, for a caller that filters some out)."""
        request = candidate.request
        assert request.start_at is not None
        wanted = self.micros(request.start_at)
        duration = request.run_duration // MICROSECOND
        lead = lead_of(request.gang.provider is Provider.TPU)
        latest = lead.latest // MICROSECOND
        amount = request.accelerator_units
        quota_blocked = [
            span
            for limit in candidate.limits
            for span in self._limit_profile(limit.key).above(limit.amount - amount)
        ]
        points: list[tuple[int, int, int, str]] = []
        for preference, row in enumerate(candidate.pools):
            pool = self.pools[row]
            earliest = (
                0
                if pool.short_until is None
                else max(0, -(-(pool.short_until - self.now) // MICROSECOND))
            )
            earliest = max(earliest, lead.earliest // MICROSECOND)
            blocked = self.pool_usage[row].above(pool.capacity - request.units) + quota_blocked
            for low, high in feasible_starts(blocked, duration, earliest, latest):
                nearest = min(max(wanted, low), high)
                points.append((abs(nearest - wanted), nearest, preference, pool.pool_id))
        points.sort()
        chosen: list[Alternative] = []
        seen: set[int] = set()
        for _, start, _, pool_id in points:
            if start in seen:
                continue
            seen.add(start)
            chosen.append(Alternative(start_at=self.now + start * MICROSECOND, pool_id=pool_id))
            if len(chosen) == ALTERNATIVES + spare:
                break
        return tuple(chosen)


def calendar_alternatives(
    snapshot: Snapshot, request: CapacityRequest, now: datetime,
    advised: Sequence[Alternative] = (), *, refused_in: str | None = None,
) -> tuple[Alternative, ...]:  # fmt: skip
    """The starts a refused or declined calendar block is offered: the ones Google's Advice
    API recommends (``advised``) at which our own timeline fits the block too, then our
    timeline's nearest feasible starts; at most ALTERNATIVES, earliest first, no start twice,
    and never the start asked in ``refused_in``, the pool where Google refused it.
    ``snapshot`` must not hold the block itself (its grants are everyone else's)."""
    plan = _Pass(snapshot, now)
    allowed = plan._allowed_pools(request)
    if not allowed.pools or not plan.quotas.knows(request.tenant):
        return ()
    limits = plan.quotas.limits(request.tenant, request.gang.accelerator)
    ledger = _ExactLedger(now, plan.pools, plan.pool_row, plan.quotas, plan.grants)
    chosen: dict[datetime, Alternative] = {}

    def refused(alternative: Alternative) -> bool:
        return (alternative.start_at, alternative.pool_id) == (request.start_at, refused_in)

    if refused_in is not None and request.start_at is not None:
        # The start asked, in another pool our plan fits it in: the nearest there is.
        others = tuple(row for row in allowed.pools if plan.pools[row].pool_id != refused_in)
        row = ledger.first_fit(_Candidate(request, others, limits, False)) if others else None
        if row is not None:
            pool_id = plan.pools[row].pool_id
            google = any((a.start_at, a.pool_id) == (request.start_at, pool_id) for a in advised)
            chosen[request.start_at] = Alternative(
                start_at=request.start_at, pool_id=pool_id, advised=google
            )
    for alternative in sorted(advised, key=lambda a: (a.start_at, a.pool_id)):
        row = plan.pool_row.get(alternative.pool_id)
        if row is None or row not in allowed.pools or alternative.start_at in chosen:
            continue
        if refused(alternative):
            continue
        moved = replace(request, start_at=alternative.start_at)
        if ledger.first_fit(_Candidate(moved, (row,), limits, False)) is not None:
            chosen[alternative.start_at] = replace(alternative, advised=True)
        if len(chosen) == ALTERNATIVES:
            break
    for ours in ledger.alternatives(_Candidate(request, allowed.pools, limits, False), spare=1):
        if len(chosen) == ALTERNATIVES:
            break
        if not refused(ours):
            chosen.setdefault(ours.start_at, ours)
    return tuple(sorted(chosen.values(), key=lambda a: a.start_at))


def _quota_needs(
    candidate: _Candidate, binding: Sequence[bool], limit_row: dict[LimitKey, int]
) -> tuple[tuple[int, int], ...]:
    """What a candidate's gang takes of each quota row that can bind: ``(row, amount)``."""
    amount = candidate.request.gang.accelerator_units
    return tuple(
        (row, amount)
        for row in (limit_row[limit.key] for limit in candidate.limits)
        if binding[row]
    )


def _place(
    grid: MinuteGrid,
    candidate: _Candidate,
    length: int,
    first: int,
    last: int,
    floor: int,
    binding: Sequence[bool],
    limit_row: dict[LimitKey, int],
    short: Sequence[int],
    shapes: dict[_ShapeKey, tuple[_Option, ...]] | None = None,
) -> tuple[int | None, int, tuple[tuple[int, int], ...], Reason | None]:
    """One flex request's earliest placement on ``grid`` as it stands: start cell (None if no
    slot opens in its window), pool row, the needs it would take and why it is held. A start
    in cell 0 (now) takes ``first`` cells, a later one (at a whole minute) ``length``.
    ``shapes`` keeps each request shape's options for the pass (see :func:`_options`)."""
    units = candidate.request.gang.units
    options: Sequence[_Option] = _options(candidate, binding, limit_row, short, shapes)
    if floor:
        options = [(max(floor, lowest), row, needs) for lowest, row, needs in options]
    if first != length:
        # Now lies inside cell 0, so a run from now may reach one cell further than from a
        # whole minute: cell 0 is probed with its own length, the search starts at cell 1.
        for lowest, row, needs in options:
            if (
                lowest == 0
                # Cheapest first: the first cell alone, then what earlier searches proved of
                # the shorter run, then the whole run.
                and all(grid.free(r, 0) >= a for r, a in needs)
                and (not needs or grid.bounds(needs, 0, length)[1] == 0)
                and all(grid.fits(r, a, 0, first) for r, a in needs)
            ):
                return 0, row, needs, None
        options = [(max(lowest, 1), row, needs) for lowest, row, needs in options]
    best, best_row, needs = _earliest_placement(grid, options, last, length)
    reason = None
    if best is not None and best > 0:
        reason = _hold_reason(grid, best_row, units, best, floor, short[best_row], length, first)
    return best, best_row, needs, reason


# (pools, tenant, accelerator, pool units, accelerator units): all a request's options depend on.
_ShapeKey = tuple[tuple[int, ...], str, str, int, int]
# A commitment held where it was promised: (cell, pool row, the needs it took).
# A commitment held: (cell, pool row, needs, the run's cells from a whole minute, from now).
_Kept = tuple[int, int, tuple[tuple[int, int], ...], int, int]
# A commitment moved earlier: (needs, cell, cells) given back, (needs, cell, cells) taken.
_Move = tuple[tuple[tuple[int, int], ...], int, int, tuple[tuple[int, int], ...], int, int]


def _undo(grid: MinuteGrid, moves: Sequence[_Move]) -> None:
    """Move each commitment back where it was promised, last move first (the grid is then as
    it was before :meth:`_Pass._move_earlier`, and what searches proved is forgotten)."""
    for given, cell, cells, taken, best, span in reversed(moves):
        grid.give(taken, best, span)
        grid.take(given, cell, cells)
    if moves:
        grid.forget()


# Per cell of a stretch: whether a request's needs have room there, and the longest stretch of
# such cells ending at or before it (MinuteGrid.room_runs).
_Rooms = tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]
# (earliest start the pool allows, pool row, the needs a placement there takes)
_Option = tuple[int, int, tuple[tuple[int, int], ...]]


def _options(
    candidate: _Candidate,
    binding: Sequence[bool],
    limit_row: dict[LimitKey, int],
    short: Sequence[int],
    shapes: dict[_ShapeKey, tuple[_Option, ...]] | None,
) -> tuple[_Option, ...]:
    """Where a candidate may go, most preferred first: per pool, the earliest start its
    stockout allows, its row and the needs a placement there takes. They depend only on the
    request's shape (its pools, tenant and gang), which thousands of requests share: within a
    pass (``binding``, ``limit_row`` and ``short`` fixed) they are built once per shape."""
    request = candidate.request
    gang = request.gang
    key = (candidate.pools, request.tenant, gang.accelerator, gang.units, gang.accelerator_units)
    if shapes is not None:
        cached = shapes.get(key)
        if cached is not None:
            return cached
    units = gang.units
    quota = _quota_needs(candidate, binding, limit_row)
    options = tuple(
        (short[row], row, ((row, units), *quota) if binding[row] else quota)
        for row in candidate.pools
    )
    if shapes is not None:
        shapes[key] = options
    return options


def _waiting(request: CapacityRequest) -> Decision:
    """A flex request no slot opens for inside its window, as things stand."""
    return Decision(
        request_id=request.request_id, outcome=Outcome.WAIT, reason=Reason.WINDOW_TOO_SHORT
    )


def _rejection(request: CapacityRequest, reason: Reason, detail: str) -> Decision:
    """A request that can never be admitted as asked."""
    return Decision(
        request_id=request.request_id, outcome=Outcome.REJECT, reason=reason, detail=detail
    )


def _earliest_placement(
    grid: MinuteGrid,
    options: Sequence[tuple[int, int, tuple[tuple[int, int], ...]]],
    last: int,
    length: int,
) -> tuple[int | None, int, tuple[tuple[int, int], ...]]:
    """The earliest start, its pool row and that pool's needs, among ``options`` given most
    preferred first as ``(lowest start, pool row, needs)``; a tie goes to the more preferred
    pool.

    Pools are searched in order of what the grid already proved of them (bounds that cost a
    few lookups), so the likely winner is searched first and any pool whose bound cannot beat
    it is never searched at all.
    """
    if len(options) == 1:  # the common case needs no ranking
        lowest, row, needs = options[0]
        if not needs:
            return (lowest, row, needs) if lowest <= last else (None, -1, ())
        bounds = grid.bounds(needs, lowest, length)
        if bounds[1] > last:
            return None, -1, ()
        start = grid.earliest_fit(needs, lowest, last, length, bounds)
        return (start, row, needs) if start is not None else (None, -1, ())
    ranked = []
    fits_now = length <= grid.cells  # a run from cell 0 lies in the grid
    for preference, (lowest, row, needs) in enumerate(options):
        bounds = grid.bounds(needs, lowest, length) if needs else (lowest, lowest)
        if bounds[1] == 0 and fits_now:
            # No start is earlier than cell 0, and every more preferred pool was ruled out
            # there: if this one fits at 0 it wins, and the others need not be looked at.
            past = grid.probe(needs, 0, length) if needs else 0
            if past == 0:
                return 0, row, needs
            bounds = (bounds[0], past)  # what the probe proved: no fit starts before ``past``
        ranked.append((bounds[1], preference, bounds, lowest, row, needs))
    ranked.sort()  # by bound, then preference: both unique together, so a total order
    best: int | None = None
    best_preference = len(options)
    best_row = -1
    best_needs: tuple[tuple[int, int], ...] = ()
    for bound, preference, bounds, lowest, row, needs in ranked:
        if best is not None and (bound, preference) > (best, best_preference):
            break  # sorted by bound: no later pool can win
        # A more preferred pool wins a tie, so it may still start at ``best`` itself.
        upper = last if best is None else (best if preference < best_preference else best - 1)
        if bound > upper:
            continue
        start = grid.earliest_fit(needs, lowest, upper, length, bounds) if needs else lowest
        if start is not None:
            best, best_preference, best_row, best_needs = start, preference, row, needs
    return best, best_row, best_needs


def _hold_reason(
    grid: MinuteGrid,
    row: int,
    units: int,
    start: int,
    floor: int,
    short: int,
    length: int,
    first: int,
) -> Reason:
    """What keeps a held request from starting before ``start`` in pool row ``row``: its own
    tenant's strict FIFO (``floor``), the pool's stockout cool-down (``short``), the pool's
    capacity, or else quota."""
    lowest = max(floor, short)
    if start == lowest and floor >= short and floor > 0:
        return Reason.FIFO_BLOCKED
    if start == lowest and short > 0:
        return Reason.POOL_SHORT_UNTIL
    # What earlier searches proved usually settles it; only otherwise is the window compared.
    lowest = _first_compared(start, floor, short, length, first)
    pool_bound = grid.bounds(((row, units),), lowest, length)[0]
    if pool_bound > lowest or not grid.fits(row, units, lowest, first if lowest == 0 else length):
        return Reason.NO_CAPACITY_UNTIL
    return Reason.QUOTA


def _longer_reason(
    grid: MinuteGrid,
    row: int,
    units: int,
    start: int,
    floor: int,
    short: int,
    length: int,
    first: int,
    reason: Reason | None,
) -> Reason | None:
    """What :func:`_hold_reason` says of a request held at ``start`` (for ``reason``, with
    ``first``) were its run from now one cell longer, if it takes ``length`` cells now
    (``first == length``): later in the minute it will, and the clock changes nothing else
    a reason reads within the minute, so a planner that plans again keeps both. Else
    ``reason``: its run cannot grow before the minute changes, and in a later minute every
    reason is judged again. Only a start compared from now reads ``first`` (no strict-FIFO
    floor, no cool-down).

    A run from now compares the pool over cells 0..length-1 (a start at cell 1 or later), a
    longer one over 1..length (from cell 2 on) or 0..length (at cell 1): both cover cells
    1..length-1, so only cells 0 and ``length`` can tell them apart, and a full comparison
    is needed only where the pool lacks room in cell 0 but has it in cell 1."""
    if first != length or max(floor, short) > 0:
        return reason
    if reason is Reason.QUOTA:  # room over 0..length-1: the longer run needs cell length too
        return reason if grid.free(row, length) >= units else Reason.NO_CAPACITY_UNTIL
    # No room somewhere in 0..length-1. The longer run covers it unless it is cell 0 alone
    # (from cell 2 on); it covers cell 1 in any case.
    if start == 1 or grid.free(row, 0) >= units or grid.free(row, 1) < units:
        return reason
    return _hold_reason(grid, row, units, start, floor, short, length, length + 1)


def _first_compared(start: int, floor: int, short: int, length: int, first: int) -> int:
    """The first cell of the run :func:`_hold_reason` compares in the pool: where a start may
    come (after the strict-FIFO floor and the cool-down), or cell 1 where that is now and a
    run from now is one cell longer (such a run was searched from cell 1: so is the pool)."""
    lowest = max(floor, short)
    return 1 if lowest == 0 and first != length and start > 1 else lowest


_first = itemgetter(0)


def _grant_key(grant: Grant) -> tuple[str, datetime, str]:
    return (grant.pool_id, grant.start_at, grant.request_id)


def _max_wait(request: CapacityRequest) -> timedelta:
    assert request.max_wait is not None  # flex requests always have one
    return request.max_wait


def _short_cell(pool: Pool, now: datetime, origin: datetime) -> int:
    """First grid cell (from ``origin``) at which something new may start in ``pool`` (after
    a stockout)."""
    if pool.short_until is None or pool.short_until <= now:
        return 0
    return ceil_cells(pool.short_until - origin)
