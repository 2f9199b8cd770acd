"""The reconcile service on in-memory fakes: the life cycle from admission to the end of a
run, failover on stockouts and timeouts, calendar blocks, the lease, and leaks."""

from __future__ import annotations

from datetime import timedelta

import pytest

from opendws.adapters.memory import MemoryCapacityProvider
from opendws.domain.model import PolicySettings
from opendws.domain.states import RequestState
from opendws.ports import (
    Change,
    Configuration,
    Fenced,
    Lane,
    Order,
    Providers,
    StatusEvent,
    order_name,
)
from opendws.service.reconcile import ReconcileSettings
from tests.builders import A3, DAY, H100, HOUR, MINUTE, NOW, calendar, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"
POOL_A, POOL_B = f"{ZONE_A}/{A3}", f"{ZONE_B}/{A3}"
LATENCY = timedelta(seconds=20)
Zones = tuple[World, MemoryCapacityProvider]


@pytest.fixture
def two_zones() -> tuple[World, MemoryCapacityProvider]:
    world, cloud = memory_world(
        [pool(zone=ZONE_A, capacity=4), pool(zone=ZONE_B, capacity=4)], tenants_for(H100)
    )
    cloud.set_stock(ZONE_A, A3, 4)
    cloud.set_stock(ZONE_B, A3, 4)
    return world, cloud


def settle(world: World, delta: timedelta = LATENCY) -> None:
    world.clock.advance(delta)
    world.run()


def test_an_admitted_request_is_provisioned_and_becomes_active(two_zones: Zones) -> None:
    world, cloud = two_zones
    submit(world.store, flex("train", vm_count=2, hours=6, locations=(ZONE_A, ZONE_B)))
    report = world.run()
    assert report.ran
    assert report.transitions == {(S.PENDING, S.PROVISIONING): 1}
    record = world.record("train")
    assert (record.state, record.pool, record.attempt) == (S.PROVISIONING, POOL_A, 1)
    assert report.provisioned == [order_name("train", 1)]
    settle(world)
    assert world.state("train") is S.ACTIVE
    assert cloud.stock(ZONE_A, A3) == 2
    assert world.published("train") == [
        ("PROVISIONING", "ADMITTED", POOL_A),
        ("ACTIVE", "READY", POOL_A),
    ]
    assert world.record("train").announced == world.record("train").events == 3


def test_a_stockout_keeps_the_order_queued_marks_the_pool_short_and_races_the_next_zone(
    two_zones: Zones,
) -> None:
    """Google keeps a resize request short of capacity ACCEPTED (the stockout is in
    status.lastAttempt; compute/docs/instance-groups/about-resize-requests-mig): the order
    is not cancelled. Its pool is marked short, and the request is offered to its other zone
    as well; the first served wins and the other order is cancelled in the same pass."""
    world, cloud = two_zones
    cloud.set_stock(ZONE_A, A3, 0)
    submit(world.store, flex("train", vm_count=2, locations=(ZONE_A, ZONE_B)))
    world.run()
    settle(world)  # A's first attempt finds no capacity: it waits; B joins the race
    record = world.record("train")
    assert record.state is S.PROVISIONING
    assert record.lanes == (Lane(POOL_A, 1), Lane(POOL_B, 2))
    assert world.store.pool_shortages()[POOL_A] == world.clock.now() + timedelta(minutes=10)
    assert order_name("train", 1) in cloud.observe([pool(zone=ZONE_A)])  # still queued
    settle(world)
    record = world.record("train")
    assert (record.state, record.pool, record.lanes) == (S.ACTIVE, POOL_B, (Lane(POOL_B, 2),))
    assert [e[:2] for e in world.published("train")] == [
        ("PROVISIONING", "ADMITTED"),
        ("PROVISIONING", "WAITING_FOR_CAPACITY"),
        ("PROVISIONING", "RACING"),
        ("ACTIVE", "READY"),
    ]
    waiting = next(e for e in world.bus.published if e.reason == "WAITING_FOR_CAPACITY")
    assert f"waiting for Google Cloud in {POOL_A} since" in waiting.message
    assert "last attempt: ZONE_RESOURCE_POOL_EXHAUSTED" in waiting.message
    # The losing order was cancelled and deleted: only the winner remains.
    assert set(cloud.observe([pool(zone=ZONE_A), pool(zone=ZONE_B)])) == {order_name("train", 2)}
    assert cloud.stock(ZONE_A, A3) == 0


