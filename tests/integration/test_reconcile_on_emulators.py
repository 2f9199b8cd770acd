"""The reconciler on the real adapters: Firestore (official emulator) for requests, lease and
configuration, and the real Compute Engine / Cloud TPU clients over the project's emulator of
a simulated cloud that behaves as Google documents. Admission → provisioning → ACTIVE; orders
wait in Google's queue until max_wait and race other zones once theirs are short; two zones
served together leave one gang; nothing is left running that no request owns; four
reconcilers at once provision each admitted request exactly once."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import timedelta

import pytest

from opendws.domain.model import PolicySettings
from opendws.domain.states import RequestState
from opendws.ports import Lane, order_name
from opendws.service.reconcile import PassReport, ReconcileSettings
from tests.builders import A3, MINUTE, NOW, calendar, flex, pool
from tests.integration.conftest import LATENCY, POOL_A, POOL_B, ZONE_A, ZONE_B, Stack
from tests.world import submit

S = RequestState


def test_admitted_requests_are_provisioned_and_become_active(stack: Stack) -> None:
    world = stack.world
    submit(world.store, flex("train", vm_count=2, hours=6, locations=(ZONE_A, ZONE_B)))
    submit(world.store, flex("slice", vm_count=1, hours=2, topology="4x4", locations=(ZONE_A,)))
    stack.run()
    assert world.record("train").state is S.PROVISIONING
    assert stack.cloud.created("resizeRequests") == {order_name("train", 1): 1}
    assert stack.cloud.created("queuedResources") == {order_name("slice", 1): 1}
    stack.advance(LATENCY)
    stack.run()
    assert (world.state("train"), world.state("slice")) == (S.ACTIVE, S.ACTIVE)
    assert stack.cloud.stock(ZONE_A, A3) == 2
    assert stack.cloud.stock(ZONE_A, "V5LITE_POD") == 0
    assert [e[0] for e in world.published("train")] == ["PROVISIONING", "ACTIVE"]
    # Its run time is up: the sweep releases it; the TPU slice too, and the stock comes back.
    stack.advance(timedelta(hours=6, minutes=2))
    stack.run()
    assert (world.state("train"), world.state("slice")) == (S.EXPIRED, S.EXPIRED)
    assert stack.cloud.stock(ZONE_A, A3) == 4
    assert stack.cloud.stock(ZONE_A, "V5LITE_POD") == 16


ZONE_C = "us-central1-c"
POOL_C = f"{ZONE_C}/{A3}"


def three_zones(stack: Stack, *, stock: tuple[int, int, int], **policy: object) -> None:
    """Zones A, B and C of one machine type, with ``stock`` free VMs each at Google."""
    configuration = stack.world.config.load()
    stack.world.config.save(
        replace(
            configuration,
            pools=(*configuration.pools, pool(zone=ZONE_C, capacity=4)),
            policy=PolicySettings(**policy),  # type: ignore[arg-type]
        )
    )
    for zone, units in zip((ZONE_A, ZONE_B, ZONE_C), stock, strict=True):
        stack.cloud.set_stock(zone, A3, units)


def test_a_three_zone_request_with_stock_only_in_the_third_is_served_there(stack: Stack) -> None:
    """Google keeps a resize request short of capacity ACCEPTED with the stockout in
    status.lastAttempt (compute/docs/instance-groups/about-resize-requests-mig; compute.proto
    InstanceGroupManagerResizeRequestStatus): the orders in A and B wait, the request races
    on into C, is served there, and the orders still queued in A and B are cancelled."""
    world = stack.world
    three_zones(stack, stock=(0, 0, 4), race_width=3)
    submit(world.store, flex("train", vm_count=2, locations=(ZONE_A, ZONE_B, ZONE_C)))
    for _ in range(4):
        stack.run()
        stack.advance(LATENCY)
    stack.run()
    record = world.record("train")
    assert (record.state, record.pool) == (S.ACTIVE, POOL_C)
    assert {POOL_A, POOL_B} <= set(world.store.pool_shortages())
    resize = stack.cloud.state()["resources"][stack.project]["resizeRequests"]  # type: ignore[index]
    states = {entry["name"]: entry["state"] for entry in resize}
    assert states[order_name("train", record.lanes[0].attempt)] == "SUCCEEDED"
    assert sorted(states.values()).count("SUCCEEDED") == 1
    assert stack.cloud.stock(ZONE_C, A3) == 2
    assert stack.left_running() == []
    reasons = [e[1] for e in world.published("train")]
    assert reasons[:2] == ["ADMITTED", "WAITING_FOR_CAPACITY"]
    assert "RACING" in reasons
    assert reasons[-1] == "READY"


def test_two_zones_served_together_leave_exactly_one_gang_after_one_pass(stack: Stack) -> None:
    """Raced eagerly into two zones that both have stock, both orders are served: the pass
    that sees it keeps the preferred one and releases the other gang, and says so."""
    world = stack.world
    three_zones(stack, stock=(4, 4, 0), race_width=2, race_eagerly=True)
    submit(world.store, flex("train", vm_count=2, locations=(ZONE_A, ZONE_B)))
    stack.run()
    assert world.record("train").lanes == (Lane(POOL_A, 1), Lane(POOL_B, 2))
    stack.advance(LATENCY)
    report = world.reconciler().run_pass()
    assert report.double_wins == [order_name("train", 2)]
    record = world.record("train")
    assert (record.state, record.pool) == (S.ACTIVE, POOL_A)
    assert (stack.cloud.stock(ZONE_A, A3), stack.cloud.stock(ZONE_B, A3)) == (2, 4)
    assert stack.left_running() == []
    ready = world.store.events("train")[-1]
    assert "paid for nothing" in ready.message


def test_all_zones_short_wait_without_cancelling_and_are_served_when_stock_returns(
    stack: Stack,
) -> None:
    world = stack.world
    three_zones(stack, stock=(0, 0, 0), race_width=2)
    submit(world.store, flex("train", vm_count=2, locations=(ZONE_A, ZONE_B)))
    for _ in range(20):  # 20 × 5 min: far past any old provisioning timeout
        stack.run()
        stack.advance(timedelta(minutes=5))
    record = world.record("train")
    assert record.state is S.PROVISIONING
    assert record.lanes == (Lane(POOL_A, 1), Lane(POOL_B, 2))
    assert stack.cloud.created("resizeRequests") == {
        order_name("train", 1): 1, order_name("train", 2): 1,
    }  # fmt: skip
    stack.cloud.set_stock(ZONE_B, A3, 4)
    stack.advance(timedelta(minutes=1))
    stack.run()
    record = world.record("train")
    assert (record.state, record.pool) == (S.ACTIVE, POOL_B)
    assert stack.left_running() == []


def test_max_wait_passing_cancels_every_order_it_had_queued(stack: Stack) -> None:
    world = stack.world
    three_zones(stack, stock=(0, 0, 0), race_width=2)
    submit(world.store, flex("train", vm_count=2, max_wait=timedelta(hours=1),
                             locations=(ZONE_A, ZONE_B)))  # fmt: skip
    for _ in range(14):
        stack.run()
        stack.advance(timedelta(minutes=5))
    assert world.state("train") is S.TIMED_OUT
    resize = stack.cloud.state()["resources"][stack.project]["resizeRequests"]  # type: ignore[index]
    assert resize == []  # cancelled, then deleted
    assert stack.left_running() == []


def test_a_calendar_block_runs_in_its_reservation(stack: Stack) -> None:
    """(Its whole story, with Google's review and the cancellation rules, is in
    test_calendar_on_emulators.py.)"""
    world = stack.world
    submit(world.store, calendar("block", vm_count=2, days=1, start_at=NOW + MINUTE * 30))
    stack.run()
    assert world.state("block") is S.PENDING  # Google reviews it first
    stack.advance(MINUTE * 2)
    stack.run()
    assert world.state("block") is S.BOOKED
    assert stack.cloud.created("futureReservations") == {order_name("block", 1): 1}
    assert stack.cloud.stock(ZONE_A, A3) == 4  # promised; taken at the start
    stack.advance(MINUTE * 28)
    stack.run()
    assert world.state("block") is S.PROVISIONING
    assert stack.cloud.stock(ZONE_A, A3) == 2
    stack.advance(LATENCY)
    stack.run()
    assert world.state("block") is S.ACTIVE
    stack.advance(timedelta(days=1))
    stack.run()
    assert world.state("block") is S.EXPIRED
    assert stack.cloud.stock(ZONE_A, A3) == 4


@pytest.mark.parametrize(
    "lease_ttl",
    [
        timedelta(minutes=2),
        # A lease that expires at once: any reconciler may take over from any other at any
        # moment, so passes really overlap and only fencing keeps them apart.
        timedelta(0),
    ],
    ids=["lease", "overlapping"],
)
def test_four_reconcilers_at_once_provision_each_request_exactly_once(
    stack: Stack, lease_ttl: timedelta
) -> None:
    """Four reconcilers run passes at once, twice over; then one finishes whatever they left.
    Every request is admitted once, ordered once, and ends ACTIVE.

    Firestore resolves contention on a document by delaying or failing one of the operations
    (cloud.google.com/firestore/docs/transaction-data-contention), so one contender goes on.
    The official emulator can fail every contender instead, with "Transaction lock timeout"
    (firebase-tools#6758, open: "neither transaction is going to succeed"), so on it the
    concurrent passes may all stand down; what they leave is finished by passes one at a
    time, and the counts below are over every pass."""
    world = stack.world
    names = [f"job-{index:02d}" for index in range(8)]
    for index, name in enumerate(names):
        submit(world.store, flex(name, vm_count=1, hours=2, locations=(ZONE_A, ZONE_B),
                                 submitted_at=NOW + index * timedelta(seconds=1)))  # fmt: skip
    world.settings = ReconcileSettings(lease_ttl=lease_ttl)
    errors: list[BaseException] = []
    reports: list[PassReport] = []

    def reconcile(holder: str) -> None:
        try:
            for _ in range(2):
                reports.append(world.reconciler(holder).run_pass())
        except BaseException as error:  # reported below
            errors.append(error)

    for _round in range(2):
        threads = [threading.Thread(target=reconcile, args=(f"reconciler-{n}",)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        stack.advance(LATENCY)
    for _ in range(2):  # admit what is left, then see it through provisioning
        reports.append(world.run())
        stack.advance(LATENCY)
    reports.append(world.run())
    assert errors == []
    assert {name: world.state(name) for name in names} == dict.fromkeys(names, S.ACTIVE)
    created = stack.cloud.created("resizeRequests")
    assert created == {order_name(name, 1): 1 for name in names}
    assert stack.cloud.stock(ZONE_A, A3) + stack.cloud.stock(ZONE_B, A3) == 0
    for name in names:
        states = [event.state for event in world.store.events(name)]
        assert states == [S.PENDING, S.PROVISIONING, S.ACTIVE], f"{name}: {states}"
    admitted = sum(report.transitions[S.PENDING, S.PROVISIONING] for report in reports)
    assert admitted == len(names)
