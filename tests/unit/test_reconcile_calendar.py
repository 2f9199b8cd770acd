"""Calendar blocks through the reconciler and the end service on the in-memory cloud, as
Google Cloud runs calendar-mode future reservations:

- compute/docs/instances/future-reservations-calendar-mode-overview: a submitted block is
  reviewed (PENDING_APPROVAL → APPROVED or DECLINED), then provisioned around its start;
  availability is viewed with the Advice API before submitting;
- compute/docs/instances/delete-future-reservations-calendar-mode: a block can be cancelled only
  while its start is more than 30 days away, or within 24 hours of approval while its start is
  at least 4 days away; otherwise it is billed in full; it can be deleted only once cancelled or
  ended;
- tpu/docs/calendar-mode-reservation: TPU chips reserved the same way, consumed at the start.

The same scenarios run over the emulator with the real clients in
tests/integration/test_calendar_on_emulators.py.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from opendws.adapters.memory import MemoryCapacityProvider
from opendws.domain.calendar import CancellationRule
from opendws.domain.model import PolicySettings
from opendws.domain.states import RequestState
from opendws.ports import Configuration, Price, ProvisionPhase, order_name
from opendws.service.release import EndOutcome
from tests.builders import A3, DAY, H100, HOUR, MINUTE, NOW, V5E, calendar, flex, pool, tpu_pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"
POOL_A, POOL_B = f"{ZONE_A}/{A3}", f"{ZONE_B}/{A3}"
REVIEW = timedelta(minutes=2)  # the memory cloud's review delay (its default)
PRICE = Price(accelerator=H100, per_hour=10.0, calendar_factor=0.5)
Cloud = tuple[World, MemoryCapacityProvider]


def world_of(
    *, capacity: int = 8, stock: int = 8, rule: CancellationRule = CancellationRule.WINDOWS
) -> Cloud:
    pools = (pool(zone=ZONE_A, capacity=capacity), pool(zone=ZONE_B, capacity=capacity))
    configuration = Configuration(
        pools=pools, tenants=tenants_for(H100, V5E),
        policy=PolicySettings(calendar_cancellation=rule), prices=(PRICE,),
    )  # fmt: skip
    world, cloud = memory_world((), (), timers=True, configuration=configuration)
    cloud.set_stock(ZONE_A, A3, stock)
    cloud.set_stock(ZONE_B, A3, stock)
    cloud.set_cancellation(rule)  # Google's rule, as the configuration says it is
    return world, cloud


@pytest.fixture
def cloud() -> Cloud:
    return world_of()


def reviewed(world: World) -> None:
    """Let Google's review happen and a pass see it."""
    world.clock.advance(REVIEW)
    world.run()


def test_a_block_is_booked_only_once_google_approved_it(cloud: Cloud) -> None:
    """PENDING (awaiting Google's approval) until APPROVED, then BOOKED; provisioned at its
    start once the reservation exists, ACTIVE, and ended at its end with its full cost."""
    world, _fake = cloud
    start = NOW + 5 * DAY
    submit(world.store, calendar("block", vm_count=2, days=1, start_at=start))
    world.run()
    record = world.record("block")
    assert (record.state, record.reason, record.pool) == (S.PENDING, "AWAITING_APPROVAL", POOL_A)
    assert "waiting for Google's review" in record.message
    world.run()  # still in review: nothing new
    assert world.state("block") is S.PENDING
    reviewed(world)
    booked = world.record("block")
    assert (booked.state, booked.reason) == (S.BOOKED, "APPROVED")
    assert "Google Cloud approved the block" in booked.message
    world.clock.advance(start - world.clock.now())
    world.run()
    assert world.state("block") is S.PROVISIONING
    world.clock.advance(MINUTE)
    world.run()
    assert world.state("block") is S.ACTIVE
    world.clock.advance(DAY)
    world.run()
    assert world.state("block") is S.EXPIRED
    assert [event[:2] for event in world.published("block")] == [
        ("PENDING", "AWAITING_APPROVAL"), ("BOOKED", "APPROVED"),
        ("PROVISIONING", "BLOCK_STARTED"), ("ACTIVE", "READY"), ("EXPIRED", "BLOCK_ENDED"),
    ]  # fmt: skip
    (entry,) = world.store.usage()
    assert entry.used_hours == entry.granted_hours == 2 * 8 * 24  # 2 VMs × 8 H100 × 24 h


