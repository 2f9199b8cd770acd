"""The clock moved: the kept pass carried over to a later ``now`` (:func:`move_clock`: a later
minute moves the grid's cells; :func:`move_within`: within the same minute only runs from now
grow), and what that changes for the walk (:class:`_ClockMove`)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import datetime

from opendws.domain.planner.incremental.full import KeepingPass, _Entry, _FlexState
from opendws.domain.planner.incremental.kept import KeptPass, NeedFullPass
from opendws.domain.planner.incremental.queue import (
    _MICROSECOND,
    _MINUTE_US,
    _shifted,
    _timing_of,
)
from opendws.domain.timeline import MINUTE

# Above this share of the flex queue planned again after the clock moved (and this many:
# a short queue replans cheaply either way), plan in full.
RESTART_SHARE = 0.25
RESTART_FLOOR = 64


@dataclass(slots=True)
class _ClockMove:
    """What moving the clock changed (see :func:`move_clock`)."""

    restart: list[_Entry] = field(default_factory=list)  # a start came: plan it again
    arrived: list[_Entry] = field(default_factory=list)  # a start came, as held: admit it
    expired: list[_Entry] = field(default_factory=list)  # max_wait passed: TIME_OUT
    slots: dict[int, tuple[int, int]] = field(default_factory=dict)  # id → what is left of a
    # started entry's slot: (first cell, cells)
    moved: bool = False  # the clock moved
    # It moved to a later minute (the cells moved): every held request's reason is judged
    # again. Within a minute, only a run from now may reach one cell further:
    shifted: bool = False
    # the held entries whose run from now did, and whose reason changed with it (see
    # _Entry.alt), and the commitments whose run from now did (their reasons are judged
    # again: see rehold)
    flipped: list[_Entry] = field(default_factory=list)
    flipped_held: set[str] = field(default_factory=set)
    expired_held: list[_Entry] = field(default_factory=list)  # a commitment's max_wait passed

    def slot(self, entry: _Entry) -> tuple[int, int]:
        """The cells ``entry`` holds in the grid now: (first cell, cells)."""
        left = self.slots.get(id(entry))
        if left is not None:
            return left
        assert entry.best is not None
        return entry.best, entry.span


def move_clock(planner: KeptPass, now: datetime, gone: set[str]) -> _ClockMove:
    """Carry the kept pass over to a later ``now`` (the caller ruled out what this cannot
    carry: pending blocks, stockouts, requests stamped after the last now); else raise
    :class:`NeedFullPass`, saying why not.

    The grid's cells are whole minutes, so a later minute drops the cells now past and
    keeps the rest, and every cell number (a start, a deadline, a strict-FIFO floor)
    moves down by as many. Aging keys do not move (policy.flex_key). What the clock does
    change is returned as changes for the walk: a held start on the new minute whose run
    from now takes the same cells is admitted where it stands; any other start that came
    is planned again from its key, with what is left of its slot given back; requests
    whose max_wait passed leave (TIME_OUT). A held start still ahead stays: a run from the
    new now is no shorter than one from that minute, which did not fit before it (nothing
    else changed). The walk then judges every held reason again."""
    state = planner._pass
    assert state is not None
    origin = now.replace(second=0, microsecond=0)
    shift = (origin - state.origin) // MINUTE
    flex = state.flex
    if flex is not None and shift > flex.grid.cells:
        raise NeedFullPass("the clock moved past the kept grid")
    if flex is not None and shift == 0:
        return move_within(planner, state, flex, now, gone)
    state.now, state.origin = now, origin
    clock = _ClockMove(moved=True, shifted=True)
    if flex is None:
        return clock
    flex.grid.advance(shift)
    flex.cells = flex.grid.cells
    into = (now - origin) // _MICROSECOND
    reach = 0
    timing = planner._timing
    # From here on, a run from now that takes ``length`` cells takes one more after its
    # slack (see move_within): noted again as each is moved.
    flips: list[tuple[int, int, _Entry]] = []
    seq = planner._seq
    for entry in flex.entries:
        request = entry.candidate.request
        key = request.request_id
        known = timing.get(key)
        if known is None:
            known = timing[key] = _timing_of(state, entry.candidate)
        holds, deadline = known
        span = entry.span  # from the last now: before first changes
        entry.first = -(-(into + holds) // _MINUTE_US)
        if entry.first == entry.length:
            seq += 1
            flips.append((entry.length * _MINUTE_US - holds, seq, entry))
        entry.last -= shift
        entry.floor = max(0, entry.floor - shift)
        if entry.best is not None:
            entry.best -= shift
        started = entry.best is not None and entry.best <= 0
        # A held start on the new now's minute, whose run from now takes the same cells:
        # it holds exactly what an admission now takes, in the same view. It is admitted
        # where it stands; only its decision changes.
        arrived = started and entry.best == 0 and entry.first == span
        if started and not arrived:
            assert entry.best is not None
            clock.slots[id(entry)] = (0, max(0, entry.best + span))
        if key in gone:
            continue
        if deadline is not None and deadline < now:
            clock.expired.append(entry)
        elif arrived:
            entry.reason = None
            clock.arrived.append(entry)
            reach = max(reach, entry.first + entry.last)
        elif started:
            clock.restart.append(entry)
        else:
            reach = max(reach, entry.first + entry.last)
    if planner._moves is not None:
        planner._moves = {
            key: (_shifted(was, shift), _shifted(to, shift))
            for key, (was, to) in planner._moves.items()
        }
    for key, entry in planner._held.items():
        known = timing.get(key)
        if known is None:
            known = timing[key] = _timing_of(state, entry.candidate)
        holds, deadline = known
        entry.first = -(-(into + holds) // _MINUTE_US)
        if entry.first == entry.length:
            seq += 1
            flips.append((entry.length * _MINUTE_US - holds, seq, entry))
        entry.last -= shift
        if entry.best is not None:
            entry.best -= shift
        # What is left of its slot, as of a started entry's (the layer moves it after).
        planner._shift_slot(key, shift)
        if key in gone:
            continue
        if deadline is not None and deadline < now:
            clock.expired_held.append(entry)
        else:
            reach = max(reach, entry.first + entry.last)
    if 1 + reach > flex.cells:
        raise NeedFullPass("the kept grid no longer reaches every deadline")
    again = len(clock.restart) + len(clock.expired)
    if again > max(RESTART_FLOOR, len(flex.entries) * RESTART_SHARE):
        # Each is planned again from its place, and what follows it is walked again:
        # past this share, a full pass costs less (and plans the same).
        raise NeedFullPass("most of the queue's starts came: a full pass costs less")
    heapq.heapify(flips)
    planner._retrack(flips, seq)
    # The deadlines stand (instants): the passed ones are popped.
    deadlines = planner._deadlines
    while deadlines and deadlines[0][0] < now:  # each expired above, or left
        heapq.heappop(deadlines)
    return clock


def move_within(
    planner: KeptPass, state: KeepingPass, flex: _FlexState, now: datetime, gone: set[str]
) -> _ClockMove:
    """:func:`move_clock` to a later ``now`` in the same minute: the grid's cells stay,
    so what the move changes is found without looking at every entry: the runs from now
    that now reach one cell further (by slack: see :meth:`KeptPass._track`), the starts now (the
    requests admitted: their instant is the new now), and the requests whose max_wait
    passed (by deadline). Each is decided as :func:`move_clock` decides it. Every other
    entry's start, window and reason stand: a start still ahead did not fit for a run
    from now no longer than it is now, and a reason reads nothing else the clock moved;
    a held entry whose run grew is held for the reason judged for that run (``alt``,
    swapped with ``reason``)."""
    state.now = now
    clock = _ClockMove(moved=True)
    into = (now - state.origin) // _MICROSECOND
    entry_of = planner._entry_of
    touched: dict[int, _Entry] = {}
    spans: dict[int, int] = {}  # a start now: the cells its run from the last now took
    for key in planner._admitted:
        entry = entry_of.get(key)
        if entry is not None and entry.best == 0:
            touched[id(entry)] = entry
            spans[id(entry)] = entry.span
    flips = planner._flips
    while flips and flips[0][0] < into:
        entry = heapq.heappop(flips)[2]
        if planner._kept(entry) and entry.first == entry.length:
            entry.first += 1
            touched[id(entry)] = entry
    deadlines = planner._deadlines
    while deadlines and deadlines[0][0] < now:
        entry = heapq.heappop(deadlines)[2]
        if planner._kept(entry):
            touched[id(entry)] = entry
    reach = 0
    for entry in touched.values():
        key = entry.candidate.request.request_id
        deadline = planner._timing_for(state, entry)[1]
        walked = entry_of.get(key) is entry
        span = spans.get(id(entry))
        arrived = span is not None and entry.first == span
        if span is not None and not arrived:
            clock.slots[id(entry)] = (0, span)
        if key in gone:
            continue
        if deadline is not None and deadline < now:
            (clock.expired if walked else clock.expired_held).append(entry)
        elif arrived:
            entry.reason = entry.alt = None
            clock.arrived.append(entry)
            reach = max(reach, entry.first + entry.last)
        elif span is not None:
            clock.restart.append(entry)
        else:  # its run from now grew a cell
            reach = max(reach, entry.first + entry.last)
            if not walked:
                clock.flipped_held.add(key)
            elif entry.best and entry.reason != entry.alt:
                entry.reason, entry.alt = entry.alt, entry.reason
                clock.flipped.append(entry)
    if 1 + reach > flex.cells:
        raise NeedFullPass("the kept grid no longer reaches every deadline")
    again = len(clock.restart) + len(clock.expired)
    if again > max(RESTART_FLOOR, len(flex.entries) * RESTART_SHARE):
        raise NeedFullPass("most of the queue's starts came: a full pass costs less")
    kept = 2 * (len(entry_of) + len(planner._held)) + 64
    if len(flips) > kept:  # mostly entries replaced since: keep the ones still kept
        planner._prune_flips()
    if len(deadlines) > kept:
        planner._prune_deadlines()
    return clock


def clock_news(
    planner: KeptPass,
    state: KeepingPass,
    clock: _ClockMove,
    moved: dict[int, _Entry],
    touched: set[int],
) -> None:
    """Add to ``moved`` the entries whose decision the clock changed and no walk made
    again: a start that came, admitted where it was held (unless the walk moved it), and
    a held entry whose run from now grew, if its reason is not the one its decision
    gives (see move_within); such a start's pool goes to ``touched``."""
    for entry in clock.arrived:
        moved[id(entry)] = entry
        if entry.best is not None:
            touched.add(entry.row)
    for entry in clock.flipped:
        key = entry.candidate.request.request_id
        if planner._entry_of.get(key) is entry and state.decisions[key].reason != entry.reason:
            moved.setdefault(id(entry), entry)