def test_an_order_waits_at_google_without_a_timeout_until_max_wait(two_zones: Zones) -> None:
    """No provisioning timeout: cancelling would lose the place in Google's queue
    (cluster-toolkit waits up to 65,535 s for flex partitions). Only max_wait ends the wait,
    and then every order the request had queued is cancelled."""
    world, cloud = two_zones
    cloud.inject(ZONE_A, A3, "hang")
    submit(world.store, flex("train", vm_count=1, max_wait=timedelta(hours=2),
                             locations=(ZONE_A,)))  # fmt: skip
    world.run()
    settle(world, timedelta(minutes=90))
    assert world.state("train") is S.PROVISIONING
    assert order_name("train", 1) in cloud.observe([pool(zone=ZONE_A)])
    settle(world, timedelta(minutes=31))
    assert world.state("train") is S.TIMED_OUT
    assert world.published("train")[-1][:2] == ("TIMED_OUT", "MAX_WAIT_PASSED")
    assert cloud.observe([pool(zone=ZONE_A)]) == {}


def test_a_stockout_after_max_wait_times_the_request_out(two_zones: Zones) -> None:
    world, cloud = two_zones
    cloud.inject(ZONE_A, A3, "stockout")
    submit(world.store, flex("late", max_wait=timedelta(seconds=10), locations=(ZONE_A,)))
    world.run()
    settle(world)
    assert world.state("late") is S.TIMED_OUT
    assert world.published("late")[-1][:2] == ("TIMED_OUT", "MAX_WAIT_PASSED")
    assert cloud.observe([pool(zone=ZONE_A)]) == {}


def test_the_sweep_ends_a_run_whose_time_is_up_and_frees_the_pool(two_zones: Zones) -> None:
    world, _cloud = two_zones
    submit(world.store, flex("short", vm_count=4, hours=1, locations=(ZONE_A,)))
    submit(
        world.store,
        flex("next", vm_count=4, hours=1, locations=(ZONE_A,), submitted_at=NOW + MINUTE),
    )
    world.run()
    settle(world)
    assert (world.state("short"), world.state("next")) == (S.ACTIVE, S.PENDING)
    assert world.record("next").eta is not None
    # The fake cloud would end the VMs itself at the hour; the sweep gets there first here
    # because the cloud's clock is the same one: both see the end.
    settle(world, HOUR + 2 * MINUTE)
    assert world.state("short") is S.EXPIRED
    assert world.state("next") is S.PROVISIONING
    settle(world)
    assert world.state("next") is S.ACTIVE


def test_a_calendar_block_is_reserved_started_and_ended(two_zones: Zones) -> None:
    world, cloud = two_zones
    start = NOW + HOUR
    submit(world.store, calendar("block", vm_count=2, days=1, start_at=start))
    world.run()
    assert (world.state("block"), world.record("block").reason) == (S.PENDING, "AWAITING_APPROVAL")
    settle(world, 2 * MINUTE)  # Google's review (the memory cloud's delay)
    record = world.record("block")
    assert (record.state, record.pool) == (S.BOOKED, POOL_A)
    assert cloud.stock(ZONE_A, A3) == 4  # promised at booking, taken at the start
    settle(world, HOUR - 2 * MINUTE)
    assert world.state("block") is S.PROVISIONING
    assert cloud.stock(ZONE_A, A3) == 2
    settle(world)
    assert world.state("block") is S.ACTIVE
    settle(world, DAY)
    assert world.state("block") is S.EXPIRED
    assert cloud.stock(ZONE_A, A3) == 4
    assert [e[0] for e in world.published("block")] == [
        "PENDING", "BOOKED", "PROVISIONING", "ACTIVE", "EXPIRED",
    ]  # fmt: skip


