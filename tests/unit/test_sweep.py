"""The sweep table (``opendws.domain.sweep``): one row per (state, observed phase), and the
rules that combine the lanes of a racing request. Pure: no fakes, no clock.

Google's behaviour the rows rest on (../shared/GOOGLE-SEMANTICS.md):
- a resize request short of capacity stays ACCEPTED, with the temporary error in
  ``status.lastAttempt``; only ``status.error`` is final (compute.proto
  ``InstanceGroupManagerResizeRequestStatus``; compute/docs/instance-groups/
  about-resize-requests-mig: "the MIG schedules VM creation as soon as resources are
  available") — so WAITING is never a failure and is not cancelled;
- Google serves its queue first come first served: a cancelled request loses its place, so
  there is no provisioning timeout (cluster-toolkit waits up to 65,535 s for flex partitions,
  ``schedmd-slurm-gcp-v6-partition/main.tf``).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from opendws.domain.model import Mode
from opendws.domain.provisioning import Lane, ProvisionPhase
from opendws.domain.reasons import Expiry
from opendws.domain.states import RequestState
from opendws.domain.sweep import (
    STOCKOUT_CODES,
    TABLE,
    Call,
    LaneView,
    SweepReason,
    SweepSettings,
    SweepView,
    Trigger,
    sweep,
)
from tests.builders import NOW

S = RequestState
P = ProvisionPhase
R = SweepReason
GRACE = SweepSettings()
A, B, C = "us-central1-a/a3", "us-central1-b/a3", "us-central1-c/a3"
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"


def seen(
    pool: str = A, attempt: int = 1, phase: ProvisionPhase | None = P.CREATING, *,
    last_attempt: str | None = None, error: str | None = None, configured: bool = True,
) -> LaneView:  # fmt: skip
    return LaneView(
        lane=Lane(pool, attempt), configured=configured, phase=phase, error_code=error,
        last_attempt=last_attempt,
    )  # fmt: skip


def view(
    state: RequestState, *lanes: LaneView, mode: Mode = Mode.FLEX_START, reason: str | None = None,
    deadline: datetime | None = NOW + timedelta(days=1), run_end: datetime | None = None,
    block: tuple[datetime, datetime] | None = None,
) -> SweepView:  # fmt: skip
    return SweepView(
        state=state, mode=mode, lanes=lanes or (seen(),), units=2, since=NOW,
        reason=reason, deadline=deadline if mode is Mode.FLEX_START else None,
        run_end=run_end, block_start=None if block is None else block[0],
        block_end=None if block is None else block[1],
    )  # fmt: skip


# One row per (state, phase) of a single order: target, reason, calls, trigger.
SINGLE = [
    # state, mode, phase → target, reason, calls, trigger
    (S.PROVISIONING, Mode.FLEX_START, P.READY, S.ACTIVE, R.READY, (), Trigger.PASSIVE),
    (S.PROVISIONING, Mode.FLEX_START, P.CREATING, None, None, (), None),
    (S.PROVISIONING, Mode.FLEX_START, P.FAILED, S.PENDING, R.PROVISIONING_FAILED,
     (Call.RELEASE,), Trigger.PASSIVE),
    (S.PROVISIONING, Mode.FLEX_START, P.ENDED, S.EXPIRED, R.CAPACITY_ENDED, (Call.RELEASE,),
     Trigger.PASSIVE),
    (S.PROVISIONING, Mode.FLEX_START, None, None, None, (Call.PROVISION,), Trigger.REPAIR),
    (S.ACTIVE, Mode.FLEX_START, P.READY, None, None, (), None),
    (S.ACTIVE, Mode.FLEX_START, P.ENDED, S.EXPIRED, R.CAPACITY_ENDED, (Call.RELEASE,),
     Trigger.PASSIVE),
    (S.ACTIVE, Mode.FLEX_START, None, S.EXPIRED, R.CAPACITY_ENDED, (Call.RELEASE,),
     Trigger.PASSIVE),
    # Calendar blocks (compute/docs/instances/future-reservations-calendar-mode-overview:
    # PENDING_APPROVAL → APPROVED or DECLINED → PROVISIONING → FULFILLED around the start).
    (S.PROVISIONING, Mode.CALENDAR, P.READY, S.ACTIVE, R.READY, (), Trigger.PASSIVE),
    (S.PROVISIONING, Mode.CALENDAR, P.RESERVED, None, None, (Call.PROVISION,), Trigger.REPAIR),
    # Google creates the reservation up to 24 h after the start: wait for it.
    (S.PROVISIONING, Mode.CALENDAR, P.APPROVED, None, None, (), None),
    (S.PROVISIONING, Mode.CALENDAR, P.FAILED, S.EXPIRED, R.BLOCK_FAILED, (Call.RELEASE,),
     Trigger.PASSIVE),
    (S.PROVISIONING, Mode.CALENDAR, None, S.EXPIRED, R.CAPACITY_ENDED, (), Trigger.PASSIVE),
    # Under Google's review (PENDING with its order).
    (S.PENDING, Mode.CALENDAR, P.REVIEW, None, None, (), None),
    (S.PENDING, Mode.CALENDAR, P.APPROVED, S.BOOKED, R.APPROVED, (), Trigger.PASSIVE),
    (S.PENDING, Mode.CALENDAR, P.RESERVED, S.BOOKED, R.APPROVED, (), Trigger.PASSIVE),
    (S.PENDING, Mode.CALENDAR, None, None, None, (Call.RESERVE,), Trigger.REPAIR),
    (S.BOOKED, Mode.CALENDAR, P.APPROVED, None, None, (), None),
    (S.BOOKED, Mode.CALENDAR, P.RESERVED, None, None, (), None),
    (S.BOOKED, Mode.CALENDAR, P.FAILED, S.EXPIRED, R.BLOCK_FAILED, (Call.RELEASE,),
     Trigger.PASSIVE),
    # A booking is not repaired by submitting again: that would be a new review.
    (S.BOOKED, Mode.CALENDAR, None, S.EXPIRED, R.CAPACITY_ENDED, (), Trigger.PASSIVE),
]  # fmt: skip


@pytest.mark.parametrize(("state", "mode", "phase", "target", "reason", "calls", "trigger"), SINGLE)
def test_one_order_follows_its_row(
    state: RequestState, mode: Mode, phase: ProvisionPhase | None, target: RequestState | None,
    reason: SweepReason | None, calls: tuple[Call, ...], trigger: Trigger | None,
) -> None:  # fmt: skip
    block = (NOW + timedelta(days=1), NOW + timedelta(days=2)) if mode is Mode.CALENDAR else None
    step = sweep(view(state, seen(phase=phase), mode=mode, block=block), NOW, GRACE)
    assert (step.target, step.reason, step.trigger) == (target, reason, trigger)
    assert step.calls == tuple((call, Lane(A, 1)) for call in calls)


def test_the_table_covers_every_live_state_and_phase_of_its_mode() -> None:
    """Every (state, phase) a live request can meet has a row: nothing falls through."""
    phases: list[ProvisionPhase | None] = [*ProvisionPhase, None]
    for state, mode in [
        (S.PROVISIONING, Mode.FLEX_START), (S.PROVISIONING, Mode.CALENDAR),
        (S.ACTIVE, Mode.FLEX_START), (S.ACTIVE, Mode.CALENDAR), (S.BOOKED, Mode.CALENDAR),
        (S.PENDING, Mode.CALENDAR),
    ]:  # fmt: skip
        for phase in phases:
            assert (state, mode, phase) in TABLE, (state, mode, phase)


def test_an_order_waiting_at_google_keeps_its_place_and_marks_its_pool_short() -> None:
    """A stockout in Google's last attempt is not a failure: nothing is cancelled, the event
    says where it waits since when and what Google's last attempt said, once."""
    waiting = seen(phase=P.WAITING, last_attempt=STOCKOUT)
    step = sweep(view(S.PROVISIONING, waiting), NOW, GRACE)
    assert (step.target, step.reason, step.calls) == (None, R.WAITING_FOR_CAPACITY, ())
    assert step.short == (A,)
    assert f"waiting for Google Cloud in {A} since" in step.message
    assert f"last attempt: {STOCKOUT}" in step.message
    told = replace(view(S.PROVISIONING, waiting), waiting_told=True)
    again = sweep(told, NOW, GRACE)
    assert (again.target, again.reason, again.calls, again.short) == (None, None, (), (A,))


