"""The CapacityProvider contract, run on the in-memory fake cloud and on the real adapters
(google-cloud-compute and google-cloud-tpu clients) over the project's Compute/TPU emulator:
the same assertions for every kind — MIG flex-start, TPU queued resources, GPU and TPU
calendar blocks (calendar-mode future reservations, reviewed by Google, consumed by VMs or by a
queued resource) — so the fake cannot drift from the real thing."""

from __future__ import annotations

import ipaddress
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import cast

import pytest

from emulators import ComputeEmulator
from opendws.adapters.memory import MemoryCapacityProvider
from opendws.bootstrap import capacity_providers
from opendws.catalog import TPU_API_TYPES
from opendws.clock import ManualClock
from opendws.domain.model import CapacityRequest, Pool, Provider
from opendws.ports import (
    CalendarBlocks,
    CapacityProvider,
    Order,
    Providers,
    ProvisionPhase,
    Withdrawal,
)
from opendws.ports.runs import workers_per_node
from opendws.sim import SimulatedCloud
from tests.builders import A3, HOUR, NOW, calendar, flex, pool, tpu_pool

KINDS = ("mig_flex", "tpu", "calendar", "tpu_calendar")
REVIEW = timedelta(minutes=2)  # Google's review of a block, in both clouds
TPU_CHIPS = {1: "2x2", 2: "2x4", 3: "4x4"}  # a TPU block of "units": 4, 8, 16 chips
BACKENDS = ("memory", "emulator")
LATENCY = timedelta(seconds=20)
ZONE, OTHER_ZONE = "us-central1-a", "us-central1-b"
# Where Google's calendar mode reserves v5e (tpu/docs/calendar-mode-reservation, "Limitations").
TPU_BLOCK_ZONE, TPU_BLOCK_OTHER_ZONE = "us-west4-b", "europe-west4-b"
STOCKOUT = "ZONE_RESOURCE_POOL_EXHAUSTED"
_ids = itertools.count()


@dataclass
class Kit:
    """A provider of one kind, its pools, and how to steer the cloud behind it."""

    kind: str
    provider: CapacityProvider
    pool: Pool
    other: Pool
    set_stock: Callable[[Pool, int], None]
    stock: Callable[[Pool], int]
    inject: Callable[[Pool, str], None]
    advance: Callable[[timedelta], object]
    created: Callable[[str], int]
    set_fill_delay: Callable[[timedelta], None]

    @property
    def block(self) -> bool:
        """A calendar kind (GPU or TPU block)."""
        return self.kind in ("calendar", "tpu_calendar")

    @property
    def blocks(self) -> CalendarBlocks:
        """The provider as a calendar-block provider (the fixture gives a BlockProvider for
        the calendar kinds)."""
        assert self.block, f"{self.kind} is not a calendar kind"
        return cast(CalendarBlocks, self.provider)

    @property
    def lead(self) -> timedelta:
        """How far ahead this kind's blocks start: a TPU block at least a day ahead
        (tpu/docs/calendar-mode-reservation), a GPU block an hour ahead here."""
        return timedelta(days=1, hours=1) if self.kind == "tpu_calendar" else HOUR

    def request(
        self, units: int = 2, hours: float = 3, *, start_in: timedelta | None = None
    ) -> CapacityRequest:
        """A request of this kind: ``units`` VMs (slices for TPU, of 2x2 = 4 chips; one slice
        of 4, 8 or 16 chips for a TPU block, a count Google's calendar mode takes)."""
        request_id = f"contract-{next(_ids)}"
        topology = "2x2" if self.kind == "tpu" else None
        start = NOW + (self.lead if start_in is None else start_in)
        if self.kind == "tpu_calendar":
            return calendar(request_id, vm_count=1, topology=TPU_CHIPS[units], days=1,
                            start_at=start,
                            locations=(self.pool.zone, self.other.zone))  # fmt: skip
        if self.block:
            return calendar(request_id, vm_count=units, days=1, start_at=start,
                            locations=(self.pool.zone, self.other.zone))  # fmt: skip
        return flex(request_id, vm_count=units, hours=hours, topology=topology,
                    locations=(self.pool.zone, self.other.zone))  # fmt: skip

    def start(self, order: Order) -> None:
        """Begin provisioning ``order`` as the reconciler would (a block: reserve, wait for
        its start, then create its VMs)."""
        if self.block:
            self.provider.reserve(order)
            self.advance(self.lead)
        self.provider.provision(order)

    def phase(self, order: Order, pool: Pool | None = None) -> ProvisionPhase | None:
        seen = self.provider.observe([pool or order.pool]).get(order.name)
        return None if seen is None else seen.phase


