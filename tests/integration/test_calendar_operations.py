"""Calendar blocks against Compute operations that take as long as Google's (the simulated
cloud's clock running with the wall clock, over the project's emulator): a block's cancel is
awaited — its answer says whether Google keeps the block — and the wait polls the endpoint the
provider calls, not Google's.

Compute's operations are PENDING, RUNNING, then DONE
(https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations); a calendar block
may be cancelled while Google allows it and is then deleted
(https://cloud.google.com/compute/docs/instances/delete-future-reservations-calendar-mode).
``zoneOperations.wait`` answers once the operation is DONE, or after about two minutes
(https://cloud.google.com/compute/docs/reference/rest/v1/zoneOperations/wait)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from emulators import ComputeEmulator
from opendws.bootstrap import capacity_providers
from opendws.clock import ManualClock
from opendws.domain.model import Pool
from opendws.ports import BlockProvider, Order, Withdrawal
from opendws.sim import SimulatedCloud
from tests.builders import A3, NOW, calendar, pool

PROJECT = "calendar-operations"
ZONE = "us-central1-a"
OPERATION = timedelta(seconds=1)


@contextmanager
def approved_block(
    latency: timedelta,
) -> Iterator[tuple[SimulatedCloud, BlockProvider, Pool, Order]]:
    """A calendar block 40 days ahead, reserved and approved by the simulated cloud (its
    operations taking ``latency``), seen through the real client on the project's emulator."""
    cloud = SimulatedCloud(
        ManualClock(NOW, running=True), provisioning_latency=timedelta(0),
        operation_latency=latency, review_delay=timedelta(0),
    )  # fmt: skip
    cloud.set_stock(ZONE, A3, 8)
    with ComputeEmulator(cloud) as emulator:
        blocks = capacity_providers(PROJECT, endpoint=emulator.endpoint).calendar
        home = pool(zone=ZONE, capacity=8)
        request = calendar("far", vm_count=1, days=1, start_at=NOW + timedelta(days=40))
        order = Order(request=request, pool=home, attempt=1)
        blocks.reserve(order)
        cloud.advance(timedelta(minutes=1))  # reviewed and approved
        yield cloud, blocks, home, order


def test_a_block_cancelled_with_operations_that_take_a_while_is_withdrawn() -> None:
    with approved_block(OPERATION) as (cloud, blocks, home, order):
        assert blocks.withdraw(order.name, home) is Withdrawal.WITHDRAWN
        blocks.release(order.name, home)
        cloud.advance(OPERATION * 2)
        assert blocks.observe([home]) == {}


def test_a_tenants_cancel_answers_as_soon_as_google_has_cancelled_the_block() -> None:
    """The cancel waits on Google's ``zoneOperations.wait``, not on polls that back off to
    seconds apart (the client's first two are 1 s and 2.5 s after the call): the reconciler
    observes the cancelled block too, and a cancel that lingers after Google finished it is
    one a pass records as cancelled at Google rather than by its tenant."""
    latency = timedelta(seconds=1.2)
    with approved_block(latency) as (_, blocks, home, order):
        started = time.monotonic()
        assert blocks.withdraw(order.name, home) is Withdrawal.WITHDRAWN
        took = time.monotonic() - started
        assert latency.total_seconds() <= took < latency.total_seconds() + 0.6, took