def test_an_order_waits_hours_without_a_timeout_until_max_wait() -> None:
    waiting = seen(phase=P.WAITING, last_attempt=STOCKOUT)
    later = NOW + timedelta(hours=20)
    step = sweep(view(S.PROVISIONING, waiting, deadline=NOW + timedelta(days=1)), later, GRACE)
    assert step.target is None
    assert step.calls == ()


def test_max_wait_passing_cancels_every_order_it_had_queued() -> None:
    lanes = (seen(A, 1, P.WAITING, last_attempt=STOCKOUT), seen(B, 2, P.CREATING))
    step = sweep(view(S.PROVISIONING, *lanes, deadline=NOW), NOW, GRACE)
    assert (step.target, step.reason, step.trigger) == (S.TIMED_OUT, Expiry.MAX_WAIT_PASSED,
                                                       Trigger.ACTIVE)  # fmt: skip
    assert step.calls == ((Call.RELEASE, Lane(A, 1)), (Call.RELEASE, Lane(B, 2)))


def test_the_first_lane_served_wins_and_the_others_are_cancelled_in_the_same_step() -> None:
    lanes = (seen(A, 1, P.WAITING, last_attempt=STOCKOUT), seen(B, 2, P.WAITING),
             seen(C, 3, P.READY))  # fmt: skip
    step = sweep(view(S.PROVISIONING, *lanes), NOW, GRACE)
    assert (step.target, step.reason, step.lanes) == (S.ACTIVE, R.READY, (Lane(C, 3),))
    assert step.calls == ((Call.RELEASE, Lane(A, 1)), (Call.RELEASE, Lane(B, 2)))
    assert step.double_wins == ()
    assert f"running in {C}" in step.message


