"""The search: a flex request's earliest placement on the minute grid, and why it is held.

:func:`place` finds a request's earliest start among its pools' :func:`options` (by
:func:`earliest_placement`, a tie going to the more preferred pool); :func:`hold_reason` says
what keeps a held request from starting earlier, and :func:`longer_reason` what it would say
were the request's run from now one cell longer.
"""

from __future__ import annotations

from collections.abc import Sequence

from opendws.domain.planner.shapes import Candidate
from opendws.domain.planner.verdicts import Reason
from opendws.domain.quotas import LimitKey
from opendws.domain.timeline import MinuteGrid

# (pools, tenant, accelerator, pool units, accelerator units): all a request's options depend on.
ShapeKey = tuple[tuple[int, ...], str, str, int, int]
# (earliest start the pool allows, pool row, the needs a placement there takes)
Option = tuple[int, int, tuple[tuple[int, int], ...]]


def quota_needs(
    candidate: Candidate, binding: Sequence[bool], limit_row: dict[LimitKey, int]
) -> tuple[tuple[int, int], ...]:
    """What a candidate's gang takes of each quota row that can bind: ``(row, amount)``."""
    amount = candidate.request.gang.accelerator_units
    return tuple(
        (row, amount)
        for row in (limit_row[limit.key] for limit in candidate.limits)
        if binding[row]
    )


def place(
    grid: MinuteGrid,
    candidate: Candidate,
    length: int,
    first: int,
    last: int,
    floor: int,
    binding: Sequence[bool],
    limit_row: dict[LimitKey, int],
    short: Sequence[int],
    shapes: dict[ShapeKey, tuple[Option, ...]] | None = None,
) -> tuple[int | None, int, tuple[tuple[int, int], ...], Reason | None]:
    """One flex request's earliest placement on ``grid`` as it stands: start cell (None if no
    slot opens in its window), pool row, the needs it would take and why it is held. A start
    in cell 0 (now) takes ``first`` cells, a later one (at a whole minute) ``length``.
    ``shapes`` keeps each request shape's options for the pass (see :func:`options`)."""
    units = candidate.request.gang.units
    choices: Sequence[Option] = options(candidate, binding, limit_row, short, shapes)
    if floor:
        choices = [(max(floor, lowest), row, needs) for lowest, row, needs in choices]
    if first != length:
        # Now lies inside cell 0, so a run from now may reach one cell further than from a
        # whole minute: cell 0 is probed with its own length, the search starts at cell 1.
        for lowest, row, needs in choices:
            if (
                lowest == 0
                # Cheapest first: the first cell alone, then what earlier searches proved of
                # the shorter run, then the whole run.
                and all(grid.free(r, 0) >= a for r, a in needs)
                and (not needs or grid.bounds(needs, 0, length)[1] == 0)
                and all(grid.fits(r, a, 0, first) for r, a in needs)
            ):
                return 0, row, needs, None
        choices = [(max(lowest, 1), row, needs) for lowest, row, needs in choices]
    best, best_row, needs = earliest_placement(grid, choices, last, length)
    reason = None
    if best is not None and best > 0:
        reason = hold_reason(grid, best_row, units, best, floor, short[best_row], length, first)
    return best, best_row, needs, reason


def options(
    candidate: Candidate,
    binding: Sequence[bool],
    limit_row: dict[LimitKey, int],
    short: Sequence[int],
    shapes: dict[ShapeKey, tuple[Option, ...]] | None,
) -> tuple[Option, ...]:
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
    quota = quota_needs(candidate, binding, limit_row)
    found = tuple(
        (short[row], row, ((row, units), *quota) if binding[row] else quota)
        for row in candidate.pools
    )
    if shapes is not None:
        shapes[key] = found
    return found


def earliest_placement(
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


def hold_reason(
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
    lowest = first_compared(start, floor, short, length, first)
    pool_bound = grid.bounds(((row, units),), lowest, length)[0]
    if pool_bound > lowest or not grid.fits(row, units, lowest, first if lowest == 0 else length):
        return Reason.NO_CAPACITY_UNTIL
    return Reason.QUOTA


def longer_reason(
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
    """What :func:`hold_reason` says of a request held at ``start`` (for ``reason``, with
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
    return hold_reason(grid, row, units, start, floor, short, length, length + 1)


def first_compared(start: int, floor: int, short: int, length: int, first: int) -> int:
    """The first cell of the run :func:`hold_reason` compares in the pool: where a start may
    come (after the strict-FIFO floor and the cool-down), or cell 1 where that is now and a
    run from now is one cell longer (such a run was searched from cell 1: so is the pool)."""
    lowest = max(floor, short)
    return 1 if lowest == 0 and first != length and start > 1 else lowest
