"""Pending calendar blocks in an incremental pass: decided again where a grant that came or
went, or a block that came or whose booking changed, reaches them (:func:`recalendar`), and
taken out when they leave (:func:`blocks_left`); each ledger row's blocks are kept in calendar
order (:func:`index_blocks`, :func:`reading`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from opendws.domain.model import Grant, Snapshot
from opendws.domain.planner.blocks import ExactLedger, decide_block
from opendws.domain.planner.incremental.full import KeepingPass
from opendws.domain.planner.incremental.kept import KeptPass, _Resource
from opendws.domain.planner.shapes import Candidate
from opendws.domain.policy import CalendarKey, calendar_key


def recalendar(
    planner: KeptPass,
    snapshot: Snapshot,
    state: KeepingPass,
    changed: list[Grant],
    fresh: Sequence[Candidate] = (),
) -> tuple[int, list[Grant], list[Grant]]:
    """Decide the calendar blocks that arrived (``fresh``, already among the pending
    ones) and again those the grants that came or went (``changed``) reach; return how
    many were decided, the bookings now held that were not (a block confirmed, or
    confirmed in another pool) and those no longer held, for the flex grid to take and
    give back as grants.

    A block's decision reads only its own rows (its pools and quota limits): the grants
    and the blocks confirmed before it there. So a block on no row a changed grant holds
    is decided as before. A block whose booking changed (and a new one) is seen by the
    blocks after it in calendar order alone, over its own window on its own rows: those
    are decided again in turn, in the same walk down the calendar order. The ledger is
    built over just the rows the blocks decided again read, from the grants there and the
    bookings of the blocks before them; when a block reached along the way reads a row it
    lacks, it is built again over the wider rows and the walk starts over.

    A confirmed block reads its rows over its own window only (it fits there or not), so
    one whose window no change on its rows overlaps is not reached; a refused one is (the
    alternatives it is offered read its rows at every start it may take)."""
    spans = [
        (set(_grant_resources(state, grant)), grant.start_at, grant.end_at) for grant in changed
    ]
    touched = {resource for resources, _, _ in spans for resource in resources}
    reached = {
        id(block): block
        for block in reading(planner, touched)
        if _reaches(spans, block, block.request.request_id not in planner._booked)
    }
    for block in fresh:
        reached[id(block)] = block
        reach_after(planner, block, reached)
    decided: dict[str, Grant | None] = {}
    while reached:
        rows = {resource for block in reached.values() for resource in _block_resources(block)}
        blocks = reading(planner, rows)
        ledger = ExactLedger(
            state.now, state.pools, state.pool_row, state.quotas,
            grants_on(snapshot, state, rows), blocks,
        )  # fmt: skip
        decided = {}
        wider = False
        for block in blocks:
            key = block.request.request_id
            booked = planner._booked.get(key)
            if id(block) in reached:
                booking = decide_block(ledger, block, state.decisions)
                decided[key] = booking
                if booking != booked:
                    known = len(reached)
                    reach_after(planner, block, reached)
                    wider = any(
                        not rows.issuperset(_block_resources(later))
                        for later in list(reached.values())[known:]
                    )
                    if wider:
                        break
                booked = booking
            if booked is not None:
                ledger.commit(booked)
        if not wider:
            break
    taken: list[Grant] = []
    given: list[Grant] = []
    for key, booking in decided.items():
        planner._put(state, key, state.decisions[key])
        booked = planner._booked.get(key)
        if booking == booked:
            continue
        if booked is not None:
            given.append(booked)
            del planner._booked[key]
        if booking is not None:
            taken.append(booking)
            planner._booked[key] = booking
    return len(decided), taken, given


def reach_after(planner: KeptPass, block: Candidate, reached: dict[int, Candidate]) -> None:
    """Add to ``reached`` the pending blocks after ``block`` in calendar order that a
    change of its booking can reach (see _reaches: its own window on its own rows)."""
    request = block.request
    assert request.start_at is not None  # a calendar request always has one
    resources = set(_block_resources(block))
    own = [(resources, request.start_at, request.start_at + request.run_duration)]
    ahead = calendar_key(request)
    for later in reading(planner, resources):
        if _calendar_key(later) > ahead and _reaches(
            own, later, later.request.request_id not in planner._booked
        ):
            reached.setdefault(id(later), later)


def grants_on(snapshot: Snapshot, state: KeepingPass, rows: set[_Resource]) -> list[Grant]:
    """The grants on any of the ledger ``rows``: by their pool, or by the quota limits of
    their tenant and accelerator (worked out once per pair: there are few)."""
    pools_on = {pool_id for pool_id, row in state.pool_row.items() if row in rows}
    limits_on: dict[tuple[str, str], bool] = {}
    on_rows: list[Grant] = []
    for grant in snapshot.grants:
        if grant.pool_id not in pools_on:
            kind = (grant.tenant, grant.accelerator)
            hit = limits_on.get(kind)
            if hit is None:
                hit = limits_on[kind] = any(
                    limit.key in rows for limit in state.quotas.limits(*kind)
                )
            if not hit:
                continue
        on_rows.append(grant)
    return on_rows


def blocks_left(
    planner: KeptPass, state: KeepingPass, left: set[str], released: list[Grant], added: list[Grant]
) -> list[Grant]:
    """Take the pending calendar blocks whose requests left (among ``left``) out of the
    kept pass. A refused one held nothing. A confirmed one's booking either came as an
    equal grant (the block was reserved: the grid holds the same takes, so that grant is
    taken out of ``added``) or did not (it is given back: appended to ``released``).
    Returns the bookings that became grants: every block now sees them, the blocks before
    them too (they are decided again)."""
    staying: list[Candidate] = []
    became: list[Grant] = []
    for block in state.calendar:
        key = block.request.request_id
        if key not in left:
            staying.append(block)
            continue
        for resource in _block_resources(block):
            planner._block_readers[resource].remove(block)
        booking = planner._booked.pop(key, None)
        if booking is None:
            continue
        index = next((i for i, grant in enumerate(added) if grant == booking), None)
        if index is None:
            released.append(booking)
        else:
            became.append(added.pop(index))
    state.calendar = staying
    return became


def index_blocks(planner: KeptPass, state: KeepingPass) -> None:
    """Keep, per ledger row, the pending calendar blocks that read it in calendar order
    (see reading)."""
    planner._block_readers = {}
    for block in sorted(state.calendar, key=_calendar_key):
        for resource in _block_resources(block):
            planner._block_readers.setdefault(resource, []).append(block)


def reading(planner: KeptPass, resources: set[_Resource]) -> list[Candidate]:
    """The pending calendar blocks whose decision reads any of ``resources``, in calendar
    order."""
    readers = planner._block_readers
    found: dict[int, Candidate] = {}
    for resource in resources:
        for block in readers.get(resource, ()):
            found[id(block)] = block
    return sorted(found.values(), key=_calendar_key)


def _calendar_key(block: Candidate) -> CalendarKey:
    return calendar_key(block.request)


def _grant_resources(state: KeepingPass, grant: Grant) -> list[_Resource]:
    """The ledger rows ``grant`` counts against: its pool (if configured) and its limits."""
    row = state.pool_row.get(grant.pool_id)
    limits: list[_Resource] = [
        limit.key for limit in state.quotas.limits(grant.tenant, grant.accelerator)
    ]
    return limits if row is None else [row, *limits]


def _reaches(
    spans: Sequence[tuple[set[_Resource], datetime, datetime]], block: Candidate, refused: bool
) -> bool:
    """Whether a change of grants (``spans``: each changed grant's ledger rows and times) can
    change ``block``'s decision: it shares a row with one, and, if confirmed, over its window
    (a refused block's alternatives read every start)."""
    request = block.request
    assert request.start_at is not None  # a calendar request always has one
    start, end = request.start_at, request.start_at + request.run_duration
    resources = _block_resources(block)
    return any(
        (refused or (since < end and start < until)) and not rows.isdisjoint(resources)
        for rows, since, until in spans
    )


def _block_resources(block: Candidate) -> list[_Resource]:
    """The ledger rows deciding ``block`` reads: its pools and its quota limits."""
    return [*block.pools, *(limit.key for limit in block.limits)]