def _pools(kind: str) -> tuple[Pool, Pool]:
    if kind == "tpu_calendar":
        return (
            tpu_pool(zone=TPU_BLOCK_ZONE, capacity=64),
            tpu_pool(zone=TPU_BLOCK_OTHER_ZONE, capacity=64),
        )
    if kind == "tpu":
        return tpu_pool(zone=ZONE, capacity=64), tpu_pool(zone=OTHER_ZONE, capacity=64)
    return pool(zone=ZONE, shape=A3, capacity=8), pool(zone=OTHER_ZONE, shape=A3, capacity=8)


def _pick(providers: Providers, kind: str) -> CapacityProvider:
    return {
        "mig_flex": providers.mig_flex, "tpu": providers.tpu, "calendar": providers.calendar,
        "tpu_calendar": providers.tpu_calendar,
    }[kind]  # fmt: skip


def _cloud_shape(pool: Pool) -> str:
    return TPU_API_TYPES[pool.shape] if pool.provider is Provider.TPU else pool.shape


@pytest.fixture(params=[(k, b) for b in BACKENDS for k in KINDS], ids=lambda p: f"{p[0]}-{p[1]}")
def kit(request: pytest.FixtureRequest) -> Iterator[Kit]:
    kind, backend = request.param
    main, other = _pools(kind)
    if backend == "memory":
        clock = ManualClock(NOW)
        fake = MemoryCapacityProvider(clock, latency=LATENCY)
        yield Kit(
            kind=kind, provider=fake, pool=main, other=other,
            set_stock=lambda p, n: fake.set_stock(p.zone, p.shape, n),
            stock=lambda p: fake.stock(p.zone, p.shape),
            inject=lambda p, k: fake.inject(p.zone, p.shape, k),
            advance=clock.advance,
            created=lambda name: fake.created().get(name, 0),
            set_fill_delay=fake.set_fill_delay,
        )  # fmt: skip
        return
    cloud = SimulatedCloud(
        ManualClock(NOW), provisioning_latency=LATENCY, operation_latency=timedelta(0)
    )
    resource_kind = {
        "mig_flex": "resizeRequests", "tpu": "queuedResources", "calendar": "futureReservations",
        "tpu_calendar": "futureReservations",
    }[kind]  # fmt: skip
    with ComputeEmulator(cloud) as emulator:
        providers = capacity_providers(f"contract-{next(_ids)}", endpoint=emulator.endpoint)
        yield Kit(
            kind=kind, provider=_pick(providers, kind), pool=main, other=other,
            set_stock=lambda p, n: cloud.set_stock(p.zone, _cloud_shape(p), n),
            stock=lambda p: cloud.stock(p.zone, _cloud_shape(p)),
            inject=lambda p, k: cloud.inject(p.zone, _cloud_shape(p), k),
            advance=cloud.advance,
            created=lambda name: cloud.created(resource_kind).get(name, 0),
            set_fill_delay=cloud.set_fill_delay,
        )  # fmt: skip


