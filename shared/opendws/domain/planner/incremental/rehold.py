"""Once the walk is done: the commitments held before the policy order moved earlier where
the plan left room and judged, as a full pass does (:func:`rehold`), testing again only those
a change can reach; and the flex decisions recorded, renumbered in the pools where a slot
came, left or moved (:func:`decide`)."""

from __future__ import annotations

from collections.abc import Mapping

from opendws.domain.admission import _waiting
from opendws.domain.model import Grant
from opendws.domain.planner.commitments import Kept, Move, judge_commitments, move_earlier, undo
from opendws.domain.planner.incremental.clock import _ClockMove
from opendws.domain.planner.incremental.full import KeepingPass, _Entry, _FlexState
from opendws.domain.planner.incremental.kept import KeptPass, NeedFullPass, _grant_cells
from opendws.domain.planner.incremental.layer import _Layer
from opendws.domain.planner.incremental.queue import _key_of, _Slot
from opendws.domain.planner.shapes import Candidate, by_first
from opendws.domain.planner.verdicts import Decision, Reason
from opendws.domain.policy import FlexKey
from opendws.domain.timeline import FOREVER, MinuteGrid


def rehold(
    planner: KeptPass,
    state: KeepingPass,
    flex: _FlexState,
    layer: _Layer,
    added: list[Grant],
    changed: dict[int, _Entry],
    touched: set[int],
    clock: _ClockMove,
    changed_rows: set[int],
    gains: dict[int, int],
) -> None:
    """Once the walk is done: raise :class:`NeedFullPass` if a commitment no longer fits
    where it was promised (:func:`still_fit`); else where the plan puts
    each held commitment and why it waits, as a full pass decides
    (:func:`move_earlier`, then :func:`judge_commitments`) on the grid the
    walk finished; the grid is then put back as it was (each held where promised). A
    commitment whose placement or reason changed goes to ``changed``; the pools where a
    placement moved to ``touched``. ``changed_rows``: the rows whose free amounts the walk
    changed; ``gains``: per row, the first cell where they may have grown.

    Each is placed in policy order (what one moving earlier frees, the next may take), but
    one held where the last pass placed it is tested again only if a row its search reads
    gained since, before its slot (in the walk, by a move of this pass, or by one of the
    last pass not carried out: see :func:`move_earlier`; or by a carried move ranked
    after it: see :func:`reached_by_moves`), and its reason is judged again only if it was tested
    again, its pool's row changed, the clock moved or it queues strict FIFO. Right after
    a full pass (whose moves are not known) every one is. A pass where none would be
    (most often the one that sees the last pass's admissions and moves carried out, at
    the same instant) stops before placing any (:func:`unmoved`)."""
    grid = flex.grid
    if not still_fit(grid, flex, state, layer, added):
        raise NeedFullPass("a commitment no longer fits where it was promised")
    # Within the minute, only a commitment whose run from now grew is judged again for
    # the clock (see move_within); a later minute moves every cell a reason compares.
    clock_moved = clock.shifted
    flipped = clock.flipped_held
    held: list[_Entry] | None = None  # in policy order, sorted once needed
    kept: dict[str, Kept] = {}
    placed: list[tuple[int, int, int, Candidate, Reason | None]] = []
    floors: dict[str, int] = {}
    settled: dict[str, frozenset[int]] | None = None
    dirty: set[int] | None = None
    gained: dict[int, int] | None = None
    reached: set[str] = set()  # tested again: ranked before a carried move's old slot
    if planner._moves is not None:
        settled = {}
        dirty = set(changed_rows)
        gained = dict(gains)
        for key, (was, to) in planner._moves.items():
            if key in layer.movers:
                continue  # carried out: held (or admitted) where the move put it
            # A move of the last pass, undone: what it gave back is taken again, and
            # what it took is free again.
            dirty.update(row for needs in (was[3], to[3]) for row, _ in needs)
            for row, _ in to[3]:
                gained[row] = min(gained.get(row, FOREVER), to[0])
        if layer.movers:
            held = sorted(planner._held.values(), key=_key_of)
            reached = reached_by_moves(planner, flex, held, layer.movers)
        if not (clock_moved or dirty or gained or reached) and unmoved(planner, changed):
            # Nothing a test or a judgement reads changed: each commitment stays where
            # the last pass placed it, and none moves (a run from now that grew adds no
            # earlier start), for the same reason unless its run from now grew. (One
            # that starts now starts at the new now, if the clock moved.)
            if flipped:
                judge_flipped(planner, state, flex, flipped, changed)
            grid.forget()
            planner._moves = {}
            if clock.moved:
                for key in planner._admitted.intersection(planner._held):
                    entry = planner._held[key]
                    changed[id(entry)] = entry
            return
    if held is None:
        held = sorted(planner._held.values(), key=_key_of)
    for rank, entry in enumerate(held, start=1):
        candidate = entry.candidate
        key = candidate.request.request_id
        cell, _, row, needs = planner._slots[key]
        kept[key] = (cell, row, needs, entry.length, entry.first)
        placed.append((row, cell, rank, candidate, None))
        if candidate.strict:
            floors[key] = planner._floor_of(entry)
        if (
            settled is not None
            and id(entry) not in changed
            and (entry.best, entry.row) == (cell, row)
            and key not in reached
        ):
            settled[key] = planner._held_reads_of(flex, candidate)
    moves: list[Move] = []
    binding, short = flex.binding, flex.short
    placed = move_earlier(
        grid, placed, kept, binding, flex.limit_row, short, moves, settled, gained
    )
    if dirty is not None:
        dirty.update(row for move in moves for needs in (move[0], move[3]) for row, _ in needs)
    reasons: dict[str, Reason | None] | None = None
    if settled is not None and dirty is not None and not clock_moved:
        reasons = {}
        judged = planner._judged_floors
        for (row, cell, _, candidate, _), entry in zip(placed, held, strict=True):
            key = candidate.request.request_id
            if (
                key in settled
                and key not in flipped
                # a strict-FIFO one is judged from its floor: the same as last judged
                and (not candidate.strict or judged.get(key) == floors[key])
                and (row, cell) == (entry.row, entry.best)
                and row not in dirty
            ):
                reasons[key] = entry.reason
    placed = judge_commitments(grid, placed, kept, floors, binding, short, reasons)
    planner._judged_floors = floors
    undo(grid, moves)
    grid.forget()
    # Each move, by its commitment's request (moves are made in rank order).
    made: dict[str, tuple[_Slot, _Slot]] = {}
    if moves:
        made_in_order = iter(moves)
        for row, cell, _, candidate, _ in placed:
            key = candidate.request.request_id
            was = planner._slots[key]
            if (cell, row) != (was[0], was[2]):
                _, _, _, best_needs, best, span = next(made_in_order)
                made[key] = (was, (best, span, row, best_needs))
        assert next(made_in_order, None) is None
    planner._moves = made
    for (row, cell, _, _, reason), entry in zip(placed, held, strict=True):
        new = id(entry) in changed
        if not new and (row, cell, reason) == (entry.row, entry.best, entry.reason):
            if clock.moved and cell == 0:  # a start now: the instant moved with the clock
                changed[id(entry)] = entry
            continue
        if new or (row, cell) != (entry.row, entry.best):
            touched.update((entry.row, row))
        planner._settle(entry, row, cell)
        entry.reason = reason
        changed[id(entry)] = entry


