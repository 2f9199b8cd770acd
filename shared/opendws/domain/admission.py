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
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import NamedTuple

from opendws.domain.model import (
    CapacityRequest,
    Grant,
    Mode,
    Pool,
    Snapshot,
    require_utc,
)
from opendws.domain.planner.blocks import ExactLedger, decide_block
from opendws.domain.planner.commitments import (
    Kept,
    Move,
    hold_commitments,
    judge_commitments,
    move_earlier,
)
from opendws.domain.planner.search import (
    Option,
    ShapeKey,
    place,
    quota_needs,
)
from opendws.domain.planner.shapes import (
    Allowed,
    Candidate,
    PoolIndex,
    binds,
    by_first,
    count_demand,
    strict_tenants,
)
from opendws.domain.planner.verdicts import Decision, Outcome, Plan, Race, Reason
from opendws.domain.policy import FlexKey, calendar_key, flex_key
from opendws.domain.quotas import LimitKey, QuotaBook
from opendws.domain.reasons import Expiry
from opendws.domain.timeline import MINUTE, MinuteGrid, ceil_cells, floor_cells


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


class _Flex(NamedTuple):
    """What a flex step leaves when it is done: the grid after every placement (commitments
    where the plan put them), the placements (pool row, cell, rank, candidate, reason), the
    commitments' moves earlier, the rows' limits and which bind, each pool's first cell after
    a stockout, the grid's cells, each request shape's options, and the commitments held."""

    grid: MinuteGrid
    placed: list[tuple[int, int, int, Candidate, Reason | None]]
    moves: list[Move]
    limits: list[int]
    limit_row: dict[LimitKey, int]
    binding: list[bool]
    short: list[int]
    cells: int
    shapes: dict[ShapeKey, tuple[Option, ...]]
    kept: dict[str, Kept]