def test_an_order_becomes_ready_after_the_latency_and_takes_its_stock(kit: Kit) -> None:
    kit.set_stock(kit.pool, 8 if kit.kind != "tpu" else 64)
    before = kit.stock(kit.pool)
    order = Order(request=kit.request(), pool=kit.pool, attempt=1)
    kit.start(order)
    assert kit.phase(order) is _accepted(kit)
    kit.advance(LATENCY)
    assert kit.phase(order) is ProvisionPhase.READY
    assert kit.stock(kit.pool) == before - order.request.units
    assert kit.created(order.name) == 1


def test_a_ready_order_says_where_its_vms_are(kit: Kit) -> None:
    """A READY gang's observation carries one host per VM, in rank order: its name
    ``{order}-{i}`` (rank i), its zone and the internal address Compute Engine gave it
    (``networkInterfaces[0].networkIP``: "If not specified by the user, an unused internal IP
    is assigned by the system", compute/docs/reference/rest/v1/instances), each VM its own.
    Read from Compute Engine, not from the VMs. A TPU gang's hosts are its slices' workers as
    the TPU API reports its nodes (tpu/docs/reference/rest/v2/projects.locations.nodes:
    ``networkEndpoints``, one per TPU VM; nodes ``{nodeIdPrefix}-{i}`` of a multi-node
    request, MultiNodeParams): node, then worker."""
    tpu = kit.kind in ("tpu", "tpu_calendar")
    kit.set_stock(kit.pool, 64 if tpu else 8)
    order = Order(request=kit.request(units=3), pool=kit.pool, attempt=1)
    kit.start(order)
    assert kit.provider.observe([kit.pool])[order.name].hosts == ()  # not READY yet
    kit.advance(LATENCY)
    seen = kit.provider.observe([kit.pool])[order.name]
    assert seen.phase is ProvisionPhase.READY
    gang = order.request.gang
    nodes, workers = gang.vm_count, workers_per_node(gang)
    if tpu:
        assert [(h.rank, h.name, h.worker, h.zone) for h in seen.hosts] == [
            (rank, order.name if nodes == 1 else f"{order.name}-{rank // workers}",
             rank % workers, kit.pool.zone)
            for rank in range(nodes * workers)
        ]  # fmt: skip
    else:
        assert [(h.rank, h.name, h.worker, h.zone) for h in seen.hosts] == [
            (rank, f"{order.name}-{rank}", None, kit.pool.zone) for rank in range(3)
        ]
    addresses = [ipaddress.ip_address(h.internal_ip) for h in seen.hosts]
    assert all(address.is_private for address in addresses)
    assert len(set(addresses)) == len(seen.hosts)
    assert [h.external_ip for h in seen.hosts] == [None] * len(seen.hosts)  # none asked for
    kit.advance(timedelta(minutes=5))
    assert kit.provider.observe([kit.pool])[order.name].hosts == seen.hosts  # for their life


def test_a_repeated_call_creates_nothing_more(kit: Kit) -> None:
    kit.set_stock(kit.pool, 8 if kit.kind != "tpu" else 64)
    before = kit.stock(kit.pool)
    order = Order(request=kit.request(), pool=kit.pool, attempt=1)
    if kit.block:
        kit.provider.reserve(order)
        kit.provider.reserve(order)
        kit.advance(kit.lead)
    kit.provider.provision(order)
    kit.provider.provision(order)
    kit.advance(LATENCY)
    kit.provider.provision(order)
    assert kit.phase(order) is ProvisionPhase.READY
    assert kit.created(order.name) == 1
    assert kit.stock(kit.pool) == before - order.request.units


# Google semantics, one row per documented behaviour ------------------------------------


def _waiting_code(kit: Kit) -> str | None:
    """What a queued order reports as its last attempt: a MIG resize request the attempt's
    temporary error; a TPU queued resource none (it is WAITING_FOR_RESOURCES, no error)."""
    return None if kit.kind == "tpu" else STOCKOUT


