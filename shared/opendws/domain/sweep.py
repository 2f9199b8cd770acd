"""The sweep, as a pure table: what the reconciler does with one live request, given what the
providers observed of its orders and the time.

``sweep(view, now, grace) -> Step`` — no I/O, no clock. The reconciler observes, calls this for
every live request, then carries the step out through one writer: the write first (guarded by
the record's version and the lease's fence), then the provider calls it licenses, in order.

Rows are keyed by (state, observed phase of one order) and marked by what caused them:
``PASSIVE`` — the cloud did it and we record it; ``ACTIVE`` — a deadline of ours passed and we
act; ``REPAIR`` — a call a crash or a failed call left undone is issued again (safe: every call
is idempotent under the order's name). Deadline rows are looked at before the table.

A request racing several pools has one order (lane) per pool. Its lanes are swept one by one
through the table and combined: the first lane Google served wins (ACTIVE, the others are
released in the same step; a second lane served too is a double win, reported so its cost is
counted); a lane that failed for good is dropped; a request left with no lane goes back in
line. While lanes wait in Google's queue nothing is cancelled: giving up a place in Google's
queue only to ask again elsewhere would lose it (Google serves first come first served). Only
the request's own max_wait ends the wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from opendws.domain.model import Mode
from opendws.domain.provisioning import Lane, ProvisionPhase
from opendws.domain.reasons import Expiry
from opendws.domain.states import RequestState

S = RequestState
P = ProvisionPhase

# Error codes that mean "no capacity there now": a pool whose orders wait with one of these in
# Google's last attempt is short, and admission starts nothing new there while it is.
STOCKOUT_CODES = frozenset(
    {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", "STOCKOUT"}
)


NOT_ACCEPTED = "NOT_ACCEPTED"  # the cloud refused every create call of an order for too long
# Failures that cool their pool down: no capacity there, or the cloud will not take orders.
_COOLS_DOWN = STOCKOUT_CODES | {NOT_ACCEPTED}


class SweepReason(StrEnum):
    """Why the sweep moved or revised a request."""

    READY = "READY"  # the provider reports the whole gang running
    WAITING_FOR_CAPACITY = "WAITING_FOR_CAPACITY"  # queued at Google, capacity not there yet
    PROVISIONING_FAILED = "PROVISIONING_FAILED"  # the cloud failed the order for good
    CAPACITY_ENDED = "CAPACITY_ENDED"  # the cloud ended the run by itself
    BLOCK_STARTED = "BLOCK_STARTED"  # a calendar block's start was reached
    # Google filled a started block's reservation (from its start, possibly up to 24 h
    # later): its VMs are created now, and its job starts once they run.
    BLOCK_FILLED = "BLOCK_FILLED"
    BLOCK_ENDED = "BLOCK_ENDED"  # a calendar block's end was reached
    # Given up after ReconcileSettings.give_up_after (off by default: it loses the place in
    # Google's queue; kept to compare against, see bench/obtain.py).
    GAVE_UP = "GAVE_UP"
    POOL_REMOVED = "POOL_REMOVED"  # its pool is no longer configured
    # Calendar blocks at Google's review (procurementStatus).
    APPROVED = "APPROVED"  # Google approved the submitted block: it is booked
    DECLINED = "DECLINED"  # Google declined the submitted block
    CANCELLED_AT_GOOGLE = "CANCELLED_AT_GOOGLE"  # the block was cancelled at Google
    BLOCK_FAILED = "BLOCK_FAILED"  # Google could not deliver an approved block
    NOT_ACCEPTED = "NOT_ACCEPTED"  # the cloud kept refusing to take the block


class Trigger(StrEnum):
    """What caused a row: see the module docstring."""

    PASSIVE = "passive"
    ACTIVE = "active"
    REPAIR = "repair"


class Call(StrEnum):
    """A provider call the step asks for, on one lane's order."""

    RESERVE = "reserve"
    PROVISION = "provision"
    RELEASE = "release"


@dataclass(frozen=True, slots=True)
class Row:
    """One row of the table: where the request goes (None: it stays), why, which calls on the
    lane's order follow, and what caused it."""

    target: RequestState | None
    reason: SweepReason | Expiry | None
    calls: tuple[Call, ...]
    trigger: Trigger


