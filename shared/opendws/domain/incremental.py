"""Planning pass after pass: :class:`IncrementalPlanner` keeps what one pass built and, given
the next snapshot (at the same instant or later), plans again only what the changes reach.

``IncrementalPlanner().plan(snapshot, now)`` always returns exactly ``admit(snapshot, now)``.
It keeps the minute grid after every placement, each flex request's entry in policy order (the
strict-FIFO floor its search started from, its start, pool, needs and reason), the calendar
blocks and the plan's decisions. The next call compares the snapshot with the last one (by
identity first, the two walked side by side: see ``_identity_changes``):

- A later ``now`` moves the kept grid's origin to its minute (cells are whole minutes; a kept
  grid reaches a day beyond what its pass needed), dropping the cells now past; aging keys do
  not move with the clock (``policy.flex_key``). A held start on the new minute whose run from
  now takes the same cells is admitted where it stands; any other start that came (an
  admission not carried out, a start passed between passes) is planned again from its place in
  the order; requests whose max_wait passed time out; a held start still ahead keeps its slot
  unless another change reaches it; every held reason is judged again in its request's view
  (see ``IncrementalPlanner._move_clock``). Within the same minute the cells stay, and only a
  run from now can change (one cell longer from some instant of the minute on): the requests
  whose run grew, those that start now and those whose max_wait passed are found by slack
  and by deadline without looking at the others, and a held request whose run grew is held
  for the reason its search also judged for the longer run (``_Entry.alt``), so a pass
  seconds after the last costs what the clock changed (``_move_within``). However short the
  queue, a later now carries the pass over (``CLOCK_FLOOR``: measured, planning a short
  queue in full costs more).
- Flex arrivals, departures (cancelled, timed out, admitted), releases (a grant that is gone)
  and new grants are applied. Requests before the first one in policy order they can reach keep
  their decisions. A grid row is rolled back (the takes of the requests from there on given
  back) only once the walk must read or change it, and only the requests on rolled rows are
  visited after that, in policy order (each row keeps its readers in order; the walk merges
  them by the entries' integer stamps, ``STAMP_GAP``): one on no rolled row keeps its slot
  untouched. Per rolled row the walk keeps how its free amounts differ from what the request it
  is at saw last pass; a request whose slot that difference cannot change (no gain where a run
  of its could newly fit, no loss inside its slot: see ``_stands``) takes its slot again
  without a search. A start a gain could open is also tested on the request's rows not rolled
  back, as it sees them (the takes of the requests after it given back over that run:
  ``_past_unrolled``), so a pool that did not change is not rolled back for a slot that stands.
  What a visit proves of a request's pool alone (no room there for a start that could win)
  stays with its entry while that pool gains nothing a run of it could reach, so a later
  change to its quota rows alone costs no scan (``_Entry.clear``). Any other is searched; if
  its slot moved, the difference follows. Once ``CASCADE_AFTER`` requests of a pool in a row
  moved, the next one whose rows changed is searched without that test (a release or an
  arrival can move a whole queue, and the test costs about what the search does), until one
  stays or stands. Held slots are renumbered in the pools where one
  came, left or moved. Ranks are the plan's ``order``, kept in step, so an arrival near the
  front rewrites no decision behind it.
- An admission carried out (the request left, its grant came holding exactly the slot it took)
  changes no row a search reads: nothing after it is searched again — unless a request ahead
  of it is held in the same pool by quota, whose reason may then turn to the pool's capacity;
  the grant is then applied as any other.
- A grant that came or went while calendar blocks are pending decides again the blocks that
  read one of its rows (its pool or a quota limit it counts against): it can make a refused
  block fit or a confirmed one not, and moves the alternatives offered. A block on none of
  its rows is decided as before, and so is a confirmed one whose window it does not overlap
  (see ``_recalendar``). A calendar block that arrived is decided in its place in calendar
  order. A block whose booking changed (or a new one) reaches the blocks after it in the
  same way, and they are decided again in turn; what the blocks book now and no longer book
  is taken and given back in the flex grid as grants are. A block that left takes nothing
  with it if it was refused; a confirmed one's booking is either reserved (an equal grant
  came: the grid holds the same, and the blocks before it, which did not see the booking,
  are decided again) or given back as a released grant (see ``_blocks_left``). So in
  service, where the reconciler submits or refuses a block in the pass that decided it,
  neither that pass nor the next plans in full.
- Commitments (``policy.commit_within``: ETAs told less than that far ahead) are held before
  the policy order, so they are kept as a layer under the walk: each held where it was
  promised, in the grid, and none of the walk's entries. Each pass works out which are held
  now (``_relayer``), looking again only at the commitments a change can reach (those that
  came or left, told apart by identity; those the horizon reached, by start; those of
  requests that came, left or started; those whose run from now grew: ``_looked_at``; in a
  later minute, every one): a commitment that came for a request the walk had placed (taken
  out of the walk; where it holds the slot it had, nothing else moves), one moved elsewhere, one
  whose request left (its slot given back, or taken as it was by the request's grant: an
  admission carried out) and one dropped while its request waits (planned again from its key,
  as an arrival). What the layer gives back or takes is applied as grants are. Once the walk
  is done, each commitment is moved earlier where the plan left room and its reason judged,
  as a full pass does, and the grid is put back (``_rehold``); only one a change can reach
  is tested again, and where nothing moved, only those whose run from now grew are judged
  again. A move the last pass made that the reconciler carried out (the
  commitment now held, or admitted, where it moved) is no such change, except for the
  commitments ranked before it: they were tested with its old slot still taken. A full
  pass holds every commitment at its first slot as long as each still fits there once all
  are held (``MinuteGrid.take_all``): only a newly held slot or a new grant can break that,
  so only their cells are checked (``_still_fit``), and a pass where one no longer fits is
  planned in full.

Anything else is planned in full, and :attr:`IncrementalPlanner.last_pass` says why: the first
pass; an earlier ``now``; a later one while a calendar block is pending (its verdict depends on
now), a pool cools down after a stockout, a request stamped after the last now is kept (it
ages from now), or beyond the kept grid's reach; changed pools, tenants or policy; a
commitment that no longer fits where it was promised, or whose request the clock planned
again; racing (``snapshot.racing``, or ``race_eagerly``: lanes are taken after every
placement); an arrival that needs a longer grid or a quota row the grid lacks; an arrival or
a grant that makes a row bind that the grid never tracked (rows that could never bind are
left out of every search). A full pass that could not hold some commitment at its first
slot keeps nothing (the next one is full whatever it sees, and names the commitments as its
reason); so does a plan that raises, whatever it raised part-way (the next one is full, and
says the last one failed: ``PLAN_FAILED``). Every full pass takes the policy keys the last
one worked out for the same request objects (a key does not move with the clock once a
request's stamp has passed; see ``_Pass``'s ``keys``).
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from itertools import filterfalse
from operator import itemgetter
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from opendws.domain.admission import (
    _collector_paused,
    _Entry,
    _FlexState,
    _Keys,
    _Pass,
    _waiting,
)
from opendws.domain.model import (
    CapacityRequest,
    Commitment,
    Grant,
    Mode,
    QueueingStrategy,
    Snapshot,
    require_utc,
)
from opendws.domain.planner.blocks import ExactLedger, decide_block
from opendws.domain.planner.commitments import (
    Kept,
    Move,
    commitment_slots,
    judge_commitments,
    move_earlier,
    undo,
)
from opendws.domain.planner.search import hold_reason, longer_reason, options, place
from opendws.domain.planner.shapes import Candidate
from opendws.domain.planner.verdicts import Decision, Outcome, Plan, Race, Reason, rebuild
from opendws.domain.policy import CalendarKey, FlexKey, calendar_key, flex_key
from opendws.domain.quotas import LimitKey
from opendws.domain.timeline import MINUTE, MinuteGrid, ceil_cells, floor_cells

_Item = TypeVar("_Item")
# Above this share of the flex queue planned again after the clock moved (and this many:
# a short queue replans cheaply either way), plan in full.
RESTART_SHARE = 0.25
RESTART_FLOOR = 64
# Below this many flex requests, a later now plans in full unless commitments are held.
# None by default: on the Philly replay's largest cluster (about a hundred queued in one
# pool; first 4.5 days, the same decisions either way), carrying every pass over took 0.70×
# the time of planning short queues in full without commitments (compiled; 0.79× in plain
# Python), and 0.97× with the default horizon's (when no commitment is held); over 20 days,
# 0.94×. A 10,000-request snapshot plans 3–4× faster carried over.
CLOCK_FLOOR = 0
# At most this many spare delta rows are kept between passes (a walk rolls a few dozen rows;
# each spare is as long as the grid).
SPARE_ROWS = 64
# How two snapshots' pending requests (and grants) are told apart (see _identity_changes):
# items looked through at a mismatch for where the two meet again, and mismatches aligned so
# before the rest is compared as sets.
ALIGN_AHEAD = 32
ALIGN_MISSES = 256
# Entries' stamps (_Entry.stamp: policy order as integers) are this far apart after a full
# pass; an arrival takes the middle between its neighbours', and when two are adjacent (after
# 32 arrivals between the same two) every entry is numbered again.
STAMP_GAP = 1 << 32
# In the walk's test of a request (see _stands), a start found on the rows rolled back is
# tested on the others with the takes of the requests after it given back: of at most this
# many requests on a row, and at most this many starts; else the request is searched.
UNROLLED_READERS = 64
UNROLLED_PROBES = 2
# After this many requests of a pool in a row moved, a walk searches the next at once (most
# often it moves too) rather than first testing whether its slot stands.
CASCADE_AFTER = 2
_NONE = 1 << 62  # no cell yet: above every grid
COMMITMENTS_HELD = "the last pass could not hold a commitment where it was promised"
PLAN_FAILED = "the last plan failed: what it kept may be half updated"


@dataclass(frozen=True, slots=True)
class PassReport:
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


@dataclass(slots=True)
class _Layer:
    """How the commitments held before the policy order change in a pass (see
    :meth:`IncrementalPlanner._relayer`). A slot is (first cell, cells, pool row, needs)."""

    # What the held slots give back (a positive amount) or take: (row, first cell, cells,
    # amount), applied to the grid under every entry.
    takes: list[tuple[int, int, int, int]] = field(default_factory=list)
    # (needs, first cell, cells) newly held: each must still fit once the walk is done
    checks: list[tuple[tuple[tuple[int, int], ...], int, int]] = field(default_factory=list)
    relocated: list[tuple[_Entry, _Slot]] = field(default_factory=list)  # held elsewhere
    dropped: list[_Entry] = field(default_factory=list)  # its request left or timed out
    absorbed: set[int] = field(default_factory=set)  # id() of a grant that took a dropped slot
    demoted: list[_Entry] = field(default_factory=list)  # no longer held: planned as any other
    promoted: list[tuple[_Entry, _Slot]] = field(default_factory=list)  # an entry now held
    quiet: list[tuple[_Entry, _Slot]] = field(default_factory=list)  # held where it was placed
    fresh: list[tuple[_Entry, _Slot]] = field(default_factory=list)  # an arrival held at once
    # A move the last pass made, carried out: the commitment is held where that pass moved it,
    # or admitted there (its grant takes exactly that slot). The grid is then as that pass
    # left it once its moves were made, so its tests and judgements still hold, except that a
    # commitment ranked before the mover was tested with the mover's old slot taken (see
    # _rehold). Its takes (the old slot given back, the new one taken) are applied as
    # ``takes`` are, but are kept apart: no change to what _rehold reads.
    carried: list[tuple[int, int, int, int]] = field(default_factory=list)
    carried_grants: set[int] = field(default_factory=set)  # id() of a grant that took one
    # request id → (policy key, old slot) of each carried move
    movers: dict[str, tuple[FlexKey, _Slot]] = field(default_factory=dict)


# A commitment's held slot: (first cell, cells, pool row, needs).
_Slot = tuple[int, int, int, tuple[tuple[int, int], ...]]
# A commitment's first slot, kept (see IncrementalPlanner._first_slot): (commitment,
# candidate, deadline minute, slot's first minute, (cells, pool row, needs) or None).
_FirstSlot = tuple[
    Commitment, Candidate, int, int, tuple[int, int, tuple[tuple[int, int], ...]] | None
]
# Minutes are counted from here where a kept cell must outlive the grid's origin.
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(slots=True)
class _ClockMove:
    """What moving the clock changed (see :meth:`IncrementalPlanner._move_clock`)."""

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
    # again: see _rehold)
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


class IncrementalPlanner:
    """Plans snapshot after snapshot with exactly the decisions of :func:`admit`, reusing the
    last pass where the changes allow (see the module docstring). One reconciler owns one
    planner; it is not thread-safe."""

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
        # _rehold).
        self._moves: dict[str, tuple[_Slot, _Slot]] | None = None
        # Held request id → (its candidate, the rows its search reads), worked out once.
        self._held_reads: dict[str, tuple[Candidate, frozenset[int]]] = {}
        # The commitments by request as the last look at them found them (the last one told for
        # each), the tuple they were read from, whether one request had two, and those that
        # started beyond the horizon then, by start: see _looked_at (None: read them all).
        self._promised: dict[str, Commitment] | None = None
        self._promised_of: tuple[Commitment, ...] = ()
        self._twice = False
        self._beyond: list[tuple[datetime, int, Commitment]] = []
        # Strict-FIFO commitment's request id → the floor its reason was last judged from
        # (see _rehold).
        self._judged_floors: dict[str, int] = {}
        # Request id → (commitment, candidate, deadline minute, first slot's minute, (its
        # cells, pool row, needs) or None), minutes counted from _EPOCH (see _first_slot).
        self._first_slots: dict[str, _FirstSlot] = {}
        self._demand: list[int] = []  # per grid row: what all flex requests could put on it
        self._reads: dict[str, frozenset[int]] = {}  # flex request id → rows its search reads
        self._entry_of: dict[str, _Entry] = {}  # flex request id → its entry
        # Flex request id → (how long a run placed for it holds its pool, in microseconds;
        # its deadline, submitted_at + max_wait): what a clock move reads of every request,
        # fixed for a kept pass (worked out once; a full pass forgets them).
        self._timing: dict[str, tuple[int, datetime | None]] = {}
        # What a move within the minute reads, so that it costs what it changes (see
        # _move_within): (slack, seq, entry) of each entry (or held one) whose run from now
        # takes ``length`` cells, by slack (microseconds into the minute after which it takes
        # one more; a heap), and (deadline, seq, entry) of each, by deadline. An entry since
        # replaced is skipped when popped (see _kept).
        self._flips: list[tuple[int, int, _Entry]] = []
        self._deadlines: list[tuple[datetime, int, _Entry]] = []
        self._seq = 0
        self._admitted: set[str] = set()  # requests whose decision is ADMIT (a start now)
        self._by_pool: dict[int, set[_Entry]] = {}  # pool row → the entries placed in it
        # Pool row → its entries in slot order as the last renumbering left them (see
        # _in_slot_order).
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
        self.last_pass = PassReport(full=True, why="no pass yet")
        # Plans made so far, and the requests whose decision the last one set anew or dropped,
        # other than for a new place in line (None: any may have, after a full pass):
        # whoever carries plans out may look at those alone, if it saw the plan before (see
        # ReconcileService; a place in line alone is no news).
        self.plans = 0
        self.changed: set[str] | None = None
        self._changed: set[str] | None = None

    def __reduce__(self) -> tuple[object, ...]:
        """Refused: a planner is not copied or pickled. Its state is one graph of entries,
        indexes and a grid that refer to each other and to the snapshot it last read; one
        reconciler owns one, and another starts with a full pass of its own."""
        raise TypeError(
            "an IncrementalPlanner is not copied or pickled: make a new one (its first plan "
            "is a full pass)"
        )

    def plan(self, snapshot: Snapshot, now: datetime) -> Plan:
        """The plan ``admit(snapshot, now)`` gives, made incrementally where it can be."""
        require_utc("now", now)
        self._start_changes()
        with _collector_paused():
            try:
                why = self._why_full(snapshot, now)
                if why is None:
                    why = self._replan(snapshot, now)
                if why is not None:
                    self._full(snapshot, now, why)
                state = self._pass
                assert state is not None
                races = tuple(
                    Race(request_id=key, pools=state.races[key]) for key in sorted(state.races)
                )
                plan = Plan(
                    now=state.now,
                    decisions=tuple(self._decisions),
                    races=races,
                    order=tuple(self._order),
                )
            except BaseException:
                # Raised part-way, it may have updated some of what it keeps and not the rest:
                # forget all of it, so that the next pass plans in full (see _why_full).
                self._pass = None
                self._snapshot = None
                self._keys = {}
                self._spare = []
                self._unkept = PLAN_FAILED
                raise
            self.plans += 1
            self.changed = self._changed
            if why is not None and state.flex is not None and state.flex.held is None:
                # A commitment was not held at its first slot: the next pass plans in full
                # whatever it sees (see _why_full).
                self._pass = None
                self._snapshot = None
                self._unkept = COMMITMENTS_HELD
            return plan

    def _start_changes(self) -> None:
        """Name no decision as changed yet. (A method, not an assignment in :meth:`plan`: a
        full pass sets ``_changed`` to None in between, which a type checker narrowing the
        attribute after an assignment in ``plan`` would not see, nor code compiled from it.)"""
        self._changed = set()

    # A full pass -----------------------------------------------------------------------------

    def _full(self, snapshot: Snapshot, now: datetime, why: str) -> None:
        self._unkept = None
        self._changed = None  # every decision is made anew
        state = _Pass(snapshot, now, keep=True, keys=self._keys)
        state.run()
        self._keys = state.keys
        self._pass = state
        self._snapshot = snapshot
        self._latest_submitted = max(
            (request.submitted_at for request in snapshot.pending),
            default=datetime.min.replace(tzinfo=UTC),
        )
        self._ids = sorted(state.decisions)
        self._decisions = list(map(state.decisions.__getitem__, self._ids))
        self._order = list(state.order)
        flex = state.flex
        self._held = {}
        self._slots = {}
        self._moves = None
        self._held_reads = {}
        self._promised = None
        self._judged_floors = {}
        self._first_slots = {}  # a new grid: its rows and binding may differ
        self._demand = [0] * (len(flex.limits) if flex is not None else 0)
        self._reads = {}
        self._entry_of = {}
        self._timing = {}
        self._flips = []
        self._deadlines = []
        self._admitted = {
            key for key, decision in state.decisions.items() if decision.outcome is Outcome.ADMIT
        }
        self._by_pool = {}
        self._slot_orders = {}
        self._readers = {}
        self._siblings = {}
        self._index_blocks(state)
        self._booked = {grant.request_id: grant for grant in state.grants[state.base_grants :]}
        if flex is not None:
            # Its facts hold only while free amounts go down; a walk first gives slots back.
            flex.grid.forget()
            readers = self._readers
            for index, entry in enumerate(flex.entries):  # in policy order, as every list below
                entry.stamp = index * STAMP_GAP
                candidate = entry.candidate
                key = candidate.request.request_id
                self._count(snapshot, flex, candidate, 1)
                reads = self._reads[key] = _reads(flex, candidate)
                for row in reads:
                    readers.setdefault(row, []).append(entry)
                if candidate.strict:
                    self._siblings.setdefault(candidate.request.tenant, []).append(entry)
                self._entry_of[key] = entry
                if entry.best is not None:
                    self._by_pool.setdefault(entry.row, set()).add(entry)
            for entry in flex.held or ():
                key = entry.candidate.request.request_id
                cell, row, needs, _, _ = flex.held_slots[key]
                self._held[key] = entry
                self._slots[key] = (cell, entry.first if cell == 0 else entry.length, row, needs)
                self._count(snapshot, flex, entry.candidate, 1)
                assert entry.best is not None
                self._by_pool.setdefault(entry.row, set()).add(entry)
                if entry.candidate.strict:
                    self._siblings.setdefault(entry.candidate.request.tenant, []).append(entry)
            if flex.held:
                for tenant in self._siblings.values():
                    tenant.sort(key=_key_of)
            self._order_keys = sorted(
                [entry.key for entry in flex.entries] + [entry.key for entry in flex.held or ()]
            )
            for entry in (*flex.entries, *(flex.held or ())):
                self._track(state, entry, heap=False)
            heapq.heapify(self._flips)
            heapq.heapify(self._deadlines)
        else:
            self._order_keys = []
        self.last_pass = PassReport(full=True, why=why)

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

    def _why_full(self, snapshot: Snapshot, now: datetime) -> str | None:
        """Why the next plan cannot start from the last one, or None if it can."""
        last = self._snapshot
        state = self._pass
        if last is None or state is None:
            return self._unkept if self._unkept is not None else "no pass yet"
        if now < state.now:
            return "the clock went back"
        if now != state.now:
            if any(p.short_until is not None and p.short_until > state.now for p in state.pools):
                return "a pool cools down after a stockout: where it may start moves with now"
            if self._latest_submitted > state.now:
                return "a request stamped after the last pass ages from now on"
            if state.flex is None or (not self._held and len(self._order) < self._clock_floor):
                return "a later now over a queue below the clock floor"
        if snapshot.policy != last.policy:
            return "the policy changed"
        if snapshot.pools is not last.pools and set(snapshot.pools) != set(last.pools):
            return "the pools changed"
        if snapshot.tenants is not last.tenants and set(snapshot.tenants) != set(last.tenants):
            return "the tenants changed"
        if snapshot.racing or last.racing:
            return "racing requests take lanes after every placement"
        if snapshot.policy.race_eagerly and snapshot.policy.race_width > 1:
            return "eager racing takes lanes after every placement"
        return None

    # An incremental pass ---------------------------------------------------------------------

    def _replan(self, snapshot: Snapshot, now: datetime) -> str | None:
        """Bring the kept pass up to ``snapshot`` at ``now``; None when done, else why a full
        pass is needed (what was changed by then is rebuilt by that full pass)."""
        state = self._pass
        assert state is not None
        kept = self._snapshot
        assert kept is not None
        gone: list[str] = []
        came: list[CapacityRequest] = []
        if snapshot.pending is not kept.pending:
            # By identity first (see _identity_changes), then by value: a request that was
            # read again as an equal object is no change.
            before, after = _identity_changes(kept.pending, snapshot.pending)
            left = {request.request_id: request for request in before}
            for request in after:
                if left.get(request.request_id) == request:
                    del left[request.request_id]
                else:
                    came.append(request)
            gone = sorted(left)
        released: list[Grant] = []
        added: list[Grant] = []
        if snapshot.grants is not kept.grants:
            # The same by identity, then by value (equal grants read again cancel out).
            ended, new = (Counter(side) for side in _identity_changes(kept.grants, snapshot.grants))
            added = list((new - ended).elements())
            released = list((ended - new).elements())
        clock = _ClockMove()
        if now != state.now and state.calendar:
            # A block's verdict depends on now: one still pending at a later now is decided
            # again in full (the blocks that left, booked or refused, are no concern).
            leaving = set(gone)
            if any(block.request.request_id not in leaving for block in state.calendar):
                return "calendar blocks are pending: a block's verdict depends on now"
        if now != state.now:
            moved = self._move_clock(now, set(gone))
            if isinstance(moved, str):
                return moved
            clock = moved
        now = state.now
        # A flex request that left has an entry or is held; only another may be a calendar
        # block.
        others = {key for key in gone if key not in self._entry_of and key not in self._held}
        became = (
            self._blocks_left(state, others, released, added) if others and state.calendar else []
        )
        flex = state.flex
        strict = {t.name for t in snapshot.tenants if t.queueing is QueueingStrategy.STRICT_FIFO}
        screened: dict[str, Decision] = {}
        arrivals: list[_Entry] = []
        fresh: list[Candidate] = []  # calendar blocks that arrived
        for request in came:
            allowed = state.pool_index.allowed(request)
            verdict = state._screen_out(request, allowed)
            if verdict is not None:
                screened[request.request_id] = verdict
                continue
            candidate = Candidate(
                request,
                allowed.pools,
                state.quotas.limits(request.tenant, request.gang.accelerator),
                request.tenant in strict,
            )
            if request.mode is not Mode.FLEX_START:
                fresh.append(candidate)
                continue
            if flex is None:
                return "no flex step to extend"
            if any(limit.key not in flex.limit_row for limit in candidate.limits):
                return "an arrival counts against a quota row the grid lacks"
            run = state.holds(candidate)
            length = ceil_cells(run)
            first = state.first_cells(run)
            last = state.last_cell(request)
            if 1 + first + last > flex.cells:
                return "an arrival needs a longer grid"
            order = flex_key(
                request,
                strict=candidate.strict,
                now=now,
                half_life=snapshot.policy.aging_half_life,
            )
            arrivals.append(_Entry(order, candidate, length, first, last, 0, None, -1, (), None))
        redecided = 0
        if fresh:
            state.calendar = [*state.calendar, *fresh]
            for block in fresh:
                for resource in _block_resources(block):
                    bisect.insort(
                        self._block_readers.setdefault(resource, []), block, key=_calendar_key
                    )
        if state.calendar and (released or added or became or fresh):
            redecided, taken, given = self._recalendar(
                snapshot, state, [*released, *added, *became], fresh
            )
            # What the blocks book now and no longer book is held and given back as grants.
            added += taken
            released += given
        if flex is not None:
            for entry in arrivals:
                self._count(snapshot, flex, entry.candidate, 1)
            # A row that was left out as never binding has none of the takes: it must stay so.
            for entry in arrivals:
                for row in _all_rows(flex, entry.candidate):
                    demand = self._demand[row]
                    if not flex.binding[row] and demand > 0 and flex.lowest[row] < demand:
                        return "an arrival makes a row bind that the grid never tracked"
            # A new grant lowers what commitments leave free (at most by its amount).
            for grant in added:
                for row, amount in _grant_rows(state, flex, grant):
                    flex.lowest[row] -= amount
                    demand = self._demand[row]
                    if not flex.binding[row] and demand > 0 and flex.lowest[row] < demand:
                        return "a new grant makes a row bind that the grid never tracked"
        layer = _Layer()
        if flex is not None and (self._held or _holds_commitments(snapshot, now)):
            found = self._relayer(snapshot, state, flex, arrivals, set(gone), added, clock)
            if isinstance(found, str):
                return found
            layer = found
        for key in gone:
            self._drop(state, key)
        for key, decision in screened.items():
            self._put(state, key, decision)
        for entry in (*clock.expired, *clock.expired_held):
            request = entry.candidate.request
            verdict = state._screen_out(request, state.pool_index.allowed(request))
            assert verdict is not None
            assert verdict.outcome is Outcome.TIME_OUT
            self._put(state, request.request_id, verdict)
        self._latest_submitted = max(
            (self._latest_submitted, *(request.submitted_at for request in came))
        )
        report = PassReport(full=False)
        if flex is not None:
            walked = self._walk(
                snapshot, state, flex, gone, arrivals, released, added, clock, layer
            )
            if isinstance(walked, str):
                return walked
            report = walked
        self._snapshot = snapshot
        self.last_pass = replace(report, redecided=redecided)
        return None

    def _relayer(
        self,
        snapshot: Snapshot,
        state: _Pass,
        flex: _FlexState,
        arrivals: list[_Entry],
        gone: set[str],
        added: list[Grant],
        clock: _ClockMove,
    ) -> _Layer | str:
        """How the commitments held before the policy order change from the last pass (the
        clock already moved): the commitments within the horizon now, each at its first slot
        (:func:`commitment_slots`), against those held then. Else why not (a commitment
        whose request the clock planned again).

        The last pass held every commitment at its first slot. Whether this one can too is
        known only once the walk is done (see :meth:`_still_fit`); every slot it takes is
        listed for that check."""
        layer = _Layer()
        new: dict[str, tuple[_Slot, _Entry]] = {}
        horizon = snapshot.policy.commit_within
        expired = {id(entry) for entry in clock.expired_held}
        fresh = {entry.candidate.request.request_id: entry for entry in arrivals}
        looked: list[str] | None = None  # the requests looked at again, sorted (None: all)
        if horizon is None:
            self._promised = None
        else:
            beyond = state.now + horizon
            named = self._looked_at(snapshot, beyond, gone, fresh, clock)
            looked = None if named is None else sorted(named)
            promised = self._promised
            assert promised is not None
            replanned = {id(entry) for entry in (*clock.restart, *clock.expired)}
            base = (state.origin - _EPOCH) // MINUTE  # the grid's cell 0, as a minute
            first_slots = self._first_slots
            for key in promised if looked is None else looked:
                commitment = promised.get(key)
                if commitment is None or commitment.start_at >= beyond or key in gone:
                    continue
                entry = self._held.get(key) or self._entry_of.get(key) or fresh.get(key)
                if entry is None or id(entry) in expired:
                    continue
                if id(entry) in replanned:
                    return "a commitment's request is planned again as the clock moved"
                # Most passes: the same commitment for the same candidate, its slot still
                # ahead (see _first_slot), inline.
                known = first_slots.get(key)
                if (
                    known is not None
                    and known[0] is commitment
                    and known[1] is entry.candidate
                    and known[4] is not None
                    and known[3] > base
                    and known[2] - base == entry.last
                ):
                    new[key] = ((known[3] - base, *known[4]), entry)
                    continue
                slot = self._first_slot(state, flex, commitment, entry, base)
                if slot is not None:
                    new[key] = (slot, entry)
            if len(self._first_slots) > 2 * len(promised) + 64:
                self._first_slots = {
                    key: known for key, known in self._first_slots.items() if key in promised
                }
        moves = self._moves or {}
        held_now = self._held
        for key, held in (
            held_now.items()
            if looked is None
            else [(key, held_now[key]) for key in looked if key in held_now]
        ):
            was = self._slots[key]
            cell, span, row, needs = was
            found = new.get(key)
            if found is not None:
                slot = found[0]
                if slot != was:
                    taken = [(need, cell, span, amount) for need, amount in needs]
                    taken += [(need, slot[0], slot[1], -amount) for need, amount in slot[3]]
                    if moves.get(key) == (was, slot):  # where the last pass moved it
                        layer.carried += taken
                        layer.movers[key] = (held.key, was)
                    else:
                        layer.takes += taken
                    layer.checks.append((slot[3], slot[0], slot[1]))
                    layer.relocated.append((held, slot))
                continue
            if key in gone or id(held) in expired:
                layer.dropped.append(held)
                grant = self._absorbing(state, flex, added, key, was)
                if grant is not None:
                    layer.absorbed.add(id(grant))
                    continue
                move = moves.get(key)
                if key in gone and move is not None and move[0] == was:
                    # Admitted where the last pass moved it: its grant takes that slot.
                    grant = self._absorbing(state, flex, added, key, move[1])
                    if grant is not None:
                        layer.carried_grants.add(id(grant))
                        layer.carried += [(need, cell, span, amount) for need, amount in needs]
                        layer.movers[key] = (held.key, was)
                        continue
            else:
                layer.demoted.append(held)
            layer.takes += [(need, cell, span, amount) for need, amount in needs]
        for key, (slot, entry) in new.items():
            if key in self._held:
                continue
            cell, span, row, needs = slot
            if key in fresh:
                layer.fresh.append((entry, slot))
            elif (
                entry.best is not None
                and clock.slot(entry) == (cell, span)
                and (entry.row, entry.needs) == (row, needs)
                # As an admission carried out (see _walk): a request ahead of it held in the
                # same pool by quota sees the pool fuller now, and may turn to capacity.
                and not any(
                    other.reason is Reason.QUOTA and other.key < entry.key
                    for other in self._by_pool.get(row, ())
                )
            ):
                layer.quiet.append((entry, slot))  # it holds the slot it had: no cell changes
                continue
            else:
                layer.promoted.append((entry, slot))
            layer.takes += [(need, cell, span, -amount) for need, amount in needs]
            layer.checks.append((needs, cell, span))
        return layer

    def _looked_at(
        self,
        snapshot: Snapshot,
        beyond: datetime,
        gone: set[str],
        fresh: Mapping[str, _Entry],
        clock: _ClockMove,
    ) -> set[str] | None:
        """Bring the commitments kept by request (``_promised``: the last one told for each)
        up to ``snapshot``'s, and name the requests whose commitment, whether it lies within
        the horizon (before ``beyond``), or what its first slot reads may have changed since
        they were last looked at: the commitments that came or left (told apart by identity,
        as pending requests are), the ones the horizon reached since (``_beyond``: by start),
        requests that left or came, those the clock planned again or timed out, and the held
        ones whose run from now grew (a slot from now spans it). For every other request
        within the horizon, the last pass found its first slot and held it there (or found
        none), and would find the same. None: every request is looked at again (after a full
        pass, in a later minute, whose cells moved, or where a request has two commitments:
        the last one counts, which the identities alone do not tell)."""
        told = snapshot.commitments
        promised = self._promised
        if promised is None or clock.shifted or self._twice:
            self._promise_all(told, beyond)
            return None
        looked: set[str] = set()
        if told is not self._promised_of:
            before, after = _identity_changes(self._promised_of, told)
            left = {commitment.request_id: commitment for commitment in before}
            came = {commitment.request_id: commitment for commitment in after}
            if len(left) < len(before) or len(came) < len(after):
                self._promise_all(told, beyond)  # one request's two, or more
                return None
            for key in left.keys() | came.keys():
                old, now_told = left.get(key), came.get(key)
                if (promised.get(key) is not old) if old is not None else key in promised:
                    self._promise_all(told, beyond)  # another one told for it
                    return None
                if now_told is None:
                    del promised[key]
                else:
                    promised[key] = now_told
                    if now_told.start_at >= beyond:
                        self._seq += 1
                        heapq.heappush(self._beyond, (now_told.start_at, self._seq, now_told))
                looked.add(key)
            self._promised_of = told
        waiting = self._beyond
        while waiting and waiting[0][0] < beyond:  # the horizon reached them
            commitment = heapq.heappop(waiting)[2]
            if promised.get(commitment.request_id) is commitment:
                looked.add(commitment.request_id)
        looked.update(fresh)
        looked.update(key for key in gone if key in promised or key in self._held)
        looked.update(
            entry.candidate.request.request_id
            for entry in (*clock.restart, *clock.expired, *clock.expired_held)
        )
        looked.update(clock.flipped_held)
        return looked

    def _promise_all(self, told: tuple[Commitment, ...], beyond: datetime) -> None:
        """Keep ``told`` by request (the last one counts), and those starting at or after
        ``beyond`` by start: every request is looked at again."""
        promised: dict[str, Commitment] = {}
        twice = False
        for commitment in told:
            twice = twice or commitment.request_id in promised
            promised[commitment.request_id] = commitment
        self._promised, self._promised_of, self._twice = promised, told, twice
        self._beyond = []
        for commitment in promised.values():
            if commitment.start_at >= beyond:
                self._seq += 1
                self._beyond.append((commitment.start_at, self._seq, commitment))
        heapq.heapify(self._beyond)

    def _first_slot(
        self, state: _Pass, flex: _FlexState, commitment: Commitment, entry: _Entry, base: int
    ) -> _Slot | None:
        """The first slot :func:`commitment_slots` gives ``commitment`` (within the
        horizon) for ``entry``'s request, or None; ``base``: the grid's cell 0, as a minute
        from _EPOCH. It is kept per request, in minutes rather than cells: for the same
        commitment and candidate, a later now leaves a slot still ahead at the same minute
        (its deadline too), so only one that came is worked out again (see _relayer, which
        reads what is kept)."""
        candidate = entry.candidate
        found = commitment_slots(
            commitment,
            candidate,
            entry.length,
            entry.first,
            entry.last,
            flex.binding,
            flex.limit_row,
            flex.short,
            origin=state.origin,
            pool_row=state.pool_row,
        )
        if found is None:
            self._first_slots[candidate.request.request_id] = (
                commitment, candidate, entry.last + base, base, None,
            )  # fmt: skip
            return None
        row, needs, cells = found
        cell, span = cells[0]
        self._first_slots[candidate.request.request_id] = (
            commitment, candidate, entry.last + base, cell + base, (span, row, needs),
        )  # fmt: skip
        return cell, span, row, needs

    def _absorbing(
        self,
        state: _Pass,
        flex: _FlexState,
        added: list[Grant],
        key: str,
        slot: tuple[int, int, int, tuple[tuple[int, int], ...]],
    ) -> Grant | None:
        """The grant among ``added`` that takes exactly the slot the commitment ``key`` held
        (its admission carried out), on every row a search reads; None if there is none."""
        cell, span, row, needs = slot
        for grant in added:
            if (
                grant.request_id == key
                and _grant_cells(flex, grant) == (cell, span)
                and state.pool_row.get(grant.pool_id) == row
                and sorted(c for c in _grant_rows(state, flex, grant) if flex.binding[c[0]])
                == sorted(needs)
            ):
                return grant
        return None

    def _move_clock(self, now: datetime, gone: set[str]) -> _ClockMove | str:
        """Carry the kept pass over to a later ``now`` (the caller ruled out what this cannot
        carry: pending blocks, stockouts, requests stamped after the last now); else why not.

        The grid's cells are whole minutes, so a later minute drops the cells now past and
        keeps the rest, and every cell number (a start, a deadline, a strict-FIFO floor)
        moves down by as many. Aging keys do not move (policy.flex_key). What the clock does
        change is returned as changes for the walk: a held start on the new minute whose run
        from now takes the same cells is admitted where it stands; any other start that came
        is planned again from its key, with what is left of its slot given back; requests
        whose max_wait passed leave (TIME_OUT). A held start still ahead stays: a run from the
        new now is no shorter than one from that minute, which did not fit before it (nothing
        else changed). The walk then judges every held reason again."""
        state = self._pass
        assert state is not None
        origin = now.replace(second=0, microsecond=0)
        shift = (origin - state.origin) // MINUTE
        flex = state.flex
        if flex is not None and shift > flex.grid.cells:
            return "the clock moved past the kept grid"
        if flex is not None and shift == 0:
            return self._move_within(state, flex, now, gone)
        state.now, state.origin = now, origin
        clock = _ClockMove(moved=True, shifted=True)
        if flex is None:
            return clock
        flex.grid.advance(shift)
        flex.cells = flex.grid.cells
        into = (now - origin) // _MICROSECOND
        reach = 0
        timing = self._timing
        # From here on, a run from now that takes ``length`` cells takes one more after its
        # slack (see _move_within): noted again as each is moved.
        flips: list[tuple[int, int, _Entry]] = []
        seq = self._seq
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
        if self._moves is not None:
            self._moves = {
                key: (_shifted(was, shift), _shifted(to, shift))
                for key, (was, to) in self._moves.items()
            }
        for key, entry in self._held.items():
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
            self._slots[key] = _shifted(self._slots[key], shift)
            if key in gone:
                continue
            if deadline is not None and deadline < now:
                clock.expired_held.append(entry)
            else:
                reach = max(reach, entry.first + entry.last)
        if 1 + reach > flex.cells:
            return "the kept grid no longer reaches every deadline"
        again = len(clock.restart) + len(clock.expired)
        if again > max(RESTART_FLOOR, len(flex.entries) * RESTART_SHARE):
            # Each is planned again from its place, and what follows it is walked again:
            # past this share, a full pass costs less (and plans the same).
            return "most of the queue's starts came: a full pass costs less"
        heapq.heapify(flips)
        self._flips, self._seq = flips, seq
        # The deadlines stand (instants): the passed ones are popped.
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < now:  # each expired above, or left
            heapq.heappop(deadlines)
        return clock

    def _move_within(
        self, state: _Pass, flex: _FlexState, now: datetime, gone: set[str]
    ) -> _ClockMove | str:
        """:meth:`_move_clock` to a later ``now`` in the same minute: the grid's cells stay,
        so what the move changes is found without looking at every entry: the runs from now
        that now reach one cell further (by slack: see :meth:`_track`), the starts now (the
        requests admitted: their instant is the new now), and the requests whose max_wait
        passed (by deadline). Each is decided as :meth:`_move_clock` decides it. Every other
        entry's start, window and reason stand: a start still ahead did not fit for a run
        from now no longer than it is now, and a reason reads nothing else the clock moved;
        a held entry whose run grew is held for the reason judged for that run (``alt``,
        swapped with ``reason``)."""
        state.now = now
        clock = _ClockMove(moved=True)
        into = (now - state.origin) // _MICROSECOND
        entry_of = self._entry_of
        touched: dict[int, _Entry] = {}
        spans: dict[int, int] = {}  # a start now: the cells its run from the last now took
        for key in self._admitted:
            entry = entry_of.get(key)
            if entry is not None and entry.best == 0:
                touched[id(entry)] = entry
                spans[id(entry)] = entry.span
        flips = self._flips
        while flips and flips[0][0] < into:
            entry = heapq.heappop(flips)[2]
            if self._kept(entry) and entry.first == entry.length:
                entry.first += 1
                touched[id(entry)] = entry
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] < now:
            entry = heapq.heappop(deadlines)[2]
            if self._kept(entry):
                touched[id(entry)] = entry
        reach = 0
        for entry in touched.values():
            key = entry.candidate.request.request_id
            deadline = self._timing_for(state, entry)[1]
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
            return "the kept grid no longer reaches every deadline"
        again = len(clock.restart) + len(clock.expired)
        if again > max(RESTART_FLOOR, len(flex.entries) * RESTART_SHARE):
            return "most of the queue's starts came: a full pass costs less"
        kept = 2 * (len(entry_of) + len(self._held)) + 64
        if len(flips) > kept:  # mostly entries replaced since: keep the ones still kept
            self._flips = [item for item in flips if self._kept(item[2])]
            heapq.heapify(self._flips)
        if len(deadlines) > kept:
            self._deadlines = [item for item in deadlines if self._kept(item[2])]
            heapq.heapify(self._deadlines)
        return clock

    def _timing_for(self, state: _Pass, entry: _Entry) -> tuple[int, datetime | None]:
        """What a clock move reads of ``entry``'s request (see _timing), worked out once."""
        key = entry.candidate.request.request_id
        known = self._timing.get(key)
        if known is None:
            known = self._timing[key] = _timing_of(state, entry.candidate)
        return known

    def _track(self, state: _Pass, entry: _Entry, *, heap: bool = True) -> None:
        """Note ``entry`` (new, or each one after a full pass) where :meth:`_move_within`
        finds it: by deadline, and, if its run from now takes ``length`` cells, by the instant
        in the minute after which it takes one more (a later minute notes those again: see
        :meth:`_move_clock`). (``heap``: pushed; else appended, and the caller heapifies.)"""
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

    def _kept(self, entry: _Entry) -> bool:
        """Whether ``entry`` is still the one kept for its request (walked or held)."""
        key = entry.candidate.request.request_id
        return self._entry_of.get(key) is entry or self._held.get(key) is entry

    def _recalendar(
        self,
        snapshot: Snapshot,
        state: _Pass,
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
            for block in self._reading(touched)
            if _reaches(spans, block, block.request.request_id not in self._booked)
        }
        for block in fresh:
            reached[id(block)] = block
            self._reach_after(block, reached)
        decided: dict[str, Grant | None] = {}
        while reached:
            rows = {resource for block in reached.values() for resource in _block_resources(block)}
            blocks = self._reading(rows)
            ledger = ExactLedger(
                state.now, state.pools, state.pool_row, state.quotas,
                self._grants_on(snapshot, state, rows), blocks,
            )  # fmt: skip
            decided = {}
            wider = False
            for block in blocks:
                key = block.request.request_id
                booked = self._booked.get(key)
                if id(block) in reached:
                    booking = decide_block(ledger, block, state.decisions)
                    decided[key] = booking
                    if booking != booked:
                        known = len(reached)
                        self._reach_after(block, reached)
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
            self._put(state, key, state.decisions[key])
            booked = self._booked.get(key)
            if booking == booked:
                continue
            if booked is not None:
                given.append(booked)
                del self._booked[key]
            if booking is not None:
                taken.append(booking)
                self._booked[key] = booking
        return len(decided), taken, given

    def _reach_after(self, block: Candidate, reached: dict[int, Candidate]) -> None:
        """Add to ``reached`` the pending blocks after ``block`` in calendar order that a
        change of its booking can reach (see _reaches: its own window on its own rows)."""
        request = block.request
        assert request.start_at is not None  # a calendar request always has one
        resources = set(_block_resources(block))
        own = [(resources, request.start_at, request.start_at + request.run_duration)]
        ahead = calendar_key(request)
        for later in self._reading(resources):
            if _calendar_key(later) > ahead and _reaches(
                own, later, later.request.request_id not in self._booked
            ):
                reached.setdefault(id(later), later)

    @staticmethod
    def _grants_on(snapshot: Snapshot, state: _Pass, rows: set[_Resource]) -> list[Grant]:
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

    def _blocks_left(
        self, state: _Pass, left: set[str], released: list[Grant], added: list[Grant]
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
                self._block_readers[resource].remove(block)
            booking = self._booked.pop(key, None)
            if booking is None:
                continue
            index = next((i for i, grant in enumerate(added) if grant == booking), None)
            if index is None:
                released.append(booking)
            else:
                became.append(added.pop(index))
        state.calendar = staying
        return became

    def _index_blocks(self, state: _Pass) -> None:
        """Keep, per ledger row, the pending calendar blocks that read it in calendar order
        (see _reading)."""
        self._block_readers = {}
        for block in sorted(state.calendar, key=_calendar_key):
            for resource in _block_resources(block):
                self._block_readers.setdefault(resource, []).append(block)

    def _reading(self, resources: set[_Resource]) -> list[Candidate]:
        """The pending calendar blocks whose decision reads any of ``resources``, in calendar
        order."""
        readers = self._block_readers
        found: dict[int, Candidate] = {}
        for resource in resources:
            for block in readers.get(resource, ()):
                found[id(block)] = block
        return sorted(found.values(), key=_calendar_key)

    def _walk(
        self,
        snapshot: Snapshot,
        state: _Pass,
        flex: _FlexState,
        gone: list[str],
        arrivals: list[_Entry],
        released: list[Grant],
        added: list[Grant],
        clock: _ClockMove,
        layer: _Layer,
    ) -> PassReport | str:
        """Re-plan the flex requests the changes reach, in policy order (module docstring),
        then the commitments held before them (see :meth:`_rehold`); else why a full pass is
        needed (a commitment no longer fits where it was promised).

        Only entries on a row the walk rolls back are visited: a row is rolled back from the
        first request in policy order that must read or change it, and every later entry on
        it is then visited in order (through each row's readers, merged by key), to take its
        share again or to be searched. An entry on no such row keeps its slot untouched."""
        entries = flex.entries
        grid = flex.grid
        gone_set = set(gone)
        # (row, first cell, cells, amount given back: negative for a new grant's take)
        freed: list[tuple[int, int, int, int]] = []
        # The same, of the last pass's moves carried out (see _Layer.carried): the walk's
        # entries see them as any other, the commitments' tests do not (see _rehold).
        carried: list[tuple[int, int, int, int]] = []
        # Where the walk begins: the first request in policy order a change can reach.
        starts: list[FlexKey] = []
        # Entries visited whatever their rows: arrivals, and the strict-FIFO requests whose
        # tenant's earlier request left (their floor moves). (key, seq, entry)
        direct: list[tuple[FlexKey, int, _Entry]] = []
        # An admission carried out: the request left and its grant came, holding exactly the
        # slot it took on every row a search reads. Nothing a search reads changes then; the
        # grant's share of rows no search reads is taken as it is.
        absorbed: set[str] = set()
        for grant in added:
            span = _grant_cells(flex, grant)
            contributions = _grant_rows(state, flex, grant)
            if id(grant) in layer.absorbed:  # it took a dropped commitment's slot exactly
                for row, amount in contributions:
                    if not flex.binding[row]:
                        grid.give(((row, -amount),), span[0], span[1])
                continue
            if id(grant) in layer.carried_grants:  # it took where the last pass moved one
                if span[1] > 0:
                    carried.extend(
                        (row, span[0], span[1], -amount) for row, amount in contributions
                    )
                continue
            entry = self._entry_of.get(grant.request_id)
            if (
                entry is not None
                and grant.request_id in gone_set
                and grant.request_id not in absorbed
                and entry.best is not None
                and span == clock.slot(entry)
                and state.pool_row.get(grant.pool_id) == entry.row
                and sorted(c for c in contributions if flex.binding[c[0]]) == sorted(entry.needs)
                # A request ahead of it held in the same pool by quota sees the pool fuller
                # now (the grant counts from the start): its reason may turn to capacity.
                and not any(
                    other.reason is Reason.QUOTA and other.key < entry.key
                    for other in self._by_pool.get(entry.row, ())
                )
            ):
                absorbed.add(grant.request_id)
                for row, amount in contributions:
                    if not flex.binding[row]:
                        grid.give(((row, -amount),), span[0], span[1])
                continue
            if span[1] > 0:
                freed.extend((row, span[0], span[1], -amount) for row, amount in contributions)
        for grant in released:
            first, cells = _grant_cells(flex, grant)
            if cells > 0:
                freed.extend(
                    (row, first, cells, amount) for row, amount in _grant_rows(state, flex, grant)
                )
        freed.extend(take for take in layer.takes if take[2] > 0)
        carried.extend(take for take in layer.carried if take[2] > 0)
        touched: set[int] = set()  # pools whose held slots are numbered again
        changed: dict[int, _Entry] = {}  # held commitments whose decision is recorded again
        arrivals = [*arrivals]
        for held in (*layer.dropped, *layer.demoted):
            request_id = held.candidate.request.request_id
            del self._held[request_id], self._slots[request_id]
            self._held_reads.pop(request_id, None)
            assert held.best is not None
            self._by_pool[held.row].discard(held)
            touched.add(held.row)
            after = self._unsibling(held)
            if held in layer.dropped:
                self._drop_order(held)
                self._count(snapshot, flex, held.candidate, -1)
                if after is not None:
                    direct.append((after.key, len(direct), after))
            else:  # planned again from its key, as if it had just come
                arrivals.append(_unheld(held))
        demoted = {id(entry) for entry in arrivals[len(arrivals) - len(layer.demoted) :]}
        for held, slot in layer.relocated:
            request_id = held.candidate.request.request_id
            self._slots[request_id] = slot
            held.needs = slot[3]
            if request_id not in layer.movers:  # held where the last pass put it: no change
                changed[id(held)] = held
            if held.candidate.strict:  # it stays where it is held: its tenant's next follows
                held.best = slot[0]
                after = self._sibling_after(held)
                if after is not None:
                    direct.append((after.key, len(direct), after))
        for entry, slot in layer.fresh:
            arrivals.remove(entry)
            self._add_order(self._hold(entry, slot, changed))
        promoted = {id(entry) for entry, _ in layer.promoted}
        for entry, _ in layer.quiet:
            self._entry_of.pop(entry.candidate.request.request_id)
            self._remove(flex, entry, ordered=False)
            self._by_pool[entry.row].discard(entry)
            touched.add(entry.row)
        leaving = [self._entry_of.pop(key) for key in gone if key in self._entry_of]
        leaving += (
            self._entry_of.pop(entry.candidate.request.request_id) for entry in clock.expired
        )
        leaving += (self._entry_of.pop(e.candidate.request.request_id) for e, _ in layer.promoted)
        for entry in clock.restart:  # planned again from its key, as if it had just come
            leaving.append(self._entry_of.pop(entry.candidate.request.request_id))
            again = _Entry(
                entry.key,
                entry.candidate,
                entry.length,
                entry.first,
                entry.last,
                0,
                None,
                -1,
                (),
                None,
            )
            self._count(snapshot, flex, again.candidate, 1)
            arrivals = [*arrivals, again]
        for entry in leaving:
            starts.append(entry.key)
            if id(entry) not in promoted:
                self._count(snapshot, flex, entry.candidate, -1)
            after = self._remove(flex, entry, ordered=id(entry) not in promoted)
            if after is not None:
                direct.append((after.key, len(direct), after))
        for entry, slot in (*layer.promoted, *layer.quiet):
            self._hold(entry, slot, changed)
        for entry in arrivals:
            starts.append(entry.key)
            self._insert(flex, entry, ordered=id(entry) not in demoted)
            direct.append((entry.key, len(direct), entry))
        starts += (key for key, _, _ in direct)
        based = {row for row, _, _, _ in (*freed, *carried)}
        if clock.shifted:
            # A held request's reason is judged at its earliest start, over cells the clock
            # just dropped: in its own view, which a rolled row gives, for every pool a held
            # slot lies in. (Within a minute, only a run from now may grow a cell: each held
            # entry knows its reason for that run, see _move_within.)
            based.update(row for row, held in self._by_pool.items() if held and flex.binding[row])
        for row in based:
            readers = self._readers.get(row)
            if readers:
                starts.append(readers[0].key)
        if not starts:
            for row, first, cells, amount in (*freed, *carried):  # rows no request reads
                grid.give(((row, amount),), first, cells)
            if self._held:
                gains: dict[int, int] = {}
                for row, first, cells, amount in freed:
                    if amount > 0 and cells > 0:
                        gains[row] = min(gains.get(row, _NONE), first)
                rows = {row for row, _, _, _ in freed}
                why = self._rehold(state, flex, layer, added, changed, touched, clock, rows, gains)
                if why is not None:
                    return why
            else:
                self._moves = {}  # none held: none moved
            news: dict[int, _Entry] = {}
            self._clock_news(state, clock, news, touched)
            news.update(changed)
            self._decide(state, news, touched)
            return PassReport(full=False, from_rank=len(entries) + 1)
        start = min(starts)
        from_rank = bisect.bisect_left(entries, start, key=_key_of) + 1
        # The stamp of the first entry from ``start`` on (rows are rolled back from there).
        first_stamp = entries[from_rank - 1].stamp if from_rank <= len(entries) else _NONE
        fresh = {id(entry) for entry in arrivals}
        rolled: set[int] = set()
        # Per rolled row, what is free now minus what was free last pass, as seen by the entry
        # the walk is at (both before its own take): the walk keeps it so as it goes.
        delta: dict[int, npt.NDArray[np.int32]] = {}
        live: set[int] = set()  # rows whose delta was ever changed (it may be nonzero)
        # Per live row, cells outside which its delta has never gained ([0]) or lost ([1]):
        # most visits are settled from these bounds without reading the delta at all.
        spans: dict[int, list[int]] = {}
        # The same, for what the commitments are tested against (see _rehold): per row
        # changed other than by a carried move, the first cell where it gained (_NONE: none).
        seen: dict[int, int] = {}
        # The walk's queue, in policy order: (2 × stamp, row, index into the row's readers,
        # None) for a rolled row's next reader; (2 × stamp, -1, seq, entry) for a direct
        # visit; (an odd number, -2, seq, entry) for a departed entry, whose slot others saw
        # from there on: just after the entry before it (_departed_at). Integers, not keys:
        # the queue compares them several times a visit. (No entry is inserted from here on,
        # so no stamp changes.)
        heap: list[tuple[int, int, int, _Entry | None]] = [
            (2 * entry.stamp, -1, seq, entry) for _, seq, entry in direct
        ]
        grid.forget()

        def roll(row: int, at: int) -> None:
            """Roll ``row`` back to the grid as it stood before the first entry stamped ``at``
            or later: give back the takes of the entries from there on, each visited later to
            take again."""
            rolled.add(row)
            spare = self._spare
            while spare and len(spare[-1]) != flex.cells:  # of a grid since resized
                spare.pop()
            delta[row] = spare.pop() if spare else np.zeros(flex.cells, dtype=np.int32)
            readers = self._readers.get(row)
            if not readers:
                return
            index = bisect.bisect_left(readers, at, key=_stamp_of)
            for holder in readers[index:]:
                if holder.best is not None:
                    give = [need for need in holder.needs if need[0] == row]
                    if give:
                        grid.give(give, holder.best, holder.span)
            if index < len(readers):
                heapq.heappush(heap, (2 * readers[index].stamp, row, index, None))

        def shift(
            needs: tuple[tuple[int, int], ...],
            first: int,
            cells: int,
            sign: int,
            carried: bool = False,
        ) -> None:
            """Add ``sign`` × each need's amount to its row's delta over the cells (of a
            carried move: not seen by the commitments' tests)."""
            for row, amount in needs:
                change = sign * amount
                if change == 0 or cells <= 0:
                    continue
                cells_of = delta[row][first : first + cells]
                cells_of += change
                live.add(row)
                if not carried:
                    gained = seen.get(row, _NONE)
                    seen[row] = min(gained, first) if change > 0 else gained
                bounds = spans.get(row)
                if bounds is None:
                    bounds = spans[row] = [_NONE, -1, _NONE, -1]
                side = 0 if change > 0 else 2
                bounds[side] = min(bounds[side], first)
                bounds[side + 1] = max(bounds[side + 1], first + cells)

        for row in based:
            roll(row, first_stamp)
        for row, first, cells, amount in freed:
            grid.give(((row, amount),), first, cells)
            shift(((row, amount),), first, cells, 1)
        for row, first, cells, amount in carried:
            grid.give(((row, amount),), first, cells)
            shift(((row, amount),), first, cells, 1, carried=True)
        touched.update(entry.row for entry in leaving if entry.best is not None)  # renumber
        for entry in leaving:
            if entry.candidate.request.request_id in absorbed:
                assert entry.best is not None
                self._by_pool[entry.row].discard(entry)
                continue
            if entry.best is not None:
                for row, _ in entry.needs:
                    if row not in rolled:
                        roll(row, first_stamp)
                first_cell, cells = clock.slot(entry)
                grid.give(entry.needs, first_cell, cells)
                self._by_pool[entry.row].discard(entry)
                heap.append((_departed_at(entries, entry), -2, len(heap), entry))
        heapq.heapify(heap)
        searched = 0
        visited = 0
        tested = 0
        moved: dict[int, _Entry] = {}  # entries whose decision may differ beyond position
        # Per pool row, how many of its requests this walk searched one after another and
        # found moved; one searched that stays, or tested and found to stand, ends the run
        # (see the visits below).
        streak: dict[int, int] = {}
        last: _Entry | None = None
        readers_of = self._readers
        siblings = self._siblings
        while heap:
            _, tag, index, item = heapq.heappop(heap)
            if tag >= 0:
                readers = readers_of[tag]
                entry = readers[index]
                if index + 1 < len(readers):
                    heapq.heappush(heap, (2 * readers[index + 1].stamp, tag, index + 1, None))
            else:
                assert item is not None
                entry = item
                if tag == -2:  # from here on, the departed slot is free
                    assert entry.best is not None
                    shift(entry.needs, *clock.slot(entry), 1)
                    continue
            if entry is last:
                continue  # reached through several rows: once is enough
            if self._entry_of.get(entry.candidate.request.request_id) is not entry:
                continue  # a strict-FIFO sibling queued for a visit that has left since
            last = entry
            visited += 1
            candidate = entry.candidate
            floor = self._floor_of(entry) if candidate.strict else 0
            reads = self._reads_of(entry)
            is_fresh = id(entry) in fresh
            keep: bool | None = False  # the slot stands; True: its reason may not
            if is_fresh or floor != entry.floor:
                keep = None
            elif not live.isdisjoint(reads):
                if streak.get(entry.row, 0) >= CASCADE_AFTER:
                    # Where the pool's last requests moved one after another, the next most
                    # likely moves too (a release or an arrival can move a pool's whole queue,
                    # a request at a time): it is searched at once, which is exact whatever
                    # it finds, rather than first tested by _stands, which then costs about
                    # as much as the search.
                    keep = None
                else:
                    tested += 1
                    keep = _stands(
                        grid,
                        flex,
                        entry,
                        [row for row in reads if row in live],
                        delta,
                        spans,
                        rolled,
                        readers_of,
                    )
                    if keep is not None:
                        streak.pop(entry.row, None)  # it stands: the pool's queue stopped
            if keep is None:
                searched += 1
                for row in reads:
                    if row not in rolled:
                        roll(row, entry.stamp)
                best, row, needs, reason = place(
                    grid,
                    candidate,
                    entry.length,
                    entry.first,
                    entry.last,
                    floor,
                    flex.binding,
                    flex.limit_row,
                    flex.short,
                    flex.shapes,
                )
                before = _floor_after(entry)
                slot_moved = (best, row, needs) != (entry.best, entry.row, entry.needs)
                if entry.best is not None:  # its pool's queue moves on, or stopped
                    if slot_moved:
                        streak[entry.row] = streak.get(entry.row, 0) + 1
                    else:
                        streak.pop(entry.row, None)
                if is_fresh or slot_moved:
                    if entry.best is not None:
                        shift(entry.needs, entry.best, entry.span, 1)
                    touched.update(r for r in (entry.row, row) if r >= 0)
                    if best is not None:
                        shift(needs, best, entry.first if best == 0 else entry.length, -1)
                if is_fresh or (best, row, needs, reason) != (
                    entry.best,
                    entry.row,
                    entry.needs,
                    entry.reason,
                ):
                    moved[id(entry)] = entry
                if entry.best is not None:
                    self._by_pool[entry.row].discard(entry)
                if best is not None:
                    self._by_pool.setdefault(row, set()).add(entry)
                entry.floor, entry.best, entry.row = floor, best, row
                entry.needs, entry.reason, entry.alt = needs, reason, reason
                entry.clear = 0  # proved of the slot it had
                if best:
                    entry.alt = longer_reason(
                        grid, row, candidate.request.gang.units, best, floor, flex.short[row],
                        entry.length, entry.first, reason,
                    )  # fmt: skip
                if best is not None:
                    grid.take(needs, best, entry.span)
                if candidate.strict and (is_fresh or _floor_after(entry) != before):
                    # The tenant's next request starts from this one's slot: visit it.
                    tenant = siblings[candidate.request.tenant]
                    following = bisect.bisect_right(tenant, entry.key, key=_key_of)
                    if following < len(tenant):
                        sibling = tenant[following]
                        heapq.heappush(heap, (2 * sibling.stamp, -1, -1 - visited, sibling))
                continue
            if entry.best is None:
                continue
            if entry.best > 0 and (keep or (clock.shifted and entry.row in rolled)):
                # Its pool's free amounts moved near its slot, or the clock moved its earliest
                # start: what holds it may have changed. Judged as a search judges it, in the
                # grid before its own take (and for a run from now a cell longer).
                units, short = candidate.request.gang.units, flex.short[entry.row]
                reason = hold_reason(
                    grid, entry.row, units, entry.best, floor, short, entry.length, entry.first
                )
                entry.alt = longer_reason(
                    grid, entry.row, units, entry.best, floor, short, entry.length,
                    entry.first, reason,
                )  # fmt: skip
                if reason != entry.reason:
                    entry.reason = reason
                    moved[id(entry)] = entry
            retake = [need for need in entry.needs if need[0] in rolled]
            if retake:
                grid.take(retake, entry.best, entry.span)
        self._clock_news(state, clock, moved, touched)
        for row, cells_of in delta.items():  # zeroed where it changed, kept for the next walk
            bounds = spans.get(row)
            if bounds is not None:
                cells_of[min(bounds[0], bounds[2]) : max(bounds[1], bounds[3])] = 0
            if len(self._spare) < SPARE_ROWS:
                self._spare.append(cells_of)
        if self._held:
            gains = {row: cell for row, cell in seen.items() if cell < _NONE}
            why = self._rehold(state, flex, layer, added, changed, touched, clock, {*seen}, gains)
            if why is not None:
                return why
        else:
            self._moves = {}  # none held: none moved
        moved.update(changed)
        self._decide(state, moved, touched)
        return PassReport(
            full=False, from_rank=from_rank, walked=visited, searched=searched, tested=tested
        )

    def _clock_news(
        self, state: _Pass, clock: _ClockMove, moved: dict[int, _Entry], touched: set[int]
    ) -> None:
        """Add to ``moved`` the entries whose decision the clock changed and no walk made
        again: a start that came, admitted where it was held (unless the walk moved it), and
        a held entry whose run from now grew, if its reason is not the one its decision
        gives (see _move_within); such a start's pool goes to ``touched``."""
        for entry in clock.arrived:
            moved[id(entry)] = entry
            if entry.best is not None:
                touched.add(entry.row)
        for entry in clock.flipped:
            key = entry.candidate.request.request_id
            if self._entry_of.get(key) is entry and state.decisions[key].reason != entry.reason:
                moved.setdefault(id(entry), entry)

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

    def _rehold(
        self,
        state: _Pass,
        flex: _FlexState,
        layer: _Layer,
        added: list[Grant],
        changed: dict[int, _Entry],
        touched: set[int],
        clock: _ClockMove,
        changed_rows: set[int],
        gains: dict[int, int],
    ) -> str | None:
        """Once the walk is done: why a full pass is needed if a commitment no longer fits
        where it was promised (:func:`_still_fit`), else None, and then where the plan puts
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
        after it: see :meth:`_reached`), and its reason is judged again only if it was tested
        again, its pool's row changed, the clock moved or it queues strict FIFO. Right after
        a full pass (whose moves are not known) every one is. A pass where none would be
        (most often the one that sees the last pass's admissions and moves carried out, at
        the same instant) stops before placing any (:meth:`_unmoved`)."""
        grid = flex.grid
        if not _still_fit(grid, flex, state, layer, added):
            return "a commitment no longer fits where it was promised"
        # Within the minute, only a commitment whose run from now grew is judged again for
        # the clock (see _move_within); a later minute moves every cell a reason compares.
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
        if self._moves is not None:
            settled = {}
            dirty = set(changed_rows)
            gained = dict(gains)
            for key, (was, to) in self._moves.items():
                if key in layer.movers:
                    continue  # carried out: held (or admitted) where the move put it
                # A move of the last pass, undone: what it gave back is taken again, and
                # what it took is free again.
                dirty.update(row for needs in (was[3], to[3]) for row, _ in needs)
                for row, _ in to[3]:
                    gained[row] = min(gained.get(row, _NONE), to[0])
            if layer.movers:
                held = sorted(self._held.values(), key=_key_of)
                reached = self._reached(flex, held, layer.movers)
            if not (clock_moved or dirty or gained or reached) and self._unmoved(changed):
                # Nothing a test or a judgement reads changed: each commitment stays where
                # the last pass placed it, and none moves (a run from now that grew adds no
                # earlier start), for the same reason unless its run from now grew. (One
                # that starts now starts at the new now, if the clock moved.)
                if flipped:
                    self._judge_flipped(state, flex, flipped, changed)
                grid.forget()
                self._moves = {}
                if clock.moved:
                    for key in self._admitted.intersection(self._held):
                        entry = self._held[key]
                        changed[id(entry)] = entry
                return None
        if held is None:
            held = sorted(self._held.values(), key=_key_of)
        for rank, entry in enumerate(held, start=1):
            candidate = entry.candidate
            key = candidate.request.request_id
            cell, _, row, needs = self._slots[key]
            kept[key] = (cell, row, needs, entry.length, entry.first)
            placed.append((row, cell, rank, candidate, None))
            if candidate.strict:
                floors[key] = self._floor_of(entry)
            if (
                settled is not None
                and id(entry) not in changed
                and (entry.best, entry.row) == (cell, row)
                and key not in reached
            ):
                settled[key] = self._held_reads_of(flex, candidate)
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
            judged = self._judged_floors
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
        self._judged_floors = floors
        undo(grid, moves)
        grid.forget()
        # Each move, by its commitment's request (moves are made in rank order).
        made: dict[str, tuple[_Slot, _Slot]] = {}
        if moves:
            made_in_order = iter(moves)
            for row, cell, _, candidate, _ in placed:
                key = candidate.request.request_id
                was = self._slots[key]
                if (cell, row) != (was[0], was[2]):
                    _, _, _, best_needs, best, span = next(made_in_order)
                    made[key] = (was, (best, span, row, best_needs))
            assert next(made_in_order, None) is None
        self._moves = made
        for (row, cell, _, _, reason), entry in zip(placed, held, strict=True):
            new = id(entry) in changed
            if not new and (row, cell, reason) == (entry.row, entry.best, entry.reason):
                if clock.moved and cell == 0:  # a start now: the instant moved with the clock
                    changed[id(entry)] = entry
                continue
            if new or (row, cell) != (entry.row, entry.best):
                self._by_pool[entry.row].discard(entry)
                self._by_pool.setdefault(row, set()).add(entry)
                touched.update((entry.row, row))
            entry.row, entry.best, entry.reason = row, cell, reason
            changed[id(entry)] = entry
        return None

    def _unmoved(self, changed: dict[int, _Entry]) -> bool:
        """Whether every held commitment is where the last pass placed it, unchanged since
        (not in ``changed``), and each strict-FIFO one has the floor its reason was last
        judged from: with nothing else changed, :meth:`_rehold` would then test and judge
        none of them again, and leave each as it was. (Only those the last pass moved can
        lie elsewhere than their slot: _rehold places the others where they are held.)"""
        held, slots, judged = self._held, self._slots, self._judged_floors
        for entry in changed.values():
            if held.get(entry.candidate.request.request_id) is entry:
                return False
        for key in self._moves or ():
            mover = held.get(key)
            if mover is not None and (mover.best, mover.row) != (slots[key][0], slots[key][2]):
                return False
        for key, floor in judged.items():
            strict = held.get(key)
            if strict is not None and self._floor_of(strict) != floor:
                return False
        return True

    def _judge_flipped(
        self, state: _Pass, flex: _FlexState, flipped: set[str], changed: dict[int, _Entry]
    ) -> None:
        """Judge again, as :meth:`_rehold` judges them, the reasons of the commitments whose
        run from now grew a cell within the minute (``flipped``), where nothing else a
        judgement reads changed and none moved: the grid is the plan's finished one (each
        commitment where it is held). One whose reason changed goes to ``changed``."""
        kept: dict[str, Kept] = {}
        placed: list[tuple[int, int, int, Candidate, Reason | None]] = []
        floors: dict[str, int] = {}
        entries: list[_Entry] = []
        for key in flipped:
            entry = self._held.get(key)
            if entry is None or entry.best is None:
                continue
            cell, _, row, needs = self._slots[key]
            kept[key] = (cell, row, needs, entry.length, entry.first)
            placed.append((row, cell, 0, entry.candidate, None))
            entries.append(entry)
            if entry.candidate.strict:
                floors[key] = self._floor_of(entry)
        judged = judge_commitments(flex.grid, placed, kept, floors, flex.binding, flex.short, None)
        for (_, _, _, _, reason), entry in zip(judged, entries, strict=True):
            if reason != entry.reason:
                entry.reason = reason
                changed[id(entry)] = entry

    def _held_reads_of(self, flex: _FlexState, candidate: Candidate) -> frozenset[int]:
        """The rows a held commitment's search reads (worked out once per candidate)."""
        key = candidate.request.request_id
        known = self._held_reads.get(key)
        if known is None or known[0] is not candidate:
            known = self._held_reads[key] = (candidate, _reads(flex, candidate))
        return known[1]

    def _reached(
        self,
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
        unseen = sorted(movers.values(), key=_first)
        for entry in reversed(held):
            while unseen and unseen[-1][0] > entry.key:
                cell, _, _, needs = unseen.pop()[1]
                for row, _ in needs:
                    later[row] = min(later.get(row, _NONE), cell)
            if later:
                key = entry.candidate.request.request_id
                cell = self._slots[key][0]
                reads = self._held_reads_of(flex, entry.candidate)
                if any(later.get(row, _NONE) < cell for row in reads):
                    reached.add(key)
        return reached

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

    def _decide(self, state: _Pass, moved: dict[int, _Entry], touched: set[int]) -> None:
        """The flex decisions after a walk: those of the entries whose placement or reason
        changed (``moved``), and positions renumbered in the pools where a slot appeared,
        left or moved (``touched``); elsewhere their relative order, so every position, is as
        it was. A decision that comes out the same is kept as it was."""
        positions: dict[int, int | None] = {}
        for row in touched:
            position = 0
            for entry in self._in_slot_order(row):
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
                        self._put(state, request_id, _in_line(before, place), renumbered=True)
        for key, entry in moved.items():
            if key in positions:
                place = positions[key]
            else:  # its slot stayed where it was: so did its place in line
                known = state.decisions.get(entry.candidate.request.request_id)
                place = known.position if known is not None else None
            self._record(state, entry, place)

    def _in_slot_order(self, row: int) -> list[_Entry]:
        """The entries placed in pool ``row``, by start and then policy order (a total order:
        a policy key ends with the request id). Sorted from the order the last call left,
        which is mostly still in order (starts move with the clock together, and a pass moves
        few), so the sort costs about one comparison per entry rather than a full sort's."""
        members = self._by_pool.get(row, set())
        ordered = [entry for entry in self._slot_orders.get(row, ()) if entry in members]
        if len(ordered) != len(members):
            listed = set(ordered)
            ordered.extend(entry for entry in members if entry not in listed)
        ordered.sort(key=_slot_order)
        self._slot_orders[row] = ordered
        return ordered

    def _record(self, state: _Pass, entry: _Entry, position: int | None) -> None:
        """The decision for ``entry`` (at ``position`` in line, if held)."""
        request = entry.candidate.request
        if entry.best is None:
            self._put(state, request.request_id, _waiting(request))
            return
        start_at = state.start_of(entry.best)
        self._put(
            state,
            request.request_id,
            Decision(
                request_id=request.request_id,
                outcome=Outcome.HOLD if entry.best else Outcome.ADMIT,
                reason=entry.reason,
                pool_id=state.pools[entry.row].pool_id,
                start_at=start_at,
                end_at=start_at + state.holds(entry.candidate),
                position=position,
            ),
        )

    def _reads_of(self, entry: _Entry) -> frozenset[int]:
        return self._reads[entry.candidate.request.request_id]

    def _count(self, snapshot: Snapshot, flex: _FlexState, candidate: Candidate, sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) what ``candidate`` could put on each row, counted
        as the full pass's binding test counts it."""
        gang = candidate.request.gang
        for row in candidate.pools:
            self._demand[row] += sign * gang.units
        lanes = min(snapshot.policy.race_width, len(candidate.pools))
        for limit in candidate.limits:
            self._demand[flex.limit_row[limit.key]] += sign * gang.accelerator_units * lanes


_MICROSECOND = timedelta(microseconds=1)
_MINUTE_US = MINUTE // _MICROSECOND


def _timing_of(state: _Pass, candidate: Candidate) -> tuple[int, datetime | None]:
    """What a clock move reads of ``candidate`` (see IncrementalPlanner._timing): how long a
    run placed for it holds its pool, in whole microseconds (timedeltas are), and its
    deadline."""
    request = candidate.request
    max_wait = request.max_wait
    deadline = None if max_wait is None else request.submitted_at + max_wait
    return state.holds(candidate) // _MICROSECOND, deadline


def _holds_commitments(snapshot: Snapshot, now: datetime) -> bool:
    """True if ``snapshot`` holds a commitment at ``now``: one told less than the horizon
    ahead (a pass holds those before the policy order; one further ahead is an estimate that
    no pass reads, so it changes no plan). A pass over one keeps nothing to plan from."""
    horizon = snapshot.policy.commit_within
    if horizon is None or not snapshot.commitments:
        return False
    beyond = now + horizon
    return any(commitment.start_at < beyond for commitment in snapshot.commitments)


def _still_fit(
    grid: MinuteGrid, flex: _FlexState, state: _Pass, layer: _Layer, added: list[Grant]
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
            for row, _ in _grant_rows(state, flex, grant)
            if flex.binding[row]
        ):
            return False
    return True


_first = itemgetter(0)


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


def _shifted(slot: _Slot, shift: int) -> _Slot:
    """A held slot once the clock moved ``shift`` cells: what is left of it, as of a started
    entry's (from cell 0) where its start has come."""
    cell, span, row, needs = slot
    if cell >= shift:
        return cell - shift, span, row, needs
    return 0, max(0, cell - shift + span), row, needs


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


def _identity_changes(
    old: tuple[_Item, ...], new: tuple[_Item, ...]
) -> tuple[list[_Item], list[_Item]]:
    """The items of ``old`` that ``new`` lacks and those of ``new`` that ``old`` lacks, by
    identity; an item both hold may be named in both lists (one that moved far in the order),
    which callers comparing by value cancel out.

    A snapshot is usually the last one with a few items inserted and removed in place: the
    two are walked side by side, equal stretches compared pointer by pointer, and at each
    mismatch the next ``ALIGN_AHEAD`` items of each are looked through for where they meet
    again. Past ``ALIGN_MISSES`` mismatches the rest is compared as sets of identities. (Sets
    of every item's identity cost several times more: each is hashed and stored, and each
    object's memory is touched.)"""
    left: list[_Item] = []
    came: list[_Item] = []
    i = j = 0
    old_size, new_size = len(old), len(new)
    misses = 0
    while True:
        while i < old_size and j < new_size and old[i] is new[j]:
            i += 1
            j += 1
        if i >= old_size or j >= new_size or misses >= ALIGN_MISSES:
            break
        misses += 1
        in_new = _position(new, old[i], j + 1, min(new_size, j + 1 + ALIGN_AHEAD))
        in_old = _position(old, new[j], i + 1, min(old_size, i + 1 + ALIGN_AHEAD))
        if in_new >= 0 and (in_old < 0 or in_new - j <= in_old - i):
            came.extend(new[j:in_new])  # inserted before old[i]
            j = in_new
        elif in_old >= 0:
            left.extend(old[i:in_old])  # removed before new[j]
            i = in_old
        else:  # one replaced by the other (or moved further than the look ahead)
            left.append(old[i])
            came.append(new[j])
            i += 1
            j += 1
    rest_old, rest_new = old[i:], new[j:]
    if rest_old and rest_new:
        by_old = dict(zip(map(id, rest_old), rest_old, strict=True))
        by_new = dict(zip(map(id, rest_new), rest_new, strict=True))
        left.extend(by_old[key] for key in filterfalse(by_new.__contains__, by_old))
        came.extend(by_new[key] for key in filterfalse(by_old.__contains__, by_new))
    else:
        left.extend(rest_old)
        came.extend(rest_new)
    return left, came


def _position(items: tuple[_Item, ...], item: _Item, start: int, stop: int) -> int:
    """The index of ``item`` itself (not an equal one) in ``items[start:stop]``, or -1."""
    for index in range(start, stop):
        if items[index] is item:
            return index
    return -1


def _stands(
    grid: MinuteGrid,
    flex: _FlexState,
    entry: _Entry,
    rows: list[int],
    delta: dict[int, npt.NDArray[np.int32]],
    spans: dict[int, list[int]],
    rolled: set[int],
    readers: Mapping[int, list[_Entry]],
) -> bool | None:
    """Whether ``entry``'s last slot is still what a search would find, judged from how the
    free amounts of ``rows`` (those of its rows that changed) differ from last pass: None if
    it must be searched again; else whether its hold reason must be worked out again.
    (``spans`` bounds, per row, the cells where it gained and where it lost.)

    Exact, not a heuristic. A search finds the earliest start among the request's options
    (a pool and the quota it counts against), a tie going to the more preferred pool. No
    start before the slot (nor a more preferred pool at it) fitted last pass. One fits now
    only if its run covers a cell where a row of that option gained: so the request stands
    unless a run of it fits from one of those starts. The slot itself still fits unless a row
    lost within it. A request with no slot waits on unless such a run fits by its deadline.

    The starts are searched on the rolled rows, which hold what this request sees. A row not
    rolled back is as it was last pass and still carries the takes of the requests after it:
    each start found is then tested there with those takes given back
    (:func:`_past_unrolled`), and the search goes on past one that does not fit.

    Where only quota rows gained, an option whose pool alone has no room for any start that
    could win cannot newly fit: that is proved once, on the pool's rolled row or on one not
    rolled back as the request sees it (:func:`_no_room_unrolled`), and kept in
    ``entry.clear`` (dropped for an option whose pool gained where a run of it could reach;
    the walk drops all of it when the request's slot or floor moves)."""
    best = entry.best
    reach = grid.cells if best is None else best + max(entry.span, entry.first)
    # Most visits follow a change that only took cells (an arrival): no row gained where a
    # run of this request could reach, and no option can newly fit.
    gained = any(spans[row][0] < min(spans[row][1], reach) for row in rows)
    # A more preferred pool wins a tie, so it need only start at the slot to take it; its own
    # pool and the less preferred ones must start before it (a request with no slot: by its
    # deadline, anywhere).
    latest = entry.last if best is None else best
    # What earlier visits proved of its pools alone (_Entry.clear), as long as they hold.
    clear = entry.clear
    for option, (lowest, pool, every_need) in enumerate(
        options(entry.candidate, flex.binding, flex.limit_row, flex.short, flex.shapes)
        if gained
        else ()
    ):
        if pool == entry.row:
            latest -= 1
        # The pool's own need, if it can bind (first of the needs: see options).
        pool_need = every_need[0] if every_need and every_need[0][0] == pool else None
        proving = False
        if pool_need is not None:
            bit = 1 << option
            pool_changed = spans.get(pool)
            if pool_changed is not None and pool_changed[0] < min(pool_changed[1], reach):
                clear &= ~bit  # its pool gained where a run of it could reach: proved no more
            elif clear & bit:
                # Its pool alone has no room for a start that could win, and gained nowhere
                # such a run could reach: whatever the quota rows gained, none fits.
                continue
            else:
                proving = True
        # Every row that gained is a rolled one: an option on none cannot newly fit.
        needs = tuple(need for need in every_need if need[0] in rolled)
        if not needs:
            continue
        gained_from, gained_to = _NONE, lowest
        for row, _ in needs:
            changed = spans.get(row)
            if changed is not None and changed[0] < min(changed[1], reach):
                gained_from = min(gained_from, changed[0])
                gained_to = max(gained_to, min(changed[1], reach))
        # The starts that could newly win: those whose run covers a gained cell, early
        # enough. (From a whole minute; a run from now is one cell longer: this errs to
        # search.) What earlier searches proved settles most of them without a scan.
        length = entry.length
        # As a search does: a strict-FIFO request starts no earlier than its floor.
        first_start = max(lowest, entry.floor, gained_from - length + 1)
        last_start = min(gained_to - 1, latest)
        if first_start > last_start:
            continue
        proved = grid.bounds(needs, first_start, length)
        if proved[1] > last_start:
            continue
        if proving:
            # Its quota rows gained but not its pool: once proved that the pool alone has no
            # room for a start that could win, later visits skip this option without a scan
            # while the pool gains nothing they could use (on a rolled row, the proof's facts
            # also speed the scan below and the pool searches of its other readers).
            assert pool_need is not None
            lo = max(lowest, entry.floor)
            if (
                grid.earliest_fit((pool_need,), lo, latest, length) is None
                if pool in rolled  # the rolled row is the pool as it sees it
                else _no_room_unrolled(grid, readers, entry, pool_need, lo, latest, length)
            ):
                clear |= 1 << option
                continue
        found = grid.earliest_fit(needs, first_start, last_start, length, proved)
        if found is None:  # most visits: no start fits even on the rolled rows
            continue
        unrolled = [need for need in every_need if need[0] not in rolled]
        for _ in range(UNROLLED_PROBES):
            # A run from now is one cell longer: tested over ``length`` cells, it errs to fit.
            past = (
                found
                if not unrolled
                else _past_unrolled(grid, readers, entry, unrolled, found, length)
            )
            if past == found:
                return None
            found = grid.earliest_fit(needs, past, last_start, length)
            if found is None:
                break
        if found is not None:
            return None  # not settled in so many starts: searched
    entry.clear = clear
    if best is None:
        return False
    span = entry.span
    for row, amount in entry.needs:
        bounds = spans.get(row)
        if bounds is None:
            continue
        lost_from, lost_to = max(bounds[2], best), min(bounds[3], best + span)
        lost = lost_from < lost_to and delta[row][lost_from:lost_to].min() < 0
        if lost and not grid.fits(row, amount, best, span):
            return None
    # Its reason reads its pool's row (one that never binds always has room: no change).
    return entry.row in rows


def _no_room_unrolled(
    grid: MinuteGrid,
    readers: Mapping[int, list[_Entry]],
    entry: _Entry,
    need: tuple[int, int],
    lo: int,
    latest: int,
    length: int,
) -> bool:
    """True if ``need`` (a pool's), on a row the walk has not rolled back, has no run of
    ``length`` cells free from any start in ``[lo, latest]`` as ``entry`` sees it: the row
    with the takes of ``entry`` and the requests after it given back, as in
    :func:`_past_unrolled`. False if there is one, or if telling means looking at more than
    :data:`UNROLLED_READERS` requests (it proves nothing then)."""
    row, amount = need
    latest = min(latest, grid.cells - length)
    if latest < lo:
        return True  # no start in the grid: none fits
    cells = _as_seen(grid, readers, entry, row, lo, latest + length)
    if cells is None:
        return False
    # The stretches of room: a run fits from the first cell of one at least ``length`` long,
    # if that cell is a start the entry could take.
    short = np.flatnonzero(cells < amount)
    edges = np.concatenate(([-1], short, [len(cells)]))
    starts = edges[:-1] + 1
    long_enough = (edges[1:] - starts >= length) & (starts <= latest - lo)
    return not bool(long_enough.any())


def _past_unrolled(
    grid: MinuteGrid,
    readers: Mapping[int, list[_Entry]],
    entry: _Entry,
    needs: Sequence[tuple[int, int]],
    start: int,
    length: int,
) -> int:
    """``start`` if each of ``needs``, on rows the walk has not rolled back, is free over cells
    ``[start, start + length)`` as ``entry`` sees them; else the cell just past the last one
    there where the first need that is not free falls short (no run of ``entry`` from
    ``start`` on can begin before it). A row whose telling means looking at more than
    :data:`UNROLLED_READERS` requests after ``entry`` is not tested (it errs to fit: a search
    more).

    Exact: such a row has not changed this pass and holds the takes of every request that reads
    it; ``entry`` sees it as it was before its own take and those of the requests after it,
    which are added back to a copy of the cells."""
    for row, amount in needs:
        cells = _as_seen(grid, readers, entry, row, start, start + length)
        if cells is None:
            continue
        short = np.flatnonzero(cells < amount)
        if len(short):
            return start + int(short[-1]) + 1
    return start


def _as_seen(
    grid: MinuteGrid,
    readers: Mapping[int, list[_Entry]],
    entry: _Entry,
    row: int,
    start: int,
    stop: int,
) -> npt.NDArray[np.int32] | None:
    """The free amounts of ``row`` (one the walk has not rolled back) over cells ``[start,
    stop)`` as ``entry`` sees them: the row holds the takes of every request that reads it,
    and those of ``entry`` and the requests after it are given back on a copy. None if that
    means looking at more than :data:`UNROLLED_READERS` requests."""
    on_row = readers.get(row, [])
    index = bisect.bisect_left(on_row, entry.stamp, key=_stamp_of)
    if len(on_row) - index > UNROLLED_READERS:
        return None
    cells = grid.free_over(row, start, stop)
    for holder in on_row[index:]:
        best = holder.best
        if best is None or best >= stop:
            continue
        end = best + holder.span
        if end <= start:
            continue
        for need_row, taken in holder.needs:
            if need_row == row:
                cells[max(best, start) - start : min(end, stop) - start] += taken
    return cells


def _calendar_key(block: Candidate) -> CalendarKey:
    return calendar_key(block.request)


def _key_of(entry: _Entry) -> FlexKey:
    return entry.key


def _stamp_of(entry: _Entry) -> int:
    return entry.stamp


def _slot_order(entry: _Entry) -> tuple[int, FlexKey]:
    """Held slots in one pool are numbered by start, then policy order."""
    assert entry.best is not None
    return entry.best, entry.key


def _floor_after(entry: _Entry) -> int:
    """The strict-FIFO floor a tenant's next request starts from after ``entry``."""
    return entry.best if entry.best is not None else max(entry.floor, entry.last)


def _grant_cells(flex: _FlexState, grant: Grant) -> tuple[int, int]:
    """The grid cells ``grant`` covers, rounded outward as commitments are: (first, count)."""
    origin = flex.grid.origin
    first = max(0, floor_cells(grant.start_at - origin))
    last = min(flex.cells, ceil_cells(grant.end_at - origin))
    return first, max(0, last - first)


# A row of the calendar ledger: a pool's row, or a quota limit's key.
_Resource = int | LimitKey


def _grant_resources(state: _Pass, grant: Grant) -> list[_Resource]:
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


def _grant_rows(state: _Pass, flex: _FlexState, grant: Grant) -> list[tuple[int, int]]:
    """Every grid row ``grant`` counts against and by how much (its pool, if configured, and
    each of its quota limits the grid has a row for)."""
    rows: list[tuple[int, int]] = []
    row = state.pool_row.get(grant.pool_id)
    if row is not None:
        rows.append((row, grant.units))
    for limit in state.quotas.limits(grant.tenant, grant.accelerator):
        limit_row = flex.limit_row.get(limit.key)
        if limit_row is not None:
            rows.append((limit_row, grant.accelerator_units))
    return rows


def _all_rows(flex: _FlexState, candidate: Candidate) -> list[int]:
    """Every grid row ``candidate`` counts against: its pools and its quota limits."""
    return [*candidate.pools, *(flex.limit_row[limit.key] for limit in candidate.limits)]


def _reads(flex: _FlexState, candidate: Candidate) -> frozenset[int]:
    """The grid rows a search for ``candidate`` reads: those of its rows that can bind."""
    return frozenset(row for row in _all_rows(flex, candidate) if flex.binding[row])
