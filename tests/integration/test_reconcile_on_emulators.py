"""The reconciler on the real adapters: Firestore (official emulator) for requests, lease and
configuration, and the real Compute Engine / Cloud TPU clients over the project's emulator of
a simulated cloud. Admission → provisioning → ACTIVE; a stockout fails over to the next zone;
a provisioning timeout is cancelled and retried elsewhere; a crash at any step converges; four
reconcilers at once provision each admitted request exactly once."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from opendws.domain.states import RequestState
from opendws.ports import order_name
from opendws.service.reconcile import PassReport, ReconcileSettings
from tests.builders import A3, MINUTE, NOW, calendar, flex
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


def test_a_stockout_fails_over_to_the_next_zone(stack: Stack) -> None:
    world = stack.world
    stack.cloud.inject(ZONE_A, A3, "stockout")
    submit(world.store, flex("train", vm_count=2, locations=(ZONE_A, ZONE_B)))
    stack.run()
    stack.advance(LATENCY)
    stack.run()
    record = world.record("train")
    assert (record.state, record.pool, record.attempt) == (S.PROVISIONING, POOL_B, 2)
    assert POOL_A in world.store.pool_shortages()
    stack.advance(LATENCY)
    stack.run()
    assert world.state("train") is S.ACTIVE
    assert [e[:3] for e in world.published("train")] == [
        ("PROVISIONING", "ADMITTED", POOL_A),
        ("PENDING", "STOCKOUT", None),
        ("PROVISIONING", "ADMITTED", POOL_B),
        ("ACTIVE", "READY", POOL_B),
    ]
    # The failed attempt was deleted in zone A; attempt 2 holds zone B's stock.
    assert stack.cloud.stock(ZONE_A, A3) == 4
    assert stack.cloud.stock(ZONE_B, A3) == 2
    events = world.store.events("train")
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in events[2].message


def test_a_provisioning_timeout_is_cancelled_and_retried_elsewhere(stack: Stack) -> None:
    world = stack.world
    stack.cloud.inject(ZONE_A, A3, "hang")
    submit(world.store, flex("train", vm_count=2, locations=(ZONE_A, ZONE_B)))
    stack.run()
    for _ in range(3):
        stack.advance(timedelta(minutes=5))
        stack.run()
    record = world.record("train")
    assert (record.state, record.pool, record.attempt) == (S.PROVISIONING, POOL_B, 2)
    assert any(e[1] == "PROVISIONING_TIMEOUT" for e in world.published("train"))
    state = stack.cloud.state()
    assert "CANCELLED" not in str(state) or order_name("train", 1) not in str(state)
    stack.advance(LATENCY)
    stack.run()
    assert world.state("train") is S.ACTIVE


def test_a_calendar_block_runs_in_its_reservation(stack: Stack) -> None:
    world = stack.world
    submit(world.store, calendar("block", vm_count=2, days=1, start_at=NOW + MINUTE * 30))
    stack.run()
    assert world.state("block") is S.BOOKED
    assert stack.cloud.created("futureReservations") == {order_name("block", 1): 1}
    assert stack.cloud.stock(ZONE_A, A3) == 4  # promised; taken at the start
    stack.advance(MINUTE * 30)
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
    stack.run()
    assert errors == []
    assert {name: world.state(name) for name in names} == dict.fromkeys(names, S.ACTIVE)
    created = stack.cloud.created("resizeRequests")
    assert created == {order_name(name, 1): 1 for name in names}
    assert stack.cloud.stock(ZONE_A, A3) + stack.cloud.stock(ZONE_B, A3) == 0
    for name in names:
        states = [event.state for event in world.store.events(name)]
        assert states == [S.PENDING, S.PROVISIONING, S.ACTIVE], f"{name}: {states}"
    admitted = sum(report.transitions["PENDING→PROVISIONING"] for report in reports)
    assert admitted == len(names)