_NOTHING = Row(None, None, (), Trigger.PASSIVE)

# (state, mode, observed phase of the order; None = nothing found under its name) → row.
# A flex request is racing when it has several lanes; the rows are per lane.
TABLE: dict[tuple[RequestState, Mode, ProvisionPhase | None], Row] = {
    # --- provisioning a flex gang ------------------------------------------------------------
    # Google served it: the whole gang runs.
    (S.PROVISIONING, Mode.FLEX_START, P.READY): Row(
        S.ACTIVE, SweepReason.READY, (), Trigger.PASSIVE
    ),
    # Queued at Google without capacity yet: keep its place; say so once.
    (S.PROVISIONING, Mode.FLEX_START, P.WAITING): Row(
        None, SweepReason.WAITING_FOR_CAPACITY, (), Trigger.PASSIVE
    ),
    # Accepted and being created: nothing to do.
    (S.PROVISIONING, Mode.FLEX_START, P.CREATING): _NOTHING,
    # Failed for good (status.error): drop this lane; with none left, back in line.
    (S.PROVISIONING, Mode.FLEX_START, P.FAILED): Row(
        S.PENDING, SweepReason.PROVISIONING_FAILED, (Call.RELEASE,), Trigger.PASSIVE
    ),
    # It ran and is gone before a pass saw it running: the run is over.
    (S.PROVISIONING, Mode.FLEX_START, P.ENDED): Row(
        S.EXPIRED, SweepReason.CAPACITY_ENDED, (Call.RELEASE,), Trigger.PASSIVE
    ),
    # Nothing under its name: the call after the write never happened (a crash, an error).
    (S.PROVISIONING, Mode.FLEX_START, None): Row(None, None, (Call.PROVISION,), Trigger.REPAIR),
    (S.PROVISIONING, Mode.FLEX_START, P.RESERVED): Row(
        None, None, (Call.PROVISION,), Trigger.REPAIR
    ),
    # A flex order never is under review or approved (those are calendar phases).
    (S.PROVISIONING, Mode.FLEX_START, P.REVIEW): _NOTHING,
    (S.PROVISIONING, Mode.FLEX_START, P.APPROVED): _NOTHING,
    # --- a calendar block submitted to Google, under review (PENDING with its order) ----------
    # Google reviews it: nothing to do but wait (the event said so at submission).
    (S.PENDING, Mode.CALENDAR, P.REVIEW): _NOTHING,
    (S.PENDING, Mode.CALENDAR, P.WAITING): _NOTHING,
    # Approved (its reservation may exist already): the block is booked.
    (S.PENDING, Mode.CALENDAR, P.APPROVED): Row(
        S.BOOKED, SweepReason.APPROVED, (), Trigger.PASSIVE
    ),
    (S.PENDING, Mode.CALENDAR, P.RESERVED): Row(
        S.BOOKED, SweepReason.APPROVED, (), Trigger.PASSIVE
    ),
    (S.PENDING, Mode.CALENDAR, P.CREATING): Row(
        S.BOOKED, SweepReason.APPROVED, (), Trigger.PASSIVE
    ),
    (S.PENDING, Mode.CALENDAR, P.READY): Row(S.BOOKED, SweepReason.APPROVED, (), Trigger.PASSIVE),
    # Declined (or cancelled at Google: see _refined): refused, its request deleted.
    (S.PENDING, Mode.CALENDAR, P.FAILED): Row(
        S.REJECTED, SweepReason.DECLINED, (Call.RELEASE,), Trigger.PASSIVE
    ),
    (S.PENDING, Mode.CALENDAR, P.ENDED): Row(
        S.REJECTED, SweepReason.BLOCK_ENDED, (Call.RELEASE,), Trigger.PASSIVE
    ),
    # Nothing under its name: the submission after the write never happened.
    (S.PENDING, Mode.CALENDAR, None): Row(None, None, (Call.RESERVE,), Trigger.REPAIR),
    # --- a booked block before its start (Google approved it) --------------------------------
    (S.BOOKED, Mode.CALENDAR, P.REVIEW): _NOTHING,
    (S.BOOKED, Mode.CALENDAR, P.APPROVED): _NOTHING,
    (S.BOOKED, Mode.CALENDAR, P.RESERVED): _NOTHING,
    (S.BOOKED, Mode.CALENDAR, P.CREATING): _NOTHING,
    (S.BOOKED, Mode.CALENDAR, P.WAITING): _NOTHING,
    (S.BOOKED, Mode.CALENDAR, P.READY): _NOTHING,
    # Google could not deliver it (or it was cancelled at Google: see _refined).
    (S.BOOKED, Mode.CALENDAR, P.FAILED): Row(
        S.EXPIRED, SweepReason.BLOCK_FAILED, (Call.RELEASE,), Trigger.PASSIVE
    ),
    (S.BOOKED, Mode.CALENDAR, P.ENDED): Row(
        S.EXPIRED, SweepReason.BLOCK_ENDED, (Call.RELEASE,), Trigger.PASSIVE
    ),
    # Its future reservation is gone (deleted outside opendws): a booking cannot be repaired
    # by submitting again, which would be a new request for Google to review.
    (S.BOOKED, Mode.CALENDAR, None): Row(
        S.EXPIRED, SweepReason.CAPACITY_ENDED, (), Trigger.PASSIVE
    ),
    # --- a calendar block from its start (it keeps its pool) ---------------------------------
    (S.PROVISIONING, Mode.CALENDAR, P.READY): Row(S.ACTIVE, SweepReason.READY, (), Trigger.PASSIVE),
    # Google fills the block's reservation from its start (up to 24 h after it).
    (S.PROVISIONING, Mode.CALENDAR, P.APPROVED): _NOTHING,
    (S.PROVISIONING, Mode.CALENDAR, P.REVIEW): _NOTHING,
    (S.PROVISIONING, Mode.CALENDAR, P.WAITING): _NOTHING,
    (S.PROVISIONING, Mode.CALENDAR, P.CREATING): _NOTHING,
    # The reservation holds the block's capacity but its VMs were not asked for yet.
    (S.PROVISIONING, Mode.CALENDAR, P.RESERVED): Row(None, None, (Call.PROVISION,), Trigger.REPAIR),
    (S.PROVISIONING, Mode.CALENDAR, P.FAILED): Row(
        S.EXPIRED, SweepReason.BLOCK_FAILED, (Call.RELEASE,), Trigger.PASSIVE
    ),
    (S.PROVISIONING, Mode.CALENDAR, P.ENDED): Row(
        S.EXPIRED, SweepReason.CAPACITY_ENDED, (Call.RELEASE,), Trigger.PASSIVE
    ),
    (S.PROVISIONING, Mode.CALENDAR, None): Row(
        S.EXPIRED, SweepReason.CAPACITY_ENDED, (), Trigger.PASSIVE
    ),
}
# A failed calendar order that was cancelled at Google (by opendws's own cancel that a crash
# interrupted before its write, or by hand) ends as a cancellation, not as a refusal.
_CANCELLED_AT_GOOGLE = {
    S.PENDING: Row(S.CANCELLED, SweepReason.CANCELLED_AT_GOOGLE, (Call.RELEASE,), Trigger.PASSIVE),
    S.BOOKED: Row(S.CANCELLED, SweepReason.CANCELLED_AT_GOOGLE, (Call.RELEASE,), Trigger.PASSIVE),
}
CANCELLED_CODE = "CANCELLED"
DECLINED_CODE = "DECLINED"
# --- a running gang (flex or calendar alike) ---------------------------------------------------
for _mode in Mode:
    TABLE[(S.ACTIVE, _mode, P.READY)] = _NOTHING
    TABLE[(S.ACTIVE, _mode, P.REVIEW)] = _NOTHING
    TABLE[(S.ACTIVE, _mode, P.APPROVED)] = _NOTHING
    TABLE[(S.ACTIVE, _mode, P.RESERVED)] = _NOTHING
    TABLE[(S.ACTIVE, _mode, P.CREATING)] = _NOTHING
    TABLE[(S.ACTIVE, _mode, P.WAITING)] = _NOTHING
    # The cloud ended it (run duration reached, deleted by hand) or it is gone.
    for _gone in (P.ENDED, P.FAILED, None):
        TABLE[(S.ACTIVE, _mode, _gone)] = Row(
            S.EXPIRED, SweepReason.CAPACITY_ENDED, (Call.RELEASE,), Trigger.PASSIVE
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneView:
    """One lane of a live request and what the providers saw under its order's name."""

    lane: Lane
    configured: bool  # its pool is still configured
    phase: ProvisionPhase | None  # None: nothing found under its name
    error_code: str | None = None
    last_attempt: str | None = None
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepView:
    """What the sweep needs to know of one live request."""

    state: RequestState
    mode: Mode
    lanes: tuple[LaneView, ...]  # at least one
    units: int
    since: datetime  # when it entered its state (a calendar block under review: submitted)
    reason: str | None  # its current reason (a revision is written only when it changes)
    # Its last event already said that it waits at Google (waiting, or raced because its
    # pools are short): waiting on is no news.
    waiting_told: bool = False
    deadline: datetime | None  # flex: submitted_at + max_wait
    run_end: datetime | None  # ACTIVE flex: when its run time is up
    block_start: datetime | None  # calendar
    block_end: datetime | None  # calendar


@dataclass(frozen=True, slots=True)
class Step:
    """What to do with one live request: the write (``target`` None and ``reason`` None:
    none; ``target`` None with a reason: a revision in the same state), then ``calls`` in
    order. ``lanes`` are the orders the record keeps afterwards."""

    target: RequestState | None
    reason: SweepReason | Expiry | None
    trigger: Trigger | None
    lanes: tuple[Lane, ...]
    calls: tuple[tuple[Call, Lane], ...] = ()
    message: str = ""
    short: tuple[str, ...] = ()  # pools where an order waits with a stockout in Google's queue
    double_wins: tuple[Lane, ...] = ()  # extra lanes served together with the winner

    @property
    def writes(self) -> bool:
        return self.target is not None or self.reason is not None


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepSettings:
    """The sweep's deadlines."""

    grace: timedelta = timedelta(minutes=1)  # a run this long past its end is ended by the sweep
    # An order whose create call the cloud kept refusing (nothing exists under its name) this
    # long after admission is dropped: there is no place in Google's queue to lose.
    not_taken_after: timedelta = timedelta(minutes=15)
    # When set, orders Google has not served after this long are cancelled and the request
    # goes back in line for its other pools (their pools marked short): the old
    # cancel-and-retry, off by default since it gives up the place in Google's queue.
    give_up_after: timedelta | None = None


def sweep(view: SweepView, now: datetime, settings: SweepSettings) -> Step:
    """The step for one live request (see the module docstring)."""
    grace, give_up_after = settings.grace, settings.give_up_after
    lanes = tuple(seen.lane for seen in view.lanes)
    releases = tuple((Call.RELEASE, lane) for lane in lanes)
    # Deadline rows (ACTIVE): looked at before the table.
    if view.mode is Mode.CALENDAR and view.block_end is not None and now >= view.block_end:
        if view.state is S.PENDING:  # still under Google's review at its end
            return Step(S.REJECTED, SweepReason.BLOCK_ENDED, Trigger.ACTIVE, lanes, releases,
                        "Google did not approve the block before its end")  # fmt: skip
        return Step(S.EXPIRED, SweepReason.BLOCK_ENDED, Trigger.ACTIVE, lanes, releases,
                    "block ended")  # fmt: skip
    if view.state is S.ACTIVE and view.run_end is not None and now >= view.run_end + grace:
        return Step(
            S.EXPIRED, Expiry.RUN_TIME_UP, Trigger.ACTIVE, lanes, releases,
            f"run time ended at {view.run_end.isoformat()} and no timer ended it; released by "
            "the sweep",
        )  # fmt: skip
    configured = tuple(seen for seen in view.lanes if seen.configured)
    if not configured:
        return _pool_removed(view, lanes)
    if view.state is S.PROVISIONING and view.mode is Mode.FLEX_START:
        if now - view.since >= settings.not_taken_after:
            configured = tuple(_not_taken(seen, settings) for seen in configured)
        step = _provisioning_flex(view, configured, now)
        if give_up_after is not None and step.target is None and now - view.since >= give_up_after:
            return Step(
                S.PENDING, SweepReason.GAVE_UP, Trigger.ACTIVE, (), releases,
                f"not served after {give_up_after} in {_pools(lanes)}; cancelled to try the "
                "request's other pools", tuple(seen.lane.pool for seen in configured),
            )  # fmt: skip
        return step
    seen = configured[0]
    if view.mode is Mode.CALENDAR:
        return _calendar(view, seen, now, settings)
    row = TABLE[(view.state, view.mode, seen.phase)]
    calls = tuple((call, seen.lane) for call in row.calls)
    target = None if row.target is view.state else row.target
    acts = target is not None or row.reason is not None or bool(calls)
    return Step(
        target, row.reason, row.trigger if acts else None, lanes, calls,
        _message(view, seen, row),
    )  # fmt: skip


def steady_until(view: SweepView, now: datetime, settings: SweepSettings) -> datetime | None:
    """The first instant after ``now`` at which :func:`sweep` may give ``view`` another step;
    None if it never will. Over ``[now, steady_until)`` the step is the one at ``now``.

    Every deadline row compares the time against one instant of the view (``now >= X``, or
    ``now - since >= d``, which is ``now >= since + d``), and no step's text reads the time, so
    the step only changes where the time crosses one of the instants its state's rows read: the
    earliest of them still ahead is the answer. The reconciler uses it to leave a live request
    whose last sweep did nothing alone until its inputs change or this instant comes; the
    property tests check it against :func:`sweep` itself.
    """
    instants: list[datetime | None] = []
    if view.mode is Mode.CALENDAR:
        instants.append(view.block_end)
        if view.state is S.PENDING:
            instants.append(view.since + settings.not_taken_after)
        elif view.state is S.BOOKED:
            instants.append(view.block_start)
    if view.state is S.ACTIVE and view.run_end is not None:
        instants.append(view.run_end + settings.grace)
    if view.state is S.PROVISIONING and view.mode is Mode.FLEX_START:
        instants += (view.since + settings.not_taken_after, view.deadline)
        if settings.give_up_after is not None:
            instants.append(view.since + settings.give_up_after)
    return min((at for at in instants if at is not None and at > now), default=None)


def _calendar(view: SweepView, seen: LaneView, now: datetime, settings: SweepSettings) -> Step:
    """A calendar block's one order: under Google's review (PENDING), booked (BOOKED), from
    its start (PROVISIONING, ACTIVE)."""
    lane = seen.lane
    lanes = (lane,)
    row = _refined(view.state, seen, TABLE[(view.state, Mode.CALENDAR, seen.phase)])
    calls = tuple((call, lane) for call in row.calls)
    if (
        view.state is S.PENDING
        and seen.phase is None
        and now - view.since >= settings.not_taken_after
    ):
        return Step(
            S.REJECTED, SweepReason.NOT_ACCEPTED, Trigger.ACTIVE, lanes, (),
            f"the cloud did not take the block in {lane.pool} within {settings.not_taken_after}",
        )  # fmt: skip
    if view.state is S.BOOKED and row.target is None:
        assert view.block_start is not None  # a booked request is a calendar block
        if now < view.block_start:
            return Step(None, None, row.trigger if calls else None, lanes, calls)
        # The block's start: its VMs consume the reservation once Google has filled it
        # (until then the PROVISIONING rows wait for it).
        if seen.phase is P.RESERVED:
            return Step(
                S.PROVISIONING, SweepReason.BLOCK_STARTED, Trigger.ACTIVE, lanes,
                ((Call.PROVISION, lane),),
                f"block started; provisioning {view.units} units in {lane.pool}",
            )  # fmt: skip
        said = f": {seen.message}" if seen.message else ""
        return Step(
            S.PROVISIONING, SweepReason.BLOCK_STARTED, Trigger.ACTIVE, lanes, (),
            f"block started; waiting for Google Cloud to fill its reservation in {lane.pool} "
            f"(it delivers a block's capacity from its start, possibly up to 24 h later){said}",
        )  # fmt: skip
    if (
        view.state is S.PROVISIONING
        and seen.phase is P.RESERVED
        and view.reason == SweepReason.BLOCK_STARTED
    ):
        # The block started before Google filled its reservation (the start's event said it
        # waits for Google): say that the wait is over, once; a repeat of the call is a repair.
        return Step(
            None, SweepReason.BLOCK_FILLED, Trigger.PASSIVE, lanes, calls,
            f"Google Cloud filled the block's reservation in {lane.pool} (the block started at "
            f"{_when(view.block_start)}); creating its {view.units} units now: a job starts "
            "once they run",
        )  # fmt: skip
    target = None if row.target is view.state else row.target
    acts = target is not None or row.reason is not None or bool(calls)
    return Step(
        target, row.reason, row.trigger if acts else None, lanes, calls,
        _message(view, seen, row),
    )  # fmt: skip


def _refined(state: RequestState, seen: LaneView, row: Row) -> Row:
    """A failed calendar order's row by the cloud's code: cancelled at Google ends in
    CANCELLED; a submitted block that failed otherwise than by a decline is refused too."""
    if seen.phase is not P.FAILED:
        return row
    if seen.error_code == CANCELLED_CODE and state in _CANCELLED_AT_GOOGLE:
        return _CANCELLED_AT_GOOGLE[state]
    if state is S.PENDING and seen.error_code != DECLINED_CODE:
        return Row(S.REJECTED, SweepReason.BLOCK_FAILED, (Call.RELEASE,), Trigger.PASSIVE)
    return row


def _provisioning_flex(view: SweepView, configured: tuple[LaneView, ...], now: datetime) -> Step:
    """A flex request's lanes combined: the first served wins; failed ones are dropped;
    max_wait ends the wait; otherwise every lane keeps its place in Google's queue."""
    every = tuple(seen.lane for seen in view.lanes)
    rows = [(seen, TABLE[(S.PROVISIONING, Mode.FLEX_START, seen.phase)]) for seen in configured]
    short = tuple(
        dict.fromkeys(
            seen.lane.pool
            for seen in configured
            if (seen.phase is P.WAITING and seen.last_attempt in STOCKOUT_CODES)
            or (seen.phase is P.FAILED and seen.error_code in _COOLS_DOWN)
        )
    )
    served = [seen for seen, row in rows if row.target is S.ACTIVE]
    if served:
        winner = served[0]  # lanes are kept in preference order: the most preferred wins a tie
        losers = tuple(lane for lane in every if lane != winner.lane)
        doubles = tuple(seen.lane for seen in served[1:])
        text = f"all {view.units} units running in {winner.lane.pool}"
        if losers:
            text += (
                "; the race's other orders are cancelled ("
                + ", ".join(lane.pool for lane in losers)
                + ")"
            )
        if doubles:
            text += (
                "; served in " + ", ".join(lane.pool for lane in doubles) + " too: that gang is "
                "released at once, and its minutes are paid for nothing"
            )
        return Step(
            S.ACTIVE, SweepReason.READY, Trigger.PASSIVE, (winner.lane,),
            tuple((Call.RELEASE, lane) for lane in losers), text, short, doubles,
        )  # fmt: skip
    ended = [seen for seen, row in rows if row.target is S.EXPIRED]
    if ended:
        return Step(
            S.EXPIRED, SweepReason.CAPACITY_ENDED, Trigger.PASSIVE, every,
            tuple((Call.RELEASE, lane) for lane in every),
            "the cloud ended the capacity before it was seen running", short,
        )  # fmt: skip
    if view.deadline is not None and now >= view.deadline:
        return Step(
            S.TIMED_OUT, Expiry.MAX_WAIT_PASSED, Trigger.ACTIVE, every,
            tuple((Call.RELEASE, lane) for lane in every),
            f"max_wait passed at {view.deadline.isoformat()} while waiting for Google Cloud "
            f"in {_pools(every)}; every order it had queued is cancelled", short,
        )  # fmt: skip
    failed = [seen for seen, row in rows if row.target is S.PENDING]
    failed_lanes = {seen.lane for seen in failed}
    kept = tuple(seen for seen in configured if seen.lane not in failed_lanes)
    dropped = tuple((Call.RELEASE, seen.lane) for seen in failed)
    failure = "; ".join(_failure(seen) for seen in failed)
    if not kept:
        return Step(
            S.PENDING, SweepReason.PROVISIONING_FAILED, Trigger.PASSIVE, (), dropped,
            failure + "; trying the request's other pools", short,
        )  # fmt: skip
    repairs = tuple(
        (call, seen.lane)
        for seen, row in rows
        if seen.lane not in failed_lanes
        for call in row.calls
    )
    waiting = [seen for seen in kept if seen.phase is P.WAITING and seen.last_attempt]
    reason: SweepReason | Expiry | None = None
    message = ""
    if failed:
        reason, message = (
            SweepReason.PROVISIONING_FAILED,
            failure + "; still racing in " + (_pools(tuple(seen.lane for seen in kept))),
        )
    elif waiting and not view.waiting_told:
        reason = SweepReason.WAITING_FOR_CAPACITY
        message = "; ".join(
            f"waiting for Google Cloud in {seen.lane.pool} since {view.since.isoformat()}, "
            f"last attempt: {seen.last_attempt}"
            for seen in waiting
        )
    trigger = Trigger.PASSIVE if reason is not None else Trigger.REPAIR if repairs else None
    return Step(
        None, reason, trigger, tuple(seen.lane for seen in kept), (*dropped, *repairs), message,
        short,
    )  # fmt: skip


def _not_taken(seen: LaneView, settings: SweepSettings) -> LaneView:
    """A lane with nothing under its name after the deadline counts as failed."""
    if seen.phase is not None:
        return seen
    return LaneView(
        lane=seen.lane, configured=seen.configured, phase=P.FAILED, error_code=NOT_ACCEPTED,
        message=f"the cloud did not take the order within {settings.not_taken_after}",
    )  # fmt: skip


def _pool_removed(view: SweepView, lanes: tuple[Lane, ...]) -> Step:
    text = f"pool {_pools(lanes)} is no longer configured"
    if view.state is S.PROVISIONING and view.mode is Mode.FLEX_START:
        return Step(S.PENDING, SweepReason.POOL_REMOVED, Trigger.PASSIVE, (), (),
                    text + "; waiting again")  # fmt: skip
    if view.state is S.PENDING:  # a calendar block under Google's review
        return Step(S.REJECTED, SweepReason.POOL_REMOVED, Trigger.PASSIVE, lanes, (),
                    text + "; refused")  # fmt: skip
    return Step(S.EXPIRED, SweepReason.POOL_REMOVED, Trigger.PASSIVE, lanes, (), text + "; ended")


def _message(view: SweepView, seen: LaneView, row: Row) -> str:
    match row.reason:
        case SweepReason.READY:
            return f"all {view.units} units running in {seen.lane.pool}"
        case SweepReason.CAPACITY_ENDED:
            if view.state is S.ACTIVE:
                return "the cloud ended the run" + (f": {seen.message}" if seen.message else "")
            return "the cloud ended the capacity before it was seen running"
        case SweepReason.PROVISIONING_FAILED:
            return _failure(seen) + "; retrying"
        case SweepReason.APPROVED:
            return (
                f"Google Cloud approved the block in {seen.lane.pool}: {view.units} units from "
                f"{_when(view.block_start)} to {_when(view.block_end)}"
            )
        case SweepReason.DECLINED:
            return "Google Cloud declined the block" + (f": {seen.message}" if seen.message else "")
        case SweepReason.BLOCK_FAILED:
            return f"Google Cloud could not deliver the block: {_failure(seen)}"
        case SweepReason.CANCELLED_AT_GOOGLE:
            return "the block was cancelled at Google Cloud"
        case SweepReason.BLOCK_ENDED:
            return "the block's time window is over"
        case _:
            return ""


def _when(at: datetime | None) -> str:
    return "?" if at is None else at.isoformat()


def _failure(seen: LaneView) -> str:
    text = f"attempt {seen.lane.attempt} in {seen.lane.pool} failed: {seen.error_code or 'UNKNOWN'}"
    return text + (f" ({seen.message})" if seen.message else "")


def _pools(lanes: tuple[Lane, ...]) -> str:
    return ", ".join(lane.pool for lane in lanes)