def unmoved(planner: KeptPass, changed: dict[int, _Entry]) -> bool:
    """Whether every held commitment is where the last pass placed it, unchanged since
    (not in ``changed``), and each strict-FIFO one has the floor its reason was last
    judged from: with nothing else changed, :func:`rehold` would then test and judge
    none of them again, and leave each as it was. (Only those the last pass moved can
    lie elsewhere than their slot: rehold places the others where they are held.)"""
    held, slots, judged = planner._held, planner._slots, planner._judged_floors
    for entry in changed.values():
        if held.get(entry.candidate.request.request_id) is entry:
            return False
    for key in planner._moves or ():
        mover = held.get(key)
        if mover is not None and (mover.best, mover.row) != (slots[key][0], slots[key][2]):
            return False
    for key, floor in judged.items():
        strict = held.get(key)
        if strict is not None and planner._floor_of(strict) != floor:
            return False
    return True


def judge_flipped(
    planner: KeptPass,
    state: KeepingPass,
    flex: _FlexState,
    flipped: set[str],
    changed: dict[int, _Entry],
) -> None:
    """Judge again, as :func:`rehold` judges them, the reasons of the commitments whose
    run from now grew a cell within the minute (``flipped``), where nothing else a
    judgement reads changed and none moved: the grid is the plan's finished one (each
    commitment where it is held). One whose reason changed goes to ``changed``."""
    kept: dict[str, Kept] = {}
    placed: list[tuple[int, int, int, Candidate, Reason | None]] = []
    floors: dict[str, int] = {}
    entries: list[_Entry] = []
    for key in flipped:
        entry = planner._held.get(key)
        if entry is None or entry.best is None:
            continue
        cell, _, row, needs = planner._slots[key]
        kept[key] = (cell, row, needs, entry.length, entry.first)
        placed.append((row, cell, 0, entry.candidate, None))
        entries.append(entry)
        if entry.candidate.strict:
            floors[key] = planner._floor_of(entry)
    judged = judge_commitments(flex.grid, placed, kept, floors, flex.binding, flex.short, None)
    for (_, _, _, _, reason), entry in zip(judged, entries, strict=True):
        if reason != entry.reason:
            entry.reason = reason
            changed[id(entry)] = entry