def test_a_block_under_review_holds_its_slot(cloud: Cloud) -> None:
    """While Google reviews a block, our plan keeps its units: a clashing block is refused."""
    world, _ = cloud
    start = NOW + 5 * DAY
    submit(world.store, calendar("first", vm_count=8, start_at=start))
    world.run()
    submit(world.store, calendar("second", vm_count=8, start_at=start, locations=(ZONE_A,),
                                 submitted_at=NOW + MINUTE))  # fmt: skip
    world.clock.advance(MINUTE)
    world.run()
    assert world.state("first") is S.PENDING
    assert world.record("second").state is S.REJECTED


def test_a_declined_block_is_rejected_with_alternatives(cloud: Cloud) -> None:
    world, fake = cloud
    fake.inject(ZONE_A, A3, "stockout")  # Google's review declines it
    start = NOW + 5 * DAY
    submit(world.store, calendar("block", vm_count=2, start_at=start, locations=(ZONE_A, ZONE_B)))
    world.run()
    reviewed(world)
    record = world.record("block")
    assert (record.state, record.reason) == (S.REJECTED, "DECLINED")
    assert record.message.startswith("Google Cloud declined the block")
    assert "nearest starts that fit:" in record.message
    # The same start in zone b, which Google recommends and our plan fits, comes first.
    assert f"{start.isoformat()} in {POOL_B} (Google recommends)" in record.message
    world.run()
    assert fake.observe(world.config.load().pools) == {}  # the declined request is deleted


def test_a_block_google_advises_against_is_refused_before_submitting() -> None:
    """Our plan has room (capacity 8) but Google's Advice API has none as asked (another
    block holds its stock over the window): refused at once, offering the start right after
    that block, which Google recommends and our plan fits."""
    world, fake = world_of(capacity=8, stock=4)
    start = NOW + 5 * DAY
    submit(world.store, calendar("other", vm_count=4, start_at=start, locations=(ZONE_A,)))
    world.run()
    reviewed(world)
    assert world.state("other") is S.BOOKED
    submit(world.store, calendar("block", vm_count=4, start_at=start, locations=(ZONE_A,),
                                 submitted_at=NOW + 3 * MINUTE))  # fmt: skip
    world.run()
    record = world.record("block")
    assert (record.state, record.reason) == (S.REJECTED, "NO_CAPACITY_AT_GOOGLE")
    assert "Advice API has no capacity" in record.message
    after = (start + DAY).isoformat()
    assert f"{after} in {POOL_A} (Google recommends)" in record.message
    assert fake.created().get(order_name("block", 1), 0) == 0  # nothing was submitted


def test_a_block_far_ahead_is_cancelled_at_google_and_deleted(cloud: Cloud) -> None:
    world, fake = cloud
    submit(world.store, calendar("block", vm_count=2, start_at=NOW + 40 * DAY))
    world.run()
    reviewed(world)
    world.clock.advance(2 * DAY)  # past the 24 h after approval, but 38 days ahead
    result = world.ending().cancel("block", "t")
    assert (result.outcome, result.state) == (EndOutcome.ENDED, S.CANCELLED)
    world.run()
    assert fake.observe(world.config.load().pools) == {}
    (entry,) = world.store.usage()
    assert entry.cost == 0.0  # a cancelled block is not billed


def test_a_block_may_be_cancelled_within_a_day_of_its_approval(cloud: Cloud) -> None:
    world, _ = cloud
    submit(world.store, calendar("block", vm_count=2, start_at=NOW + 10 * DAY))
    world.run()
    reviewed(world)
    world.clock.advance(23 * HOUR)
    assert world.ending().cancel("block", "t").state is S.CANCELLED