def test_two_lanes_served_together_keep_one_gang_and_report_the_other() -> None:
    """The most preferred served lane wins; the other gang is released in the same step and
    named as a double win (its minutes are paid for nothing)."""
    lanes = (seen(A, 1, P.READY), seen(B, 2, P.READY))
    step = sweep(view(S.PROVISIONING, *lanes), NOW, GRACE)
    assert step.lanes == (Lane(A, 1),)
    assert step.calls == ((Call.RELEASE, Lane(B, 2)),)
    assert step.double_wins == (Lane(B, 2),)
    assert "paid for nothing" in step.message


def test_a_failed_lane_is_dropped_while_others_still_race() -> None:
    lanes = (seen(A, 1, P.FAILED, error="RESOURCE_OPERATION_RATE_EXCEEDED"),
             seen(B, 2, P.WAITING))  # fmt: skip
    step = sweep(view(S.PROVISIONING, *lanes), NOW, GRACE)
    assert (step.target, step.reason, step.lanes) == (None, R.PROVISIONING_FAILED, (Lane(B, 2),))
    assert step.calls == ((Call.RELEASE, Lane(A, 1)),)


def test_with_every_lane_failed_the_request_goes_back_in_line() -> None:
    lanes = (seen(A, 1, P.FAILED, error="X"), seen(B, 2, P.FAILED, error="Y"))
    step = sweep(view(S.PROVISIONING, *lanes), NOW, GRACE)
    assert (step.target, step.reason, step.lanes) == (S.PENDING, R.PROVISIONING_FAILED, ())
    assert [call for call, _ in step.calls] == [Call.RELEASE, Call.RELEASE]


def test_a_lane_never_created_is_created_again_while_the_others_wait() -> None:
    lanes = (seen(A, 1, P.WAITING), seen(B, 2, None))
    step = sweep(view(S.PROVISIONING, *lanes), NOW, GRACE)
    assert step.target is None
    assert step.trigger is Trigger.REPAIR
    assert step.calls == ((Call.PROVISION, Lane(B, 2)),)


def test_a_run_past_its_end_is_released_by_the_sweep_after_the_grace() -> None:
    end = NOW - timedelta(seconds=30)
    assert sweep(view(S.ACTIVE, seen(phase=P.READY), run_end=end), NOW, GRACE).target is None
    assert GRACE.grace == timedelta(minutes=1)
    late = NOW + timedelta(minutes=1)
    step = sweep(view(S.ACTIVE, seen(phase=P.READY), run_end=end), late, GRACE)
    expected = (S.EXPIRED, Expiry.RUN_TIME_UP, Trigger.ACTIVE)
    assert (step.target, step.reason, step.trigger) == expected


def test_a_block_starts_and_ends_on_time() -> None:
    block = (NOW, NOW + timedelta(days=1))
    start = sweep(view(S.BOOKED, seen(phase=P.RESERVED), mode=Mode.CALENDAR, block=block), NOW,
                  GRACE)  # fmt: skip
    assert (start.target, start.reason) == (S.PROVISIONING, R.BLOCK_STARTED)
    assert start.calls == ((Call.PROVISION, Lane(A, 1)),)
    end = sweep(view(S.ACTIVE, seen(phase=P.READY), mode=Mode.CALENDAR, block=block),
                block[1], GRACE)  # fmt: skip
    assert (end.target, end.reason, end.calls) == (
        S.EXPIRED, R.BLOCK_ENDED, ((Call.RELEASE, Lane(A, 1)),),
    )  # fmt: skip


def test_a_block_starting_before_google_filled_its_reservation_waits_for_it() -> None:
    """Google creates the auto-created reservation at approval, empty, and provisions the
    capacity into it from the start, PROVISIONING for up to 24 h after it
    (compute/docs/hpc/reserve-capacity-account-team;
    compute/docs/instances/future-reservations-calendar-mode-overview): no VM is asked for
    until the reservation is filled."""
    block = (NOW, NOW + timedelta(days=1))
    start = sweep(view(S.BOOKED, seen(phase=P.APPROVED), mode=Mode.CALENDAR, block=block), NOW,
                  GRACE)  # fmt: skip
    assert (start.target, start.reason, start.calls) == (S.PROVISIONING, R.BLOCK_STARTED, ())
    assert "waiting for Google Cloud to fill its reservation" in start.message
    later = sweep(view(S.PROVISIONING, seen(phase=P.RESERVED), mode=Mode.CALENDAR, block=block),
                  NOW + timedelta(hours=3), GRACE)  # fmt: skip
    assert later.calls == ((Call.PROVISION, Lane(A, 1)),)