class _Pass:
    """One admission pass; lives inside :func:`admit`. The incremental planner's full pass
    (``planner.incremental.full.KeepingPass``) is this pass, keeping what the next plan
    starts from through the hooks below (:meth:`_policy_key`, :meth:`_grid_slack`,
    :meth:`_grid_made`, :meth:`_promised`, :meth:`_searched`, :meth:`_finished`), which here
    keep nothing."""

    def __init__(self, snapshot: Snapshot, now: datetime) -> None:
        self.snapshot = snapshot
        self.now = now
        # The flex grid's cells are the clock's whole minutes (UTC), the same in every pass:
        # cell 0 is the minute ``now`` falls in, and a start there is now; a later start is at
        # a whole minute. A slot one pass holds lies on the cell boundaries of the next.
        self.origin = now.replace(second=0, microsecond=0)
        self.calendar: list[Candidate] = []  # the calendar blocks screened in, by id
        self.base_grants = 0  # how many of self.grants the snapshot gave (then blocks)
        self.pool_index = PoolIndex(snapshot.pools)
        self.pools: tuple[Pool, ...] = self.pool_index.pools
        self.pool_row = self.pool_index.pool_row
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

    def run(self) -> Plan:
        pending = sorted(self.snapshot.pending, key=lambda r: r.request_id)
        calendar, flex = self._screen(pending)  # 1
        self.calendar = calendar
        self.base_grants = len(self.grants)
        self._decide_calendar(calendar)  # 2
        self._decide_flex(flex, self._racers())  # 3 and 4
        # Every pending request (ids unique, sorted above) has exactly one decision.
        decisions = tuple(self.decisions[request.request_id] for request in pending)
        races = tuple(Race(request_id=key, pools=self.races[key]) for key in sorted(self.races))
        return Plan(now=self.now, decisions=decisions, races=races, order=tuple(self.order))

    def holds(self, candidate: Candidate) -> timedelta:
        """How long a flex run placed for ``candidate`` holds its pool: Google's expected
        serve wait, then its run duration. The wait is the largest of its pools' — exact for
        one pool, and never short for several (a slot in a pool that serves sooner frees
        early, so others move earlier, never later)."""
        run = candidate.request.run_duration
        if not self.waits:
            return run
        return run + max(self.serve_waits[row] for row in candidate.pools)

    def cells(self, candidate: Candidate) -> tuple[int, int, int]:
        """A flex ``candidate``'s run and window in cells: (length, first, last): the cells
        its run takes from a whole minute, from now (see :meth:`first_cells`), and the
        latest cell it may start in (see :meth:`last_cell`)."""
        run = self.holds(candidate)
        return ceil_cells(run), self.first_cells(run), self.last_cell(candidate.request)

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

    def _racers(self) -> list[tuple[Candidate, tuple[int, ...]]]:
        """The racing requests that may take more lanes: each with the rows it waits in."""
        if self.snapshot.policy.race_width <= 1:
            return []
        racers = []
        for racer in sorted(self.snapshot.racing, key=lambda r: r.request.request_id):
            request = racer.request
            if request.mode is not Mode.FLEX_START or not self.quotas.knows(request.tenant):
                continue
            waiting = tuple(self.pool_row[p] for p in racer.pools if p in self.pool_row)
            allowed = self.pool_index.allowed(request).pools
            if len(waiting) >= self.snapshot.policy.race_width or len(allowed) <= len(waiting):
                continue
            limits = self.quotas.limits(request.tenant, request.gang.accelerator)
            racers.append((Candidate(request, allowed, limits, False), waiting))
        return racers

    # 1. Screening ---------------------------------------------------------------------------

    def _screen(
        self, pending: Iterable[CapacityRequest]
    ) -> tuple[list[Candidate], list[Candidate]]:
        calendar: list[Candidate] = []
        flex: list[Candidate] = []
        strict = strict_tenants(self.snapshot)
        for request in pending:
            screened = self.screen(request, strict)
            if isinstance(screened, Decision):
                self.decisions[request.request_id] = screened
            else:
                (flex if request.mode is Mode.FLEX_START else calendar).append(screened)
        return calendar, flex

    def screen(self, request: CapacityRequest, strict: frozenset[str]) -> Candidate | Decision:
        """``request`` as a candidate to plan (``strict``: the tenants that queue strict
        FIFO), or the decision for one that cannot be planned at all."""
        allowed = self.pool_index.allowed(request)
        verdict = self._screen_out(request, allowed)
        if verdict is not None:
            return verdict
        return Candidate(
            request,
            allowed.pools,
            self.quotas.limits(request.tenant, request.gang.accelerator),
            request.tenant in strict,
        )

    def _screen_out(self, request: CapacityRequest, allowed: Allowed) -> Decision | None:
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

    # 2. Calendar blocks ---------------------------------------------------------------------

    def _decide_calendar(self, calendar: list[Candidate]) -> None:
        if not calendar:
            return
        ledger = ExactLedger(
            self.now, self.pools, self.pool_row, self.quotas, self.grants, calendar
        )
        for candidate in sorted(calendar, key=lambda c: calendar_key(c.request)):
            grant = decide_block(ledger, candidate, self.decisions)
            if grant is not None:
                ledger.commit(grant)
                self.grants.append(grant)

    # 3. Flex requests -----------------------------------------------------------------------

    def _decide_flex(
        self, flex: list[Candidate], racers: list[tuple[Candidate, tuple[int, ...]]]
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
        queue = sorted(self._queued(flex), key=by_first)
        self.order = [candidate.request.request_id for _, candidate, _, _, _ in queue]
        cells = 1 + max(
            (
                *(first + last for _, _, _, first, last in queue),
                *(self.first_cells(self.holds(racer)) for racer, _ in racers),
            )
        )
        cells += self._grid_slack()
        grid = MinuteGrid(self.origin, cells, limits, self._commitments(limit_row))
        self._grid_made(grid, len(limits))
        binding = self._binding_rows(
            grid, limits, limit_row, [*flex, *(racer for racer, _ in racers)]
        )
        short = [_short_cell(pool, now, self.origin) for pool in self.pools]
        fifo_floor: dict[str, int] = {}  # strict-FIFO tenant → earliest start of its next request
        shapes: dict[ShapeKey, tuple[Option, ...]] = {}
        placed: list[tuple[int, int, int, Candidate, Reason | None]] = []
        kept, all_first = hold_commitments(
            grid, queue, binding, limit_row, short,
            snapshot=self.snapshot, now=self.now, origin=self.origin, pool_row=self.pool_row,
        )  # fmt: skip
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
                self._promised(key, candidate, length, first, last, cell, row, needs)
                continue
            floor = fifo_floor.get(request.tenant, 0) if candidate.strict else 0
            best, best_row, needs, reason = place(
                grid, candidate, length, first, last, floor, binding, limit_row, short, shapes
            )
            self._searched(
                grid, short, key, candidate, length, first, last, floor,
                best, best_row, needs, reason,
            )  # fmt: skip
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
        moves: list[Move] = []
        if kept:
            placed = move_earlier(grid, placed, kept, binding, limit_row, short, moves)
            placed = judge_commitments(grid, placed, kept, floors, binding, short)
        lanes = self._race(grid, placed, racers, binding, limit_row, short)
        self._record_placements(grid, placed, lanes)
        self._finished(
            _Flex(grid, placed, moves, limits, limit_row, binding, short, cells, shapes, kept),
            all_first,
        )

    # Hooks for a pass that keeps its state (see the class docstring) -------------------------

    def _policy_key(
        self, request: CapacityRequest, strict: bool, now: datetime, half_life: timedelta
    ) -> FlexKey:
        """A flex request's policy key."""
        return flex_key(request, strict=strict, now=now, half_life=half_life)

    def _grid_slack(self) -> int:
        """Cells the flex grid reaches beyond what this pass searches: none."""
        return 0

    def _grid_made(self, grid: MinuteGrid, rows: int) -> None:
        """The flex grid of ``rows`` rows was made (grants and blocks taken, no placement
        yet)."""

    def _promised(
        self, key: FlexKey, candidate: Candidate, length: int, first: int, last: int,
        cell: int, row: int, needs: tuple[tuple[int, int], ...],
    ) -> None:  # fmt: skip
        """A commitment was held at ``cell`` of pool ``row``, where it was promised."""

    def _searched(
        self, grid: MinuteGrid, short: Sequence[int], key: FlexKey, candidate: Candidate,
        length: int, first: int, last: int, floor: int, best: int | None, row: int,
        needs: tuple[tuple[int, int], ...], reason: Reason | None,
    ) -> None:  # fmt: skip
        """A flex request was searched from ``floor``: its slot (``best`` None: none), in the
        grid as it stood before its own take."""

    def _finished(self, flex: _Flex, all_first: bool) -> None:
        """The flex step is done: its decisions are recorded (``all_first``: every commitment
        was held at its first slot)."""

    def _queued(
        self, flex: Iterable[Candidate]
    ) -> Iterator[tuple[FlexKey, Candidate, int, int, int]]:
        """Each flex candidate with its policy key and its run and window in cells: ``(key,
        candidate, length, first, last)`` (see :meth:`cells`)."""
        now = self.now
        half_life = self.snapshot.policy.aging_half_life
        for candidate in flex:
            key = self._policy_key(candidate.request, candidate.strict, now, half_life)
            yield (key, candidate, *self.cells(candidate))

    def _race(
        self,
        grid: MinuteGrid,
        placed: list[tuple[int, int, int, Candidate, Reason | None]],
        racers: list[tuple[Candidate, tuple[int, ...]]],
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
        candidate: Candidate,
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
        quota = quota_needs(candidate, binding, limit_row)
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
        flex: Sequence[Candidate],
    ) -> list[bool]:
        """Per grid row, whether it can bind at all this pass: a pool or quota whose peak use
        plus every pending request that could land on it stays within its limit never blocks
        anyone, so it is neither searched nor updated (an exact shortcut, not a heuristic)."""
        demand = [0] * len(limits)
        width = self.snapshot.policy.race_width
        for candidate in flex:
            count_demand(demand, candidate, limit_row, width)
        return [binds(demand[row], grid.lowest(row)) for row in range(len(limits))]

    def _record_placements(
        self,
        grid: MinuteGrid,
        placed: list[tuple[int, int, int, Candidate, Reason | None]],
        lanes: dict[str, tuple[int, ...]],
    ) -> None:
        """Admissions and held slots as decisions; held slots are numbered per pool by ETA,
        then policy rank (position 1 is next in line)."""
        # By pool row, start, then rank: ranks are unique, so the tuples never compare further.
        placed.sort()
        position = 0
        previous_row = -1
        decisions = self.decisions
        for row, start, _rank, candidate, reason in placed:
            if start > 0:
                position = position + 1 if row == previous_row else 1
                previous_row = row
            key = candidate.request.request_id
            decisions[key] = self.placement(
                candidate, row, start, reason, position, lanes.get(key, ())
            )

    def placement(
        self,
        candidate: Candidate,
        row: int,
        cell: int,
        reason: Reason | None,
        position: int | None,
        lanes: tuple[int, ...] = (),
    ) -> Decision:
        """The decision for ``candidate`` placed in pool ``row`` at ``cell``: admitted in cell
        0 (now), else held there at ``position`` in the pool's line, for as long as a run
        holds the pool (with ``lanes``: the pool rows it races in besides)."""
        pool_ids = self.pool_index.pool_ids
        start_at = self.start_of(cell)
        return Decision(
            request_id=candidate.request.request_id,
            outcome=Outcome.HOLD if cell else Outcome.ADMIT,
            reason=reason,
            pool_id=pool_ids[row],
            start_at=start_at,
            end_at=start_at + self.holds(candidate),
            position=position if cell else None,
            lanes=tuple(pool_ids[lane] for lane in lanes),
        )

    def _commitments(
        self, limit_row: dict[LimitKey, int]
    ) -> Iterable[tuple[int, datetime, datetime, int]]:
        """Every grant as (grid row, start, end, amount) for its pool and the limits it counts
        against; a grant on a pool no longer configured still counts against quota."""
        for grant in self.grants:
            for row, amount in self.grant_rows(grant, limit_row):
                yield row, grant.start_at, grant.end_at, amount

    def grant_rows(self, grant: Grant, limit_row: Mapping[LimitKey, int]) -> list[tuple[int, int]]:
        """Every grid row ``grant`` counts against and by how much: its pool's, if the pool is
        configured, and each of its tenant's quota limits that has a row in ``limit_row``."""
        rows: list[tuple[int, int]] = []
        row = self.pool_row.get(grant.pool_id)
        if row is not None:
            rows.append((row, grant.units))
        for limit in self.quotas.limits(grant.tenant, grant.accelerator):
            limit_row_index = limit_row.get(limit.key)
            if limit_row_index is not None:
                rows.append((limit_row_index, grant.accelerator_units))
        return rows


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
