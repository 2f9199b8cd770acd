"""The snapshot a reconcile pass plans from is built from parts kept between passes
(:mod:`opendws.service.parts`), brought up to date only for the requests that changed: it is
the snapshot built afresh from every record, and a pass where nothing changed hands the
planner the very tuples of the last one."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import cast

import pytest

from opendws.domain.model import CapacityRequest, Commitment, Grant, PolicySettings, Snapshot
from opendws.domain.planner.incremental.planner import IncrementalPlanner
from opendws.domain.planner.verdicts import Outcome, Plan, Reason
from opendws.domain.states import RequestState
from opendws.ports import RequestRecord, submitted
from opendws.service.reconcile import ReconcileService, _grant
from tests.builders import A3, DAY, H100, HOUR, MINUTE, calendar, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
ZONES = ("us-central1-a", "us-central1-b")


class _Recording:
    """A planner that has each snapshot checked and kept (and each plan kept) by ``planned``
    before and after the real one plans it; everything else is the real planner's."""

    def __init__(self, real: IncrementalPlanner, planned: Planned) -> None:
        self._real = real
        self._planned = planned

    def plan(self, snapshot: Snapshot, now: datetime) -> Plan:
        self._planned.check(snapshot, now)
        self._planned.snapshots.append(snapshot)
        made = self._real.plan(snapshot, now)
        self._planned.plans.append(made)
        return made

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)


class Planned:
    """Every snapshot ``service`` plans from, each checked against one built afresh from the
    mirror's records at that moment."""

    def __init__(self, service: ReconcileService) -> None:
        self.service = service
        self.snapshots: list[Snapshot] = []
        self.plans: list[Plan] = []
        self.checked = 0
        # The service's planner, wrapped: a compiled planner's methods cannot be replaced.
        service.kept.planner = cast(IncrementalPlanner, _Recording(service.kept.planner, self))

    def check(self, snapshot: Snapshot, now: datetime) -> None:
        committing = snapshot.policy.commit_within is not None
        fresh = afresh(self.service.kept.mirror.current(), self.service.kept.held, now, committing)
        pending, fixed, moving, commitments = fresh
        assert Counter(snapshot.pending) == Counter(pending)
        assert Counter(snapshot.commitments) == Counter(commitments)
        assert Counter(g for g in snapshot.grants if g.request_id not in moving) == Counter(fixed)
        assert {g.request_id for g in snapshot.grants if g.request_id in moving} == moving
        # A run Google is still creating holds its pool for its whole run from when it is
        # expected to be served, never before now: worked out at this pass's now.
        for grant in snapshot.grants:
            record = self.service.kept.mirror.get(grant.request_id)
            if record is not None and record.state is S.PROVISIONING:
                assert grant.end_at >= now + record.request.run_duration
        self.checked += 1


HELD = {Reason.NO_CAPACITY_UNTIL, Reason.QUOTA, Reason.POOL_SHORT_UNTIL, Reason.FIFO_BLOCKED}


def afresh(
    records: list[RequestRecord],
    held: Mapping[str, tuple[str, datetime]],
    now: datetime,
    committing: bool,
) -> tuple[list[CapacityRequest], list[Grant], set[str], list[Commitment]]:
    """The snapshot's parts built from every record, one by one: the queue, the grants that
    stay where they are, the requests whose grants move with the clock, the commitments."""
    pending: list[CapacityRequest] = []
    fixed: list[Grant] = []
    moving: set[str] = set()
    commitments: list[Commitment] = []
    for record in records:
        state, request_id = record.state, record.request_id
        if submitted(record):
            fixed.append(_grant(record, now))  # a block under Google's review
        elif state is S.PENDING:
            pending.append(record.request)
            if committing and record.reason in HELD and record.eta and record.pool:
                pool_id, start_at = held.get(request_id, (record.pool, record.eta))
                commitments.append(
                    Commitment(request_id=request_id, pool_id=pool_id, start_at=start_at)
                )
        elif state in (S.PROVISIONING, S.ACTIVE, S.BOOKED) and record.pool:
            if state is S.PROVISIONING or (record.since is None and not record.request.start_at):
                moving.add(request_id)
            else:
                fixed.append(_grant(record, now))
    return pending, fixed, moving, commitments


def held_slots(plan: Plan) -> dict[str, tuple[str | None, datetime | None]]:
    """Every held request's (pool, start) in ``plan``."""
    return {
        d.request_id: (d.pool_id, d.start_at)
        for d in plan.decisions
        if d.outcome is Outcome.HOLD and d.pool_id and d.start_at
    }


def busy_world(policy: PolicySettings) -> World:
    world, cloud = memory_world(
        [pool(zone=zone, capacity=8) for zone in ZONES],
        tenants_for(H100),
        timers=True,
        policy=policy,
    )
    for zone in ZONES:
        cloud.set_stock(zone, A3, 8)
    return world


