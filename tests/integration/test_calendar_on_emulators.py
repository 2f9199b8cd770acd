"""Calendar blocks end to end on the real adapters: Firestore (official emulator) for the
requests, and the real google-cloud-compute clients (FutureReservations, Advice, Instances)
and the Cloud TPU REST API over the project's emulator of a simulated cloud that reviews,
provisions and bills calendar-mode future reservations as Google documents:

- compute/docs/instances/future-reservations-calendar-mode-overview (review: PENDING_APPROVAL →
  APPROVED or DECLINED; the Advice API's view of future availability; consuming the
  auto-created reservation with RESERVATION_BOUND VMs);
- compute/docs/instances/delete-future-reservations-calendar-mode (cancel only while the start
  is more than 30 days away, or within 24 h of approval while it is at least 4 days away;
  otherwise billed in full; delete only once cancelled or ended);
- tpu/docs/calendar-mode-reservation (TPU chips reserved the same way, consumed at the start by
  a queued resource naming the reservation).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from opendws.adapters.memory import MemoryNudger
from opendws.domain.states import RequestState
from opendws.ports import Price, order_name
from opendws.service.release import EndOutcome, EndService
from tests.builders import A3, DAY, H100, HOUR, MINUTE, NOW, calendar, tpu_pool
from tests.integration.conftest import LATENCY, POOL_A, POOL_B, ZONE_A, ZONE_B, Stack
from tests.world import submit

S = RequestState
REVIEW = timedelta(minutes=2)  # the simulated cloud's review delay (its default)
PRICE = Price(accelerator=H100, per_hour=10.0, calendar_factor=0.5)


@pytest.fixture
def blocks(stack: Stack) -> Stack:
    """The stack with a price for H100 (for the cost a refusal names)."""
    configuration = stack.world.config.load()
    stack.world.config.save(replace(configuration, prices=(PRICE,)))
    return stack


def ending(stack: Stack) -> EndService:
    world = stack.world
    return EndService(
        world.store, world.config, world.providers, None, world.bus, MemoryNudger(), world.clock
    )


def reviewed(stack: Stack) -> None:
    """Let Google's review happen and a pass see it."""
    stack.advance(REVIEW)
    stack.run()


def futures(stack: Stack, zone: str = ZONE_A) -> dict[str, str]:
    """Name → procurementStatus of the future reservations at Google in ``zone``."""
    return {
        item["name"]: item["status"]["procurementStatus"]
        for item in stack.cloud.list_future_reservations(stack.project, zone)
    }


def test_a_block_is_booked_once_google_approves_it_and_runs_in_its_reservation(
    blocks: Stack,
) -> None:
    world = blocks.world
    start = NOW + 5 * DAY
    submit(world.store, calendar("block", vm_count=2, days=1, start_at=start))
    blocks.run()
    record = world.record("block")
    assert (record.state, record.reason, record.pool) == (S.PENDING, "AWAITING_APPROVAL", POOL_A)
    name = order_name("block", 1)
    assert futures(blocks) == {name: "PENDING_APPROVAL"}
    reviewed(blocks)
    assert (world.state("block"), world.record("block").reason) == (S.BOOKED, "APPROVED")
    blocks.advance(start - world.clock.now())
    blocks.run()
    assert world.state("block") is S.PROVISIONING
    blocks.advance(LATENCY)
    blocks.run()
    assert world.state("block") is S.ACTIVE
    vms = blocks.cloud.list_instances(blocks.project, ZONE_A)
    assert {vm["scheduling"]["provisioningModel"] for vm in vms} == {"RESERVATION_BOUND"}
    # instances.insert takes the disk type's URL (a bare name is refused as malformed).
    disk_types = {vm["disks"][0]["initializeParams"]["diskType"] for vm in vms}
    assert disk_types == {f"zones/{ZONE_A}/diskTypes/pd-balanced"}
    assert {vm["reservationAffinity"]["values"][0] for vm in vms} == {name}
    blocks.advance(DAY)
    blocks.run()
    assert world.state("block") is S.EXPIRED
    assert blocks.cloud.list_instances(blocks.project, ZONE_A) == []
    assert blocks.cloud.stock(ZONE_A, A3) == 4
    assert [event[:2] for event in world.published("block")] == [
        ("PENDING", "AWAITING_APPROVAL"), ("BOOKED", "APPROVED"),
        ("PROVISIONING", "BLOCK_STARTED"), ("ACTIVE", "READY"), ("EXPIRED", "BLOCK_ENDED"),
    ]  # fmt: skip


