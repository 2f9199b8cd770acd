"""Planning pass after pass: :class:`IncrementalPlanner` keeps what one pass built and, given
the next snapshot at the same instant, plans again only what the changes reach.

``IncrementalPlanner().plan(snapshot, now)`` always returns exactly ``admit(snapshot, now)``.
It keeps the minute grid after every placement, each flex request's entry in policy order (the
strict-FIFO floor its search started from, its start, pool, needs and reason), the calendar
blocks and the plan's decisions. The next call compares the snapshot with the last one:

- Flex arrivals, departures (cancelled, timed out, admitted), releases (a grant that is gone)
  and new grants are applied. The walk starts at the first request in policy order they can
  reach; requests before it keep their decisions. A grid row is rolled back (the takes of the
  requests not walked yet given back) only once the walk must read or change it. A request none
  of whose rows (the pools and quota limits its search reads) has changed so far, with the same
  strict-FIFO floor, finds what it found last time: its slot is taken again without a search.
  Any other is searched; if its slot moved, the rows it left and took count as changed. Ranks
  follow the new order; held slots are renumbered in the pools where one came, left or moved.
- An admission carried out (the request left, its grant came holding exactly the slot it took)
  changes no row a search reads: nothing after it is searched again.
- A grant that came or went while calendar blocks are pending decides the blocks again (it can
  make a refused block fit or a confirmed one not, and moves the alternatives offered).

Anything else is planned in full, and :attr:`IncrementalPlanner.last_pass` says why: the first
pass; a different ``now`` (every grid cell, deadline and aging key is relative to it); changed
pools, tenants or policy; commitments (``commit_within`` with any commitment); racing
(``snapshot.racing``, or ``race_eagerly``: lanes are taken after every placement); a calendar
request that arrived or
left; a grant that changes which blocks are confirmed; an arrival that needs a longer grid or
a quota row the grid lacks; an arrival or a grant that makes a row bind that the grid never
tracked (rows that could never bind are left out of every search).
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from opendws.domain.admission import (
    Decision,
    Outcome,
    Plan,
    Race,
    _Candidate,
    _Entry,
    _FlexState,
    _Pass,
    _place,
    _waiting,
)
from opendws.domain.model import (
    CapacityRequest,
    Grant,
    Mode,
    QueueingStrategy,
    Snapshot,
    require_utc,
)
from opendws.domain.policy import FlexKey, flex_key
from opendws.domain.timeline import ceil_cells, floor_cells


@dataclass(frozen=True, slots=True)
class PassReport:
    """How the last plan was made: in full (and why), or incrementally (from which rank, and
    how many requests were searched again; the others took their slot again)."""

    full: bool
    why: str = ""  # full: the reason
    from_rank: int = 0  # incremental: 1-based rank of the first request walked again
    walked: int = 0  # incremental: requests walked again
    searched: int = 0  # incremental: of those, searched again


class IncrementalPlanner:
    """Plans snapshot after snapshot with exactly the decisions of :func:`admit`, reusing the
    last pass where the changes allow (see the module docstring). One reconciler owns one
    planner; it is not thread-safe."""

    def __init__(self) -> None:
        self._pass: _Pass | None = None
        self._snapshot: Snapshot | None = None
        self._pending: dict[int, CapacityRequest] = {}  # id() → the pending request
        self._grants: Counter[Grant] = Counter()
        self._ids: list[str] = []  # decision ids, sorted: the plan's order
        self._demand: list[int] = []  # per grid row: what all flex requests could put on it
        self._reads: dict[str, frozenset[int]] = {}  # flex request id → rows its search reads
        self._entry_of: dict[str, _Entry] = {}  # flex request id → its entry
        self._by_pool: dict[int, set[_Entry]] = {}  # pool row → the entries placed in it
        self.last_pass = PassReport(full=True, why="no pass yet")

    def plan(self, snapshot: Snapshot, now: datetime) -> Plan:
        """The plan ``admit(snapshot, now)`` gives, made incrementally where it can be."""
        require_utc("now", now)
        why = self._why_full(snapshot, now)
        if why is None:
            why = self._replan(snapshot)
        if why is not None:
            self._full(snapshot, now, why)
        state = self._pass
        assert state is not None
        decisions = tuple(map(state.decisions.__getitem__, self._ids))
        races = tuple(Race(request_id=key, pools=state.races[key]) for key in sorted(state.races))
        return Plan(now=state.now, decisions=decisions, races=races)

    # A full pass -----------------------------------------------------------------------------

    def _full(self, snapshot: Snapshot, now: datetime, why: str) -> None:
        state = _Pass(snapshot, now, keep=True)
        state.run()
        self._pass = state
        self._remember(snapshot, _by_identity(snapshot), None)
        self._ids = sorted(state.decisions)
        flex = state.flex
        self._demand = [0] * (len(flex.limits) if flex is not None else 0)
        self._reads = {}
        self._entry_of = {}
        self._by_pool = {}
        if flex is not None:
            # Its facts hold only while free amounts go down; a walk first gives slots back.
            flex.grid.forget()
            for entry in flex.entries:
                key = entry.candidate.request.request_id
                self._count(snapshot, flex, entry.candidate, 1)
                self._reads[key] = _reads(flex, entry.candidate)
                self._entry_of[key] = entry
                if entry.best is not None:
                    self._by_pool.setdefault(entry.row, set()).add(entry)
        self.last_pass = PassReport(full=True, why=why)

    def _remember(
        self,
        snapshot: Snapshot,
        pending: dict[int, CapacityRequest],
        grants: Counter[Grant] | None,
    ) -> None:
        self._snapshot = snapshot
        self._pending = pending
        self._grants = Counter(snapshot.grants) if grants is None else grants

    def _why_full(self, snapshot: Snapshot, now: datetime) -> str | None:
        """Why the next plan cannot start from the last one, or None if it can."""
        last = self._snapshot
        state = self._pass
        if last is None or state is None:
            return "no pass yet"
        if now != state.now:
            return "the clock moved: every cell, deadline and aging key is relative to now"
        if snapshot.policy != last.policy:
            return "the policy changed"
        if snapshot.pools is not last.pools and set(snapshot.pools) != set(last.pools):
            return "the pools changed"
        if snapshot.tenants is not last.tenants and set(snapshot.tenants) != set(last.tenants):
            return "the tenants changed"
        if snapshot.policy.commit_within is not None and (snapshot.commitments or last.commitments):
            # Without any, a horizon changes nothing: admit plans as without one.
            return "commitments are held before the policy order is planned"
        if snapshot.racing or last.racing:
            return "racing requests take lanes after every placement"
        if snapshot.policy.race_eagerly and snapshot.policy.race_width > 1:
            return "eager racing takes lanes after every placement"
        return None

    # An incremental pass ---------------------------------------------------------------------

    def _replan(self, snapshot: Snapshot) -> str | None:
        """Bring the kept pass up to ``snapshot``; None when done, else why a full pass is
        needed (what was changed by then is rebuilt by that full pass)."""
        state = self._pass
        assert state is not None
        now = state.now
        old = self._pending
        pending = old
        gone: list[str] = []
        came: list[CapacityRequest] = []
        if self._snapshot is None or snapshot.pending is not self._snapshot.pending:
            # By identity first (C-speed set differences), then by value: a request that was
            # read again as an equal object is no change.
            pending = _by_identity(snapshot)
            left = {old[k].request_id: old[k] for k in old.keys() - pending.keys()}
            for k in pending.keys() - old.keys():
                request = pending[k]
                if left.get(request.request_id) == request:
                    del left[request.request_id]
                else:
                    came.append(request)
            gone = sorted(left)
        grants = self._grants
        released: list[Grant] = []
        added: list[Grant] = []
        if self._snapshot is None or snapshot.grants is not self._snapshot.grants:
            grants = Counter(snapshot.grants)
            added = list((grants - self._grants).elements())
            released = list((self._grants - grants).elements())
        calendar_ids = {candidate.request.request_id for candidate in state.calendar}
        if any(key in calendar_ids for key in gone):
            return "a calendar request left"
        if any(request.mode is not Mode.FLEX_START for request in came):
            return "a calendar request arrived"
        flex = state.flex
        strict = {t.name for t in snapshot.tenants if t.queueing is QueueingStrategy.STRICT_FIFO}
        screened: dict[str, Decision] = {}
        arrivals: list[_Entry] = []
        for request in came:
            allowed = state._allowed_pools(request)
            verdict = state._screen_out(request, allowed)
            if verdict is not None:
                screened[request.request_id] = verdict
                continue
            if flex is None:
                return "no flex step to extend"
            candidate = _Candidate(
                request,
                allowed.pools,
                state.quotas.limits(request.tenant, request.gang.accelerator),
                request.tenant in strict,
            )
            if any(limit.key not in flex.limit_row for limit in candidate.limits):
                return "an arrival counts against a quota row the grid lacks"
            length = ceil_cells(request.run_duration)
            first = state.first_cells(request.run_duration)
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
        if (released or added) and state.calendar:
            why = self._recalendar(snapshot, state)
            if why is not None:
                return why
        for key in gone:
            del state.decisions[key]
            del self._ids[bisect.bisect_left(self._ids, key)]
        for key, decision in screened.items():
            state.decisions[key] = decision
            bisect.insort(self._ids, key)
        report = PassReport(full=False)
        if flex is not None:
            report = self._walk(snapshot, state, flex, gone, arrivals, released, added)
        self._remember(snapshot, pending, grants)
        self.last_pass = report
        return None

    def _recalendar(self, snapshot: Snapshot, state: _Pass) -> str | None:
        """Decide the calendar blocks again on the new grants; why not, if that confirms
        another set of blocks (the flex grid holds the confirmed ones)."""
        fresh = _Pass(snapshot, state.now)
        fresh._decide_calendar(state.calendar)
        if fresh.grants[len(snapshot.grants) :] != state.grants[state.base_grants :]:
            return "a grant that came or went changes which calendar blocks are confirmed"
        for candidate in state.calendar:
            key = candidate.request.request_id
            state.decisions[key] = fresh.decisions[key]
        state.grants = fresh.grants
        state.base_grants = len(snapshot.grants)
        return None

    def _walk(
        self,
        snapshot: Snapshot,
        state: _Pass,
        flex: _FlexState,
        gone: list[str],
        arrivals: list[_Entry],
        released: list[Grant],
        added: list[Grant],
    ) -> PassReport:
        """Re-plan the flex requests from the first one the changes reach (module docstring)."""
        entries = flex.entries
        grid = flex.grid
        starts = [len(entries)]
        gone_set = set(gone)
        # (row, first cell, cells, amount given back: negative for a new grant's take)
        freed: list[tuple[int, int, int, int]] = []
        # An admission carried out: the request left and its grant came, holding exactly the
        # slot it took on every row a search reads. Nothing a search reads changes then; the
        # grant's share of rows no search reads is taken as it is.
        absorbed: set[str] = set()
        for grant in added:
            span = _grant_cells(flex, grant)
            contributions = _grant_rows(state, flex, grant)
            entry = self._entry_of.get(grant.request_id)
            if (
                entry is not None
                and grant.request_id in gone_set
                and grant.request_id not in absorbed
                and entry.best is not None
                and span == (entry.best, entry.span)
                and state.pool_row.get(grant.pool_id) == entry.row
                and sorted(c for c in contributions if flex.binding[c[0]]) == sorted(entry.needs)
            ):
                absorbed.add(grant.request_id)
                for row, amount in contributions:
                    if not flex.binding[row]:
                        grid.give(((row, -amount),), span[0], span[1])
                continue
            if span[1] > 0:
                freed.extend((row, span[0], span[1], -amount) for row, amount in contributions)
        leaving = [self._entry_of.pop(key) for key in gone if key in self._entry_of]
        for entry in leaving:
            starts.append(bisect.bisect_left(entries, entry.key, key=_key_of))
            self._count(snapshot, flex, entry.candidate, -1)
            del self._reads[entry.candidate.request.request_id]
        for entry in arrivals:
            starts.append(bisect.bisect_left(entries, entry.key, key=_key_of))
            self._reads[entry.candidate.request.request_id] = _reads(flex, entry.candidate)
            self._entry_of[entry.candidate.request.request_id] = entry
        for grant in released:
            first, cells = _grant_cells(flex, grant)
            if cells > 0:
                freed.extend(
                    (row, first, cells, amount) for row, amount in _grant_rows(state, flex, grant)
                )
        dirty = {row for row, _, _, _ in freed}
        if dirty:
            for index, entry in enumerate(entries):
                if not self._reads_of(entry).isdisjoint(dirty):
                    starts.append(index)
                    break
        start = min(starts)
        if start == len(entries) and not arrivals:
            return PassReport(full=False, from_rank=start + 1)
        fresh = {id(entry) for entry in arrivals}
        suffix = [e for e in entries[start:] if e.candidate.request.request_id not in gone_set]
        suffix.extend(arrivals)
        suffix.sort(key=_key_of)
        # A row is rolled back only once it must be read or changed: to the grid as it stood
        # before the entry being walked, by giving back the takes of the entries not walked yet
        # (``holders``: per row, the suffix indices holding a take on it). A row never rolled
        # back is one no change reached: its final state is the same as before.
        holders: dict[int, list[int]] = {}
        for index, entry in enumerate(suffix):
            if entry.best is not None and id(entry) not in fresh:
                for row, _ in entry.needs:
                    holders.setdefault(row, []).append(index)
        rolled: set[int] = set()
        grid.forget()

        def roll(row: int, at: int) -> None:
            rolled.add(row)
            indices = holders.get(row, [])
            for index in indices[bisect.bisect_left(indices, at) :]:
                holder = suffix[index]
                assert holder.best is not None
                grid.give(
                    [need for need in holder.needs if need[0] == row], holder.best, holder.span
                )

        for row in dirty:
            roll(row, 0)
        for row, first, cells, amount in freed:
            grid.give(((row, amount),), first, cells)
        for entry in leaving:
            if entry.candidate.request.request_id in absorbed:
                assert entry.best is not None
                self._by_pool[entry.row].discard(entry)
                continue
            if entry.best is not None:
                for row, _ in entry.needs:
                    if row not in rolled:
                        roll(row, 0)
                grid.give(entry.needs, entry.best, entry.span)
                self._by_pool[entry.row].discard(entry)
            dirty.update(row for row, _ in entry.needs)
        # Each strict-FIFO tenant's floor after its last request before ``start``: walk back
        # until every such tenant is found (usually a few entries).
        floors: dict[str, int] = {}
        strict_tenants = {
            t.name for t in snapshot.tenants if t.queueing is QueueingStrategy.STRICT_FIFO
        }
        for index in range(start - 1, -1, -1):
            if len(floors) == len(strict_tenants):
                break
            entry = entries[index]
            tenant = entry.candidate.request.tenant
            if entry.candidate.strict and tenant not in floors:
                floors[tenant] = _floor_after(entry)
        searched = 0
        moved: set[int] = set()  # entries whose decision may differ beyond rank and position
        touched = {entry.row for entry in leaving if entry.best is not None}  # renumber them
        for index, entry in enumerate(suffix):
            candidate = entry.candidate
            tenant = candidate.request.tenant
            floor = floors.get(tenant, 0) if candidate.strict else 0
            reads = self._reads_of(entry)
            if id(entry) in fresh or floor != entry.floor or not dirty.isdisjoint(reads):
                searched += 1
                for row in reads:
                    if row not in rolled:
                        roll(row, index)
                best, row, needs, reason = _place(
                    grid,
                    candidate,
                    entry.length,
                    entry.first,
                    entry.last,
                    floor,
                    flex.binding,
                    flex.limit_row,
                    flex.short,
                )
                if id(entry) in fresh or (best, row, needs) != (entry.best, entry.row, entry.needs):
                    dirty.update(r for r, _ in entry.needs)
                    dirty.update(r for r, _ in needs)
                    touched.update(r for r in (entry.row, row) if r >= 0)
                if id(entry) in fresh or (best, row, needs, reason) != (
                    entry.best,
                    entry.row,
                    entry.needs,
                    entry.reason,
                ):
                    moved.add(id(entry))
                if entry.best is not None:
                    self._by_pool[entry.row].discard(entry)
                if best is not None:
                    self._by_pool.setdefault(row, set()).add(entry)
                entry.floor, entry.best, entry.row = floor, best, row
                entry.needs, entry.reason = needs, reason
                if best is not None:
                    grid.take(needs, best, entry.span)
            elif entry.best is not None and rolled:
                again = [need for need in entry.needs if need[0] in rolled]
                if again:
                    grid.take(again, entry.best, entry.span)
            if candidate.strict:
                floors[tenant] = _floor_after(entry)
        entries[start:] = suffix
        self._decide(state, flex, start, moved, touched)
        return PassReport(full=False, from_rank=start + 1, walked=len(suffix), searched=searched)

    def _decide(
        self,
        state: _Pass,
        flex: _FlexState,
        start: int,
        moved: set[int],
        touched: set[int],
    ) -> None:
        """The flex decisions after a walk from ``start``: ranks from there follow the new
        order; held slots are renumbered in the pools where a slot appeared, left or moved
        (``touched``), and elsewhere their relative order, so every position, is as it was.
        A decision that comes out the same is kept as it was."""
        entries = flex.entries
        positions: dict[int, int | None] = {}
        renumbered: list[_Entry] = []
        for row in touched:
            position = 0
            for entry in sorted(self._by_pool.get(row, ()), key=_slot_order):
                renumbered.append(entry)
                if entry.best:
                    position += 1
                    positions[id(entry)] = position
                else:
                    positions[id(entry)] = None
        walked = {id(entry) for entry in entries[start:]}
        for entry in renumbered:  # before the walk: the same rank, maybe another position
            if id(entry) not in walked:
                before = state.decisions[entry.candidate.request.request_id]
                if before.position != positions[id(entry)]:
                    self._record(state, flex, entry, before.rank or 0, positions[id(entry)])
        for rank, entry in enumerate(entries[start:], start=start + 1):
            request = entry.candidate.request
            known = state.decisions.get(request.request_id)
            if known is None:
                bisect.insort(self._ids, request.request_id)
            position_of = (
                known.position
                if known is not None and id(entry) not in positions
                else positions.get(id(entry))
            )
            if (
                known is not None
                and id(entry) not in moved
                and known.rank == rank
                and known.position == position_of
            ):
                continue
            self._record(state, flex, entry, rank, position_of)

    @staticmethod
    def _record(
        state: _Pass, flex: _FlexState, entry: _Entry, rank: int, position: int | None
    ) -> None:
        """The decision for ``entry`` at ``rank`` (and ``position`` if held)."""
        request = entry.candidate.request
        if entry.best is None:
            state.decisions[request.request_id] = _waiting(request, rank)
            return
        start_at = state.start_of(entry.best)
        state.decisions[request.request_id] = Decision(
            request_id=request.request_id,
            outcome=Outcome.HOLD if entry.best else Outcome.ADMIT,
            reason=entry.reason,
            pool_id=state.pools[entry.row].pool_id,
            start_at=start_at,
            end_at=start_at + request.run_duration,
            rank=rank,
            position=position,
        )

    def _reads_of(self, entry: _Entry) -> frozenset[int]:
        return self._reads[entry.candidate.request.request_id]

    def _count(
        self, snapshot: Snapshot, flex: _FlexState, candidate: _Candidate, sign: int
    ) -> None:
        """Add (``sign`` 1) or remove (-1) what ``candidate`` could put on each row, counted
        as the full pass's binding test counts it."""
        gang = candidate.request.gang
        for row in candidate.pools:
            self._demand[row] += sign * gang.units
        lanes = min(snapshot.policy.race_width, len(candidate.pools))
        for limit in candidate.limits:
            self._demand[flex.limit_row[limit.key]] += sign * gang.accelerator_units * lanes


def _by_identity(snapshot: Snapshot) -> dict[int, CapacityRequest]:
    return dict(zip(map(id, snapshot.pending), snapshot.pending, strict=True))


def _key_of(entry: _Entry) -> FlexKey:
    return entry.key


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


def _all_rows(flex: _FlexState, candidate: _Candidate) -> list[int]:
    """Every grid row ``candidate`` counts against: its pools and its quota limits."""
    return [*candidate.pools, *(flex.limit_row[limit.key] for limit in candidate.limits)]


def _reads(flex: _FlexState, candidate: _Candidate) -> frozenset[int]:
    """The grid rows a search for ``candidate`` reads: those of its rows that can bind."""
    return frozenset(row for row in _all_rows(flex, candidate) if flex.binding[row])