def test_a_cancel_google_would_refuse_is_refused_at_once_and_changes_nothing(
    cloud: Cloud,
) -> None:
    """More than 24 h after approval and less than 30 days ahead: the block is billed in full;
    the refusal says when it ends, what it costs, and that releasing early does not help."""
    world, fake = cloud
    start = NOW + 10 * DAY
    submit(world.store, calendar("block", vm_count=2, days=3, start_at=start))
    world.run()
    reviewed(world)
    before = world.record("block")
    world.clock.advance(25 * HOUR)
    result = world.ending().cancel("block", "t")
    assert (result.outcome, result.state) == (EndOutcome.REFUSED, S.BOOKED)
    assert "can no longer be cancelled" in result.message
    assert f"billed in full from {start.isoformat()} to {(start + 3 * DAY).isoformat()}" in (
        result.message
    )
    cost = 2 * 8 * 72 * PRICE.per_hour * PRICE.calendar_factor
    assert f"{cost:,.2f} in all" in result.message
    assert "releasing its VMs early does not stop the charge" in result.message
    after = world.record("block")
    assert (after.state, after.version) == (before.state, before.version)
    observed = fake.observe(world.config.load().pools)
    assert observed[order_name("block", 1)].phase is ProvisionPhase.APPROVED
    assert world.bus.published[-1].reason == "NOT_CANCELLABLE"


def test_with_the_older_pages_rule_a_submitted_block_is_never_cancelled() -> None:
    world, _ = world_of(rule=CancellationRule.NEVER)
    submit(world.store, calendar("block", vm_count=2, start_at=NOW + 40 * DAY))
    world.run()
    reviewed(world)
    result = world.ending().cancel("block", "t")
    assert result.outcome is EndOutcome.REFUSED
    assert "does not allow a submitted calendar block to be cancelled" in result.message


def test_a_block_in_review_may_be_withdrawn(cloud: Cloud) -> None:
    world, fake = cloud
    submit(world.store, calendar("block", vm_count=2, start_at=NOW + 5 * DAY))
    world.run()
    assert world.ending().cancel("block", "t").state is S.CANCELLED
    world.clock.advance(REVIEW)
    world.run()
    assert fake.observe(world.config.load().pools) == {}


def test_releasing_a_running_block_deletes_its_vms_keeps_the_reservation_and_bills_it_all(
    cloud: Cloud,
) -> None:
    world, fake = cloud
    start = NOW + 5 * DAY
    submit(world.store, calendar("block", vm_count=2, days=2, start_at=start))
    world.run()
    reviewed(world)
    world.clock.advance(start - world.clock.now())
    world.run()
    world.clock.advance(MINUTE)
    world.run()
    assert world.state("block") is S.ACTIVE
    world.clock.advance(HOUR)
    result = world.ending().release("block", "t")
    assert result.state is S.RELEASED
    name = order_name("block", 1)
    kept = fake.observe(world.config.load().pools)[name]
    assert kept.phase is ProvisionPhase.RESERVED  # its VMs gone, the reservation kept
    report = world.run()
    assert report.kept == [name]
    assert report.leaks == []
    (entry,) = world.store.usage()
    assert entry.used_hours == entry.granted_hours == 2 * 8 * 48
    assert entry.cost == pytest.approx(2 * 8 * 48 * PRICE.per_hour * PRICE.calendar_factor)
    world.clock.advance(2 * DAY)  # the block's end: Google deletes the reservation
    report = world.run()
    assert report.leaks == [name]  # the ended request is deleted
    assert fake.observe(world.config.load().pools) == {}


def test_a_cancel_that_reached_google_before_its_write_is_completed(cloud: Cloud) -> None:
    """A crash between Google's cancel and our write: the next pass sees the block cancelled
    at Google and ends the request CANCELLED."""
    world, fake = cloud
    submit(world.store, calendar("block", vm_count=2, start_at=NOW + 40 * DAY))
    world.run()
    reviewed(world)
    pools = {p.pool_id: p for p in world.config.load().pools}
    fake.withdraw(order_name("block", 1), pools[POOL_A])
    world.run()
    record = world.record("block")
    assert (record.state, record.reason) == (S.CANCELLED, "CANCELLED_AT_GOOGLE")