def test_a_declined_block_is_rejected_with_alternatives_google_recommends(blocks: Stack) -> None:
    world = blocks.world
    blocks.cloud.inject(ZONE_A, A3, "stockout")  # Google's review declines it
    start = NOW + 5 * DAY
    submit(world.store, calendar("block", vm_count=2, start_at=start, locations=(ZONE_A, ZONE_B)))
    blocks.run()
    reviewed(blocks)
    record = world.record("block")
    assert (record.state, record.reason) == (S.REJECTED, "DECLINED")
    assert f"{start.isoformat()} in {POOL_B} (Google recommends)" in record.message
    blocks.run()
    assert futures(blocks) == {}  # the declined request is deleted


def test_a_block_the_advice_api_has_no_room_for_is_refused_before_submitting(
    blocks: Stack,
) -> None:
    world = blocks.world
    start = NOW + 5 * DAY
    submit(world.store, calendar("first", vm_count=3, start_at=start, locations=(ZONE_A,)))
    blocks.run()
    reviewed(blocks)
    assert world.state("first") is S.BOOKED
    # Our plan would fit 1 more VM of 4; Google promised 3 of its 4 over the window.
    submit(world.store, calendar("second", vm_count=2, start_at=start, locations=(ZONE_A,),
                                 submitted_at=NOW + 3 * MINUTE))  # fmt: skip
    blocks.run()
    record = world.record("second")
    assert (record.state, record.reason) == (S.REJECTED, "NO_CAPACITY")  # our own plan first
    submit(world.store, calendar("third", vm_count=1, start_at=start, locations=(ZONE_A,),
                                 submitted_at=NOW + 3 * MINUTE))  # fmt: skip
    blocks.cloud.set_stock(ZONE_A, A3, 3)  # Google now has only what it promised
    blocks.run()
    third = world.record("third")
    assert (third.state, third.reason) == (S.REJECTED, "NO_CAPACITY_AT_GOOGLE")
    assert f"{(start + DAY).isoformat()} in {POOL_A} (Google recommends)" in third.message
    assert order_name("third", 1) not in futures(blocks)


def test_a_cancel_google_would_refuse_is_refused_with_the_charge_and_changes_nothing(
    blocks: Stack,
) -> None:
    world = blocks.world
    start = NOW + 10 * DAY
    submit(world.store, calendar("block", vm_count=2, days=3, start_at=start))
    blocks.run()
    reviewed(blocks)
    before = world.record("block")
    blocks.advance(25 * HOUR)
    result = ending(blocks).cancel("block", "t")
    assert (result.outcome, result.state) == (EndOutcome.REFUSED, S.BOOKED)
    end = start + 3 * DAY
    assert f"billed in full from {start.isoformat()} to {end.isoformat()}" in result.message
    assert f"{2 * 8 * 72 * 10.0 * 0.5:,.2f} in all" in result.message
    assert "releasing its VMs early does not stop the charge" in result.message
    assert world.record("block").version == before.version
    # Past its lockTime Google is procuring it (APPROVED → PROCURING: locked, CP
    # FutureReservationStatus); it is still there, and still billed.
    assert futures(blocks) == {order_name("block", 1): "PROCURING"}


def test_a_block_far_ahead_is_cancelled_at_google_then_deleted(blocks: Stack) -> None:
    world = blocks.world
    submit(world.store, calendar("block", vm_count=2, start_at=NOW + 40 * DAY))
    blocks.run()
    reviewed(blocks)
    blocks.advance(3 * DAY)
    result = ending(blocks).cancel("block", "t")
    assert (result.outcome, result.state) == (EndOutcome.ENDED, S.CANCELLED)
    assert futures(blocks) == {}
    blocks.run()
    assert blocks.left_running() == []


def test_releasing_a_running_block_deletes_its_vms_and_keeps_its_reservation_to_its_end(
    blocks: Stack,
) -> None:
    world = blocks.world
    start = NOW + 5 * DAY
    submit(world.store, calendar("block", vm_count=2, days=2, start_at=start))
    blocks.run()
    reviewed(blocks)
    blocks.advance(start - world.clock.now())
    blocks.run()
    blocks.advance(LATENCY)
    blocks.run()
    assert world.state("block") is S.ACTIVE
    blocks.advance(HOUR)
    assert ending(blocks).release("block", "t").state is S.RELEASED
    assert blocks.cloud.list_instances(blocks.project, ZONE_A) == []
    name = order_name("block", 1)
    assert futures(blocks) == {name: "FULFILLED"}
    assert [r["name"] for r in blocks.cloud.list_reservations(blocks.project, ZONE_A)] == [name]
    (entry,) = world.store.usage()
    assert entry.used_hours == entry.granted_hours == 2 * 8 * 48
    assert entry.cost == pytest.approx(2 * 8 * 48 * 10.0 * 0.5)
    blocks.run()  # the reservation is kept (not a leak): Google bills it to its end anyway
    assert [r["name"] for r in blocks.cloud.list_reservations(blocks.project, ZONE_A)] == [name]
    blocks.advance(2 * DAY)
    blocks.run()
    assert blocks.cloud.list_reservations(blocks.project, ZONE_A) == []
    assert futures(blocks) == {}  # deleted once it ended


