"""Commitments (``policy.commit_within``): ETAs told less than that far ahead, held before the
policy order where they were promised, moved earlier once the plan is made, and judged why
each still waits.

:func:`hold_commitments` holds them (each where :func:`commitment_slots` allows);
:func:`move_earlier` moves each to an earlier start where the finished plan left room (tested
first by :func:`may_start_before`); :func:`judge_commitments` says why each waits;
:func:`undo` puts the moves back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import numpy as np
import numpy.typing as npt

from opendws.domain.model import Commitment, Snapshot
from opendws.domain.planner.search import first_compared, hold_reason, place, quota_needs
from opendws.domain.planner.shapes import Candidate
from opendws.domain.planner.verdicts import Reason
from opendws.domain.policy import FlexKey
from opendws.domain.quotas import LimitKey
from opendws.domain.timeline import FOREVER, MINUTE, MinuteGrid, floor_cells

# A commitment held: (cell, pool row, needs, the run's cells from a whole minute, from now).
Kept = tuple[int, int, tuple[tuple[int, int], ...], int, int]
# A commitment moved earlier: (needs, cell, cells) given back, (needs, cell, cells) taken.
Move = tuple[tuple[tuple[int, int], ...], int, int, tuple[tuple[int, int], ...], int, int]

# Per cell of a stretch: whether a request's needs have room there, and the longest stretch of
# such cells ending at or before it (MinuteGrid.room_runs).
_Rooms = tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64]]


def hold_commitments(
    grid: MinuteGrid,
    queue: Sequence[tuple[FlexKey, Candidate, int, int, int]],
    binding: Sequence[bool],
    limit_row: dict[LimitKey, int],
    short: Sequence[int],
    *,
    snapshot: Snapshot,
    now: datetime,
    origin: datetime,
    pool_row: Mapping[str, int],
) -> tuple[dict[str, Kept], bool]:
    """Commitments (``policy.commit_within``): in policy order, each pending flex request
    whose announced ETA lies within the horizon takes its slot in its pool first, where it
    still fits — at the minute of its ETA, or the next when the grid's minutes fall
    between (under a minute's rounding). One that no longer fits (a stockout, a pool or a
    quota shrunk, a run that started late) is planned again like any other. Returns
    request id → :data:`Kept`, and whether each took its first slot (see
    :func:`commitment_slots`); why each waits is judged once the plan is finished
    (:func:`judge_commitments`). ``snapshot``, ``now``, ``origin`` and ``pool_row``: the
    pass's (its grid's cell 0 is ``origin``'s minute)."""
    horizon = snapshot.policy.commit_within
    if horizon is None or not snapshot.commitments:
        return {}, True
    promised = {c.request_id: c for c in snapshot.commitments}
    # Per commitment, in policy order: (request id, pool row, needs, its candidate slots
    # as (cell, span), its run's cells from a whole minute and from now).
    held: list[tuple[str, int, tuple[tuple[int, int], ...], list[tuple[int, int]], int, int]] = []
    beyond = now + horizon  # a start told from here on is an estimate
    for _, candidate, length, first_length, last in queue:
        request = candidate.request
        commitment = promised.get(request.request_id)
        if commitment is None or commitment.start_at >= beyond:
            continue
        found = commitment_slots(
            commitment, candidate, length, first_length, last, binding, limit_row, short,
            origin=origin, pool_row=pool_row,
        )  # fmt: skip
        if found is not None:
            held.append((request.request_id, *found, length, first_length))
    # Why each waits is judged on the finished plan (judge_commitments). Most passes
    # keep every commitment at its first slot: taken at once where they all fit so.
    if grid.take_all([(needs, *slots[0]) for _, _, needs, slots, _, _ in held]):
        return {
            key: (slots[0][0], row, needs, length, first)
            for key, row, needs, slots, length, first in held
        }, True
    kept: dict[str, Kept] = {}
    for key, row, needs, slots, length, first in held:
        for cell, span in slots:
            if all(grid.fits(need, units, cell, span) for need, units in needs):
                grid.take(needs, cell, span)
                kept[key] = (cell, row, needs, length, first)
                break
    return kept, False


