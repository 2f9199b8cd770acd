"""The incremental planner: which changes it applies without a full pass, and which make it
plan in full (its decisions are compared with ``admit`` on random change sequences in
tests/property/test_incremental_properties.py). The counts of a pass's work (``walked``,
``searched``, ``tested``) are upper bounds: they say the planner does no more than so much for
a change, not how it goes about it."""

from __future__ import annotations

import copy
import functools
import pickle
from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from opendws.domain import Outcome, Snapshot, admit
from opendws.domain.model import (
    CapacityRequest,
    Commitment,
    Grant,
    PolicySettings,
    QueueingStrategy,
)
from opendws.domain.planner.incremental.planner import (
    COMMITMENTS_HELD,
    PLAN_FAILED,
    IncrementalPlanner,
)
from opendws.domain.planner.verdicts import Reason
from opendws.domain.policy import flex_key
from tests.builders import (
    A3,
    DAY,
    HOUR,
    MINUTE,
    NOW,
    ZONE,
    calendar,
    flex,
    grant,
    grant_of,
    pool,
    quota,
    tenant,
)
from tests.builders import snapshot as build_snapshot
from tests.property.test_admission_properties import applied


def busy() -> Snapshot:
    """One pool of 8 VMs, half of it running for two hours, and a queue behind it."""
    return build_snapshot(
        pools=[pool(capacity=8)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=[grant("g1", units=4, start_at=NOW - HOUR, hours=3)],
        pending=[flex(f"r{index}", vm_count=2 + index % 3, hours=1 + index) for index in range(8)],
    )


def test_an_arrival_is_planned_incrementally_with_the_same_plan() -> None:
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    assert planner.plan(first, NOW) == admit(first, NOW)
    assert planner.last_pass.full
    second = replace(first, pending=(*first.pending, flex("late", vm_count=1, hours=1)))
    assert planner.plan(second, NOW) == admit(second, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.walked >= 1


def test_a_release_moves_the_held_slots_earlier_as_a_full_plan_does() -> None:
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    before = planner.plan(first, NOW)
    released = replace(first, grants=())
    after = planner.plan(released, NOW)
    assert after == admit(released, NOW)
    assert not planner.last_pass.full
    assert len(after.having(Outcome.ADMIT)) > len(before.having(Outcome.ADMIT))


def test_a_departure_is_planned_incrementally() -> None:
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    planner.plan(first, NOW)
    fewer = replace(first, pending=first.pending[1:])
    assert planner.plan(fewer, NOW) == admit(fewer, NOW)
    assert not planner.last_pass.full


def test_an_admission_carried_out_is_planned_incrementally() -> None:
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    plan = planner.plan(first, NOW)
    carried = applied(first, plan)
    assert planner.plan(carried, NOW) == admit(carried, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.searched <= 0  # every grant holds the slot its request took


def test_a_new_grant_elsewhere_is_planned_incrementally() -> None:
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    planner.plan(first, NOW)
    more = replace(first, grants=(*first.grants, grant("g2", units=2, start_at=NOW + HOUR)))
    assert planner.plan(more, NOW) == admit(more, NOW)
    assert not planner.last_pass.full


def test_a_plan_that_raises_part_way_forgets_what_it_kept_and_the_next_is_full() -> None:
    """A plan that raises part-way may have updated some of what the planner keeps and not the
    rest: the planner forgets all of it, so the next plan is full, says why, and is admit's.
    Here the clock has moved (every kept slot with it) when an arrival without a max_wait
    (no validated flex request lacks one: it is set past validation) fails the planner's own
    check; the same data makes a plain and a compiled planner raise alike."""
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    planner.plan(first, NOW)
    broken = flex("broken", vm_count=1, hours=1)
    object.__setattr__(broken, "max_wait", None)
    later = NOW + 2 * MINUTE
    with pytest.raises(AssertionError):
        planner.plan(replace(first, pending=(*first.pending, broken)), later)
    assert planner.plans == 1
    again = replace(first, pending=(*first.pending, flex("late", vm_count=1, hours=1)))
    assert planner.plan(again, later) == admit(again, later)
    assert planner.last_pass.full
    assert planner.last_pass.why == PLAN_FAILED
    fewer = replace(again, pending=again.pending[1:])
    assert planner.plan(fewer, later) == admit(fewer, later)
    assert not planner.last_pass.full  # and the one after goes on from it


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_planner_refuses_to_be_copied_and_says_so(how: str) -> None:
    """A planner's state is one graph of entries, indexes and a grid that refer to each other
    and to the snapshot it last read: it is not copied (a copy would also differ between the
    compiled build and plain Python), and says what to do instead."""
    planner = IncrementalPlanner(clock_floor=0)
    planner.plan(busy(), NOW)
    with pytest.raises(TypeError, match="IncrementalPlanner is not copied or pickled"):
        copy.deepcopy(planner) if how == "deepcopy" else pickle.dumps(planner)
    more = replace(busy(), pending=(*busy().pending, flex("late", vm_count=1, hours=1)))
    assert planner.plan(more, NOW) == admit(more, NOW)  # the planner itself goes on


def test_an_equal_request_read_again_is_no_change() -> None:
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    planner.plan(first, NOW)
    again = replace(first, pending=tuple(replace(request) for request in first.pending))
    assert planner.plan(again, NOW) == admit(again, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.walked <= 0


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda s: s, "the clock went back"),
        (lambda s: replace(s, pools=(pool(capacity=9),)), "the pools changed"),
        (lambda s: replace(s, policy=PolicySettings(race_width=1)), "the policy changed"),
    ],
)
def test_broad_changes_plan_in_full_and_say_why(change: object, why: str) -> None:
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    planner.plan(first, NOW)
    assert callable(change)
    changed: Snapshot = change(first)
    now = NOW - MINUTE if why == "the clock went back" else NOW
    assert planner.plan(changed, now) == admit(changed, now)
    assert planner.last_pass.full
    assert planner.last_pass.why.startswith(why)


def two_queues() -> Snapshot:
    """Two pools of 4 VMs in two zones, each with a queue of 100 one-VM requests of an hour
    held one after another; the tenant's quota never binds."""
    zones = (ZONE, "us-central1-b")
    return build_snapshot(
        pools=[pool(zone=zone, capacity=4) for zone in zones],
        tenants=[tenant("t", quota(nominal=100_000))],
        pending=[
            flex(f"{zone}-{index:03d}", vm_count=4, hours=1, locations=(zone,), max_wait=7 * DAY)
            for zone in zones
            for index in range(100)
        ],
    )


def test_an_arrival_behind_a_long_queue_visits_only_itself() -> None:
    """The walk visits the requests on rows the change reaches, not the queue behind the
    first one it reaches: the last of 201 in policy order is searched alone."""
    planner = IncrementalPlanner(clock_floor=0)
    first = two_queues()
    planner.plan(first, NOW)
    late = flex("late", vm_count=4, hours=3, locations=("us-central1-b",), max_wait=6 * DAY)
    second = replace(first, pending=(*first.pending, late))
    plan = planner.plan(second, NOW)
    assert plan == admit(second, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.walked <= 1
    assert planner.last_pass.searched <= 1
    assert plan.rank("late") == 201


def test_an_arrival_at_the_front_moves_ranks_without_rewriting_decisions() -> None:
    """A small request at the front of a queue whose pool has room for it now changes no one's
    slot: every rank behind it moves by one (the plan's order), every other decision is the
    very one the last pass made, and none of the other pool's requests is visited."""
    planner = IncrementalPlanner(clock_floor=0)
    roomy = replace(two_queues(), grants=())
    first = replace(
        roomy, pools=(pool(zone=ZONE, capacity=4), pool(zone="us-central1-b", capacity=5))
    )
    before = planner.plan(first, NOW)
    urgent = flex("urgent", vm_count=1, hours=1, locations=("us-central1-b",), priority=1)
    second = replace(first, pending=(urgent, *first.pending))
    after = planner.plan(second, NOW)
    assert after == admit(second, NOW)
    assert not planner.last_pass.full
    assert after.rank("urgent") == 1
    assert after.decision("urgent").outcome is Outcome.ADMIT
    for decision in before.decisions:
        assert after.decision(decision.request_id) is decision
        assert after.rank(decision.request_id) == (before.rank(decision.request_id) or 0) + 1
    assert planner.last_pass.walked <= 101  # the arrival and its own pool's queue
    assert planner.last_pass.searched <= 1


def test_a_release_searches_only_requests_that_could_use_what_it_frees() -> None:
    """A one-VM run that ends early frees one VM for its last two hours. The two four-VM
    requests whose slots lie in those hours see it only inside their own slots (the first
    starts now; the second, an hour later, would need the four VMs the first holds to start
    sooner), and the 98 queued behind them never see it: each takes its slot again without a
    search, and the plan is still the full one."""
    planner = IncrementalPlanner(clock_floor=0)
    first = replace(
        two_queues(),
        pools=(pool(zone=ZONE, capacity=5), pool(zone="us-central1-b", capacity=4)),
        grants=(grant("small", units=1, start_at=NOW - HOUR, hours=3),),
    )
    planner.plan(first, NOW)
    second = replace(first, grants=())
    assert planner.plan(second, NOW) == admit(second, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.walked <= 100
    assert planner.last_pass.searched <= 0


def test_a_release_searches_the_requests_it_lets_start_sooner() -> None:
    """A four-VM run that ends two hours early lets the queue of its pool (four-VM requests
    held one after another from then) start two hours sooner: each is searched and moves."""
    planner = IncrementalPlanner(clock_floor=0)
    first = replace(
        two_queues(),
        pools=(pool(zone=ZONE, capacity=5), pool(zone="us-central1-b", capacity=4)),
        grants=(grant("big", units=4, start_at=NOW - HOUR, hours=3),),
    )
    before = planner.plan(first, NOW)
    second = replace(first, grants=())
    after = planner.plan(second, NOW)
    assert after == admit(second, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.walked <= 100
    assert planner.last_pass.searched <= 100
    # The first two are tested (is the slot still the earliest?) and move; from then on, each
    # request of the pool is searched at once: its pool's queue is moving.
    assert planner.last_pass.tested <= 2
    queued = before.decision(f"{ZONE}-001")
    assert queued.start_at == NOW + 3 * HOUR
    assert after.decision(f"{ZONE}-001").start_at == NOW + HOUR


def behind_a_run_beside_a_quota(pending: list[CapacityRequest]) -> Snapshot:
    """Two pools of 4 VMs: a four-VM run holds the first until two hours from now (``big``,
    the first grant); tenant ``t``'s quota never binds, and ``t2``'s (32 GPUs, one four-VM
    run) is all in use in the other zone for twenty hours."""
    other = "us-central1-b"
    return build_snapshot(
        pools=[pool(capacity=4), pool(zone=other, capacity=4)],
        tenants=[tenant("t", quota(nominal=100_000)), tenant("t2", quota(nominal=32))],
        grants=[
            grant("big", units=4, start_at=NOW - HOUR, hours=3),
            grant("elsewhere", tenant="t2", pool_id=f"{other}/{A3}", units=4, hours=20),
        ],
        pending=pending,
    )


def test_a_pool_whose_queue_stops_moving_is_tested_again() -> None:
    """A release moves ten requests of one tenant two hours earlier, each searched at once
    after the first two (tested first, then searched); the next request of the pool, another
    tenant's held by its quota until the twentieth hour, is searched at once too and stays;
    the two behind it are tested again first, and stand without a search."""
    queue = [
        flex(f"r{index}", vm_count=4, hours=1, submitted_at=NOW - HOUR, max_wait=7 * DAY)
        for index in range(10)
    ]
    quota_bound = [
        flex(f"q{index}", tenant="t2", vm_count=4, hours=1, max_wait=7 * DAY) for index in range(3)
    ]
    first = behind_a_run_beside_a_quota([*queue, *quota_bound])
    planner = IncrementalPlanner(clock_floor=0)
    before = planner.plan(first, NOW)
    second = replace(first, grants=first.grants[1:])
    after = planner.plan(second, NOW)
    assert after == admit(second, NOW)
    assert not planner.last_pass.full
    report = planner.last_pass
    assert report.walked <= 13
    assert report.searched <= 11
    assert report.tested <= 4
    assert before.decision("r9").start_at == NOW + 11 * HOUR
    assert after.decision("r9").start_at == NOW + 9 * HOUR
    for index in range(3):
        assert after.decision(f"q{index}").start_at == NOW + (20 + index) * HOUR
        assert before.decision(f"q{index}").start_at == NOW + (20 + index) * HOUR


def test_a_request_that_stands_breaks_a_pool_s_run_of_moves() -> None:
    """A release lets r0 start two hours sooner; q0, next in the pool, is held by its tenant's
    quota and stands; r1 and r2 then move one after the other. Only two moves in a row make
    the walk search the next request of the pool at once: q0's standing broke the run, so
    all four are tested first."""
    pending = [
        flex("r0", vm_count=4, hours=1, submitted_at=NOW - 3 * HOUR, max_wait=7 * DAY),
        flex("q0", tenant="t2", vm_count=4, hours=1, submitted_at=NOW - 2 * HOUR),
        *(
            flex(f"r{index}", vm_count=4, hours=1, submitted_at=NOW - HOUR, max_wait=7 * DAY)
            for index in (1, 2)
        ),
    ]
    first = behind_a_run_beside_a_quota(pending)
    planner = IncrementalPlanner(clock_floor=0)
    planner.plan(first, NOW)
    second = replace(first, grants=first.grants[1:])
    after = planner.plan(second, NOW)
    assert after == admit(second, NOW)
    assert after.order == ("r0", "q0", "r1", "r2")
    assert [after.decision(key).start_at for key in ("r0", "r1", "r2")] == [
        NOW,
        NOW + HOUR,
        NOW + 2 * HOUR,
    ]
    report = planner.last_pass
    assert report.walked <= 4
    assert report.searched <= 3
    assert report.tested <= 4


def test_a_release_lets_a_request_start_the_minute_before_its_slot() -> None:
    """A booked minute that ends the pool's busy stretch is released: the queue's first
    request, held from the minute after it, starts a minute sooner (a search must try the
    start just before a slot, not only those a whole cell further back)."""
    planner = IncrementalPlanner(clock_floor=0)
    first = replace(
        two_queues(),
        grants=(
            grant("running", units=4, start_at=NOW - HOUR, end_at=NOW + 59 * MINUTE),
            grant("booked", units=4, start_at=NOW + 59 * MINUTE, end_at=NOW + HOUR),
        ),
    )
    before = planner.plan(first, NOW)
    assert before.decision(f"{ZONE}-000").start_at == NOW + HOUR
    second = replace(first, grants=first.grants[:1])
    after = planner.plan(second, NOW)
    assert after == admit(second, NOW)
    assert not planner.last_pass.full
    assert after.decision(f"{ZONE}-000").start_at == NOW + 59 * MINUTE


OTHER_ZONE = "us-central1-b"


def quota_in_use_elsewhere(*, until: datetime) -> Grant:
    """Tenant ``a``'s whole quota (32 H100s, 4 VMs) held by a run in the other zone's pool,
    started an hour ago, until ``until``: ``a`` waits for quota in the first pool, not room."""
    return grant(
        "ga",
        tenant="a",
        pool_id=f"{OTHER_ZONE}/{A3}",
        units=4,
        accelerator_units=32,
        start_at=NOW - HOUR,
        end_at=until,
    )


def test_an_admission_carried_out_behind_a_quota_hold_turns_its_reason_to_capacity() -> None:
    """e waits for its tenant's quota with the pool free; x, behind it in policy order, is
    admitted into that pool now. Once x's grant holds the pool, a full plan says e waits for
    the pool's capacity: so must the incremental one."""
    first = build_snapshot(
        pools=[pool(capacity=8), pool(zone=OTHER_ZONE, capacity=8)],
        tenants=[tenant("a", quota(nominal=32)), tenant("b", quota(nominal=1000))],
        grants=[
            quota_in_use_elsewhere(until=NOW + HOUR),
        ],
        pending=[
            flex("e", tenant="a", vm_count=4, hours=1),
            flex("x", tenant="b", vm_count=8, hours=0.6),
        ],
    )
    planner = IncrementalPlanner(clock_floor=0)
    plan = planner.plan(first, NOW)
    assert plan.decision("e").reason is Reason.QUOTA
    assert plan.decision("x").outcome is Outcome.ADMIT
    carried = applied(first, plan)
    again = planner.plan(carried, NOW)
    assert again == admit(carried, NOW)
    assert not planner.last_pass.full
    assert again.decision("e").reason is Reason.NO_CAPACITY_UNTIL


@pytest.mark.parametrize("later", [timedelta(seconds=20), MINUTE, 61 * MINUTE])
def test_a_later_now_is_planned_incrementally_with_the_same_plan(later: timedelta) -> None:
    """The clock moving is a change like the others: the kept grid drops the minutes now
    past, the held starts that came are planned again (here the ones behind the running
    grant, which ends 2 h from NOW), and the rest keep their slots."""
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    planner.plan(first, NOW)
    plan = planner.plan(first, NOW + later)
    assert plan == admit(first, NOW + later)
    assert not planner.last_pass.full, planner.last_pass
    assert plan.now == NOW + later


def quota_wait_before_a_booking(policy: PolicySettings | None = None) -> Snapshot:
    """e waits for its tenant's quota (in use elsewhere for 3 h); its run (59.5 min) takes
    60 cells from a whole minute. At NOW a run from now takes 60 cells too, and the pool is
    free over them: QUOTA. 31 s later a run from now takes 61 cells, so the search starts at
    cell 1 and the reason compares cells 1..60, and cell 60 is booked whole by b: the pool's
    capacity."""
    return build_snapshot(
        pools=[pool(capacity=8), pool(zone=OTHER_ZONE, capacity=8)],
        tenants=[tenant("a", quota(nominal=32)), tenant("b", quota(nominal=1000))],
        grants=[
            quota_in_use_elsewhere(until=NOW + 3 * HOUR),
            grant("gb", tenant="b", units=8, start_at=NOW + HOUR, hours=0.5),
        ],
        pending=[flex("e", tenant="a", vm_count=4, run=timedelta(minutes=59, seconds=30))],
        policy=policy,
    )


def test_a_run_from_now_that_grows_a_cell_within_the_minute_changes_the_reason() -> None:
    """(See quota_wait_before_a_booking.) Within the minute nothing else changed: the
    planner visits no request, yet gives e the reason a full pass gives (the one it kept
    for the longer run)."""
    first = quota_wait_before_a_booking()
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(first, NOW).decision("e").reason is Reason.QUOTA
    for seconds in (20, 31, 59):
        plan = planner.plan(first, NOW + timedelta(seconds=seconds))
        assert plan == admit(first, NOW + timedelta(seconds=seconds))
        assert not planner.last_pass.full, planner.last_pass
        assert planner.last_pass.walked <= 0
    assert plan.decision("e").reason is Reason.NO_CAPACITY_UNTIL
    # The next minute: a run from now takes 60 cells again, from the minute after NOW.
    next_minute = NOW + timedelta(seconds=61)
    assert planner.plan(first, next_minute) == admit(first, next_minute)


def test_a_run_from_now_that_grows_a_cell_can_leave_a_full_first_minute_behind() -> None:
    """The other way round: b holds the whole pool for NOW's minute only. At NOW e's run
    from now is compared from cell 0, which lacks room: the pool's capacity. 31 s later the
    search (and so the reason) starts at cell 1, and the pool has room from there: QUOTA."""
    first = build_snapshot(
        pools=[pool(capacity=8), pool(zone=OTHER_ZONE, capacity=8)],
        tenants=[tenant("a", quota(nominal=32)), tenant("b", quota(nominal=1000))],
        grants=[
            quota_in_use_elsewhere(until=NOW + 3 * HOUR),
            grant("gb", tenant="b", units=8, start_at=NOW - HOUR, end_at=NOW + MINUTE),
        ],
        pending=[flex("e", tenant="a", vm_count=4, run=timedelta(minutes=59, seconds=30))],
    )
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(first, NOW).decision("e").reason is Reason.NO_CAPACITY_UNTIL
    later = NOW + timedelta(seconds=31)
    plan = planner.plan(first, later)
    assert plan == admit(first, later)
    assert not planner.last_pass.full, planner.last_pass
    assert plan.decision("e").reason is Reason.QUOTA


def test_a_deadline_passed_while_the_clock_moved_times_the_request_out() -> None:
    planner = IncrementalPlanner(clock_floor=0)
    queued = replace(
        busy(), pending=(*busy().pending, flex("hurry", vm_count=8, hours=1, max_wait=HOUR))
    )
    before = planner.plan(queued, NOW)
    assert before.decision("hurry").outcome is Outcome.WAIT
    after = planner.plan(queued, NOW + 61 * MINUTE)
    assert after == admit(queued, NOW + 61 * MINUTE)
    assert not planner.last_pass.full
    assert after.decision("hurry").outcome is Outcome.TIME_OUT


def test_a_commitment_whose_run_from_now_grows_a_cell_is_judged_again() -> None:
    """quota_wait_before_a_booking with e's slot committed (held before the policy order):
    within the minute, only the commitments whose run from now grew are judged again, and
    e's reason turns as a full pass turns it."""
    first = quota_wait_before_a_booking(PolicySettings(commit_within=DAY))
    told = Commitment(request_id="e", pool_id=f"{ZONE}/{A3}", start_at=NOW + 3 * HOUR)
    committed = replace(first, commitments=(told,))
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(committed, NOW).decision("e").reason is Reason.QUOTA
    for seconds in (20, 31, 59):
        plan = planner.plan(committed, NOW + timedelta(seconds=seconds))
        assert plan == admit(committed, NOW + timedelta(seconds=seconds))
        assert not planner.last_pass.full, planner.last_pass
    assert plan.decision("e").reason is Reason.NO_CAPACITY_UNTIL


def test_a_commitment_that_starts_now_starts_at_the_later_now_within_the_minute() -> None:
    """Its start came (admitted, not yet carried out); 20 s later, with nothing else
    changed and its run from now no longer, the plan admits it at the new now."""
    waiting = build_snapshot(
        pools=[pool(capacity=8)],
        tenants=[tenant("a", quota(nominal=1000))],
        pending=[flex("r", tenant="a", vm_count=2, run=timedelta(minutes=59, seconds=30))],
        policy=PolicySettings(commit_within=DAY),
    )
    told = replace(
        waiting, commitments=(Commitment(request_id="r", pool_id=f"{ZONE}/{A3}", start_at=NOW),)
    )
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(told, NOW).decision("r").outcome is Outcome.ADMIT
    for seconds in (10, 20):
        plan = planner.plan(told, NOW + timedelta(seconds=seconds))
        assert plan == admit(told, NOW + timedelta(seconds=seconds))
        assert not planner.last_pass.full, planner.last_pass
    assert plan.decision("r").start_at == NOW + timedelta(seconds=20)


def test_a_strict_fifo_commitment_is_judged_again_when_its_waiting_sibling_leaves() -> None:
    """s1 (4 VMs) cannot start by its deadline (1 h; one VM of the pool is busy for 3 h):
    it waits, and holds its tenant's line until then, so s2, committed at 1 h, waits for it
    (FIFO_BLOCKED). s1 leaves: it had no slot, so no free amount changes, but s2's floor
    does, and with it s2's reason."""
    first = build_snapshot(
        pools=[pool(capacity=4)],
        tenants=[tenant("s", quota(nominal=1000), strict_fifo=True)],
        grants=[grant("busy", tenant="s", units=1, start_at=NOW - HOUR, hours=4)],
        pending=[
            flex("s1", tenant="s", vm_count=4, hours=1, max_wait=HOUR),
            flex("s2", tenant="s", vm_count=1, run=timedelta(minutes=29, seconds=30)),
        ],
        policy=PolicySettings(commit_within=DAY),
    )
    committed = replace(
        first,
        commitments=(Commitment(request_id="s2", pool_id=f"{ZONE}/{A3}", start_at=NOW + HOUR),),
    )
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(committed, NOW).decision("s2").reason is Reason.FIFO_BLOCKED
    planner.plan(committed, NOW + timedelta(seconds=10))
    assert not planner.last_pass.full, planner.last_pass
    left = replace(committed, pending=committed.pending[1:])
    plan = planner.plan(left, NOW + timedelta(seconds=20))
    assert plan == admit(left, NOW + timedelta(seconds=20))
    assert not planner.last_pass.full, planner.last_pass
    assert plan.decision("s2").reason is not Reason.FIFO_BLOCKED


def big_behind_small(horizon: timedelta, told: timedelta = 2 * HOUR) -> Snapshot:
    """The pool full for 2 h; big (4 VMs, 1 h) told ``told`` from NOW; small (1 VM, 10 min),
    smaller and so first in policy order, takes the pool's first free minutes before big
    unless big's commitment is held (it lies within ``horizon``)."""
    return replace(
        build_snapshot(
            pools=[pool(capacity=4)],
            tenants=[tenant("t", quota(nominal=1024))],
            grants=[grant("blocker", units=4, hours=2)],
            pending=[
                flex("big", vm_count=4, hours=1, submitted_at=NOW - MINUTE),
                flex("small", vm_count=1, run=10 * MINUTE),
            ],
            policy=PolicySettings(commit_within=horizon),
        ),
        commitments=(Commitment(request_id="big", pool_id=f"{ZONE}/{A3}", start_at=NOW + told),),
    )


def test_a_commitment_the_horizon_reaches_within_the_minute_is_held() -> None:
    """big was told 2 h 30 s from NOW (a start told between minutes). Until NOW + 30 s that
    lies beyond the horizon (2 h): an estimate, and small goes first. At NOW + 40 s, in the
    same minute, the horizon reaches it: big is held at the first minute of its start,
    before the policy order, and small goes after it, as a full pass plans it (the planner
    finds such commitments by their start, without looking at the others)."""
    alone = big_behind_small(2 * HOUR, 2 * HOUR + 30 * timedelta(seconds=1))
    # Elsewhere, x is held at its commitment all along (so every pass looks at commitments).
    x = flex("x", vm_count=4, hours=1, locations=[OTHER_ZONE])
    first = replace(
        alone,
        pools=(*alone.pools, pool(zone=OTHER_ZONE, capacity=4)),
        grants=(*alone.grants, grant("elsewhere", units=4, pool_id=f"{OTHER_ZONE}/{A3}")),
        pending=(*alone.pending, x),
        commitments=(
            *alone.commitments,
            Commitment(request_id="x", pool_id=f"{OTHER_ZONE}/{A3}", start_at=NOW + HOUR),
        ),
    )
    planner = IncrementalPlanner(clock_floor=0)
    for seconds in (10, 20):
        plan = planner.plan(first, NOW + timedelta(seconds=seconds))
        assert plan.decision("big").start_at == NOW + 2 * HOUR + 10 * MINUTE
    assert not planner.last_pass.full, planner.last_pass
    later = NOW + timedelta(seconds=40)
    plan = planner.plan(first, later)
    assert plan == admit(first, later)
    assert not planner.last_pass.full, planner.last_pass
    assert plan.decision("big").start_at == NOW + 2 * HOUR


def test_a_request_back_in_line_is_held_at_the_commitment_it_kept() -> None:
    """big, held at its commitment, leaves the queue (its commitment stays told) and comes
    back: it is held there again, before small, as a full pass holds it."""
    first = big_behind_small(DAY)
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(first, NOW).decision("big").start_at == NOW + 2 * HOUR
    without = replace(first, pending=first.pending[1:])
    assert planner.plan(without, NOW) == admit(without, NOW)
    plan = planner.plan(first, NOW)
    assert plan == admit(first, NOW)
    assert not planner.last_pass.full, planner.last_pass
    assert plan.decision("big").start_at == NOW + 2 * HOUR


def test_a_commitment_starting_now_takes_the_cell_its_run_from_now_grew() -> None:
    """r is committed now and admitted (not yet carried out); its run (59.5 min) takes 60
    cells from NOW, and 61 from 31 s later, so q, queued behind it for the whole pool,
    starts a minute later then, as a full pass plans it."""
    first = replace(
        build_snapshot(
            pools=[pool(capacity=8)],
            tenants=[tenant("t", quota(nominal=1024))],
            pending=[
                flex("r", vm_count=8, run=timedelta(minutes=59, seconds=30)),
                flex("q", vm_count=8, hours=1),
            ],
            policy=PolicySettings(commit_within=DAY),
        ),
        commitments=(Commitment(request_id="r", pool_id=f"{ZONE}/{A3}", start_at=NOW),),
    )
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(first, NOW).decision("q").start_at == NOW + HOUR
    for seconds in (10, 40):
        plan = planner.plan(first, NOW + timedelta(seconds=seconds))
        assert plan == admit(first, NOW + timedelta(seconds=seconds))
        assert not planner.last_pass.full, planner.last_pass
    assert plan.decision("q").start_at == NOW + 61 * MINUTE


def test_a_deadline_passed_within_the_minute_times_the_request_out() -> None:
    """The deadline (90 s after NOW) falls between two passes of the same minute: the pass
    that moved only within the minute still finds it (by deadline, not by looking at every
    request) and times it out, as a full pass does."""
    planner = IncrementalPlanner(clock_floor=0)
    queued = replace(
        busy(),
        pending=(
            *busy().pending,
            flex("hurry", vm_count=8, hours=1, max_wait=timedelta(seconds=90)),
        ),
    )
    planner.plan(queued, NOW)
    before = planner.plan(queued, NOW + timedelta(seconds=75))
    assert before.decision("hurry").outcome is Outcome.WAIT
    after = planner.plan(queued, NOW + timedelta(seconds=95))
    assert after == admit(queued, NOW + timedelta(seconds=95))
    assert not planner.last_pass.full, planner.last_pass
    assert after.decision("hurry").outcome is Outcome.TIME_OUT


def test_a_request_stamped_after_now_plans_in_full_when_the_clock_moves() -> None:
    """Its aging counts from now, not from its stamp, until now passes its stamp."""
    planner = IncrementalPlanner(clock_floor=0)
    ahead = replace(busy(), pending=(*busy().pending, flex("early", submitted_at=NOW + HOUR)))
    planner.plan(ahead, NOW)
    assert planner.plan(ahead, NOW + MINUTE) == admit(ahead, NOW + MINUTE)
    assert planner.last_pass.why == "a request stamped after the last pass ages from now on"


def test_two_strict_fifo_requests_leaving_at_once_leave_no_slot_behind() -> None:
    """The first one's departure queues its tenant's next request for a visit; that one left
    too, so the walk must skip it rather than place a request that is gone."""
    planner = IncrementalPlanner(clock_floor=0)
    first = build_snapshot(
        pools=[pool(capacity=4)],
        tenants=[tenant("s", quota(nominal=1024), strict_fifo=True)],
        pending=[flex(f"s{index}", tenant="s", vm_count=4, hours=1) for index in range(4)],
    )
    planner.plan(first, NOW)
    second = replace(first, pending=first.pending[2:])
    plan = planner.plan(second, NOW)
    assert plan == admit(second, NOW)
    assert not planner.last_pass.full
    assert plan.decision("s2").outcome is Outcome.ADMIT


def test_a_clock_move_that_starts_most_of_the_queue_plans_in_full() -> None:
    """Sixty hours on, 120 of 200 one-hour holds in two rows have started (a pass every
    minute would have admitted them): replanning each from its place costs more than a full
    pass."""
    planner = IncrementalPlanner(clock_floor=0)
    first = two_queues()
    planner.plan(first, NOW)
    assert planner.plan(first, NOW + 60 * HOUR) == admit(first, NOW + 60 * HOUR)
    assert planner.last_pass.why == "most of the queue's starts came: a full pass costs less"


def test_a_reason_judged_again_leaves_the_requests_own_slot_out() -> None:
    """e waits for its tenant's quota (used by a run elsewhere until 30 min), with room in
    its pool now (4 of 8 VMs free); its slot from 30 min overlaps the hour its reason is
    judged over. A block after it in its pool is released: e's slot stands and its reason is
    judged again, as a search judges it, before e takes its slot: still QUOTA, not the pool's
    capacity."""
    first = build_snapshot(
        pools=[pool(capacity=8), pool(zone=OTHER_ZONE, capacity=8)],
        tenants=[
            tenant("a", quota(nominal=32)),
            tenant("b", quota(nominal=1000)),
            tenant("c", quota(nominal=1000)),
        ],
        grants=[
            quota_in_use_elsewhere(until=NOW + 30 * MINUTE),
            grant("gb", tenant="b", units=4, accelerator_units=32, start_at=NOW - HOUR, hours=3),
            grant("gc", tenant="c", units=1, accelerator_units=8, start_at=NOW + 100 * MINUTE),
        ],
        pending=[flex("e", tenant="a", vm_count=4, hours=1)],
    )
    planner = IncrementalPlanner(clock_floor=0)
    plan = planner.plan(first, NOW)
    assert plan.decision("e").reason is Reason.QUOTA
    released = replace(first, grants=first.grants[:2])
    again = planner.plan(released, NOW)
    assert again == admit(released, NOW)
    assert not planner.last_pass.full
    assert again.decision("e").reason is Reason.QUOTA


def test_a_later_now_over_a_queue_below_the_clock_floor_plans_in_full() -> None:
    """A planner given a clock floor plans a queue shorter than it again in full when the
    clock moves, and the plan is the same."""
    planner = IncrementalPlanner(clock_floor=1_000)
    first = busy()
    planner.plan(first, NOW)
    assert planner.plan(first, NOW + MINUTE) == admit(first, NOW + MINUTE)
    assert planner.last_pass.why == "a later now over a queue below the clock floor"


def test_by_default_a_later_now_carries_even_a_short_queue_over() -> None:
    """By default (CLOCK_FLOOR 0), a later now carries the pass over however short the
    queue: measured on the Philly replay, planning short queues in full cost more."""
    planner = IncrementalPlanner()
    first = busy()
    planner.plan(first, NOW)
    assert planner.plan(first, NOW + MINUTE) == admit(first, NOW + MINUTE)
    assert not planner.last_pass.full


def two_zones_of_blocks() -> Snapshot:
    """Two pools of 8 VMs in two zones, each with its own tenant (no cohort), a grant of its
    tenant holding the whole pool for three days, one more for day 4, and a one-day calendar
    block on day 2 that is refused: its alternatives are the gaps between the grants."""
    zones = (ZONE, "us-central1-b")
    return build_snapshot(
        pools=[pool(zone=zone, capacity=8) for zone in zones],
        tenants=[tenant(f"t-{zone}", quota(nominal=1024)) for zone in zones],
        grants=[
            grant(
                f"{zone}-{name}",
                tenant=f"t-{zone}",
                pool_id=f"{zone}/{A3}",
                units=8,
                start_at=start,
                hours=hours,
            )
            for zone in zones
            for name, start, hours in (("now", NOW, 72), ("day4", NOW + 4 * DAY, 24))
        ],
        pending=[
            calendar(f"block-{zone}", tenant=f"t-{zone}", locations=(zone,), start_at=NOW + DAY)
            for zone in zones
        ],
    )


def test_a_release_decides_again_only_the_blocks_on_its_rows() -> None:
    """Releasing day 4's grant in one zone changes the alternatives offered to that zone's
    refused block, as a full plan does; the other zone's block, on none of the grant's rows
    (its pool, its tenant's quota), is not decided again."""
    planner = IncrementalPlanner(clock_floor=0)
    first = two_zones_of_blocks()
    before = planner.plan(first, NOW)
    assert {d.outcome for d in before.decisions} == {Outcome.REFUSE}
    released = replace(
        first, grants=tuple(g for g in first.grants if g.request_id != f"{ZONE}-day4")
    )
    after = planner.plan(released, NOW)
    assert after == admit(released, NOW)
    assert not planner.last_pass.full
    assert planner.last_pass.redecided == 1
    block = f"block-{ZONE}"
    assert after.decision(block).outcome is Outcome.REFUSE
    assert after.decision(block).alternatives != before.decision(block).alternatives
    other = "block-us-central1-b"
    assert after.decision(other) == before.decision(other)


def test_a_release_decides_again_a_confirmed_block_only_if_it_overlaps_its_window() -> None:
    """A confirmed block fits over its own window or not, so a release there may change it
    and one that ended before it began cannot: the first is decided again (and stays
    confirmed), the second is not, and each plan is ``admit``'s."""
    planner = IncrementalPlanner(clock_floor=0)
    first = build_snapshot(
        pools=[pool(capacity=8)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=[
            grant("early", units=4, start_at=NOW, hours=12),
            grant("during", units=4, start_at=NOW + DAY, hours=12),
        ],
        pending=[calendar("block", start_at=NOW + DAY)],
    )
    before = planner.plan(first, NOW)
    assert before.decision("block").outcome is Outcome.CONFIRM
    for name, decided in (("early", 0), ("during", 1)):
        released = replace(first, grants=tuple(g for g in first.grants if g.request_id != name))
        planner = IncrementalPlanner(clock_floor=0)
        planner.plan(first, NOW)
        after = planner.plan(released, NOW)
        assert after == admit(released, NOW)
        assert not planner.last_pass.full
        assert planner.last_pass.redecided == decided, name
        assert after.decision("block") == before.decision("block")


def test_a_release_that_lets_a_refused_block_fit_books_it_incrementally() -> None:
    """A block confirmed where it was refused: its booking is taken in the flex grid as a
    grant's would be, without a full pass."""
    planner = IncrementalPlanner(clock_floor=0)
    first = two_zones_of_blocks()
    planner.plan(first, NOW)
    released = replace(
        first, grants=tuple(g for g in first.grants if g.request_id != f"{ZONE}-now")
    )
    plan = planner.plan(released, NOW)
    assert plan == admit(released, NOW)
    assert plan.decision(f"block-{ZONE}").outcome is Outcome.CONFIRM
    assert not planner.last_pass.full, planner.last_pass


def before_a_block() -> Snapshot:
    """A full pool's queue of whole-pool runs: f1 now (two hours), then f3 (ten hours), then
    f2 (twenty)."""
    return build_snapshot(
        pools=[pool(capacity=8)],
        tenants=[tenant("t", quota(nominal=1024))],
        pending=[
            flex("f1", vm_count=8, hours=2, max_wait=2 * DAY),
            flex("f2", vm_count=8, hours=20, max_wait=2 * DAY),
            flex("f3", vm_count=8, hours=10, max_wait=2 * DAY),
        ],
    )


BLOCK_START = NOW + 6 * HOUR


def with_block(
    snapshot: Snapshot, name: str = "block", *, vm_count: int = 4, priority: int = 0
) -> Snapshot:
    """``snapshot`` with a calendar block of ``vm_count`` VMs for a day from six hours
    ahead."""
    block = calendar(name, vm_count=vm_count, start_at=BLOCK_START, priority=priority)
    return replace(snapshot, pending=(*snapshot.pending, block))


def test_a_calendar_block_that_arrives_is_decided_and_booked_incrementally() -> None:
    """A block arriving is decided in its place in calendar order, without a full pass; once
    confirmed, its booking holds the flex grid as a grant does: f3, whose ten hours would
    overlap it, starts when the block ends (the pool's other half is too little)."""
    planner = IncrementalPlanner(clock_floor=0)
    first = before_a_block()
    assert planner.plan(first, NOW).decision("f3").start_at == NOW + 2 * HOUR
    second = with_block(first)
    plan = planner.plan(second, NOW)
    assert plan == admit(second, NOW)
    assert not planner.last_pass.full, planner.last_pass
    assert planner.last_pass.redecided == 1
    assert plan.decision("block").outcome is Outcome.CONFIRM
    assert plan.decision("f3").start_at == BLOCK_START + DAY


def test_a_calendar_block_reserved_as_booked_changes_nothing_else() -> None:
    """The reconciler reserves the confirmed block (its request leaves the queue, its grant
    comes holding exactly its booking) and carries out f1's admission: the next pass, at a
    later now, holds both as the last one did, searching nothing."""
    planner = IncrementalPlanner(clock_floor=0)
    booked = with_block(before_a_block())
    planner.plan(before_a_block(), NOW)
    plan = planner.plan(booked, NOW)
    carried = applied(booked, plan)
    assert len(carried.grants) == 2
    later = NOW + timedelta(seconds=5)
    again = planner.plan(carried, later)
    assert again == admit(carried, later)
    assert not planner.last_pass.full, planner.last_pass
    assert planner.last_pass.searched <= 0
    assert again.decision("f3").start_at == BLOCK_START + DAY


def test_a_block_that_arrives_moves_the_alternatives_of_a_refused_one_after_it() -> None:
    """A refused block is offered other starts, read over every start it may take: a block
    that arrives ahead of it in calendar order and is confirmed outside its window still
    takes some of them, and the refused one is offered others, as a full plan offers."""
    planner = IncrementalPlanner(clock_floor=0)
    first = build_snapshot(
        pools=[pool(capacity=8)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=[grant("g", units=8, start_at=NOW + 10 * HOUR, hours=30)],
        pending=[calendar("refused", vm_count=8, start_at=NOW + 20 * HOUR)],
    )
    before = planner.plan(first, NOW)
    assert before.decision("refused").outcome is Outcome.REFUSE
    ahead = calendar("ahead", vm_count=4, start_at=NOW + 50 * HOUR, submitted_at=NOW - HOUR)
    second = replace(first, pending=(*first.pending, ahead))
    after = planner.plan(second, NOW)
    assert after == admit(second, NOW)
    assert not planner.last_pass.full, planner.last_pass
    assert after.decision("ahead").outcome is Outcome.CONFIRM
    assert after.decision("refused").alternatives != before.decision("refused").alternatives


def test_a_block_reserved_is_seen_by_the_blocks_before_it() -> None:
    """A pending block is decided before the later ones' bookings exist (calendar order);
    once a later block is reserved, its grant holds for every block: the refused block w,
    ahead of x, is offered alternatives that now avoid x's day, as a full plan offers."""
    planner = IncrementalPlanner(clock_floor=0)
    w = calendar("w", vm_count=8, start_at=NOW + 6 * HOUR, submitted_at=NOW - HOUR)
    x = calendar("x", vm_count=4, start_at=NOW + 20 * HOUR)
    first = build_snapshot(
        pools=[pool(capacity=8)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=[grant("g", units=4, start_at=NOW + 10 * HOUR, hours=2)],
        pending=[w, x],
    )
    before = planner.plan(first, NOW)
    assert before.decision("w").outcome is Outcome.REFUSE
    assert before.decision("x").outcome is Outcome.CONFIRM
    reserved = replace(
        first, pending=(w,), grants=(*first.grants, grant_of(x, start_at=x.start_at))
    )
    after = planner.plan(reserved, NOW)
    assert after == admit(reserved, NOW)
    assert not planner.last_pass.full, planner.last_pass
    assert after.decision("w").alternatives != before.decision("w").alternatives


def test_a_confirmed_block_that_leaves_unreserved_gives_its_booking_back() -> None:
    """A confirmed block withdrawn before it was reserved (its request leaves, no grant
    comes): what its booking held is free again, and f3 starts where it did before."""
    planner = IncrementalPlanner(clock_floor=0)
    first = before_a_block()
    planner.plan(first, NOW)
    planner.plan(with_block(first), NOW)
    plan = planner.plan(first, NOW)
    assert plan == admit(first, NOW)
    assert not planner.last_pass.full, planner.last_pass
    assert plan.decision("f3").start_at == NOW + 2 * HOUR


def test_a_block_that_arrives_ahead_of_a_confirmed_one_displaces_it_incrementally() -> None:
    """A block of higher priority comes before a confirmed one in calendar order and takes
    the room it had: the later one is refused, and the flex grid gives its booking back and
    takes the new one's, without a full pass; f3 starts when the new block ends."""
    planner = IncrementalPlanner(clock_floor=0)
    first = with_block(before_a_block(), "late", vm_count=8)
    assert planner.plan(first, NOW).decision("late").outcome is Outcome.CONFIRM
    second = with_block(first, "urgent", priority=1)
    plan = planner.plan(second, NOW)
    assert plan == admit(second, NOW)
    assert plan.decision("late").outcome is Outcome.REFUSE
    assert not planner.last_pass.full, planner.last_pass
    assert planner.last_pass.redecided == 2
    assert plan.decision("f3").start_at == BLOCK_START + DAY


def test_a_block_still_pending_at_a_later_now_plans_in_full() -> None:
    """A block's verdict depends on now: while one is pending, a later now plans in full;
    once it has left, a later now is carried over."""
    planner = IncrementalPlanner(clock_floor=0)
    pending = with_block(before_a_block())
    planner.plan(pending, NOW)
    planner.plan(pending, NOW + MINUTE)
    assert planner.last_pass.full
    assert planner.last_pass.why.startswith("calendar blocks are pending")
    plan = planner.plan(before_a_block(), NOW + 2 * MINUTE)
    assert plan == admit(before_a_block(), NOW + 2 * MINUTE)
    assert not planner.last_pass.full, planner.last_pass


def told(snapshot: Snapshot, now: datetime = NOW) -> tuple[Commitment, ...]:
    """Every slot ``admit`` holds, committed as the reconciler commits them."""
    return tuple(
        Commitment(request_id=d.request_id, pool_id=d.pool_id or "", start_at=d.start_at)
        for d in admit(snapshot, now).decisions
        if d.outcome is Outcome.HOLD and d.start_at is not None
    )


def test_commitments_are_carried_over_from_pass_to_pass() -> None:
    """Commitments are held before the policy order; the planner keeps them between passes
    as a layer under the walk. An arrival, a commitment that comes, one that moves, and one
    dropped while its request still waits are each planned incrementally, with ``admit``'s
    plan every time."""
    sticky = PolicySettings(commit_within=DAY)
    first = replace(busy(), policy=sticky)
    promises = told(first)
    assert len(promises) >= 2
    planner = IncrementalPlanner(clock_floor=0)
    committed = replace(first, commitments=promises)
    assert planner.plan(committed, NOW) == admit(committed, NOW)
    assert planner.last_pass.full
    again = replace(committed, pending=(*committed.pending, flex("late", vm_count=8, hours=1)))
    assert planner.plan(again, NOW) == admit(again, NOW)
    assert not planner.last_pass.full
    # The arrival's slot is committed too (it comes into the layer where it was placed).
    recommitted = replace(again, commitments=told(again))
    assert len(recommitted.commitments) == len(promises) + 1
    assert planner.plan(recommitted, NOW) == admit(recommitted, NOW)
    assert not planner.last_pass.full
    # One commitment moved an hour later, one dropped while its request waits on.
    moved, *rest = recommitted.commitments
    shifted = replace(recommitted, commitments=(replace(moved, start_at=moved.start_at + HOUR),
                                                *rest[1:]))  # fmt: skip
    assert planner.plan(shifted, NOW) == admit(shifted, NOW)
    assert not planner.last_pass.full
    none_held = replace(shifted, commitments=())
    assert planner.plan(none_held, NOW) == admit(none_held, NOW)
    assert not planner.last_pass.full


@pytest.mark.parametrize("busy_first", [0.5, 0], ids=["moved", "admitted"])
def test_a_move_carried_out_frees_its_old_slot_for_a_commitment_ranked_before_it(
    busy_first: float,
) -> None:
    """A pass moves commitments earlier in policy order; once the reconciler carries that out
    (commits the slot one moved to, or admits it there), the next pass holds it there, as
    that pass left it. A commitment ranked after the mover was tested on that grid already;
    one ranked before it was tested with the mover's old slot still taken, and may now start
    there.

    One pool of 6 VMs, 4 of them busy for two hours (2 more for the first half hour, or
    not). E (of a higher priority: ranked first) is committed at +3 h behind X at +2 h. A
    release lets X move to +30 min (or start now); once that is carried out, E may start at
    +2 h, where X was."""
    pool_id = f"{ZONE}/{A3}"
    grants = [grant("g1", units=2, hours=2), grant("g2", units=2, hours=2)]
    if busy_first:
        grants.append(grant("g3", units=2, hours=busy_first))
    first = build_snapshot(
        pools=[pool(capacity=6)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=grants,
        pending=[flex("e", vm_count=6, hours=1, priority=1), flex("x", vm_count=4, hours=1)],
        policy=PolicySettings(commit_within=DAY),
    )
    committed = replace(
        first,
        commitments=(
            Commitment(request_id="e", pool_id=pool_id, start_at=NOW + 3 * HOUR),
            Commitment(request_id="x", pool_id=pool_id, start_at=NOW + 2 * HOUR),
        ),
    )
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(committed, NOW) == admit(committed, NOW)
    released = replace(committed, grants=committed.grants[::2])  # g2 ends early
    moved = planner.plan(released, NOW)
    assert moved == admit(released, NOW)
    assert not planner.last_pass.full
    assert moved.decision("x").start_at == NOW + busy_first * HOUR
    assert moved.decision("e").start_at == NOW + 3 * HOUR
    # Carried out: an admission as its grant, from now; every held slot committed.
    carried = replace(
        applied(released, moved),
        commitments=tuple(
            Commitment(request_id=d.request_id, pool_id=pool_id, start_at=d.start_at)
            for d in moved.having(Outcome.HOLD)
            if d.start_at is not None
        ),
    )
    plan = planner.plan(carried, NOW)
    assert plan == admit(carried, NOW)
    assert not planner.last_pass.full
    assert plan.decision("e").start_at == NOW + 2 * HOUR


def test_a_commitment_moves_a_minute_earlier_when_the_minute_before_its_slot_frees() -> None:
    """A commitment held where it was promised is tested again only if room grew before its
    slot: from its slot on, the slot it holds has room for it. A run of one minute right
    before it ending (the pool busy up to then) frees just that minute, which is enough to
    start there."""
    pool_id = f"{ZONE}/{A3}"
    before = NOW + 2 * HOUR - MINUTE
    minute = grant("g2", units=4, start_at=before, end_at=NOW + 2 * HOUR)
    first = build_snapshot(
        pools=[pool(capacity=4)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=[grant("g1", units=4, start_at=NOW - HOUR, end_at=before), minute],
        pending=[flex("e", vm_count=4, hours=1)],
        policy=PolicySettings(commit_within=DAY),
    )
    committed = replace(
        first, commitments=(Commitment(request_id="e", pool_id=pool_id, start_at=NOW + 2 * HOUR),)
    )
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(committed, NOW) == admit(committed, NOW)
    assert planner.plan(committed, NOW) == admit(committed, NOW)  # nothing moved
    assert not planner.last_pass.full
    freed = replace(committed, grants=committed.grants[:1])
    plan = planner.plan(freed, NOW)
    assert plan == admit(freed, NOW)
    assert not planner.last_pass.full
    assert plan.decision("e").start_at == before


def test_a_commitment_that_no_longer_fits_plans_in_full_and_keeps_nothing() -> None:
    """A grant that comes over a commitment's slot (another tenant's, say) leaves it no room
    where it was promised: a full pass then holds it elsewhere (or plans it as any other),
    so that pass plans in full, and, as one commitment was not held at its first slot, it
    keeps nothing: the next pass names the commitments as its reason."""
    sticky = PolicySettings(commit_within=DAY)
    first = replace(busy(), policy=sticky)
    committed = replace(first, commitments=told(first))
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(committed, NOW) == admit(committed, NOW)
    promise = committed.commitments[0]
    over = grant("over", units=8, start_at=promise.start_at, hours=1)
    crowded = replace(committed, grants=(*committed.grants, over))
    assert planner.plan(crowded, NOW) == admit(crowded, NOW)
    assert planner.last_pass.full
    assert planner.last_pass.why == "a commitment no longer fits where it was promised"
    later = replace(crowded, pending=(*crowded.pending, flex("later", vm_count=1, hours=2)))
    assert planner.plan(later, NOW) == admit(later, NOW)
    assert planner.last_pass.why == COMMITMENTS_HELD


def test_policy_keys_carried_from_the_last_full_pass_follow_what_they_depend_on() -> None:
    """A full pass takes the policy keys of the last one for the same request objects; a new
    aging half-life, a tenant turned strict FIFO, a rewritten request or one stamped after
    the last pass's now is keyed afresh: every pass plans exactly as ``admit``."""
    planner = IncrementalPlanner(clock_floor=10_000)  # every later now plans in full
    first = busy()
    waiting = [flex(f"w{index}", vm_count=3, hours=5 - index, submitted_at=NOW - index * HOUR)
               for index in range(4)]  # fmt: skip
    ahead = flex("stamped-later", vm_count=2, hours=1, submitted_at=NOW + 30 * MINUTE)
    first = replace(first, pending=(*first.pending, *waiting, ahead))
    steps = [
        (first, NOW),
        (first, NOW + 10 * MINUTE),  # the same requests: keys carried over
        (replace(first, policy=PolicySettings(aging_half_life=30 * MINUTE)), NOW + 20 * MINUTE),
        (
            replace(
                first, tenants=(replace(first.tenants[0], queueing=QueueingStrategy.STRICT_FIFO),)
            ),
            NOW + 40 * MINUTE,
        ),
        (
            replace(first, pending=(*first.pending[:-1], replace(ahead, priority=5))),
            NOW + 50 * MINUTE,
        ),
    ]
    for snapshot, now in steps:
        assert planner.plan(snapshot, now) == admit(snapshot, now)
        assert planner.last_pass.full


def test_a_request_stamped_ahead_is_keyed_afresh_while_its_stamp_lies_ahead() -> None:
    """A request stamped after now ages from now (policy.flex_key), so its key moves with
    the clock until its stamp: a later full pass must not take it from the pass before. Here
    it goes before ``steady`` at NOW and after it an hour later, and the two want the same
    slot."""
    hour_half_life = PolicySettings(aging_half_life=HOUR)
    ahead = flex("ahead", vm_count=4, hours=1, submitted_at=NOW + 2 * HOUR)
    steady = flex("steady", vm_count=4, hours=3, submitted_at=NOW - HOUR)
    key = functools.partial(flex_key, strict=False, half_life=HOUR)
    assert key(ahead, now=NOW) < key(steady, now=NOW)
    assert key(ahead, now=NOW + HOUR) > key(steady, now=NOW + HOUR)
    snapshot = build_snapshot(
        pools=[pool(capacity=4)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=[grant("g1", units=4, start_at=NOW - HOUR, hours=5)],
        pending=[ahead, steady],
        policy=hour_half_life,
    )
    planner = IncrementalPlanner(clock_floor=10_000)
    for now in (NOW, NOW + HOUR):
        plan = planner.plan(snapshot, now)
        assert plan == admit(snapshot, now)
        assert planner.last_pass.full
    first, second = plan.decision("steady").start_at, plan.decision("ahead").start_at
    assert first is not None
    assert second is not None
    assert first < second


def test_a_commitment_is_held_once_it_lies_within_the_horizon() -> None:
    """Commitments are held only when told less than ``commit_within`` ahead; one further
    ahead is an estimate no pass reads: at the horizon exactly it is not held. A minute later
    it is a minute inside and held, carried over as the clock moves; once it is gone, the
    request is planned as any other. Every pass is ``admit``'s."""
    planner = IncrementalPlanner(clock_floor=0)
    first = busy()
    plan = admit(first, NOW)
    far = max(
        (d for d in plan.having(Outcome.HOLD) if d.start_at is not None),
        key=lambda d: (d.start_at, d.request_id),
    )
    assert far.start_at is not None
    assert far.pool_id is not None
    ahead = far.start_at - NOW
    promise = Commitment(request_id=far.request_id, pool_id=far.pool_id, start_at=far.start_at)
    at_horizon = replace(first, policy=PolicySettings(commit_within=ahead), commitments=(promise,))
    assert planner.plan(at_horizon, NOW) == admit(at_horizon, NOW)
    grown = replace(at_horizon, pending=(*at_horizon.pending, flex("late", vm_count=1, hours=1)))
    assert planner.plan(grown, NOW) == admit(grown, NOW)
    assert not planner.last_pass.full
    # A minute later the same commitment lies a minute inside the horizon: held.
    assert planner.plan(grown, NOW + MINUTE) == admit(grown, NOW + MINUTE)
    assert not planner.last_pass.full
    assert far.request_id in planner._held
    again = replace(grown, pending=(*grown.pending, flex("later", vm_count=1, hours=1)))
    assert planner.plan(again, NOW + MINUTE) == admit(again, NOW + MINUTE)
    assert not planner.last_pass.full
    # Once it is gone (admitted, say), its request is planned as any other.
    free = replace(again, commitments=())
    assert planner.plan(free, NOW + MINUTE) == admit(free, NOW + MINUTE)
    assert not planner.last_pass.full
    assert not planner._held
    last = replace(free, pending=(*free.pending, flex("last", vm_count=1, hours=1)))
    assert planner.plan(last, NOW + MINUTE) == admit(last, NOW + MINUTE)
    assert not planner.last_pass.full


def test_a_settled_commitment_is_judged_again_when_its_pool_row_changes() -> None:
    """A commitment that keeps its slot pass after pass is not judged again while nothing
    its reason reads changed. Held by quota while its pool has room now, it is held by the
    pool's capacity once an arrival takes that room, at the same instant: its pool's row
    changed, so its reason is worked out again, as ``admit`` works it out."""
    elsewhere = "us-central1-b"
    first = build_snapshot(
        pools=[pool(capacity=8), pool(zone=elsewhere, capacity=8)],
        tenants=[tenant("a", quota(nominal=16)), tenant("b", quota(nominal=1024))],
        grants=[grant("a-run", tenant="a", units=2, start_at=NOW - HOUR, hours=3)],
        pending=[
            flex("a-next", tenant="a", vm_count=2, hours=1),
            flex("b-there", tenant="b", vm_count=1, hours=1, locations=(elsewhere,)),
            flex("b-whole", tenant="b", vm_count=8, hours=1),  # its pool's row can bind
        ],
    )
    first = replace(first, policy=PolicySettings(commit_within=DAY))
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(first, NOW) == admit(first, NOW)
    committed = replace(first, commitments=told(first))
    assert planner.plan(committed, NOW) == admit(committed, NOW)  # the commitment comes
    settled = planner.plan(committed, NOW)  # nothing changed: it is settled
    assert settled.decision("a-next").reason is Reason.QUOTA
    crowded = replace(
        committed, pending=(*committed.pending, flex("b-now", tenant="b", vm_count=6, hours=2))
    )
    plan = planner.plan(crowded, NOW)
    assert plan == admit(crowded, NOW)
    assert not planner.last_pass.full
    assert plan.decision("b-now").outcome is Outcome.ADMIT
    assert plan.decision("a-next").reason is Reason.NO_CAPACITY_UNTIL


def test_a_walk_hands_its_delta_rows_back_zeroed() -> None:
    """The walk keeps, per row it rolls back, how that row's free amounts differ from the last
    pass, in a row as long as the grid, and keeps those rows for the next walk. Each must be
    handed back all zeros: here the two releases leave gains in a row that the last arrival's
    walk reuses, where a gain left over would hide the loss inside a held slot (the slot kept
    where it no longer fits, a plan other than the full one)."""
    planner = IncrementalPlanner(clock_floor=0)
    runs = [("g0", 1, 3), ("g1", 1, 4), ("g2", 2, 4)]
    queued = [("r0", 2, 2), ("r1", 1, 4), ("r2", 1, 4), ("r3", 2, 1), ("r4", 3, 4)]
    queued += [("r5", 2, 2), ("r6", 3, 1)]
    snapshot = build_snapshot(
        pools=[pool(capacity=3)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=[
            grant(name, units=units, start_at=NOW - HOUR, hours=hours)
            for name, units, hours in runs
        ],
        pending=[flex(name, vm_count=vms, hours=hours) for name, vms, hours in queued],
    )
    planner.plan(snapshot, NOW)
    changes = [
        lambda s: replace(s, pending=(*s.pending, flex("a0", vm_count=1, hours=1))),
        lambda s: replace(s, grants=tuple(g for g in s.grants if g.request_id != "g2")),
        lambda s: replace(s, grants=tuple(g for g in s.grants if g.request_id != "g1")),
        lambda s: replace(s, pending=(*s.pending, flex("a3", vm_count=2, hours=1))),
    ]
    for change in changes:
        snapshot = change(snapshot)
        assert planner.plan(snapshot, NOW) == admit(snapshot, NOW)
        assert not planner.last_pass.full
        assert planner.last_pass.walked > 0
        assert planner._spare, "the walk kept no row for the next one"
        assert not any(row.any() for row in planner._spare)


def test_a_pool_not_rolled_back_is_tested_as_the_request_sees_it() -> None:
    """Two releases free quota and room; the walk tests whether each queued request could now
    start sooner in one of its pools. A pool the walk has not rolled back still holds the
    takes of the requests after the one tested, which that request does not see: they are
    given back for the test (here a request would otherwise keep a slot the full plan moves
    sooner, in a pool that looked full)."""
    zone_b = "us-central1-b"
    both = (ZONE, zone_b)
    planner = IncrementalPlanner(clock_floor=0)
    snapshot = build_snapshot(
        pools=[pool(zone=ZONE, capacity=3), pool(zone=zone_b, capacity=1)],
        tenants=[tenant("t1", quota(nominal=16)), tenant("t2", quota(nominal=1024))],
        grants=[
            grant("g0", tenant="t1", units=1, start_at=NOW - HOUR, hours=2),
            grant(
                "g1", tenant="t2", pool_id=f"{zone_b}/{A3}", units=1, start_at=NOW - HOUR, hours=3
            ),
        ],
        pending=[
            flex("r0", tenant="t2", vm_count=1, hours=2),
            flex("r1", tenant="t1", vm_count=1, hours=3, locations=(zone_b, ZONE)),
            flex("r2", tenant="t2", vm_count=1, hours=1),
            flex("r3", tenant="t2", vm_count=2, hours=4, locations=both),
            flex("r4", tenant="t1", vm_count=2, hours=3),
            flex("r5", tenant="t1", vm_count=1, hours=2),
            flex("r6", tenant="t2", vm_count=2, hours=2, locations=both),
            flex("r7", tenant="t2", vm_count=1, hours=4),
        ],
    )
    planner.plan(snapshot, NOW)
    for released in ("g0", "g1"):
        snapshot = replace(
            snapshot, grants=tuple(g for g in snapshot.grants if g.request_id != released)
        )
        assert planner.plan(snapshot, NOW) == admit(snapshot, NOW)
        assert not planner.last_pass.full


def test_arrivals_between_the_same_two_requests_keep_the_walk_in_policy_order() -> None:
    """The walk orders its visits by policy key; forty arrivals landing one after another just
    before the same request (once ordered by integer stamps, which this many arrivals ran out
    of room between). Each pass still plans as ``admit``, the kept entries stay in policy
    order, and a departure among them is visited in its place."""
    planner = IncrementalPlanner(clock_floor=0)
    # Same size, same submission: policy order is request id order.
    snapshot = build_snapshot(
        pools=[pool(capacity=3)],
        tenants=[tenant("t", quota(nominal=1024))],
        grants=[grant("g1", units=2, start_at=NOW - HOUR, hours=3)],
        pending=[flex("a", hours=2), flex("z", hours=2)],
    )
    assert planner.plan(snapshot, NOW) == admit(snapshot, NOW)
    for index in range(40):
        arrival = flex(f"b{index:02d}", hours=2)
        snapshot = replace(snapshot, pending=(*snapshot.pending, arrival))
        assert planner.plan(snapshot, NOW) == admit(snapshot, NOW)
        assert not planner.last_pass.full
        flex_state = planner._pass.flex if planner._pass is not None else None
        assert flex_state is not None
        keys = [entry.key for entry in flex_state.entries]
        assert keys == sorted(set(keys)), f"entries out of order after {arrival.request_id}"
    for gone in ("b05", "a", "b39"):
        snapshot = replace(
            snapshot, pending=tuple(r for r in snapshot.pending if r.request_id != gone)
        )
        assert planner.plan(snapshot, NOW) == admit(snapshot, NOW)
        assert not planner.last_pass.full


ELSEWHERE = f"{OTHER_ZONE}/{A3}"


def waiting_beside(*grants: Grant) -> Snapshot:
    """r (tenant a: half the first pool, for an hour) beside ``grants``: the first pool of 8
    VMs, a second of 16 (``ELSEWHERE``, where a's other runs are), a's quota 64 H100s."""
    return build_snapshot(
        pools=[pool(capacity=8), pool(zone=OTHER_ZONE, capacity=16)],
        tenants=[tenant("a", quota(nominal=64)), tenant("b", quota(nominal=1024))],
        grants=grants,
        pending=[flex("r", tenant="a", vm_count=4, hours=1)],
    )


def start_of_r(planner: IncrementalPlanner, snapshot: Snapshot) -> datetime | None:
    """r's start in ``planner``'s plan of ``snapshot``, checked to be ``admit``'s and made
    without a full pass."""
    plan = planner.plan(snapshot, NOW)
    assert plan == admit(snapshot, NOW)
    assert not planner.last_pass.full, planner.last_pass
    return plan.decision("r").start_at


def without(snapshot: Snapshot, *ids: str) -> Snapshot:
    """``snapshot`` with the grants named ``ids`` released."""
    return replace(snapshot, grants=tuple(g for g in snapshot.grants if g.request_id not in ids))


def test_what_a_visit_proved_of_a_pool_alone_is_dropped_once_the_pool_gains() -> None:
    """r waits three hours for room in its pool; its tenant's quota frees sooner. A release
    of quota that does not reach past the pool's busy hours lets the walk prove, once, that
    the pool alone has no room for r before its slot (``_Entry.clear``), and later visits
    skip the pool while it gains nothing r could use. Then the pool frees half its room
    while new quota taken elsewhere keeps r at its slot; when that quota is released, r starts
    now: what was proved of the pool must have been dropped when it gained."""
    snapshot = waiting_beside(
        grant("b1", tenant="b", units=4, start_at=NOW - HOUR, hours=4),
        grant("b2", tenant="b", units=4, start_at=NOW - HOUR, hours=4),
        grant("far", tenant="b", units=4, start_at=NOW + 10 * HOUR, hours=1),
        grant("a1", tenant="a", pool_id=ELSEWHERE, units=4, start_at=NOW - HOUR, hours=4),
        grant("a2", tenant="a", pool_id=ELSEWHERE, units=4, start_at=NOW - HOUR, hours=2),
    )
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(snapshot, NOW).decision("r").start_at == NOW + 3 * HOUR
    # Quota frees for the first hour, the pool only ten hours ahead: r stays.
    snapshot = without(snapshot, "a2", "far")
    assert start_of_r(planner, snapshot) == NOW + 3 * HOUR
    # Half the pool frees now, but the quota is taken again until r's slot: r stays.
    again = grant("a3", tenant="a", pool_id=ELSEWHERE, units=4, start_at=NOW, hours=3)
    snapshot = without(replace(snapshot, grants=(*snapshot.grants, again)), "b1")
    assert start_of_r(planner, snapshot) == NOW + 3 * HOUR
    # The quota frees: only the pool's own gain, a pass ago, lets r start now.
    assert start_of_r(planner, without(snapshot, "a3")) == NOW


def test_what_a_visit_proved_of_a_pool_alone_is_dropped_once_the_request_moves() -> None:
    """As above, a release of quota lets the walk prove that r's pool alone has no room before
    its slot (three hours ahead). Then quota taken elsewhere over the hour of that slot moves r
    an hour later, where the pool had room all along: what was proved covers only the starts
    before the old slot, so when that quota is released r must move back."""
    snapshot = waiting_beside(
        grant("b1", tenant="b", units=8, start_at=NOW - HOUR, hours=4),
        grant("far", tenant="b", units=4, start_at=NOW + 10 * HOUR, hours=1),
        grant("a1", tenant="a", pool_id=ELSEWHERE, units=4, start_at=NOW - HOUR, hours=4),
        grant("a2", tenant="a", pool_id=ELSEWHERE, units=4, start_at=NOW - HOUR, hours=2),
    )
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(snapshot, NOW).decision("r").start_at == NOW + 3 * HOUR
    kept = without(snapshot, "a2", "far")
    assert start_of_r(planner, kept) == NOW + 3 * HOUR
    over_the_slot = grant(
        "a4", tenant="a", pool_id=ELSEWHERE, units=8, start_at=NOW + 3 * HOUR, hours=1
    )
    moved = replace(kept, grants=(*kept.grants, over_the_slot))
    assert start_of_r(planner, moved) == NOW + 4 * HOUR
    assert start_of_r(planner, kept) == NOW + 3 * HOUR


def test_a_pool_not_rolled_back_has_room_for_a_start_just_before_the_slot() -> None:
    """r waits for its tenant's quota until three hours ahead; its pool frees a minute
    before. A release of a little quota makes the walk test whether the pool alone, as r
    sees it (not rolled back), has room for a start that could win: it has, from the minute
    before the slot, so nothing is proved; once the quota frees, r starts that minute."""
    snapshot = waiting_beside(
        grant("b1", tenant="b", units=8, start_at=NOW - HOUR, end_at=NOW + 179 * MINUTE),
        grant("a1", tenant="a", pool_id=ELSEWHERE, units=7, start_at=NOW - HOUR, hours=4),
        grant("a2", tenant="a", pool_id=ELSEWHERE, units=1, start_at=NOW - HOUR, hours=2),
    )
    planner = IncrementalPlanner(clock_floor=0)
    assert planner.plan(snapshot, NOW).decision("r").start_at == NOW + 3 * HOUR
    snapshot = without(snapshot, "a2")
    assert start_of_r(planner, snapshot) == NOW + 3 * HOUR
    assert start_of_r(planner, without(snapshot, "a1")) == NOW + 179 * MINUTE