def test_a_waiting_request_announces_its_eta_once_until_it_changes(two_zones: Zones) -> None:
    world, _ = two_zones
    submit(world.store, flex("big", vm_count=4, hours=2, locations=(ZONE_A,)))
    submit(world.store, flex("after", vm_count=4, hours=3, locations=(ZONE_A,),
                             submitted_at=NOW + MINUTE))  # fmt: skip
    world.run()
    held = world.record("after")
    assert held.state is S.PENDING
    assert held.reason == "NO_CAPACITY_UNTIL"
    assert held.eta is not None
    assert held.position == 1
    count = len(world.bus.published)
    world.run()
    assert len(world.bus.published) == count  # nothing new to say


def test_a_second_reconciler_stands_back_while_the_lease_is_held(two_zones: Zones) -> None:
    world, _ = two_zones
    fence = world.store.acquire_lease("other", world.clock.now(), timedelta(minutes=2))
    assert fence is not None
    submit(world.store, flex("r1", locations=(ZONE_A,)))
    assert not world.run().ran
    assert world.state("r1") is S.PENDING
    world.clock.advance(timedelta(minutes=3))  # the other holder died; its lease ran out
    assert world.run().ran
    assert world.state("r1") is S.PROVISIONING


def test_a_reconciler_that_lost_its_lease_cannot_write(two_zones: Zones) -> None:
    world, _ = two_zones
    submit(world.store, flex("r1", locations=(ZONE_A,)))
    old = world.store.acquire_lease("old", NOW, timedelta(minutes=2))
    new = world.store.acquire_lease("new", NOW + timedelta(minutes=3), timedelta(minutes=2))
    assert old is not None
    assert new is not None
    assert new.token == old.token + 1
    record = world.record("r1")
    with pytest.raises(Fenced, match="held by new"):
        world.store.change(
            "r1",
            Change(
                expected_version=record.version,
                state=S.CANCELLED,
                event=StatusEvent(
                    request_id="r1", tenant="t", state=S.CANCELLED, previous_state=S.PENDING, at=NOW
                ),
            ),
            fence=old,
        )
    with pytest.raises(Fenced):
        world.store.mark_pool_short(POOL_A, NOW + HOUR, old)
    assert world.state("r1") is S.PENDING
    assert POOL_A not in world.store.pool_shortages()


def test_an_owned_resource_no_request_wants_is_released(two_zones: Zones) -> None:
    world, cloud = two_zones
    stray = flex("gone", vm_count=2, locations=(ZONE_A,))
    cloud.provision(Order(request=stray, pool=pool(zone=ZONE_A, capacity=4), attempt=1))
    world.clock.advance(LATENCY)
    assert cloud.stock(ZONE_A, A3) == 2
    report = world.run()
    assert report.leaks == [order_name("gone", 1)]
    assert cloud.stock(ZONE_A, A3) == 4


def test_a_request_whose_pool_was_removed_waits_again(two_zones: Zones) -> None:
    world, _ = two_zones
    submit(world.store, flex("r1", locations=(ZONE_A, ZONE_B)))
    world.run()
    assert world.record("r1").pool == POOL_A

    world.config.save(
        Configuration(pools=(pool(zone=ZONE_B, capacity=4),), tenants=tenants_for(H100))
    )
    world.run()
    record = world.record("r1")
    assert (record.state, record.pool) == (S.PROVISIONING, POOL_B)
    assert any(e[1] == "POOL_REMOVED" for e in world.published("r1"))


