"""The memory fake's calendar blocks behave as Google's calendar-mode future reservations do:
reviewed after a delay, approved or declined by capacity over the window, locked for
cancellation by Google's rule, live from their start, over at their end, kept (and billed)
when Google will not let them go, and advised by the same capacity model. Each test names the
Google page it pins (compute/docs/instances/...)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from opendws.adapters.memory import MemoryCapacityProvider
from opendws.clock import ManualClock
from opendws.domain.calendar import CANCEL_FAR_AHEAD, CancellationRule, cancel_deadline
from opendws.domain.model import Pool
from opendws.ports import (
    Advised,
    CalendarBlocks,
    CapacityProvider,
    Observed,
    Order,
    ProvisionPhase,
    Withdrawal,
)
from tests.builders import A3, DAY, HOUR, MINUTE, NOW, calendar, pool

ZONE, OTHER_ZONE = "us-central1-a", "us-central1-b"
LATENCY = timedelta(seconds=20)
REVIEW = timedelta(minutes=2)
HERE = pool(zone=ZONE, shape=A3, capacity=8)
THERE = pool(zone=OTHER_ZONE, shape=A3, capacity=8)


class Cloud:
    """A memory fake on a manual clock, with stock in both zones."""

    def __init__(
        self, stock: int = 8, other: int = 0, *, review_delay: timedelta = REVIEW,
        cancellation: CancellationRule = CancellationRule.WINDOWS,
    ) -> None:  # fmt: skip
        self.clock = ManualClock(NOW)
        self.fake = MemoryCapacityProvider(
            self.clock, latency=LATENCY, review_delay=review_delay, cancellation=cancellation
        )
        self.fake.set_stock(ZONE, A3, stock)
        self.fake.set_stock(OTHER_ZONE, A3, other)
        self._ids = 0

    def block(
        self, units: int = 3, *, start: datetime = NOW + 40 * DAY, days: float = 2,
        where: Pool = HERE,
    ) -> Order:  # fmt: skip
        self._ids += 1
        request = calendar(f"block-{self._ids}", vm_count=units, days=days, start_at=start,
                           locations=(ZONE, OTHER_ZONE))  # fmt: skip
        return Order(request=request, pool=where, attempt=1)

    def submit(self, order: Order) -> Order:
        self.fake.reserve(order)
        return order

    def seen(self, order: Order) -> Observed | None:
        return self.fake.observe([order.pool]).get(order.name)

    def phase(self, order: Order) -> ProvisionPhase | None:
        seen = self.seen(order)
        return None if seen is None else seen.phase

    def stock(self, where: Pool = HERE) -> int:
        return self.fake.stock(where.zone, where.shape)

    def at(self, when: datetime) -> None:
        """Move the clock to ``when``."""
        self.clock.set(when)

    def later(self, delta: timedelta) -> None:
        self.clock.advance(delta)


def test_a_block_is_in_review_until_the_delay_then_approved() -> None:
    """A submitted block is PENDING_APPROVAL until Google reviews it, then APPROVED; its
    units are promised, not taken, before its start; its window's end is reported
    (compute/docs/instances/create-future-reservations-calendar-mode)."""
    cloud = Cloud()
    order = cloud.submit(cloud.block())
    seen = cloud.seen(order)
    assert seen is not None
    assert seen.phase is ProvisionPhase.REVIEW
    assert seen.locked_at is None
    start = order.request.start_at
    assert start is not None
    assert seen.ends_at == start + order.request.run_duration
    cloud.later(REVIEW - MINUTE)
    assert cloud.phase(order) is ProvisionPhase.REVIEW
    cloud.later(MINUTE)
    seen = cloud.seen(order)
    assert seen is not None
    assert seen.phase is ProvisionPhase.APPROVED
    assert seen.ends_at == start + order.request.run_duration
    assert cloud.stock() == 8


def test_the_review_delay_is_settable() -> None:
    """The review takes the world's delay (create-future-reservations-calendar-mode: the
    request waits in PENDING_APPROVAL for Google's review)."""
    cloud = Cloud(review_delay=HOUR)
    order = cloud.submit(cloud.block())
    cloud.later(REVIEW)
    assert cloud.phase(order) is ProvisionPhase.REVIEW
    cloud.fake.set_review_delay(timedelta(0))
    quick = cloud.submit(cloud.block())
    assert cloud.phase(quick) is ProvisionPhase.APPROVED
    cloud.later(HOUR)
    assert cloud.phase(order) is ProvisionPhase.APPROVED