def test_a_declined_block_is_refused_and_its_request_deleted() -> None:
    """procurementStatus DECLINED (compute/docs/instances/future-reservations-calendar-mode-
    overview): the block is refused; the declined request may be deleted."""
    block = (NOW + timedelta(days=5), NOW + timedelta(days=6))
    declined = seen(phase=P.FAILED, error="DECLINED")
    step = sweep(view(S.PENDING, declined, mode=Mode.CALENDAR, block=block), NOW, GRACE)
    assert (step.target, step.reason) == (S.REJECTED, R.DECLINED)
    assert step.calls == ((Call.RELEASE, Lane(A, 1)),)
    assert step.message.startswith("Google Cloud declined the block")


def test_a_block_cancelled_at_google_ends_cancelled_whether_booked_or_in_review() -> None:
    """A cancel that reached Google before its write (a crash in between) is completed."""
    block = (NOW + timedelta(days=40), NOW + timedelta(days=41))
    cancelled = seen(phase=P.FAILED, error="CANCELLED")
    for state in (S.PENDING, S.BOOKED):
        step = sweep(view(state, cancelled, mode=Mode.CALENDAR, block=block), NOW, GRACE)
        assert (step.target, step.reason) == (S.CANCELLED, R.CANCELLED_AT_GOOGLE), state


def test_a_block_the_cloud_never_took_is_refused_after_the_deadline() -> None:
    block = (NOW + timedelta(days=5), NOW + timedelta(days=6))
    missing = view(S.PENDING, seen(phase=None), mode=Mode.CALENDAR, block=block)
    assert sweep(missing, NOW, GRACE).calls == ((Call.RESERVE, Lane(A, 1)),)
    late = sweep(missing, NOW + GRACE.not_taken_after, GRACE)
    assert (late.target, late.reason, late.calls) == (S.REJECTED, R.NOT_ACCEPTED, ())


def test_a_block_still_in_review_at_its_end_is_refused() -> None:
    block = (NOW - timedelta(days=1), NOW)
    step = sweep(view(S.PENDING, seen(phase=P.REVIEW), mode=Mode.CALENDAR, block=block), NOW,
                 GRACE)  # fmt: skip
    assert (step.target, step.reason) == (S.REJECTED, R.BLOCK_ENDED)


def test_a_lane_in_a_pool_no_longer_configured_sends_the_request_back_in_line() -> None:
    step = sweep(view(S.PROVISIONING, seen(configured=False)), NOW, GRACE)
    assert (step.target, step.reason) == (S.PENDING, R.POOL_REMOVED)
    active = sweep(view(S.ACTIVE, seen(phase=P.READY, configured=False)), NOW, GRACE)
    assert (active.target, active.reason) == (S.EXPIRED, R.POOL_REMOVED)


def test_stockout_codes_are_the_ones_google_reports() -> None:
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in STOCKOUT_CODES
    assert "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS" in STOCKOUT_CODES


def test_giving_up_after_a_while_is_an_option_that_is_off_by_default() -> None:
    """The old cancel-and-retry (kept to compare against): off, an order waits; on, an order
    not served after that long is cancelled, its pool marked short, the request back in line."""
    waiting = seen(phase=P.WAITING, last_attempt=STOCKOUT)
    later = NOW + timedelta(minutes=30)
    kept = sweep(replace(view(S.PROVISIONING, waiting), waiting_told=True), later, GRACE)
    assert kept.target is None
    step = sweep(
        view(S.PROVISIONING, waiting), later, SweepSettings(give_up_after=timedelta(minutes=15))
    )
    assert (step.target, step.reason, step.short) == (S.PENDING, R.GAVE_UP, (A,))
    assert step.calls == ((Call.RELEASE, Lane(A, 1)),)


def test_an_order_the_cloud_never_took_is_dropped_after_a_while() -> None:
    """Nothing exists under its name (every create call was refused): there is no place in
    Google's queue to keep, so after ``not_taken_after`` the lane is dropped like a failure."""
    never = seen(phase=None)
    early = sweep(view(S.PROVISIONING, never), NOW, GRACE)
    assert (early.target, early.calls) == (None, ((Call.PROVISION, Lane(A, 1)),))
    late = sweep(view(S.PROVISIONING, never), NOW + timedelta(minutes=15), GRACE)
    assert (late.target, late.reason) == (S.PENDING, R.PROVISIONING_FAILED)
    assert "NOT_ACCEPTED" in late.message