def commitment_slots(
    commitment: Commitment,
    candidate: Candidate,
    length: int,
    first_length: int,
    last: int,
    binding: Sequence[bool],
    limit_row: dict[LimitKey, int],
    short: Sequence[int],
    *,
    origin: datetime,
    pool_row: Mapping[str, int],
) -> tuple[int, tuple[tuple[int, int], ...], list[tuple[int, int]]] | None:
    """Where a commitment within the horizon may be held: (pool row, needs, its slots as
    (cell, span), the first preferred), or None if it cannot be (its pool is gone or not
    one of the request's, or no slot lies between the pool's cool-down and the request's
    deadline). ``origin``: the minute of the pass's grid's cell 0."""
    row = pool_row.get(commitment.pool_id)
    if row is None or row not in candidate.pools:
        return None
    # A start told by an earlier pass lies on a whole minute, one of this pass's cell
    # boundaries; one that has come is now (cell 0).
    offset = commitment.start_at - origin
    first = max(0, floor_cells(offset))
    cells = [first] if first == 0 or offset % MINUTE == timedelta(0) else [first, first + 1]
    slots = [
        (cell, first_length if cell == 0 else length)
        for cell in cells
        if short[row] <= cell <= last
    ]
    if not slots:
        return None
    quota = quota_needs(candidate, binding, limit_row)
    needs = ((row, candidate.request.gang.units), *quota) if binding[row] else quota
    return row, needs, slots


def move_earlier(
    grid: MinuteGrid,
    placed: list[tuple[int, int, int, Candidate, Reason | None]],
    kept: dict[str, Kept],
    binding: Sequence[bool],
    limit_row: dict[LimitKey, int],
    short: Sequence[int],
    moves: list[Move] | None = None,
    settled: Mapping[str, frozenset[int]] | None = None,
    gained: dict[int, int] | None = None,
) -> list[tuple[int, int, int, Candidate, Reason | None]]:
    """Each committed request, in policy order, moves to an earlier start where what the
    plan left free allows (its own slot given back first, so it never moves later).
    ``moves`` collects each move made, in order (see :func:`undo`).

    A planner that plans again passes ``settled``: request id → the rows its search reads,
    for each commitment held where the last pass placed it, and ``gained``: per row, the
    first cell from which its free amounts may have grown since that pass's test read
    them (the slots moves made here give back are added). A start before cell ``c``
    needs room only in cells before ``c`` (from ``c`` on, the slot it holds has room for
    it: see :func:`may_start_before`), so one none of whose rows gained before ``c``
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
                if gained.get(read, FOREVER) < cell:
                    break
            else:  # no row it reads gained before its slot: it cannot move
                moved.append(item)
                continue
        _, _, needs, length, first = promise
        # The test reads only the cells before its slot, so its own slot may stay taken
        # for it; the search may reach into the slot, so that is given back first.
        # Its needs are its pool's (where that can bind), then its quota's.
        quota = needs[1:] if binding[promise[1]] else needs
        if not may_start_before(grid, candidate, cell, length, quota, binding, short, rooms, reach):
            moved.append((row, cell, rank, candidate, reason))
            continue
        grid.give(needs, cell, length)
        grid.forget()  # its slot given back raised free amounts: facts may not hold
        best, best_row, best_needs, best_reason = place(
            grid, candidate, length, first, cell, 0, binding, limit_row, short
        )
        if best is None or best >= cell:
            best, best_row, best_needs, best_reason = cell, row, needs, reason
        else:
            rooms.clear()  # it moved: free amounts changed
            if gained is not None:  # its slot given back: those rows gained from there
                for need, _ in needs:
                    gained[need] = min(gained.get(need, FOREVER), cell)
            if moves is not None:
                moves.append(
                    (needs, cell, length, best_needs, best, first if best == 0 else length)
                )
        grid.take(best_needs, best, first if best == 0 else length)
        moved.append((best_row, best, rank, candidate, best_reason))
    return moved


def judge_commitments(
    grid: MinuteGrid,
    placed: list[tuple[int, int, int, Candidate, Reason | None]],
    kept: dict[str, Kept],
    floors: Mapping[str, int],
    binding: Sequence[bool],
    short: Sequence[int],
    known: Mapping[str, Reason | None] | None = None,
) -> list[tuple[int, int, int, Candidate, Reason | None]]:
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
    judged: list[tuple[int, int, int, Candidate, Reason | None]] = []
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
            # The pool row lacks the gang in the first cell hold_reason compares, a cell
            # before the slot: NO_CAPACITY_UNTIL, in one read (the slot covers no cell
            # before its start, so it need not be given back to judge it).
            lowest = first_compared(cell, floor, short[row], length, first)
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
            reason = hold_reason(grid, row, units, cell, floor, short[row], length, first)
            if reaches:
                grid.take(own, cell, length)
        else:
            judged.append(item)
            continue
        judged.append((row, cell, rank, candidate, reason))
    return judged


def may_start_before(
    grid: MinuteGrid,
    candidate: Candidate,
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


def undo(grid: MinuteGrid, moves: Sequence[Move]) -> None:
    """Move each commitment back where it was promised, last move first (the grid is then as
    it was before :func:`move_earlier`, and what searches proved is forgotten)."""
    for given, cell, cells, taken, best, span in reversed(moves):
        grid.give(taken, best, span)
        grid.take(given, cell, cells)
    if moves:
        grid.forget()