def test_a_tpu_block_from_booking_to_its_end() -> None:
    """A TPU calendar block: chips reserved ahead, consumed at the start, ended at the end (in
    a zone where Google reserves v5e in calendar mode, tpu/docs/calendar-mode-reservation)."""
    block_zone = "us-west4-b"
    configuration = Configuration(
        pools=(tpu_pool(zone=block_zone, capacity=64),), tenants=tenants_for(V5E)
    )
    world, fake = memory_world((), (), timers=True, configuration=configuration)
    (tpu,) = configuration.pools
    fake.set_stock(tpu.zone, tpu.shape, 64)
    start = NOW + 3 * DAY
    submit(world.store, calendar("slice", topology="4x4", start_at=start, days=2,
                                 locations=(block_zone,)))  # fmt: skip
    world.run()
    assert world.state("slice") is S.PENDING
    reviewed(world)
    assert world.state("slice") is S.BOOKED
    assert fake.stock(tpu.zone, tpu.shape) == 64  # promised, not taken before the start
    world.clock.advance(start - world.clock.now())
    world.run()
    assert fake.stock(tpu.zone, tpu.shape) == 48
    world.clock.advance(MINUTE)
    world.run()
    assert world.state("slice") is S.ACTIVE
    world.clock.advance(2 * DAY)
    world.run()
    assert world.state("slice") is S.EXPIRED
    assert fake.stock(tpu.zone, tpu.shape) == 64


def test_a_tpu_block_starting_within_a_day_is_refused_at_intake() -> None:
    """tpu/docs/calendar-mode-reservation: TPU availability 1 to 120 days in advance."""
    from opendws.domain.model import InvalidModel

    with pytest.raises(InvalidModel, match="at least 1 day ahead"):
        calendar("slice", topology="4x4", start_at=NOW + 12 * HOUR)


def test_with_the_never_rule_a_released_block_is_kept_to_its_end_not_released_as_a_leak() -> None:
    """Under the older pages' rule a block is never cancellable once approved (no lockTime):
    released, it is kept (and billed) to its end, and not taken for a leak meanwhile."""
    world, fake = world_of(rule=CancellationRule.NEVER)
    start = NOW + 5 * DAY
    submit(world.store, calendar("block", vm_count=2, days=1, start_at=start))
    world.run()
    reviewed(world)
    world.clock.advance(start - world.clock.now())
    world.run()
    world.clock.advance(MINUTE)
    world.run()
    assert world.ending().release("block", "t").state is S.RELEASED
    name = order_name("block", 1)
    report = world.run()
    assert (report.kept, report.leaks) == ([name], [])
    assert fake.observe(world.config.load().pools)[name].locked_at is None


def test_the_cli_and_the_end_service_refuse_a_cancel_by_the_same_rule(cloud: Cloud) -> None:
    """``dws cancel`` checks block_cancel_refusal before publishing: the message it prints is
    the one the end service announces."""
    from opendws.service.release import block_cancel_refusal

    world, _ = cloud
    submit(world.store, calendar("block", vm_count=2, start_at=NOW + 10 * DAY))
    world.run()
    configuration = world.config.load()
    assert block_cancel_refusal(world.record("block"), configuration, world.clock.now()) is None
    reviewed(world)
    assert block_cancel_refusal(world.record("block"), configuration, world.clock.now()) is None
    world.clock.advance(25 * HOUR)
    refusal = block_cancel_refusal(world.record("block"), configuration, world.clock.now())
    assert refusal is not None
    assert world.ending().cancel("block", "t").message == refusal


def test_a_block_costs_no_full_plan_in_service(cloud: Cloud) -> None:
    """A reconciler keeps one planner from pass to pass: the pass that decides a block that
    arrived beside a queue of flex requests, the next one (the block submitted to Google: its
    request no longer waits, its hold is a grant equal to what the plan booked) and the one
    that sees it approved are all carried over, none planned in full."""
    world, _ = cloud
    for index in range(6):
        submit(world.store, flex(f"f{index}", vm_count=4, hours=3 + index))
    service = world.reconciler()
    service.run_pass()
    submit(world.store, calendar("block", vm_count=2, days=1, start_at=NOW + 5 * DAY))
    reports = []
    for wait in (MINUTE, MINUTE, REVIEW):
        world.clock.advance(wait)
        service.run_pass()
        reports.append(service.kept.planner.last_pass)
    assert world.state("block") is S.BOOKED
    assert [report.full for report in reports] == [False, False, False], reports
    assert reports[0].redecided == 1  # the block, decided in its pass