def _accepted(kit: Kit) -> ProvisionPhase:
    """An order's phase once accepted, before it is first tried: a resize request is ACCEPTED
    without an attempt (CREATING); a queued resource waits in WAITING_FOR_RESOURCES from its
    acceptance (tpu/docs/queued-resources), and a calendar block's VMs are being created."""
    return ProvisionPhase.WAITING if kit.kind == "tpu" else ProvisionPhase.CREATING


def test_a_short_order_waits_with_a_stockout_and_is_ready_when_stock_returns(kit: Kit) -> None:
    """Capacity that is not there never fails the order: a resize request stays ACCEPTED with
    the temporary error in ``status.lastAttempt`` (compute.proto
    ``InstanceGroupManagerResizeRequestStatus``; compute/docs/instance-groups/about-resize-
    requests-mig: "the MIG schedules VM creation as soon as resources are available"), a
    queued resource waits in WAITING_FOR_RESOURCES (tpu/docs/queued-resources). It is served
    when stock returns. (This row replaces one that expected FAILED with the stockout code:
    that was how the old simulated cloud behaved, not how Google does.)"""
    if kit.block:
        pytest.skip("a calendar block is refused at booking instead (the next row)")
    order = Order(request=kit.request(units=3), pool=kit.pool, attempt=1)
    kit.set_stock(kit.pool, order.request.units - 1)
    kit.provider.provision(order)
    kit.advance(LATENCY)
    seen = kit.provider.observe([kit.pool])[order.name]
    assert (seen.phase, seen.last_attempt) == (ProvisionPhase.WAITING, _waiting_code(kit))
    assert seen.error_code is None
    kit.advance(timedelta(hours=2))
    assert kit.phase(order) is ProvisionPhase.WAITING  # it keeps waiting: no deadline here
    assert kit.stock(kit.pool) == order.request.units - 1
    kit.set_stock(kit.pool, order.request.units)
    kit.advance(timedelta(seconds=1))
    seen = kit.provider.observe([kit.pool])[order.name]
    assert (seen.phase, seen.last_attempt) == (ProvisionPhase.READY, None)
    assert kit.stock(kit.pool) == 0


def test_a_block_without_the_units_is_declined_after_review(kit: Kit) -> None:
    """A submitted block is reviewed (procurementStatus PENDING_APPROVAL), then DECLINED when
    Google has not the capacity over its window (compute/docs/instances/future-reservations-
    calendar-mode-overview); a declined request may be deleted."""
    if not kit.block:
        pytest.skip("only calendar blocks are booked")
    order = Order(request=kit.request(units=3), pool=kit.pool, attempt=1)
    kit.set_stock(kit.pool, order.request.units - 1)
    kit.provider.reserve(order)
    assert kit.phase(order) is ProvisionPhase.REVIEW
    assert kit.created(order.name) == 1
    kit.advance(REVIEW)
    seen = kit.provider.observe([kit.pool])[order.name]
    assert (seen.phase, seen.error_code) == (ProvisionPhase.FAILED, "DECLINED")
    kit.provider.release(order.name, kit.pool)
    assert kit.provider.observe([kit.pool]) == {}


def test_waiting_orders_are_served_first_come_first_served(kit: Kit) -> None:
    """Google serves waiting requests per zone and shape as capacity frees, first come first
    served (GOOGLE-SEMANTICS: the simulated cloud's serving rule); a later order does not
    overtake an earlier one that does not fit yet."""
    if kit.block:
        pytest.skip("calendar blocks do not queue")
    kit.set_stock(kit.pool, 0)
    first = Order(request=kit.request(units=2, hours=3), pool=kit.pool, attempt=1)
    kit.provider.provision(first)
    kit.advance(timedelta(minutes=30))
    second = Order(request=kit.request(units=1, hours=3), pool=kit.pool, attempt=1)
    kit.provider.provision(second)
    kit.advance(LATENCY)
    assert kit.phase(first) is kit.phase(second) is ProvisionPhase.WAITING
    kit.set_stock(kit.pool, second.request.units)  # the second fits: it must not overtake
    kit.advance(timedelta(seconds=1))
    assert kit.phase(first) is kit.phase(second) is ProvisionPhase.WAITING
    kit.set_stock(kit.pool, first.request.units + second.request.units)
    kit.advance(timedelta(seconds=1))
    assert kit.phase(first) is kit.phase(second) is ProvisionPhase.READY
    assert kit.stock(kit.pool) == 0


