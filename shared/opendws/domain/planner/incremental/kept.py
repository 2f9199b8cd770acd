"""What the incremental planner keeps from one pass to the next (:class:`KeptPass`): the
decisions in the plan's order, each flex request's entry and the indexes over them (rows'
readers, pools' held slots, strict-FIFO lines, policy order, timings), the commitments held
before the policy order, and the helpers that keep those indexes in step as entries come,
leave and are held; with the shapes the phases share (:class:`PlanReport`, a held slot) and
the small rules they all read (an entry's stamp, a grant's cells and rows, a search's
rows)."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt

from opendws.domain.admission import _Entry, _FlexState, _Keys, _Pass
from opendws.domain.model import Commitment, Grant, Snapshot
from opendws.domain.planner.shapes import Candidate, count_demand
from opendws.domain.planner.verdicts import Decision, Outcome, Reason, rebuild
from opendws.domain.policy import FlexKey
from opendws.domain.quotas import LimitKey
from opendws.domain.timeline import MINUTE, covering

# Below this many flex requests, a later now plans in full unless commitments are held.
# None by default: on the Philly replay's largest cluster (about a hundred queued in one
# pool; first 4.5 days, the same decisions either way), carrying every pass over took 0.70×
# the time of planning short queues in full without commitments (compiled; 0.79× in plain
# Python), and 0.97× with the default horizon's (when no commitment is held); over 20 days,
# 0.94×. A 10,000-request snapshot plans 3–4× faster carried over.
CLOCK_FLOOR = 0

# Entries' stamps (_Entry.stamp: policy order as integers) are this far apart after a full
# pass; an arrival takes the middle between its neighbours', and when two are adjacent (after
# 32 arrivals between the same two) every entry is numbered again.
STAMP_GAP = 1 << 32


@dataclass(frozen=True, slots=True)
class PlanReport:
    """How the last plan was made: in full (and why), or incrementally (from which rank, how
    many requests were visited, how many of them were tested and how many searched again, the
    others taking their slot again, and how many calendar blocks were decided again)."""

    full: bool
    why: str = ""  # full: the reason
    from_rank: int = 0  # incremental: 1-based rank of the first request a change reached
    walked: int = 0  # incremental: requests visited (those on a rolled-back row)
    searched: int = 0  # incremental: of those, searched again
    tested: int = 0  # incremental: of those, tested first for whether their slot stands
    redecided: int = 0  # incremental: pending calendar blocks decided again (a grant reached
    # one of their rows)

    def __reduce__(self) -> tuple[object, ...]:
        return rebuild(self)


class NeedFullPass(Exception):
    """An incremental pass cannot bring the kept pass up to the snapshot, for ``reason``: the
    plan is made in full instead (its :class:`PlanReport` says why). Raised by a phase part-way;
    the full pass rebuilds whatever the phases changed by then."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# A commitment's held slot: (first cell, cells, pool row, needs).
_Slot = tuple[int, int, int, tuple[tuple[int, int], ...]]

# A commitment's first slot, kept (see first_slot): (commitment,
# candidate, deadline minute, slot's first minute, (cells, pool row, needs) or None).
_FirstSlot = tuple[
    Commitment, Candidate, int, int, tuple[int, int, tuple[tuple[int, int], ...]] | None
]


# Minutes are counted from here where a kept cell must outlive the grid's origin.
_SLOTS_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)

# A row of the calendar ledger: a pool's row, or a quota limit's key.
_Resource = int | LimitKey


