"""Commitments through the reconciler: the ETA a held request was told (its record's eta and
pool) is what the next passes keep, when the policy's ``commit_within`` is set."""

from __future__ import annotations

from datetime import timedelta

import pytest

from opendws.domain.model import PolicySettings
from opendws.domain.planner.incremental.planner import IncrementalPlanner
from opendws.domain.states import RequestState
from opendws.ports import Change, Fence, Fenced, StatusEvent
from opendws.service import reconcile
from opendws.service.reconcile import ReconcileService
from tests.builders import A3, DAY, H100, HOUR, MINUTE, NOW, ZONE, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState


def planning_on(world: World) -> ReconcileService:
    """A reconciler whose planner plans on from its last plan even over a short queue (as
    over a long one), so that a decision nothing changed stays the very same object."""
    service = world.reconciler()
    service.kept.planner = IncrementalPlanner(clock_floor=0)
    return service


@pytest.mark.parametrize("committed", [False, True])
def test_a_told_eta_holds_against_a_smaller_newcomer_only_when_committed(committed: bool) -> None:
    policy = PolicySettings(commit_within=14 * DAY if committed else None)
    world, cloud = memory_world([pool(capacity=4)], tenants_for(H100), policy=policy)
    cloud.set_stock(ZONE, A3, 4)
    service = world.reconciler()
    submit(world.store, flex("blocker", vm_count=4, hours=2))
    service.run_pass()
    world.clock.advance(MINUTE)
    submit(world.store, flex("big", vm_count=4, hours=1, submitted_at=world.clock.now()))
    service.run_pass()
    told = world.record("big").eta
    assert told is not None
    assert told > NOW + HOUR
    world.clock.advance(MINUTE)
    submit(world.store, flex("small", vm_count=1, run=10 * MINUTE, submitted_at=world.clock.now()))
    service.run_pass()
    now_told = world.record("big").eta
    assert now_told is not None
    if committed:
        assert now_told == told  # kept: small waits behind big's slot
        assert world.record("small").eta == told + HOUR
    else:
        assert now_told - told == timedelta(minutes=10)  # pushed back by small
    assert world.state("big") is S.PENDING


def test_a_pass_reports_the_plans_earliest_held_start() -> None:
    """So that whoever schedules passes (the replay; a timer) can run one exactly when a held
    slot comes, even where the ETA announced is later (a move under eta_tolerance)."""
    world, cloud = memory_world([pool(capacity=4)], tenants_for(H100))
    cloud.set_stock(ZONE, A3, 4)
    service = world.reconciler()
    submit(world.store, flex("blocker", vm_count=4, hours=2))
    assert service.run_pass().next_start is None  # admitted: nothing held
    submit(world.store, flex("big", vm_count=4, hours=1))
    report = service.run_pass()
    assert report.next_start == world.record("big").eta == NOW + 2 * HOUR


@pytest.mark.parametrize("committed", [False, True])
def test_within_the_horizon_a_later_eta_is_always_told(committed: bool) -> None:
    """A run still being created holds its pool from now on, so the slot behind it drifts
    later with the clock (a cause outside the plan). An estimate's drift under eta_tolerance
    is not announced; within the commitment horizon the ETA is a promise, so every later one
    is — and the next pass commits to the slot it holds, not to an earlier ETA told before."""
    policy = PolicySettings(commit_within=2 * HOUR if committed else None)
    world, cloud = memory_world(
        [pool(capacity=4)], tenants_for(H100), policy=policy, latency=DAY
    )  # fmt: skip
    cloud.set_stock(ZONE, A3, 4)
    service = world.reconciler()
    submit(world.store, flex("creating", vm_count=4, hours=1))
    service.run_pass()
    assert world.state("creating") is S.PROVISIONING
    submit(world.store, flex("behind", vm_count=4, hours=1))
    service.run_pass()
    assert world.record("behind").eta == NOW + HOUR
    world.clock.advance(2 * MINUTE)
    service.run_pass()
    told = [e.eta for e in world.bus.published if e.request_id == "behind" and e.eta]
    if committed:
        assert told == [NOW + HOUR, NOW + HOUR + 2 * MINUTE]
        assert world.record("behind").eta == NOW + HOUR + 2 * MINUTE
    else:
        assert told == [NOW + HOUR]  # a 2-minute move of an estimate is not news


def test_a_pass_that_only_sees_its_admissions_run_rewrites_no_held_request() -> None:
    """One VM of two is taken for 3 h. ``late`` (1 VM, 1 h) is admitted when the other frees
    at 1 h, and ``early`` (1 VM, 30 min, first in policy order) is held behind it, both as
    commitments. The next pass at the same instant only sees ``late`` running: the plan is
    the same, so nothing waiting is written or announced again. (A commitment's reason used
    to be judged before the plan's own admission was placed: QUOTA in the pass that admitted
    ``late``, NO_CAPACITY_UNTIL in the next, one write and one event per held request for
    every admission — 96% of the Philly replay's events.)"""
    world, cloud = memory_world([pool(capacity=2)], tenants_for(H100), latency=timedelta(0))
    cloud.set_stock(ZONE, A3, 2)
    service = world.reconciler()
    submit(world.store, flex("blocker", vm_count=1, hours=3))
    submit(world.store, flex("running", vm_count=1, hours=1))
    service.run_pass()
    service.run_pass()  # both run from now
    world.clock.advance(MINUTE)
    submit(world.store, flex("late", vm_count=1, hours=1, submitted_at=world.clock.now()))
    service.run_pass()
    world.clock.advance(MINUTE)
    early = flex("early", vm_count=1, run=30 * MINUTE, submitted_at=world.clock.now())
    submit(world.store, early)
    service.run_pass()
    assert world.record("late").eta == NOW + HOUR
    world.clock.set_at_least(NOW + HOUR)  # "running" ends: "late" comes to its slot
    admitting = service.run_pass()
    assert world.state("late") is S.PROVISIONING
    assert world.state("early") is S.PENDING
    held = world.record("early")
    seen_running = service.run_pass()
    assert world.state("late") is S.ACTIVE
    assert seen_running.revisions == 0
    assert world.record("early").version == held.version
    assert held.reason == "NO_CAPACITY_UNTIL"
    assert admitting.ran
    assert seen_running.ran


