"""The kept queue (:class:`KeptQueue`): the incremental planner's kept entries and every
index over them, changed through its methods alone.

An *entry* (``admission._Entry``) is a flex request as the kept pass placed it: its policy key,
its run and window in cells, its floor, and where it starts (``best``, a cell, or None), in
which pool row (``row``), taking what (``needs``), held for what (``reason``). The indexes:

- the decisions, by request id in the plan's order (``_ids``, ``_decisions``), and the ids
  admitted now (``_admitted``); which of them the current plan changed (``_changed``);
- the flex requests in policy order (``_order``, ``_order_keys``), each walked one's entry
  (``_entry_of``) in the pass's ``flex.entries``, and the rows its search reads (``_reads``);
- per grid row, the entries that read it, in policy order (``_readers``); per strict-FIFO
  tenant, its entries in policy order (``_siblings``); per pool row, the entries placed in it
  (``_by_pool``, and ``_slot_orders``, their order when last numbered);
- the commitments held before the policy order (``_held``) and the slot each holds
  (``_slots``);
- per grid row, what every flex request could put on it (``_demand``);
- what a clock move reads: each request's timing (``_timing``), and the entries by the instant
  their run from now takes one more cell (``_flips``) and by deadline (``_deadlines``), heaps
  whose replaced entries are skipped when popped (:meth:`KeptQueue._kept`). These three are
  the clock's work lists: filled here as entries come, popped by the clock as it moves.

No phase assigns to these otherwise: each change is a method here, so that an index cannot be
kept in step in one place and forgotten in another. :func:`.check.check` rebuilds the indexes
from the entries and names any that disagrees, and a test reads the phases' source for a write
that bypasses these methods.
"""

from __future__ import annotations

import bisect
import heapq
from datetime import datetime, timedelta

from opendws.domain.model import Snapshot
from opendws.domain.planner.incremental.full import KeepingPass, _Entry, _FlexState
from opendws.domain.planner.shapes import Candidate, count_demand
from opendws.domain.planner.verdicts import Decision, Outcome
from opendws.domain.policy import FlexKey
from opendws.domain.timeline import MINUTE

# A commitment's held slot: (first cell, cells, pool row, needs).
_Slot = tuple[int, int, int, tuple[tuple[int, int], ...]]

_MICROSECOND = timedelta(microseconds=1)
_MINUTE_US = MINUTE // _MICROSECOND