class KeptPass:
    """What an incremental planner keeps between passes, and the helpers that keep its indexes
    in step as entries come, leave and are held. The phases, in the modules beside this one,
    read and change it through the planner they are given."""

    def __init__(self, *, clock_floor: int = CLOCK_FLOOR) -> None:
        """``clock_floor``: below this many flex requests (and no commitment held) a later
        now plans in full; by default none does (see :data:`CLOCK_FLOOR`)."""
        self._clock_floor = clock_floor
        self._pass: _Pass | None = None
        self._snapshot: Snapshot | None = None
        self._ids: list[str] = []  # decision ids, sorted: the plan's order
        self._decisions: list[Decision] = []  # the decision of each of _ids, in that order
        self._order: list[str] = []  # every planned flex request's id, in policy order
        self._order_keys: list[FlexKey] = []  # their policy keys, in the same order
        # The commitments held before the policy order (none of the walk's entries): id → an
        # entry whose best, row and reason say where the plan put it, and id → the slot it
        # holds in the grid, (first cell, cells, pool row, needs).
        self._held: dict[str, _Entry] = {}
        self._slots: dict[str, _Slot] = {}
        # Where the last pass moved commitments earlier (None: not known, after a full pass):
        # request id → (the slot it was held at, the slot it moved to). What the next pass
        # tests them against differs there, unless that pass holds it where it moved (see
        # rehold).
        self._moves: dict[str, tuple[_Slot, _Slot]] | None = None
        # Held request id → (its candidate, the rows its search reads), worked out once.
        self._held_reads: dict[str, tuple[Candidate, frozenset[int]]] = {}
        # The commitments by request as the last look at them found them (the last one told for
        # each), the tuple they were read from, whether one request had two, and those that
        # started beyond the horizon then, by start: see looked_at (None: read them all).
        self._promised: dict[str, Commitment] | None = None
        self._promised_of: tuple[Commitment, ...] = ()
        self._twice = False
        self._beyond: list[tuple[datetime, int, Commitment]] = []
        # Strict-FIFO commitment's request id → the floor its reason was last judged from
        # (see rehold).
        self._judged_floors: dict[str, int] = {}
        # Request id → (commitment, candidate, deadline minute, first slot's minute, (its
        # cells, pool row, needs) or None), minutes counted from _SLOTS_EPOCH (see first_slot).
        self._first_slots: dict[str, _FirstSlot] = {}
        self._demand: list[int] = []  # per grid row: what all flex requests could put on it
        self._reads: dict[str, frozenset[int]] = {}  # flex request id → rows its search reads
        self._entry_of: dict[str, _Entry] = {}  # flex request id → its entry
        # Flex request id → (how long a run placed for it holds its pool, in microseconds;
        # its deadline, submitted_at + max_wait): what a clock move reads of every request,
        # fixed for a kept pass (worked out once; a full pass forgets them).
        self._timing: dict[str, tuple[int, datetime | None]] = {}
        # What a move within the minute reads, so that it costs what it changes (see
        # move_within): (slack, seq, entry) of each entry (or held one) whose run from now
        # takes ``length`` cells, by slack (microseconds into the minute after which it takes
        # one more; a heap), and (deadline, seq, entry) of each, by deadline. An entry since
        # replaced is skipped when popped (see _kept).
        self._flips: list[tuple[int, int, _Entry]] = []
        self._deadlines: list[tuple[datetime, int, _Entry]] = []
        self._seq = 0
        self._admitted: set[str] = set()  # requests whose decision is ADMIT (a start now)
        self._by_pool: dict[int, set[_Entry]] = {}  # pool row → the entries placed in it
        # Pool row → its entries in slot order as the last renumbering left them (see
        # in_slot_order).
        self._slot_orders: dict[int, list[_Entry]] = {}
        self._readers: dict[int, list[_Entry]] = {}  # grid row → entries reading it, in order
        self._siblings: dict[str, list[_Entry]] = {}  # strict-FIFO tenant → its entries, in order
        # ledger row → the pending calendar blocks whose decision reads it, in calendar order
        self._block_readers: dict[_Resource, list[Candidate]] = {}
        self._booked: dict[str, Grant] = {}  # calendar request id → the grant it was confirmed
        self._latest_submitted = datetime.min.replace(tzinfo=UTC)  # of any request kept
        # Why the last plan kept nothing (None: it kept its pass, or there was none): it held
        # commitments elsewhere than promised (COMMITMENTS_HELD), or it raised (PLAN_FAILED).
        self._unkept: str | None = None
        # The last full pass's policy keys, for the next full pass (see _Pass's keys).
        self._keys: _Keys = {}
        # Zeroed rows of the grid's length for the walk's deltas, kept from pass to pass: a
        # fresh one a rolled row costs its pages again (the walk zeroes what it changed).
        self._spare: list[npt.NDArray[np.int32]] = []
        self.last_pass = PlanReport(full=True, why="no pass yet")
        # Plans made so far, and the requests whose decision the last one set anew or dropped,
        # other than for a new place in line (None: any may have, after a full pass):
        # whoever carries plans out may look at those alone, if it saw the plan before (see
        # ReconcileService; a place in line alone is no news).
        self.plans = 0
        self.changed: set[str] | None = None
        self._changed: set[str] | None = None

    def _start_changes(self) -> None:
        """Name no decision as changed yet. (A method, not an assignment in :meth:`plan`: a
        full pass sets ``_changed`` to None in between, which a type checker narrowing the
        attribute after an assignment in ``plan`` would not see, nor code compiled from it.)"""
        self._changed = set()

    def _put(self, state: _Pass, key: str, decision: Decision, *, renumbered: bool = False) -> None:
        """Set the decision for ``key``, in the pass and in the plan's sorted list; one that
        differs only by its place in line (``renumbered``) is not named in ``changed``."""
        state.decisions[key] = decision
        if decision.outcome is Outcome.ADMIT:
            self._admitted.add(key)
        else:
            self._admitted.discard(key)
        index = bisect.bisect_left(self._ids, key)
        if index < len(self._ids) and self._ids[index] == key:
            if self._decisions[index] is decision:
                return
            self._decisions[index] = decision
        else:
            self._ids.insert(index, key)
            self._decisions.insert(index, decision)
        if self._changed is not None and not renumbered:
            self._changed.add(key)

    def _drop(self, state: _Pass, key: str) -> None:
        """Forget the decision for ``key`` (its request left)."""
        self._timing.pop(key, None)
        self._admitted.discard(key)
        del state.decisions[key]
        index = bisect.bisect_left(self._ids, key)
        del self._ids[index]
        del self._decisions[index]
        if self._changed is not None:
            self._changed.add(key)

    def _timing_for(self, state: _Pass, entry: _Entry) -> tuple[int, datetime | None]:
        """What a clock move reads of ``entry``'s request (see _timing), worked out once."""
        key = entry.candidate.request.request_id
        known = self._timing.get(key)
        if known is None:
            known = self._timing[key] = _timing_of(state, entry.candidate)
        return known

    def _track(self, state: _Pass, entry: _Entry, *, heap: bool = True) -> None:
        """Note ``entry`` (new, or each one after a full pass) where :func:`move_within`
        finds it: by deadline, and, if its run from now takes ``length`` cells, by the instant
        in the minute after which it takes one more (a later minute notes those again: see
        :func:`move_clock`). (``heap``: pushed; else appended, and the caller heapifies.)"""
        holds, deadline = self._timing_for(state, entry)
        self._seq += 1
        if deadline is not None:
            timed = (deadline, self._seq, entry)
            if heap:
                heapq.heappush(self._deadlines, timed)
            else:
                self._deadlines.append(timed)
        if entry.first == entry.length:
            slack = entry.length * _MINUTE_US - holds  # into ≤ slack while it takes length
            if heap:
                heapq.heappush(self._flips, (slack, self._seq, entry))
            else:
                self._flips.append((slack, self._seq, entry))

    def _track_new(self, entry: _Entry) -> None:
        """:meth:`_track` an entry made in this pass, at its now."""
        state = self._pass
        assert state is not None
        self._track(state, entry)

    def _carried_out(
        self,
        entry: _Entry,
        slot_of: Callable[[_Entry], tuple[int, int]],
        cells: tuple[int, int],
        row: int | None,
        needs: Sequence[tuple[int, int]],
    ) -> bool:
        """Whether what came for ``entry``'s request (a grant, or a commitment held at
        ``cells`` on ``row`` with ``needs``) holds exactly the slot the last pass placed it in
        (``slot_of``: its cells in the grid now): an admission, or a move, carried out. Not
        when a request ahead of it is held in the same pool by quota: that one sees the pool
        fuller now (what came counts from its start), and its reason may turn to capacity."""
        return (
            entry.best is not None
            and slot_of(entry) == cells
            and entry.row == row
            and sorted(needs) == sorted(entry.needs)
            and not any(
                other.reason is Reason.QUOTA and other.key < entry.key
                for other in self._by_pool.get(entry.row, ())
            )
        )

    def _kept(self, entry: _Entry) -> bool:
        """Whether ``entry`` is still the one kept for its request (walked or held)."""
        key = entry.candidate.request.request_id
        return self._entry_of.get(key) is entry or self._held.get(key) is entry

    def _hold(self, entry: _Entry, slot: _Slot, changed: dict[int, _Entry]) -> _Entry:
        """Hold ``entry``'s request at ``slot`` before the policy order: its held entry, put
        where the walk's lists and its tenant's strict-FIFO line see it."""
        cell, _, row, needs = slot
        held = _Entry(
            entry.key, entry.candidate, entry.length, entry.first, entry.last, 0, cell, row,
            needs, None,
        )  # fmt: skip
        key = entry.candidate.request.request_id
        self._held[key] = held
        self._slots[key] = slot
        self._track_new(held)
        self._by_pool.setdefault(row, set()).add(held)
        if entry.candidate.strict:
            bisect.insort(
                self._siblings.setdefault(entry.candidate.request.tenant, []), held, key=_key_of
            )
        changed[id(held)] = held
        return held

    def _unsibling(self, entry: _Entry) -> _Entry | None:
        """Take a strict-FIFO ``entry`` out of its tenant's line; returns the next one."""
        if not entry.candidate.strict:
            return None
        tenant = self._siblings[entry.candidate.request.tenant]
        index = bisect.bisect_left(tenant, entry.key, key=_key_of)
        assert tenant[index] is entry
        del tenant[index]
        return tenant[index] if index < len(tenant) else None

    def _sibling_after(self, entry: _Entry) -> _Entry | None:
        """The next request in a strict-FIFO ``entry``'s tenant line, if there is one."""
        tenant = self._siblings[entry.candidate.request.tenant]
        index = bisect.bisect_right(tenant, entry.key, key=_key_of)
        return tenant[index] if index < len(tenant) else None

    def _held_reads_of(self, flex: _FlexState, candidate: Candidate) -> frozenset[int]:
        """The rows a held commitment's search reads (worked out once per candidate)."""
        key = candidate.request.request_id
        known = self._held_reads.get(key)
        if known is None or known[0] is not candidate:
            known = self._held_reads[key] = (candidate, _reads(flex, candidate))
        return known[1]

    def _insert(self, flex: _FlexState, entry: _Entry, *, ordered: bool = True) -> None:
        """Add an arrival's entry in policy order: to the entries, the order (unless
        ``ordered`` is False: a held commitment's request, already there) and the readers of
        every row its search reads (and its tenant's, if strict FIFO)."""
        candidate = entry.candidate
        request_id = candidate.request.request_id
        reads = self._reads[request_id] = _reads(flex, candidate)
        self._entry_of[request_id] = entry
        self._track_new(entry)
        index = bisect.bisect_left(flex.entries, entry.key, key=_key_of)
        flex.entries.insert(index, entry)
        _stamp(flex.entries, index)
        if ordered:
            self._add_order(entry)
        for row in reads:
            bisect.insort(self._readers.setdefault(row, []), entry, key=_key_of)
        if candidate.strict:
            bisect.insort(
                self._siblings.setdefault(candidate.request.tenant, []), entry, key=_key_of
            )

    def _add_order(self, entry: _Entry) -> None:
        index = bisect.bisect_left(self._order_keys, entry.key)
        self._order_keys.insert(index, entry.key)
        self._order.insert(index, entry.candidate.request.request_id)

    def _drop_order(self, entry: _Entry) -> None:
        index = bisect.bisect_left(self._order_keys, entry.key)
        assert self._order[index] == entry.candidate.request.request_id
        del self._order_keys[index]
        del self._order[index]

    def _remove(self, flex: _FlexState, entry: _Entry, *, ordered: bool = True) -> _Entry | None:
        """Take a departed entry out of every list :meth:`_insert` put it in (the order only
        if ``ordered``); returns its tenant's next strict-FIFO entry, whose floor it set, if
        there is one."""
        candidate = entry.candidate
        reads = self._reads.pop(candidate.request.request_id)
        index = bisect.bisect_left(flex.entries, entry.key, key=_key_of)
        assert flex.entries[index] is entry
        del flex.entries[index]
        if ordered:
            self._drop_order(entry)
        for row in reads:
            readers = self._readers[row]
            del readers[bisect.bisect_left(readers, entry.key, key=_key_of)]
        if not candidate.strict:
            return None
        tenant = self._siblings[candidate.request.tenant]
        index = bisect.bisect_left(tenant, entry.key, key=_key_of)
        del tenant[index]
        return tenant[index] if index < len(tenant) else None

    def _floor_of(self, entry: _Entry) -> int:
        """The strict-FIFO floor ``entry`` starts from: where its tenant's request before it
        (in policy order) left it, as that request stands now."""
        tenant = self._siblings[entry.candidate.request.tenant]
        index = bisect.bisect_left(tenant, entry.key, key=_key_of)
        return _floor_after(tenant[index - 1]) if index > 0 else 0

    def _reads_of(self, entry: _Entry) -> frozenset[int]:
        return self._reads[entry.candidate.request.request_id]

    def _count(self, snapshot: Snapshot, flex: _FlexState, candidate: Candidate, sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) what ``candidate`` could put on each row, counted
        as the full pass's binding test counts it."""
        count_demand(self._demand, candidate, flex.limit_row, snapshot.policy.race_width, sign)