def test_settings_are_honoured() -> None:
    """give_up_after brings back the old cancel-and-retry, for comparison (bench/obtain.py)."""
    settings = ReconcileSettings(give_up_after=timedelta(minutes=1))
    world, cloud = memory_world(
        [pool(zone=ZONE_A, capacity=4), pool(zone=ZONE_B, capacity=4)],
        tenants_for(H100),
        settings=settings,
        policy=PolicySettings(race_width=1),
    )
    cloud.set_stock(ZONE_B, A3, 4)
    cloud.inject(ZONE_A, A3, "hang")
    submit(world.store, flex("r1", locations=(ZONE_A, ZONE_B)))
    world.run()
    settle(world, timedelta(minutes=1))
    assert world.record("r1").pool == POOL_B
    assert any(e[1] == "GAVE_UP" for e in world.published("r1"))


class RefusingZone:
    """A provider that refuses every creation in one zone (the API answers with an error)."""

    def __init__(self, inner: MemoryCapacityProvider, zone: str) -> None:
        self.inner = inner
        self.zone = zone
        self.refused = 0

    def observe(self, pools):  # type: ignore[no-untyped-def]
        return self.inner.observe(pools)

    def reserve(self, order: Order) -> None:
        self.inner.reserve(order)

    def provision(self, order: Order) -> None:
        if order.pool.zone == self.zone:
            self.refused += 1
            raise RuntimeError("400 Invalid value for field 'resource.instances'")
        self.inner.provision(order)

    def release(self, name: str, pool):  # type: ignore[no-untyped-def]
        self.inner.release(name, pool)


def test_a_failing_provider_call_holds_up_no_one_and_fails_over_once_never_taken(
    two_zones: Zones,
) -> None:
    world, cloud = two_zones
    refusing = RefusingZone(cloud, ZONE_A)
    # No calendar block here: RefusingZone has no advise() or withdraw().
    world.providers = Providers(mig_flex=refusing, tpu=refusing, calendar=refusing)  # type: ignore[arg-type]
    submit(world.store, flex("stuck", vm_count=1, locations=(ZONE_A, ZONE_B)))
    submit(world.store, flex("fine", vm_count=1, locations=(ZONE_B,), submitted_at=NOW + MINUTE))
    report = world.run()
    assert len(report.errors) == 1
    assert "400 Invalid value" in report.errors[0]
    settle(world)
    assert (world.state("stuck"), world.state("fine")) == (S.PROVISIONING, S.ACTIVE)
    assert refusing.refused == 2  # re-issued on the next pass
    settle(world, timedelta(minutes=15))
    record = world.record("stuck")
    assert (record.state, record.pool, record.attempt) == (S.PROVISIONING, POOL_B, 2)
    settle(world)
    assert world.state("stuck") is S.ACTIVE


def test_one_pass_applies_every_kind_of_decision(two_zones: Zones) -> None:
    world, _ = two_zones
    submit(world.store, flex("now", vm_count=2, locations=(ZONE_A,)))
    submit(world.store, flex("held", vm_count=4, hours=5, locations=(ZONE_A,),
                             submitted_at=NOW + MINUTE))  # fmt: skip
    submit(world.store, flex("huge", vm_count=9, locations=(ZONE_A, ZONE_B)))
    submit(world.store, calendar("block", vm_count=4, start_at=NOW + DAY, locations=(ZONE_B,)))
    submit(world.store, calendar("clash", vm_count=1, start_at=NOW + DAY, locations=(ZONE_B,),
                                 submitted_at=NOW + MINUTE))  # fmt: skip
    report = world.run()
    states = {name: world.state(name) for name in ("now", "held", "huge", "block", "clash")}
    assert states == {
        "now": S.PROVISIONING,
        "held": S.PENDING,
        "huge": S.REJECTED,
        "block": S.PENDING,  # submitted to Google, awaiting its approval
        "clash": S.REJECTED,
    }
    assert world.record("block").reason == "AWAITING_APPROVAL"
    assert world.record("huge").reason == "NEVER_FITS"
    clash = world.record("clash")
    assert clash.reason == "NO_CAPACITY"
    assert "nearest starts that fit" in clash.message
    assert report.transitions == {
        (S.PENDING, S.PROVISIONING): 1, (S.PENDING, S.REJECTED): 2,
    }  # fmt: skip
    assert report.revisions == 2  # held: its ETA announced; block: submitted for review