def test_a_much_shorter_order_is_served_before_a_slightly_earlier_long_one(kit: Kit) -> None:
    """ "Shorter requests are typically fulfilled more quickly" (compute/docs/instances/about-
    flex-start-vms): created minutes apart, a 1-hour order is served before a 3-day one
    (the simulated cloud's rule: creation time + run duration / 24)."""
    if kit.block:
        pytest.skip("calendar blocks do not queue")
    kit.set_stock(kit.pool, 0)
    long = Order(request=kit.request(units=2, hours=72), pool=kit.pool, attempt=1)
    kit.provider.provision(long)
    kit.advance(timedelta(minutes=5))
    short = Order(request=kit.request(units=2, hours=1), pool=kit.pool, attempt=1)
    kit.provider.provision(short)
    kit.advance(LATENCY)
    kit.set_stock(kit.pool, short.request.units)
    kit.advance(timedelta(seconds=1))
    assert (kit.phase(short), kit.phase(long)) == (ProvisionPhase.READY, ProvisionPhase.WAITING)


def test_an_injected_stockout_makes_the_order_wait_and_it_is_served_after(kit: Kit) -> None:
    """An injected stockout is one attempt that finds no capacity: the order waits with the
    temporary error (it is not failed) and a later attempt serves it. (This row replaces one
    that expected a stockout to fail the order.)"""
    if kit.block:
        pytest.skip("a calendar block's VMs consume its own reservation: no stockout there")
    kit.set_stock(kit.pool, 64)
    kit.inject(kit.pool, "stockout")
    order = Order(request=kit.request(), pool=kit.pool, attempt=1)
    kit.provider.provision(order)
    kit.advance(LATENCY)
    seen = kit.provider.observe([kit.pool])[order.name]
    assert (seen.phase, seen.error_code) == (ProvisionPhase.WAITING, None)
    assert seen.last_attempt == STOCKOUT or kit.kind == "tpu"
    kit.advance(timedelta(minutes=2))
    assert kit.phase(order) is ProvisionPhase.READY


def test_an_injected_error_is_a_final_failure_even_with_stock(kit: Kit) -> None:
    """Only ``status.error`` is final: FAILED with its code (compute.proto
    ``InstanceGroupManagerResizeRequestStatus.error``; a queued resource's FAILED state)."""
    if kit.block:
        pytest.skip("a calendar block's VMs consume its own reservation")
    kit.set_stock(kit.pool, 64)
    kit.inject(kit.pool, "error")
    order = Order(request=kit.request(), pool=kit.pool, attempt=1)
    kit.provider.provision(order)
    kit.advance(LATENCY)
    seen = kit.provider.observe([kit.pool])[order.name]
    assert seen.phase is ProvisionPhase.FAILED
    assert seen.error_code
    assert seen.error_code != STOCKOUT
    assert kit.stock(kit.pool) == 64


def test_a_hung_order_is_never_served_until_released(kit: Kit) -> None:
    if kit.block:
        pytest.skip("a calendar block's capacity is reserved: it does not queue")
    kit.set_stock(kit.pool, 64)
    kit.inject(kit.pool, "hang")
    order = Order(request=kit.request(), pool=kit.pool, attempt=1)
    kit.provider.provision(order)
    kit.advance(timedelta(hours=3))
    assert kit.phase(order) in (ProvisionPhase.CREATING, ProvisionPhase.WAITING)
    kit.provider.release(order.name, kit.pool)
    assert kit.phase(order) is None
    assert kit.stock(kit.pool) == 64