_MICROSECOND = timedelta(microseconds=1)
_MINUTE_US = MINUTE // _MICROSECOND


def _timing_of(state: _Pass, candidate: Candidate) -> tuple[int, datetime | None]:
    """What a clock move reads of ``candidate`` (see KeptPass._timing): how long a
    run placed for it holds its pool, in whole microseconds (timedeltas are), and its
    deadline."""
    request = candidate.request
    max_wait = request.max_wait
    deadline = None if max_wait is None else request.submitted_at + max_wait
    return state.holds(candidate) // _MICROSECOND, deadline


def _stamp(entries: list[_Entry], index: int) -> None:
    """Stamp ``entries[index]``, just inserted in policy order, between its neighbours (or
    number every entry again, :data:`STAMP_GAP` apart, when they leave no room)."""
    before = entries[index - 1].stamp if index > 0 else None
    after = entries[index + 1].stamp if index + 1 < len(entries) else None
    if before is None:
        entries[index].stamp = 0 if after is None else after - STAMP_GAP
    elif after is None:
        entries[index].stamp = before + STAMP_GAP
    elif after - before >= 2:
        entries[index].stamp = (before + after) // 2
    else:
        for position, entry in enumerate(entries):
            entry.stamp = position * STAMP_GAP


def _departed_at(entries: list[_Entry], departed: _Entry) -> int:
    """Where a departed entry goes in the walk's queue: an odd number just after twice the
    stamp of the last entry before it in policy order (so before every later one)."""
    index = bisect.bisect_left(entries, departed.key, key=_key_of)
    before = entries[index - 1].stamp if index > 0 else entries[0].stamp - 1 if entries else 0
    return 2 * before + 1