def test_an_eta_drifting_less_than_the_tolerance_is_not_announced(two_zones: Zones) -> None:
    """An estimate (an ETA beyond the commitment horizon): within the horizon every later ETA
    is told (test_reconcile_commitments)."""
    world, cloud = two_zones
    cloud.inject(ZONE_A, A3, "hang")  # "first" stays provisioning: its end drifts with the clock
    submit(world.store, flex("first", vm_count=4, hours=3, locations=(ZONE_A,)))
    submit(world.store, flex("after", vm_count=4, hours=4, locations=(ZONE_A,),
                             submitted_at=NOW + MINUTE))  # fmt: skip
    world.run()
    first_eta = world.record("after").eta
    assert first_eta == NOW + 3 * HOUR
    settle(world, 2 * MINUTE)
    assert world.record("after").eta == first_eta  # moved 2 min: not news
    settle(world, 6 * MINUTE)
    assert world.record("after").eta == NOW + 8 * MINUTE + 3 * HOUR  # moved 8 min: announced
    assert [e[0] for e in world.published("after")] == ["PENDING", "PENDING"]


def test_a_long_pass_renews_its_lease_and_stops_when_it_was_taken(two_zones: Zones) -> None:
    world, _ = two_zones
    world.settings = ReconcileSettings(renew_every=2)
    for index in range(6):
        submit(world.store, flex(f"r{index}", vm_count=4, hours=1 + index, locations=(ZONE_A,)))
    store = world.store

    class Thief:
        """Takes the lease over after the third write of the pass."""

        def __init__(self) -> None:
            self.writes = 0

        def __getattr__(self, name: str) -> object:
            return getattr(store, name)

        def change(self, *args: object, **kwargs: object) -> object:
            self.writes += 1
            if self.writes == 3:
                store.release_lease(kwargs["fence"])  # type: ignore[arg-type]
                store.acquire_lease("thief", world.clock.now(), timedelta(minutes=2))
            return store.change(*args, **kwargs)  # type: ignore[arg-type]

    world.store = Thief()  # type: ignore[assignment]
    report = world.run()
    assert report.fenced
    assert sum(report.transitions.values()) + report.revisions == 2


def test_a_pass_reports_what_google_is_still_to_serve_as_it_stands_when_the_pass_ends(
    two_zones: Zones,
) -> None:
    """``in_flight`` counts the requests a pass leaves PROVISIONING or under Google's review
    (a replay keeps passing while any is), after the pass's own writes: an admission adds one,
    a served order and a reviewed block take theirs away."""
    world, _ = two_zones
    submit(world.store, flex("train", vm_count=2, hours=6, locations=(ZONE_A,)))
    submit(world.store, calendar("block", vm_count=2, days=1, start_at=NOW + DAY))
    first = world.run()  # train admitted (PROVISIONING); block submitted (under review)
    assert (world.state("train"), world.record("block").reason) == (
        S.PROVISIONING,
        "AWAITING_APPROVAL",
    )
    assert first.in_flight == 2
    world.clock.advance(LATENCY)
    second = world.run()  # the order served: ACTIVE; the block still in review
    assert world.state("train") is S.ACTIVE
    assert second.in_flight == 1
    world.clock.advance(2 * MINUTE)
    third = world.run()  # reviewed: BOOKED
    assert world.state("block") is S.BOOKED
    assert third.in_flight == 0