def test_repeating_reserve_changes_nothing() -> None:
    """The same block submitted twice is one future reservation
    (create-future-reservations-calendar-mode: names are unique in a zone)."""
    cloud = Cloud()
    order = cloud.block()
    cloud.submit(order)
    cloud.later(REVIEW)
    cloud.submit(order)
    assert cloud.fake.created() == {order.name: 1}
    assert cloud.phase(order) is ProvisionPhase.APPROVED


def test_a_block_without_capacity_over_its_window_is_declined() -> None:
    """Google declines a block its capacity cannot cover over the window, counting what it
    promised to overlapping approved blocks; a block after them fits
    (compute/docs/instances/future-reservations-calendar-mode-overview)."""
    cloud = Cloud(stock=5)
    first = cloud.submit(cloud.block(3))
    cloud.later(REVIEW)
    overlapping = cloud.submit(cloud.block(3, start=NOW + 41 * DAY))
    after = cloud.submit(cloud.block(3, start=NOW + 42 * DAY))  # starts at the first one's end
    cloud.later(REVIEW)
    assert cloud.phase(first) is ProvisionPhase.APPROVED
    declined = cloud.seen(overlapping)
    assert declined is not None
    assert declined.phase is ProvisionPhase.FAILED
    assert declined.error_code == "DECLINED"
    assert "are not available in" in declined.message
    assert declined.locked_at is None
    assert cloud.phase(after) is ProvisionPhase.APPROVED


def test_an_injected_stockout_declines_at_the_review() -> None:
    """The injection is taken at the review (create-future-reservations-calendar-mode: a
    request Google cannot satisfy is DECLINED)."""
    cloud = Cloud()
    order = cloud.submit(cloud.block())
    cloud.fake.inject(ZONE, A3, "stockout")
    cloud.later(REVIEW)
    seen = cloud.seen(order)
    assert seen is not None
    assert (seen.phase, seen.error_code) == (ProvisionPhase.FAILED, "DECLINED")


def test_an_injected_hang_leaves_the_block_in_review() -> None:
    """A review that never comes: the block stays PENDING_APPROVAL, and (not yet approved,
    promised to no one) it may still be withdrawn
    (compute/docs/instances/create-future-reservations-calendar-mode)."""
    cloud = Cloud(cancellation=CancellationRule.NEVER)
    cloud.fake.inject(ZONE, A3, "hang")
    order = cloud.submit(cloud.block())
    cloud.later(30 * DAY)
    assert cloud.phase(order) is ProvisionPhase.REVIEW
    assert cloud.fake.withdraw(order.name, HERE) is Withdrawal.WITHDRAWN
    seen = cloud.seen(order)
    assert seen is not None
    assert (seen.phase, seen.error_code) == (ProvisionPhase.FAILED, "CANCELLED")


def test_an_injected_error_fails_the_insert_and_creates_nothing() -> None:
    """A failed insert operation leaves no future reservation behind
    (compute/docs/instances/create-future-reservations-calendar-mode)."""
    cloud = Cloud()
    cloud.fake.inject(ZONE, A3, "error")
    order = cloud.submit(cloud.block())
    assert cloud.seen(order) is None
    assert cloud.fake.created() == {}
    cloud.submit(order)  # asked again: the insert now succeeds
    assert cloud.phase(order) is ProvisionPhase.REVIEW


@pytest.mark.parametrize("rule", list(CancellationRule))
def test_an_approved_block_reports_when_it_locks(rule: CancellationRule) -> None:
    """status.lockTime: the last instant the approved block may be cancelled, by the rule the
    world follows (compute/docs/instances/delete-future-reservations-calendar-mode); never
    cancellable: none."""
    cloud = Cloud(cancellation=rule)
    order = cloud.submit(cloud.block())
    cloud.later(REVIEW)
    seen = cloud.seen(order)
    assert seen is not None
    start = order.request.start_at
    assert start is not None
    assert seen.locked_at == cancel_deadline(rule, start=start, approved_at=NOW + REVIEW)
    if rule is CancellationRule.WINDOWS:
        assert seen.locked_at is not None
        assert seen.locked_at < start - CANCEL_FAR_AHEAD
    else:
        assert seen.locked_at is None