def test_release_while_waiting_cancels_then_deletes_and_leaves_nothing(kit: Kit) -> None:
    """Only an ACCEPTED resize request can be cancelled and only an inactive one deleted
    (compute.proto ``InstanceGroupManagerResizeRequests.Cancel/Delete``; magic-modules
    ``custom_delete/compute_mig_resize_request_delete.go.tmpl`` cancels and waits first):
    release does both, in order, and leaves nothing; a queued resource is deleted."""
    if kit.block:
        pytest.skip("calendar blocks do not queue")
    kit.set_stock(kit.pool, 0)
    order = Order(request=kit.request(), pool=kit.pool, attempt=1)
    kit.provider.provision(order)
    kit.advance(LATENCY)
    assert kit.phase(order) is ProvisionPhase.WAITING
    kit.provider.release(order.name, kit.pool)
    assert kit.provider.observe([kit.pool]) == {}
    kit.set_stock(kit.pool, 64)
    kit.advance(LATENCY)
    assert kit.provider.observe([kit.pool]) == {}  # nothing was left queued to be served
    assert kit.stock(kit.pool) == 64
    kit.provider.release(order.name, kit.pool)  # safe to repeat


def test_release_gives_everything_back_and_is_safe_to_repeat(kit: Kit) -> None:
    """(A started calendar block is billed to its end and kept: the next row.)"""
    if kit.block:
        pytest.skip("a started calendar block is kept by Google to its end (the next row)")
    kit.set_stock(kit.pool, 64)
    order = Order(request=kit.request(), pool=kit.pool, attempt=1)
    kit.start(order)
    kit.advance(LATENCY)
    assert kit.phase(order) is ProvisionPhase.READY
    kit.provider.release(order.name, kit.pool)
    assert kit.provider.observe([kit.pool]) == {}
    assert kit.stock(kit.pool) == 64
    kit.provider.release(order.name, kit.pool)
    kit.provider.release("odws-never-made-0000000000-1", kit.pool)
    assert kit.stock(kit.pool) == 64


def test_releasing_a_running_block_deletes_its_consumers_and_keeps_the_block(kit: Kit) -> None:
    """A block that may no longer be cancelled is billed in full and kept to its end
    (compute/docs/instances/delete-future-reservations-calendar-mode); releasing it deletes
    its VMs (or queued resource) only. At its end Google deletes the reservation; the request
    may be deleted then."""
    if not kit.block:
        pytest.skip("only calendar blocks are kept to their end")
    kit.set_stock(kit.pool, 64)
    order = Order(request=kit.request(), pool=kit.pool, attempt=1)
    kit.start(order)
    kit.advance(LATENCY)
    assert kit.phase(order) is ProvisionPhase.READY
    kit.provider.release(order.name, kit.pool)
    seen = kit.provider.observe([kit.pool])[order.name]
    assert seen.phase is ProvisionPhase.RESERVED  # its consumers gone, the block kept
    assert seen.ends_at == order.request.start_at + order.request.run_duration  # type: ignore[operator]
    assert kit.stock(kit.pool) == 64 - order.request.units  # still held: it is paid for
    kit.provider.release(order.name, kit.pool)  # safe to repeat: it is still kept
    assert kit.phase(order) is ProvisionPhase.RESERVED
    kit.advance(timedelta(days=1))
    assert kit.phase(order) is ProvisionPhase.ENDED
    assert kit.stock(kit.pool) == 64
    kit.provider.release(order.name, kit.pool)
    assert kit.provider.observe([kit.pool]) == {}