def reached_by_moves(
    planner: KeptPass,
    flex: _FlexState,
    held: list[_Entry],
    movers: Mapping[str, tuple[FlexKey, _Slot]],
) -> set[str]:
    """The held commitments (``held``: in policy order) a carried move can reach: the
    last pass tested each with the old slot of every mover ranked after it still taken
    (moves are made in policy order), so one whose search reads a row such a slot gives
    back, from before its own slot, is tested again. One ranked after every mover was
    tested on the grid the moves left, which is the grid now. A mover admitted since is
    no longer held, but counts by its policy key."""
    reached: set[str] = set()
    later: dict[int, int] = {}  # per row, the first cell a mover ranked after gave back
    # Movers by policy key, the last ranked last: an admitted one is no longer held.
    unseen = sorted(movers.values(), key=by_first)
    for entry in reversed(held):
        while unseen and unseen[-1][0] > entry.key:
            cell, _, _, needs = unseen.pop()[1]
            for row, _ in needs:
                later[row] = min(later.get(row, FOREVER), cell)
        if later:
            key = entry.candidate.request.request_id
            cell = planner._slots[key][0]
            reads = planner._held_reads_of(flex, entry.candidate)
            if any(later.get(row, FOREVER) < cell for row in reads):
                reached.add(key)
    return reached


def still_fit(
    grid: MinuteGrid, flex: _FlexState, state: KeepingPass, layer: _Layer, added: list[Grant]
) -> bool:
    """Whether every commitment held is still held at its first slot, as a full pass holds
    them, judged on the grid the walk finished.

    They all are while every grid row they take keeps a free amount of at least zero over
    their cells once all are taken (:meth:`MinuteGrid.take_all`). Only a slot newly held and
    a new grant lower what they leave free, so only their cells are read. Each walk entry
    holds its slot only where it fits, so a cell an entry covers is at least zero whatever
    the commitments leave; any other cell is what they leave. A new grant on a cell no
    commitment holds fails this too: a full pass is then planned, which errs only in cost."""
    for needs, cell, span in layer.checks:
        if span > 0 and not all(grid.fits(row, 0, cell, span) for row, _ in needs):
            return False
    for grant in added:
        if id(grant) in layer.absorbed:
            continue
        first, cells = _grant_cells(flex, grant)
        if cells > 0 and not all(
            grid.fits(row, 0, first, cells)
            for row, _ in state.grant_rows(grant, flex.limit_row)
            if flex.binding[row]
        ):
            return False
    return True


def decide(
    planner: KeptPass, state: KeepingPass, moved: dict[int, _Entry], touched: set[int]
) -> None:
    """The flex decisions after a walk: those of the entries whose placement or reason
    changed (``moved``), and positions renumbered in the pools where a slot appeared,
    left or moved (``touched``); elsewhere their relative order, so every position, is as
    it was. A decision that comes out the same is kept as it was."""
    positions: dict[int, int | None] = {}
    for row in touched:
        position = 0
        for entry in planner._in_slot_order(row):
            if entry.best:
                position += 1
                positions[id(entry)] = position
            else:
                positions[id(entry)] = None
            if id(entry) not in moved:
                request_id = entry.candidate.request.request_id
                before = state.decisions[request_id]
                place = positions[id(entry)]
                if before.position != place:
                    # Its slot and reason stand (a held start keeps its instant as the
                    # clock moves): only its place in line changed.
                    planner._put(state, request_id, _in_line(before, place), renumbered=True)
    for key, entry in moved.items():
        if key in positions:
            place = positions[key]
        else:  # its slot stayed where it was: so did its place in line
            known = state.decisions.get(entry.candidate.request.request_id)
            place = known.position if known is not None else None
        record(planner, state, entry, place)


def record(planner: KeptPass, state: KeepingPass, entry: _Entry, position: int | None) -> None:
    """The decision for ``entry`` (at ``position`` in line, if held)."""
    request = entry.candidate.request
    if entry.best is None:
        planner._put(state, request.request_id, _waiting(request))
        return
    planner._put(
        state,
        request.request_id,
        state.placement(entry.candidate, entry.row, entry.best, entry.reason, position),
    )


def _in_line(decision: Decision, position: int | None) -> Decision:
    """``decision`` at another place in line, all else as it was (built field by field:
    ``dataclasses.replace`` reads the fields by name, and a pass may renumber dozens)."""
    return Decision(
        request_id=decision.request_id,
        outcome=decision.outcome,
        reason=decision.reason,
        pool_id=decision.pool_id,
        start_at=decision.start_at,
        end_at=decision.end_at,
        position=position,
        alternatives=decision.alternatives,
        lanes=decision.lanes,
        detail=decision.detail,
    )