def test_withdraw_is_allowed_while_the_start_is_far_ahead() -> None:
    """More than 30 days before its start an approved block may be cancelled: CANCELLED, and
    its promise is freed for others (compute/docs/instances/delete-future-reservations-
    calendar-mode). Asked again: nothing more to cancel."""
    cloud = Cloud(stock=3)
    order = cloud.submit(cloud.block(3))
    cloud.later(REVIEW + 5 * DAY)  # 35 days ahead, long after its approval
    assert cloud.fake.withdraw(order.name, HERE) is Withdrawal.WITHDRAWN
    seen = cloud.seen(order)
    assert seen is not None
    assert (seen.phase, seen.error_code) == (ProvisionPhase.FAILED, "CANCELLED")
    assert cloud.fake.withdraw(order.name, HERE) is Withdrawal.WITHDRAWN
    assert cloud.fake.withdraw("odws-never-made-0000000000-1", HERE) is Withdrawal.WITHDRAWN
    other = cloud.submit(cloud.block(3))
    cloud.later(REVIEW)
    assert cloud.phase(other) is ProvisionPhase.APPROVED


def test_withdraw_is_allowed_within_a_day_of_approval_and_refused_after() -> None:
    """Within 30 days of its start a block may be cancelled only within 24 hours of its
    approval while its start is at least 4 days away; after that Google refuses and nothing
    changes (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    cloud = Cloud()
    early = cloud.submit(cloud.block(start=NOW + 10 * DAY))
    late = cloud.submit(cloud.block(start=NOW + 10 * DAY))
    cloud.later(REVIEW + 23 * HOUR)
    assert cloud.fake.withdraw(early.name, HERE) is Withdrawal.WITHDRAWN
    cloud.later(2 * HOUR)
    before = cloud.seen(late)
    assert cloud.fake.withdraw(late.name, HERE) is Withdrawal.REFUSED
    assert cloud.seen(late) == before
    assert before is not None
    assert before.phase is ProvisionPhase.APPROVED


def test_the_never_rule_refuses_every_approved_block() -> None:
    """Older Compute pages and the TPU page: a submitted (approved) block cannot be cancelled,
    however far ahead (compute/docs/instances/delete-future-reservations-calendar-mode, as the
    CancellationRule NEVER reads it)."""
    cloud = Cloud(cancellation=CancellationRule.NEVER)
    order = cloud.submit(cloud.block(start=NOW + 50 * DAY))
    cloud.later(REVIEW)
    assert cloud.fake.withdraw(order.name, HERE) is Withdrawal.REFUSED
    assert cloud.phase(order) is ProvisionPhase.APPROVED


def test_a_declined_block_is_withdrawn_and_deleted() -> None:
    """A DECLINED request has nothing to cancel, and may be deleted
    (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    cloud = Cloud(stock=2, cancellation=CancellationRule.NEVER)
    order = cloud.submit(cloud.block(3))
    cloud.later(REVIEW)
    assert cloud.fake.withdraw(order.name, HERE) is Withdrawal.WITHDRAWN
    cloud.fake.release(order.name, HERE)
    assert cloud.seen(order) is None


def test_withdraw_is_refused_once_the_block_has_started() -> None:
    """A block whose window has begun cannot be cancelled, whatever the rule
    (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    cloud = Cloud()
    order = cloud.submit(cloud.block(start=NOW + HOUR))
    cloud.later(HOUR)
    assert cloud.phase(order) is ProvisionPhase.RESERVED
    assert cloud.fake.withdraw(order.name, HERE) is Withdrawal.REFUSED
    assert cloud.phase(order) is ProvisionPhase.RESERVED
    assert cloud.stock() == 5


def test_release_deletes_a_block_that_may_still_be_cancelled() -> None:
    """Releasing a block Google still lets go removes it, and its promise
    (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    cloud = Cloud(stock=3)
    order = cloud.submit(cloud.block(3))
    cloud.later(REVIEW)
    cloud.fake.release(order.name, HERE)
    assert cloud.seen(order) is None
    again = cloud.submit(cloud.block(3))
    cloud.later(REVIEW)
    assert cloud.phase(again) is ProvisionPhase.APPROVED


def test_release_keeps_a_block_google_will_not_cancel_until_its_end() -> None:
    """A block past its cancellation window is billed in full: a release does not delete it;
    it stays reported (APPROVED, then RESERVED with no VMs) with its end, takes its units at its
    start, gives them back at its end (ENDED), and only then may be deleted
    (compute/docs/instances/delete-future-reservations-calendar-mode)."""
    cloud = Cloud(cancellation=CancellationRule.NEVER)
    order = cloud.submit(cloud.block(3, start=NOW + 10 * DAY, days=2))
    cloud.later(REVIEW)
    cloud.fake.release(order.name, HERE)
    kept = cloud.seen(order)
    assert kept is not None
    assert kept.phase is ProvisionPhase.APPROVED
    assert kept.ends_at == NOW + 12 * DAY
    cloud.at(NOW + 10 * DAY)
    assert cloud.phase(order) is ProvisionPhase.RESERVED
    assert cloud.stock() == 5
    cloud.fake.release(order.name, HERE)
    assert cloud.phase(order) is ProvisionPhase.RESERVED
    cloud.at(NOW + 12 * DAY)
    assert cloud.phase(order) is ProvisionPhase.ENDED
    assert cloud.stock() == 8
    cloud.fake.release(order.name, HERE)
    assert cloud.seen(order) is None
    assert cloud.stock() == 8


def test_release_of_a_live_block_deletes_its_vms_and_keeps_the_block() -> None:
    """Releasing a running block's VMs early does not end the block: its reservation stays
    (RESERVED, units still held) until its end (compute/docs/instances/
    delete-future-reservations-calendar-mode)."""
    cloud = Cloud()
    order = cloud.submit(cloud.block(3, start=NOW + HOUR, days=1))
    cloud.later(HOUR)
    cloud.fake.provision(order)
    cloud.later(LATENCY)
    assert cloud.phase(order) is ProvisionPhase.READY
    cloud.fake.release(order.name, HERE)
    kept = cloud.seen(order)
    assert kept is not None
    assert kept.phase is ProvisionPhase.RESERVED
    assert kept.ends_at == NOW + HOUR + DAY
    assert cloud.stock() == 5
    cloud.at(NOW + HOUR + DAY)
    assert cloud.phase(order) is ProvisionPhase.ENDED
    assert cloud.stock() == 8


def test_a_block_is_live_at_its_start_and_its_vms_use_its_units() -> None:
    """At its start the block's units are taken and its reservation exists (RESERVED); VMs
    created before then have nothing to consume, so provisioning waits; afterwards they come up
    on the block's own units (CREATING, then READY after the latency)
    (compute/docs/instances/future-reservations-calendar-mode-overview)."""
    cloud = Cloud(stock=3)
    order = cloud.submit(cloud.block(3, start=NOW + HOUR, days=1))
    cloud.later(REVIEW)
    cloud.fake.provision(order)
    assert cloud.phase(order) is ProvisionPhase.APPROVED
    assert cloud.stock() == 3
    cloud.at(NOW + HOUR)
    assert cloud.phase(order) is ProvisionPhase.RESERVED
    assert cloud.stock() == 0
    cloud.fake.provision(order)
    assert cloud.phase(order) is ProvisionPhase.CREATING
    cloud.later(LATENCY)
    assert cloud.phase(order) is ProvisionPhase.READY
    cloud.fake.provision(order)
    assert cloud.phase(order) is ProvisionPhase.READY
    assert cloud.stock() == 0
    assert cloud.fake.created() == {order.name: 1}


def test_the_end_of_a_block_ends_it_and_gives_its_units_back() -> None:
    """At the end of its window the block's VMs and reservation are deleted: ENDED, units
    back (compute/docs/instances/future-reservations-calendar-mode-overview)."""
    cloud = Cloud()
    order = cloud.submit(cloud.block(3, start=NOW + HOUR, days=1))
    cloud.at(NOW + HOUR)
    cloud.fake.provision(order)
    cloud.at(NOW + HOUR + DAY - MINUTE)
    assert cloud.phase(order) is ProvisionPhase.READY
    assert cloud.stock() == 5
    cloud.later(MINUTE)
    seen = cloud.seen(order)
    assert seen is not None
    assert seen.phase is ProvisionPhase.ENDED
    assert cloud.stock() == 8
    cloud.fake.provision(order)
    assert cloud.phase(order) is ProvisionPhase.ENDED


def test_an_approved_block_whose_units_are_gone_at_its_start_fails() -> None:
    """Approval promises capacity; if it is gone at the start the request FAILS
    (compute/docs/instances/future-reservations-calendar-mode-overview)."""
    cloud = Cloud()
    order = cloud.submit(cloud.block(3, start=NOW + HOUR))
    cloud.later(REVIEW)
    cloud.fake.set_stock(ZONE, A3, 1)
    cloud.at(NOW + HOUR)
    seen = cloud.seen(order)
    assert seen is not None
    assert (seen.phase, seen.error_code) == (ProvisionPhase.FAILED, "FAILED")
    assert cloud.stock() == 1
    cloud.fake.release(order.name, HERE)
    assert cloud.seen(order) is None


def test_advice_names_the_starts_and_zones_where_the_block_fits() -> None:
    """Google's advice (compute/docs/instances/create-future-reservations-calendar-mode,
    "view availability"): starts in the asked range, earliest first, where the units are free
    for the whole duration by the review's capacity model — here the earliest start in the
    zone with room, and the end of the approved block that fills the other; one per
    (start, zone)."""
    cloud = Cloud(stock=5, other=3)
    taken = cloud.submit(cloud.block(3, start=NOW + 10 * DAY, days=2))
    cloud.later(REVIEW)
    ask = cloud.block(3, start=NOW + 5 * DAY, days=7).request
    earliest, latest = NOW + 5 * DAY, NOW + 20 * DAY
    advised = cloud.fake.advise(ask, [HERE, THERE], earliest=earliest, latest=latest)
    end = NOW + 12 * DAY
    assert advised == (
        Advised(start_at=earliest, end_at=earliest + 7 * DAY, zone=OTHER_ZONE),
        Advised(start_at=end, end_at=end + 7 * DAY, zone=ZONE),
        Advised(start_at=end, end_at=end + 7 * DAY, zone=OTHER_ZONE),
    )
    assert cloud.phase(taken) is ProvisionPhase.APPROVED
    # Nothing fits: no advice.
    big = cloud.block(6, days=7).request
    assert cloud.fake.advise(big, [HERE, THERE], earliest=earliest, latest=latest) == ()
    # A block's end outside the range is no candidate.
    only_here = cloud.fake.advise(ask, [HERE], earliest=earliest, latest=NOW + 11 * DAY)
    assert only_here == ()


def test_advice_names_at_most_three_starts() -> None:
    """Up to three recommendations (create-future-reservations-calendar-mode)."""
    cloud = Cloud(stock=3)
    for day in (10, 20, 30, 40):
        cloud.submit(cloud.block(3, start=NOW + day * DAY, days=2))
    cloud.later(REVIEW)
    ask = cloud.block(3, days=1).request
    advised = cloud.fake.advise(ask, [HERE], earliest=NOW + 10 * DAY, latest=NOW + 50 * DAY)
    assert [a.start_at for a in advised] == [NOW + 12 * DAY, NOW + 22 * DAY, NOW + 32 * DAY]
    assert {a.zone for a in advised} == {ZONE}


def test_the_fake_serves_both_ports() -> None:
    """The fake is a CapacityProvider and the CalendarBlocks calendar orders need (checked by
    mypy on this file; at run time, it simply has the methods)."""
    fake = Cloud().fake
    provider: CapacityProvider = fake
    blocks: CalendarBlocks = fake
    assert callable(provider.reserve)
    assert callable(blocks.advise)
    assert callable(blocks.withdraw)