def test_a_block_is_cancelled_only_within_googles_windows(kit: Kit) -> None:
    """Cancellable while its start is more than 30 days away, or within 24 h of approval
    while its start is at least 4 days away (compute/docs/instances/delete-future-
    reservations-calendar-mode); a refusal changes nothing."""
    if not kit.block:
        pytest.skip("only calendar blocks are withdrawn")
    kit.set_stock(kit.pool, 64)
    far = Order(request=kit.request(start_in=timedelta(days=40)), pool=kit.pool, attempt=1)
    near = Order(request=kit.request(start_in=timedelta(days=10)), pool=kit.pool, attempt=1)
    kit.provider.reserve(far)
    kit.provider.reserve(near)
    kit.advance(REVIEW)
    approved = kit.provider.observe([kit.pool])
    assert approved[near.name].phase is ProvisionPhase.APPROVED
    assert approved[near.name].locked_at is not None
    kit.advance(timedelta(hours=25))
    assert kit.blocks.withdraw(near.name, kit.pool) is Withdrawal.REFUSED
    assert kit.phase(near) is ProvisionPhase.APPROVED
    assert kit.blocks.withdraw(far.name, kit.pool) is Withdrawal.WITHDRAWN
    seen = kit.provider.observe([kit.pool])[far.name]
    assert (seen.phase, seen.error_code) == (ProvisionPhase.FAILED, "CANCELLED")
    assert kit.blocks.withdraw(far.name, kit.pool) is Withdrawal.WITHDRAWN  # a repeat
    kit.provider.release(far.name, kit.pool)
    assert set(kit.provider.observe([kit.pool])) == {near.name}


def test_advice_recommends_where_and_when_the_block_fits(kit: Kit) -> None:
    """advice.calendarMode: the starts at which the block's units are free for its whole
    duration, earliest first (compute/docs/instances/future-reservations-calendar-mode-
    overview, "View resources future availability")."""
    if not kit.block:
        pytest.skip("only calendar blocks are advised")
    taken = Order(request=kit.request(units=3), pool=kit.pool, attempt=1)
    kit.set_stock(kit.pool, 2 * taken.request.units - 1)  # room for one such block at a time
    kit.set_stock(kit.other, 0)
    kit.provider.reserve(taken)
    kit.advance(REVIEW)
    assert kit.phase(taken) is ProvisionPhase.APPROVED
    start = taken.request.start_at
    assert start is not None
    wanted = kit.request(units=3)
    pools = [kit.pool, kit.other]
    at_start = kit.blocks.advise(wanted, pools, earliest=start, latest=start)
    assert at_start == ()  # its units are promised to the first block over the same window
    later = kit.blocks.advise(wanted, pools, earliest=start, latest=start + timedelta(days=5))
    assert later
    assert (later[0].start_at, later[0].zone) == (start + timedelta(days=1), kit.pool.zone)
    assert all(advice.zone == kit.pool.zone for advice in later)  # none in the empty zone


def test_observe_reports_only_the_given_pools(kit: Kit) -> None:
    kit.set_stock(kit.pool, 64)
    kit.set_stock(kit.other, 64)
    here = Order(request=kit.request(), pool=kit.pool, attempt=1)
    there = Order(request=kit.request(), pool=kit.other, attempt=1)
    if kit.block:
        kit.provider.reserve(there)  # both blocks booked before they start
    kit.start(here)
    kit.provider.provision(there)
    kit.advance(LATENCY)
    assert set(kit.provider.observe([kit.pool])) == {here.name}
    assert set(kit.provider.observe([kit.other])) == {there.name}
    assert kit.provider.observe([kit.pool])[here.name].pool_id == kit.pool.pool_id
    assert set(kit.provider.observe([kit.pool, kit.other])) == {here.name, there.name}


def test_the_end_of_a_run_or_block(kit: Kit) -> None:
    """Flex-start VMs are deleted when their run time is up (``instanceTerminationAction=
    DELETE``, compute/docs/instances/about-flex-start-vms), a flex-start TPU slice too (its
    queued resource becomes SUSPENDED: tpu/docs/request-using-flex-start), and a calendar
    block's VMs at its end: ENDED, stock back. (TPU slices used to run until released: that
    was the guaranteed tier; flex_start is now the default.)"""
    kit.set_stock(kit.pool, 64)
    order = Order(request=kit.request(hours=2), pool=kit.pool, attempt=1)
    kit.start(order)
    kit.advance(LATENCY)
    assert kit.phase(order) is ProvisionPhase.READY
    kit.advance(timedelta(days=1, hours=1))
    assert kit.phase(order) is ProvisionPhase.ENDED
    assert kit.stock(kit.pool) == 64


