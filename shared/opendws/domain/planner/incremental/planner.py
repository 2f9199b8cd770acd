"""The incremental planner (:class:`IncrementalPlanner`): each ``plan`` first asks whether the
kept pass can be carried over (:meth:`IncrementalPlanner._why_full`); if it can, brings it up to
the snapshot phase by phase (:meth:`IncrementalPlanner._replan`: what came and left, the clock,
the calendar blocks, the commitments' layer, then the walk); else, or if a phase finds it
cannot, plans in full and keeps that pass. See the package docstring for what each change
costs."""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime

from opendws.domain.admission import _collector_paused
from opendws.domain.model import (
    CapacityRequest,
    Grant,
    Mode,
    Snapshot,
    require_utc,
)
from opendws.domain.planner.incremental.blocks import (
    _block_resources,
    _calendar_key,
    blocks_left,
    index_blocks,
    recalendar,
)
from opendws.domain.planner.incremental.clock import _ClockMove, move_clock
from opendws.domain.planner.incremental.diff import identity_changes
from opendws.domain.planner.incremental.full import KeepingPass, _Entry
from opendws.domain.planner.incremental.kept import KeptPass, NeedFullPass, PlanReport
from opendws.domain.planner.incremental.layer import _holds_commitments, _Layer, relayer
from opendws.domain.planner.incremental.queue import _all_rows
from opendws.domain.planner.incremental.walk import walk
from opendws.domain.planner.shapes import Candidate, binds, strict_tenants
from opendws.domain.planner.verdicts import Decision, Outcome, Plan, Race
from opendws.domain.policy import flex_key

COMMITMENTS_HELD = "the last pass could not hold a commitment where it was promised"

PLAN_FAILED = "the last plan failed: what it kept may be half updated"


class IncrementalPlanner(KeptPass):
    """Plans snapshot after snapshot with exactly the decisions of :func:`admit`, reusing the
    last pass where the changes allow (see the package docstring). One reconciler owns one
    planner; it is not thread-safe."""

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
                    try:
                        self._replan(snapshot, now)
                    except NeedFullPass as need:
                        why = need.reason
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

    # A full pass -----------------------------------------------------------------------------

    def _full(self, snapshot: Snapshot, now: datetime, why: str) -> None:
        self._unkept = None
        self._changed = None  # every decision is made anew
        state = KeepingPass(snapshot, now, keys=self._keys)
        state.run()
        self._keys = state.keys
        self._snapshot = snapshot
        self._latest_submitted = max(
            (request.submitted_at for request in snapshot.pending),
            default=datetime.min.replace(tzinfo=UTC),
        )
        self._moves = None
        self._promised = None
        self._judged_floors = {}
        self._first_slots = {}  # a new grid: its rows and binding may differ
        index_blocks(self, state)
        self._booked = {grant.request_id: grant for grant in state.grants[state.base_grants :]}
        if state.flex is not None:
            # Its facts hold only while free amounts go down; a walk first gives slots back.
            state.flex.grid.forget()
        self._index(snapshot, state)
        self.last_pass = PlanReport(full=True, why=why)

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

    def _replan(self, snapshot: Snapshot, now: datetime) -> None:
        """Bring the kept pass up to ``snapshot`` at ``now``; else raise :class:`NeedFullPass`,
        saying why a full pass is needed (what was changed by then is rebuilt by that full
        pass)."""
        state = self._pass
        assert state is not None
        kept = self._snapshot
        assert kept is not None
        gone: list[str] = []
        came: list[CapacityRequest] = []
        if snapshot.pending is not kept.pending:
            # By identity first (see identity_changes), then by value: a request that was
            # read again as an equal object is no change.
            before, after = identity_changes(kept.pending, snapshot.pending)
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
            ended, new = (Counter(side) for side in identity_changes(kept.grants, snapshot.grants))
            added = list((new - ended).elements())
            released = list((ended - new).elements())
        clock = _ClockMove()
        if now != state.now and state.calendar:
            # A block's verdict depends on now: one still pending at a later now is decided
            # again in full (the blocks that left, booked or refused, are no concern).
            leaving = set(gone)
            if any(block.request.request_id not in leaving for block in state.calendar):
                raise NeedFullPass("calendar blocks are pending: a block's verdict depends on now")
        if now != state.now:
            clock = move_clock(self, now, set(gone))
        now = state.now
        # A flex request that left has an entry or is held; only another may be a calendar
        # block.
        others = {key for key in gone if key not in self._entry_of and key not in self._held}
        became = (
            blocks_left(self, state, others, released, added) if others and state.calendar else []
        )
        flex = state.flex
        strict = strict_tenants(snapshot)
        screened: dict[str, Decision] = {}
        arrivals: list[_Entry] = []
        fresh: list[Candidate] = []  # calendar blocks that arrived
        for request in came:
            candidate = state.screen(request, strict)
            if isinstance(candidate, Decision):
                screened[request.request_id] = candidate
                continue
            if request.mode is not Mode.FLEX_START:
                fresh.append(candidate)
                continue
            if flex is None:
                raise NeedFullPass("no flex step to extend")
            if any(limit.key not in flex.limit_row for limit in candidate.limits):
                raise NeedFullPass("an arrival counts against a quota row the grid lacks")
            length, first, last = state.cells(candidate)
            if 1 + first + last > flex.cells:
                raise NeedFullPass("an arrival needs a longer grid")
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
            redecided, taken, given = recalendar(
                self, snapshot, state, [*released, *added, *became], fresh
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
                    if not flex.binding[row] and binds(self._demand[row], flex.lowest[row]):
                        raise NeedFullPass(
                            "an arrival makes a row bind that the grid never tracked"
                        )
            # A new grant lowers what commitments leave free (at most by its amount).
            for grant in added:
                for row, amount in state.grant_rows(grant, flex.limit_row):
                    flex.lowest[row] -= amount
                    if not flex.binding[row] and binds(self._demand[row], flex.lowest[row]):
                        raise NeedFullPass(
                            "a new grant makes a row bind that the grid never tracked"
                        )
        layer = _Layer()
        if flex is not None and (self._held or _holds_commitments(snapshot, now)):
            layer = relayer(self, snapshot, state, flex, arrivals, set(gone), added, clock)
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
        report = PlanReport(full=False)
        if flex is not None:
            report = walk(
                self, snapshot, state, flex, gone, arrivals, released, added, clock, layer
            )
        self._snapshot = snapshot
        self.last_pass = replace(report, redecided=redecided)