class KeptQueue:
    """The kept entries and their indexes (see the module docstring), and the only code that
    changes the indexes."""

    def __init__(self) -> None:
        self._pass: KeepingPass | None = None  # the kept pass, whose flex.entries are indexed here
        self._ids: list[str] = []  # decision ids, sorted: the plan's order
        self._decisions: list[Decision] = []  # the decision of each of _ids, in that order
        self._admitted: set[str] = set()  # requests whose decision is ADMIT (a start now)
        self._changed: set[str] | None = None  # see KeptPass.changed
        self._order: list[str] = []  # every planned flex request's id, in policy order
        self._order_keys: list[FlexKey] = []  # their policy keys, in the same order
        # The commitments held before the policy order (none of the walk's entries): id → an
        # entry whose best, row and reason say where the plan put it, and id → the slot it
        # holds in the grid, (first cell, cells, pool row, needs).
        self._held: dict[str, _Entry] = {}
        self._slots: dict[str, _Slot] = {}
        # Held request id → (its candidate, the rows its search reads), worked out once.
        self._held_reads: dict[str, tuple[Candidate, frozenset[int]]] = {}
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
        self._by_pool: dict[int, set[_Entry]] = {}  # pool row → the entries placed in it
        # Pool row → its entries in slot order as the last renumbering left them (see
        # _in_slot_order).
        self._slot_orders: dict[int, list[_Entry]] = {}
        self._readers: dict[int, list[_Entry]] = {}  # grid row → entries reading it, in order
        self._siblings: dict[str, list[_Entry]] = {}  # strict-FIFO tenant → its entries, in order

    def _index(self, snapshot: Snapshot, state: KeepingPass) -> None:
        """Index a full pass's decisions and entries (and its commitments held first), every
        index from scratch."""
        self._pass = state
        self._ids = sorted(state.decisions)
        self._decisions = list(map(state.decisions.__getitem__, self._ids))
        self._admitted = {
            key for key, decision in state.decisions.items() if decision.outcome is Outcome.ADMIT
        }
        self._order = list(state.order)
        flex = state.flex
        self._held = {}
        self._slots = {}
        self._held_reads = {}
        self._demand = [0] * (len(flex.limits) if flex is not None else 0)
        self._reads = {}
        self._entry_of = {}
        self._timing = {}
        self._flips = []
        self._deadlines = []
        self._by_pool = {}
        self._slot_orders = {}
        self._readers = {}
        self._siblings = {}
        if flex is None:
            self._order_keys = []
            return
        readers = self._readers
        for entry in flex.entries:  # in policy order, as every list below
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

    def _start_changes(self) -> None:
        """Name no decision as changed yet. (A method, not an assignment in :meth:`plan`: a
        full pass sets ``_changed`` to None in between, which a type checker narrowing the
        attribute after an assignment in ``plan`` would not see, nor code compiled from it.)"""
        self._changed = set()

    def _put(
        self, state: KeepingPass, key: str, decision: Decision, *, renumbered: bool = False
    ) -> None:
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

    def _drop(self, state: KeepingPass, key: str) -> None:
        """Forget the decision for ``key`` (its request left)."""
        self._timing.pop(key, None)
        self._admitted.discard(key)
        del state.decisions[key]
        index = bisect.bisect_left(self._ids, key)
        del self._ids[index]
        del self._decisions[index]
        if self._changed is not None:
            self._changed.add(key)

    def _timing_for(self, state: KeepingPass, entry: _Entry) -> tuple[int, datetime | None]:
        """What a clock move reads of ``entry``'s request (see _timing), worked out once."""
        key = entry.candidate.request.request_id
        known = self._timing.get(key)
        if known is None:
            known = self._timing[key] = _timing_of(state, entry.candidate)
        return known

    def _track(self, state: KeepingPass, entry: _Entry, *, heap: bool = True) -> None:
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

    def _settle(self, entry: _Entry, row: int, best: int | None) -> None:
        """Place ``entry`` at cell ``best`` of pool ``row`` (``best`` None: nowhere), in the
        pools' sets as in the entry."""
        if entry.best is not None:
            self._by_pool[entry.row].discard(entry)
        if best is not None:
            self._by_pool.setdefault(row, set()).add(entry)
        entry.row, entry.best = row, best

    def _leave_pool(self, entry: _Entry) -> None:
        """Take a placed ``entry`` that is leaving out of its pool's set."""
        assert entry.best is not None
        self._by_pool[entry.row].discard(entry)

    def _forget(self, key: str) -> _Entry:
        """Take flex request ``key``'s entry out of :attr:`_entry_of` (a leaving entry: the
        walk takes it out of its lists with :meth:`_remove`)."""
        return self._entry_of.pop(key)

    def _unhold(self, held: _Entry) -> _Entry | None:
        """Let go of a commitment held before the policy order: out of the held ones, their
        slots, its pool and its tenant's line; returns its tenant's next strict-FIFO entry,
        if there is one."""
        key = held.candidate.request.request_id
        del self._held[key], self._slots[key]
        self._held_reads.pop(key, None)
        self._leave_pool(held)
        return self._unsibling(held)

    def _reslot(self, held: _Entry, slot: _Slot) -> None:
        """A held commitment now holds ``slot`` (in the same pool): its needs are the slot's."""
        self._slots[held.candidate.request.request_id] = slot
        held.needs = slot[3]

    def _shift_slot(self, key: str, shift: int) -> None:
        """What is left of held ``key``'s slot once the clock moved ``shift`` cells, as of a
        started entry's (from cell 0) where its start has come."""
        self._slots[key] = _shifted(self._slots[key], shift)

    def _retrack(self, flips: list[tuple[int, int, _Entry]], seq: int) -> None:
        """Every entry's flip noted again after a new minute (see move_clock), as a heap."""
        self._flips, self._seq = flips, seq

    def _prune_flips(self) -> None:
        """Drop the flips of entries since replaced (skipped when popped until then)."""
        self._flips = [item for item in self._flips if self._kept(item[2])]
        heapq.heapify(self._flips)

    def _prune_deadlines(self) -> None:
        """Drop the deadlines of entries since replaced (skipped when popped until then)."""
        self._deadlines = [item for item in self._deadlines if self._kept(item[2])]
        heapq.heapify(self._deadlines)


def _timing_of(state: KeepingPass, candidate: Candidate) -> tuple[int, datetime | None]:
    """What a clock move reads of ``candidate`` (see KeptQueue._timing): how long a
    run placed for it holds its pool, in whole microseconds (timedeltas are), and its
    deadline."""
    request = candidate.request
    max_wait = request.max_wait
    deadline = None if max_wait is None else request.submitted_at + max_wait
    return state.holds(candidate) // _MICROSECOND, deadline


def _key_of(entry: _Entry) -> FlexKey:
    return entry.key


def _floor_after(entry: _Entry) -> int:
    """The strict-FIFO floor a tenant's next request starts from after ``entry``."""
    return entry.best if entry.best is not None else max(entry.floor, entry.last)


def _all_rows(flex: _FlexState, candidate: Candidate) -> list[int]:
    """Every grid row ``candidate`` counts against: its pools and its quota limits."""
    return [*candidate.pools, *(flex.limit_row[limit.key] for limit in candidate.limits)]


def _reads(flex: _FlexState, candidate: Candidate) -> frozenset[int]:
    """The grid rows a search for ``candidate`` reads: those of its rows that can bind."""
    return frozenset(row for row in _all_rows(flex, candidate) if flex.binding[row])


def _shifted(slot: _Slot, shift: int) -> _Slot:
    """A held slot once the clock moved ``shift`` cells: what is left of it, as of a started
    entry's (from cell 0) where its start has come."""
    cell, span, row, needs = slot
    if cell >= shift:
        return cell - shift, span, row, needs
    return 0, max(0, cell - shift + span), row, needs


def _slot_order(entry: _Entry) -> tuple[int, FlexKey]:
    """Held slots in one pool are numbered by start, then policy order."""
    assert entry.best is not None
    return entry.best, entry.key