def test_a_later_eta_kept_quiet_is_told_once_the_clock_brings_it_within_the_horizon() -> None:
    """``behind`` was told the end of a run Google had not served yet; served 2 minutes
    later, the run ends 2 minutes later, and so does ``behind``'s slot: outside the
    commitment horizon a move under eta_tolerance is not news. The slot then stays where it
    is, pass after pass (the same decision for the same record); once the clock brings it
    within the horizon it is a promise, and the later ETA is told then."""
    policy = PolicySettings(commit_within=2 * HOUR)
    world, cloud = memory_world(
        [pool(capacity=4)], tenants_for(H100), policy=policy, latency=2 * MINUTE
    )  # fmt: skip
    cloud.set_stock(ZONE, A3, 4)
    service = planning_on(world)
    submit(world.store, flex("creating", vm_count=4, hours=3))
    service.run_pass()
    submit(world.store, flex("behind", vm_count=4, hours=1))
    service.run_pass()
    assert world.record("behind").eta == NOW + 3 * HOUR
    world.clock.advance(2 * MINUTE)
    service.run_pass()
    assert world.state("creating") is S.ACTIVE
    later = NOW + 3 * HOUR + 2 * MINUTE
    for minutes in (30, 60, 62):  # eta - now: 2 h 32 min, 2 h 2 min, 2 h exactly
        world.clock.set_at_least(NOW + minutes * MINUTE)
        service.run_pass()
        assert world.record("behind").eta == NOW + 3 * HOUR  # not yet within the horizon
    world.clock.set_at_least(NOW + 63 * MINUTE)
    service.run_pass()
    assert world.record("behind").eta == later
    told = [e.eta for e in world.bus.published if e.request_id == "behind" and e.eta]
    assert told == [NOW + 3 * HOUR, later]


def test_a_record_rewritten_by_another_writer_is_compared_again_with_the_same_decision() -> None:
    """Another writer rewrote a held request's record (its ETA gone): the plan's decision for
    it is the same as last pass, but the record is not, so the pass compares them again and
    tells the ETA again."""
    world, cloud = memory_world([pool(capacity=4)], tenants_for(H100))
    cloud.set_stock(ZONE, A3, 4)
    service = planning_on(world)
    submit(world.store, flex("blocker", vm_count=4, hours=2))
    service.run_pass()
    submit(world.store, flex("held", vm_count=4, hours=1))
    service.run_pass()
    assert service.run_pass().revisions == 0  # the same plan: nothing new to tell
    record = world.record("held")
    assert record.eta == NOW + 2 * HOUR
    event = StatusEvent(
        request_id="held", tenant="t", state=S.PENDING, previous_state=S.PENDING, at=NOW
    )
    world.store.change(
        "held", Change(expected_version=record.version, state=S.PENDING, event=event, eta=None)
    )
    assert world.record("held").eta is None
    service.run_pass()
    assert world.record("held").eta == NOW + 2 * HOUR


def test_a_plan_no_pass_carried_out_is_looked_at_in_full_by_the_next_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pass that lost its lease right after planning carried out nothing of its plan; the
    next plan is made from that one, so its changes alone would miss what the lost plan
    changed (here ``held``, pushed an hour later by an urgent arrival): the next pass looks
    at every decision, and tells ``held`` its new ETA."""
    world, cloud = memory_world(
        [pool(capacity=4)],
        tenants_for(H100),
        latency=timedelta(0),
        policy=PolicySettings(commit_within=None),  # an estimate, not a promise: it moves
    )
    cloud.set_stock(ZONE, A3, 4)
    service = planning_on(world)
    submit(world.store, flex("blocker", vm_count=4, hours=2))
    service.run_pass()
    service.run_pass()  # running from now
    submit(world.store, flex("held", vm_count=4, hours=1))
    service.run_pass()
    assert world.record("held").eta == NOW + 2 * HOUR
    assert service.run_pass().revisions == 0  # nothing new to tell
    submit(world.store, flex("urgent", vm_count=4, hours=1, priority=10))
    real_due = reconcile._Cycle._due
    fences: list[Fence] = []

    def lost_lease(cycle: reconcile._Cycle, *args: object) -> object:
        fences.append(cycle.fence)
        raise Fenced("another reconciler took the lease")

    monkeypatch.setattr(reconcile._Cycle, "_due", lost_lease)
    assert service.run_pass().fenced
    monkeypatch.setattr(reconcile._Cycle, "_due", real_due)
    world.store.release_lease(fences[0])  # whoever held it let it go: a pass at once
    assert service.run_pass().ran
    assert world.record("urgent").eta == NOW + 2 * HOUR
    assert world.record("held").eta == NOW + 3 * HOUR
    # And the slots it keeps for the next pass are this plan's, not the last carried out's.
    pool_id = world.record("held").pool
    assert service.kept.held == {
        "urgent": (pool_id, NOW + 2 * HOUR),
        "held": (pool_id, NOW + 3 * HOUR),
    }