def _unheld(held: _Entry) -> _Entry:
    """A walk entry for a commitment no longer held: searched from its key, as an arrival."""
    return _Entry(
        held.key, held.candidate, held.length, held.first, held.last, 0, None, -1, (), None
    )


def _key_of(entry: _Entry) -> FlexKey:
    return entry.key


def _stamp_of(entry: _Entry) -> int:
    return entry.stamp


def _floor_after(entry: _Entry) -> int:
    """The strict-FIFO floor a tenant's next request starts from after ``entry``."""
    return entry.best if entry.best is not None else max(entry.floor, entry.last)


def _grant_cells(flex: _FlexState, grant: Grant) -> tuple[int, int]:
    """The grid cells ``grant`` covers, rounded outward as commitments are: (first, count)."""
    first, last = covering(grant.start_at, grant.end_at, flex.grid.origin, flex.cells)
    return first, max(0, last - first)


def _all_rows(flex: _FlexState, candidate: Candidate) -> list[int]:
    """Every grid row ``candidate`` counts against: its pools and its quota limits."""
    return [*candidate.pools, *(flex.limit_row[limit.key] for limit in candidate.limits)]


def _reads(flex: _FlexState, candidate: Candidate) -> frozenset[int]:
    """The grid rows a search for ``candidate`` reads: those of its rows that can bind."""
    return frozenset(row for row in _all_rows(flex, candidate) if flex.binding[row])