def test_a_block_promises_its_units_and_takes_them_at_its_start(kit: Kit) -> None:
    """An approved block's units are promised over its window (a second overlapping block
    is declined) and taken from stock only at its start."""
    if not kit.block:
        pytest.skip("only calendar blocks are reserved ahead")
    first = Order(request=kit.request(units=3), pool=kit.pool, attempt=1)
    second = Order(request=kit.request(units=3), pool=kit.pool, attempt=1)
    units = first.request.units
    kit.set_stock(kit.pool, 2 * units - 1)
    kit.provider.reserve(first)
    kit.advance(REVIEW)
    assert kit.phase(first) is ProvisionPhase.APPROVED
    assert kit.stock(kit.pool) == 2 * units - 1  # promised, not taken before the start
    kit.provider.reserve(second)  # overlaps: 2 × units > stock, so Google declines it
    kit.advance(REVIEW)
    seen = kit.provider.observe([kit.pool])[second.name]
    assert (seen.phase, seen.error_code) == (ProvisionPhase.FAILED, "DECLINED")
    kit.advance(kit.lead)
    assert kit.phase(first) is ProvisionPhase.RESERVED  # its reservation holds its units
    assert kit.stock(kit.pool) == units - 1


def test_a_blocks_reservation_is_consumed_only_once_google_has_filled_it(kit: Kit) -> None:
    """An approved block's reservation exists from approval, empty; Google provisions the
    capacity into it from the start, possibly up to 24 h later ("Compute Engine automatically
    creates an empty reservation. Then, at your chosen start time, Compute Engine provisions the
    requested capacity into the auto-created reservation", compute/docs/hpc/
    reserve-capacity-account-team; CP FutureReservationStatus: PROVISIONING with
    ``fulfilledCount``, then FULFILLED). Until it is filled the block is APPROVED, not RESERVED:
    the reconciler asks for no VM and no slice."""
    if not kit.block:
        pytest.skip("only calendar blocks have a reservation to fill")
    kit.set_fill_delay(timedelta(minutes=5))
    order = Order(request=kit.request(units=1), pool=kit.pool, attempt=1)
    kit.set_stock(kit.pool, order.request.units)
    kit.provider.reserve(order)
    kit.advance(REVIEW)
    assert kit.phase(order) is ProvisionPhase.APPROVED
    kit.advance(kit.lead)
    assert kit.phase(order) is ProvisionPhase.APPROVED  # started: the units are Google's
    assert kit.stock(kit.pool) == 0
    kit.advance(timedelta(minutes=5))
    assert kit.phase(order) is ProvisionPhase.RESERVED
    kit.provider.provision(order)
    kit.advance(LATENCY)
    assert kit.phase(order) is ProvisionPhase.READY


def test_a_tpu_block_where_google_does_not_reserve_it_is_refused(kit: Kit) -> None:
    """ "You can only reserve the following TPU versions in the specified zones"
    (tpu/docs/calendar-mode-reservation, "Limitations"): v5e only in europe-west4-b,
    us-west4-b (BATCH) and us-south1-a (SERVING). The insert is refused and nothing exists."""
    if kit.kind != "tpu_calendar":
        pytest.skip("the zones are a rule of TPU calendar blocks")
    elsewhere = tpu_pool(zone=ZONE, capacity=64)
    kit.set_stock(elsewhere, 64)
    order = Order(request=kit.request(units=1), pool=elsewhere, attempt=1)
    with pytest.raises(Exception, match="us-central1-a"):
        kit.provider.reserve(order)
    kit.advance(REVIEW)
    assert kit.phase(order) is None