@pytest.mark.parametrize("committed", [True, False])
def test_a_kept_snapshot_is_the_one_built_afresh_through_arrivals_runs_releases_and_blocks(
    committed: bool,
) -> None:
    """Flex arrivals held behind each other, runs Google takes a while to create (their
    grants move with the clock), releases, timers and calendar blocks, over many passes with
    commitments on: every snapshot planned from has the parts a fresh build gives."""
    rng = random.Random(17)
    world = busy_world(PolicySettings(commit_within=14 * DAY if committed else None))
    service = world.reconciler()
    planned = Planned(service)
    for step in range(80):
        for _ in range(rng.randrange(3)):
            submit(
                world.store,
                flex(
                    f"f{step}-{rng.randrange(10**6)}",
                    vm_count=rng.randint(1, 6),
                    hours=rng.choice((0.5, 1, 2, 4)),
                    locations=rng.sample(ZONES, rng.randint(1, 2)),
                    submitted_at=world.clock.now(),
                ),
            )
        if step % 15 == 3:
            submit(
                world.store,
                calendar(
                    f"c{step}",
                    vm_count=2,
                    days=1,
                    start_at=world.clock.now() + 2 * DAY,
                    locations=(ZONES[step % 2],),
                    submitted_at=world.clock.now(),
                ),
            )
        active = sorted(world.store.in_states(S.ACTIVE), key=lambda r: r.request_id)
        if active and rng.random() < 0.4:
            world.ending().release(rng.choice(active).request_id, "t")
        world.fire_due()
        if service.run_pass().ran:
            # Where the pass holds each held request, kept from pass to pass: as every
            # decision of the plan says.
            assert service.kept.held == held_slots(planned.plans[-1])
        world.clock.advance(rng.choice((timedelta(seconds=5), MINUTE, 5 * MINUTE, HOUR)))
    assert planned.checked >= 80
    assert any(snapshot.commitments for snapshot in planned.snapshots) is committed
    states = Counter(record.state for record in world.store.in_states(*S))
    assert states[S.PENDING] > 0  # requests were held behind others
    assert states[S.ACTIVE] + states[S.RELEASED] > 0


def test_a_pass_where_nothing_changed_hands_the_planner_the_same_tuples() -> None:
    """Once the world settles (a run holds the pool, two wait behind it, each told its ETA),
    a pass that finds nothing changed plans from the last pass's own tuples: the planner sees
    at once that nothing did."""
    world = busy_world(PolicySettings(commit_within=14 * DAY))
    service = world.reconciler()
    planned = Planned(service)
    submit(world.store, flex("run", vm_count=8, hours=10, locations=ZONES[:1]))
    service.run_pass()
    for name in ("held-1", "held-2"):
        later = world.clock.now()
        submit(
            world.store, flex(name, vm_count=8, hours=1, locations=ZONES[:1], submitted_at=later)
        )
    for _ in range(5):  # admitted, created, then running; the others told their ETAs
        service.run_pass()
        world.clock.advance(MINUTE)
    assert world.state("run") is S.ACTIVE
    service.run_pass()
    service.run_pass()
    before, after = planned.snapshots[-2:]
    assert len(after.pending) == 2
    assert len(after.commitments) == 2
    assert after.pending is before.pending
    assert after.grants is before.grants
    assert after.commitments is before.commitments
    # A new arrival changes the queue and leaves the grants' tuple as it was.
    later = world.clock.now()
    submit(world.store, flex("late", vm_count=8, hours=1, locations=ZONES[:1], submitted_at=later))
    service.run_pass()
    newest = planned.snapshots[-1]
    assert len(newest.pending) == 3
    assert newest.grants is after.grants


def test_a_cold_service_builds_every_part_from_the_records() -> None:
    """A second reconciler (a cold instance) reads everything once and builds its snapshot
    from every record: the same queue and grants the warm one plans from."""
    world = busy_world(PolicySettings(commit_within=14 * DAY))
    warm = world.reconciler()
    warm_planned = Planned(warm)
    submit(world.store, flex("run", vm_count=8, hours=10, locations=ZONES[:1]))
    warm.run_pass()
    submit(world.store, flex("held", vm_count=8, hours=1, locations=ZONES[:1]))
    for _ in range(4):
        warm.run_pass()
        world.clock.advance(MINUTE)
    warm.run_pass()
    cold = world.reconciler("reconciler-2")
    cold_planned = Planned(cold)
    world.clock.advance(MINUTE)
    cold.run_pass()
    assert Counter(cold_planned.snapshots[-1].pending) == Counter(
        warm_planned.snapshots[-1].pending
    )
    assert Counter(cold_planned.snapshots[-1].grants) == Counter(warm_planned.snapshots[-1].grants)
    assert len(cold_planned.snapshots[-1].pending) == 1


def test_a_request_racing_two_pools_holds_a_grant_in_each_while_it_races() -> None:
    """Google keeps a resize request short of capacity queued (its stockout in
    status.lastAttempt; compute/docs/instance-groups/about-resize-requests-mig), so a flex
    request short in one zone is offered to its other zone too: until one lane wins, each
    lane's pool is held for it, worked out at every pass (the race moves with the clock)."""
    world, cloud = memory_world([pool(zone=zone, capacity=4) for zone in ZONES], tenants_for(H100))
    cloud.set_stock(ZONES[0], A3, 0)
    cloud.set_stock(ZONES[1], A3, 4)
    cloud.inject(ZONES[1], A3, "hang")  # the other zone does not serve it either, yet
    service = world.reconciler()
    planned = Planned(service)
    submit(world.store, flex("train", vm_count=2, locations=ZONES))
    for _ in range(6):
        service.run_pass()
        world.clock.advance(timedelta(seconds=20))  # Google's answer (the fake's latency)
        if len(world.record("train").lanes) > 1:
            break
    assert len(world.record("train").lanes) == 2  # racing
    service.run_pass()
    pools = [grant.pool_id for grant in planned.snapshots[-1].grants]
    assert sorted(pools) == sorted(lane.pool for lane in world.record("train").lanes)