def test_a_tpu_block_is_a_future_reservation_of_chips_consumed_by_a_queued_resource(
    blocks: Stack,
) -> None:
    """In a zone where Google reserves v5e in calendar mode, as BATCH
    (tpu/docs/calendar-mode-reservation); the reservation asked as gcloud asks it (the family,
    the chip count, the workload type: command_lib/compute/future_reservations/util.py) and
    consumed by a reservation-bound queued resource (tpu/docs/consume-reservation)."""
    world = blocks.world
    zone = "us-west4-b"
    configuration = world.config.load()
    world.config.save(
        replace(configuration, pools=(*configuration.pools, tpu_pool(zone=zone, capacity=16)))
    )
    blocks.cloud.set_stock(zone, "V5LITE_POD", 16)
    start = NOW + 3 * DAY
    submit(world.store, calendar("slice", topology="4x4", start_at=start, days=2,
                                 locations=(zone,)))  # fmt: skip
    blocks.run()
    name = order_name("slice", 1)
    assert world.record("slice").reason == "AWAITING_APPROVAL"
    (future,) = blocks.cloud.list_future_reservations(blocks.project, zone)
    aggregate = future["aggregateReservation"]
    assert aggregate["vmFamily"] == "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT5LP"
    assert aggregate["workloadType"] == "BATCH"
    assert aggregate["reservedResources"] == [{"accelerator": {"acceleratorCount": 16}}]
    reviewed(blocks)
    assert world.state("slice") is S.BOOKED
    assert blocks.cloud.stock(zone, "V5LITE_POD") == 16  # promised, not taken yet
    blocks.advance(start - world.clock.now())
    blocks.run()
    assert blocks.cloud.stock(zone, "V5LITE_POD") == 0
    blocks.advance(LATENCY)
    blocks.run()
    assert world.state("slice") is S.ACTIVE
    queued = blocks.cloud.state()["resources"]
    assert isinstance(queued, dict)
    (resource,) = [
        item
        for zone in queued.values()
        for item in zone.get("queuedResources", [])
        if item["name"].endswith(name)
    ]
    assert resource["reservationName"].endswith(f"/reservations/{name}")
    assert resource["provisioningModel"] == "RESERVATION_BOUND"
    blocks.advance(2 * DAY)
    blocks.run()
    assert world.state("slice") is S.EXPIRED
    assert blocks.cloud.stock(zone, "V5LITE_POD") == 16
    assert blocks.left_running() == []


def test_a_block_whose_reservation_google_fills_late_runs_once_it_is_filled(
    blocks: Stack,
) -> None:
    """Google creates an approved block's reservation at approval, empty, and provisions the
    capacity into it from the start, possibly up to 24 h later ("Compute Engine automatically
    creates an empty reservation. Then, at your chosen start time, Compute Engine provisions
    the requested capacity into the auto-created reservation", compute/docs/hpc/
    reserve-capacity-account-team). opendws provisions when the future reservation's
    status.procurementStatus is FULFILLED ("fulfilled completely", CP
    FutureReservationStatus), not when the reservation exists: no VM is asked for (and
    refused) before, and the event says it waits for Google."""
    world = blocks.world
    blocks.cloud.set_fill_delay(5 * MINUTE)
    start = NOW + 5 * DAY
    submit(world.store, calendar("late", vm_count=2, days=1, start_at=start))
    blocks.run()
    reviewed(blocks)
    name = order_name("late", 1)
    assert [r["name"] for r in blocks.cloud.list_reservations(blocks.project, ZONE_A)] == [name]
    blocks.advance(start - world.clock.now())
    blocks.run()
    assert world.state("late") is S.PROVISIONING
    (started,) = [
        event.message
        for event in world.bus.published
        if (event.request_id, event.reason) == ("late", "BLOCK_STARTED")
    ]
    assert "waiting for Google Cloud to fill its reservation" in started
    for _ in range(4):
        blocks.advance(MINUTE)
        blocks.run()
        assert world.state("late") is S.PROVISIONING
        assert blocks.cloud.list_instances(blocks.project, ZONE_A) == []
    assert blocks.cloud.created("instances") == {}  # nothing asked for, nothing refused
    blocks.advance(MINUTE)
    blocks.run()
    assert len(blocks.cloud.list_instances(blocks.project, ZONE_A)) == 2
    blocks.advance(LATENCY)
    blocks.run()
    assert world.state("late") is S.ACTIVE
