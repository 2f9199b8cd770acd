"""Google's queue in the plan: a flex order opendws admitted runs only once Google serves it
("the MIG schedules Flex-start VM creation as soon as resources are available",
cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig), so its capacity is
held from admission until its run ends. The reconciler learns each pool's serve wait (the 90th
percentile of admission → ACTIVE) and plans with it: a run placed in the pool holds the wait,
then its run; an admitted run still in Google's queue holds until its admission plus that
wait plus its run. A promise made behind such a run therefore does not move later while
Google serves within its usual time."""

from __future__ import annotations

from datetime import timedelta

from opendws.domain.readiness import ReadySample
from opendws.domain.states import RequestState
from opendws.ports import RequestStore
from opendws.ports.records import expected_serve, hold_end
from opendws.service.queries import QueryService, SpanKind
from opendws.service.reconcile import GOOGLE_LATE, ReconcileSettings
from tests.builders import A3, H100, NOW, ZONE, flex, pool
from tests.world import World, memory_world, submit, tenants_for

S = RequestState
POOL = f"{ZONE}/{A3}"
GOOGLE = timedelta(minutes=10)  # the fake cloud's time from an order to its running VMs
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)


def _served_three(world: World) -> None:
    """Three one-VM runs of an hour, each served after GOOGLE: the pool's serve wait (p90)
    is then GOOGLE."""
    for name in ("a", "b", "c"):
        submit(world.store, flex(name, vm_count=1, hours=1))
    world.run()
    world.clock.advance(GOOGLE)
    world.run()
    assert {world.state(name) for name in ("a", "b", "c")} == {S.ACTIVE}


def _told(world: World, request_id: str) -> list[object]:
    return [e.eta for e in world.bus.published if e.request_id == request_id and e.eta]


def test_a_promise_behind_a_run_in_googles_queue_holds_while_google_serves_in_time() -> None:
    """x is admitted at NOW+10m into the pool's last unit; Google serves it 10 minutes later.
    big (the whole pool) is told NOW+10m + 10m + 1h, the end of x's run as planned with the
    pool's serve wait — not NOW+10m + 1h, which every pass of Google's queue would push
    later. Five minutes on, x is still in Google's queue: big's ETA stands (no new event).
    Once Google serves x, x's run ends exactly there and big's ETA still stands."""
    world, cloud = memory_world([pool(capacity=4)], tenants_for(H100), latency=GOOGLE)
    cloud.set_stock(ZONE, A3, 4)
    _served_three(world)
    admitted = world.clock.now()
    submit(world.store, flex("x", vm_count=1, hours=1, submitted_at=admitted))
    submit(world.store, flex("big", vm_count=4, hours=1, submitted_at=admitted))
    world.run()
    assert world.state("x") is S.PROVISIONING
    promised = admitted + GOOGLE + HOUR
    assert world.record("big").eta == promised
    assert hold_end(world.record("x"), admitted, GOOGLE) == promised

    world.clock.advance(GOOGLE / 2)
    world.run()
    assert world.state("x") is S.PROVISIONING  # still in Google's queue, within its time
    assert world.record("big").eta == promised
    assert _told(world, "big") == [promised]

    world.clock.advance(GOOGLE / 2)
    world.run()
    assert world.state("x") is S.ACTIVE
    assert world.record("big").eta == promised
    assert _told(world, "big") == [promised]


def test_a_run_google_serves_late_moves_what_waits_behind_it_later_and_says_so() -> None:
    """Past the pool's serve wait the run is held from now on: Google is late, a cause
    outside the plan, and the promise behind it moves later; the event names the cause —
    the run not yet served, then served late."""
    world, cloud = memory_world([pool(capacity=4)], tenants_for(H100), latency=GOOGLE)
    cloud.set_stock(ZONE, A3, 4)
    _served_three(world)
    cloud.set_latency(3 * GOOGLE)  # Google is slower than it was for this one
    admitted = world.clock.now()
    submit(world.store, flex("x", vm_count=1, hours=1, submitted_at=admitted))
    submit(world.store, flex("big", vm_count=4, hours=1, submitted_at=admitted))
    reconciler = world.reconciler()
    reconciler.run_pass()
    # Late, x is expected a further serve wait after the first: big moves once per wait,
    # not with every pass.
    world.clock.advance(GOOGLE + GOOGLE / 2)
    reconciler.run_pass()
    world.clock.advance(GOOGLE / 2)
    reconciler.run_pass()
    assert world.state("x") is S.PROVISIONING
    assert world.record("big").eta == admitted + 2 * GOOGLE + HOUR
    assert _told(world, "big") == [admitted + GOOGLE + HOUR, admitted + 2 * GOOGLE + HOUR]
    waiting = [e.message for e in world.bus.published if e.request_id == "big"][-1]
    assert waiting.endswith(
        f"; {GOOGLE_LATE} in {POOL}: 1 run admitted there not yet served within the 0:10:00 planned"
    )
    world.clock.advance(GOOGLE + timedelta(seconds=30))
    reconciler.run_pass()
    assert world.state("x") is S.ACTIVE  # served at 3 × GOOGLE, in this pass
    served = admitted + 3 * GOOGLE + timedelta(minutes=1)  # its run ends 30 s into a minute
    assert world.record("big").eta == served + HOUR
    moved = [e.message for e in world.bus.published if e.request_id == "big"][-1]
    assert moved.endswith(f"; {GOOGLE_LATE} in {POOL}: 1 run served later than the 0:10:00 planned")


def test_the_hold_of_a_run_in_googles_queue() -> None:
    """Admission + serve wait + run while that lies ahead; from now on once it has passed;
    an ACTIVE run's hold does not read the serve wait."""
    world, cloud = memory_world([pool(capacity=4)], tenants_for(H100), latency=GOOGLE)
    cloud.set_stock(ZONE, A3, 4)
    submit(world.store, flex("x", vm_count=1, hours=1))
    world.run()
    record = world.record("x")
    assert record.state is S.PROVISIONING
    assert hold_end(record, NOW, GOOGLE) == NOW + GOOGLE + HOUR
    assert hold_end(record, NOW + GOOGLE, GOOGLE) == NOW + GOOGLE + HOUR
    assert hold_end(record, NOW + 2 * GOOGLE, GOOGLE) == NOW + 2 * GOOGLE + HOUR
    assert hold_end(record, NOW + 2 * GOOGLE) == NOW + 2 * GOOGLE + HOUR
    world.clock.advance(GOOGLE)
    world.run()
    active = world.record("x")
    assert hold_end(active, NOW + 2 * GOOGLE, 3 * GOOGLE) == NOW + GOOGLE + HOUR


def test_a_late_order_is_expected_a_further_serve_wait_later_in_steps() -> None:
    admitted, wait = NOW, GOOGLE
    assert expected_serve(admitted, NOW, wait) == NOW + wait
    assert expected_serve(admitted, NOW + wait, wait) == NOW + wait
    assert expected_serve(admitted, NOW + wait + MINUTE, wait) == NOW + 2 * wait
    assert expected_serve(admitted, NOW + 2 * wait, wait) == NOW + 2 * wait
    assert expected_serve(admitted, NOW + 5 * wait + MINUTE, wait) == NOW + 6 * wait
    # No wait known: from now on.
    assert expected_serve(admitted, NOW + wait, timedelta(0)) == NOW + wait


def test_the_timeline_draws_a_run_in_googles_queue_as_the_planner_holds_it() -> None:
    world, cloud = memory_world([pool(capacity=4)], tenants_for(H100), latency=GOOGLE)
    cloud.set_stock(ZONE, A3, 4)
    _served_three(world)
    admitted = world.clock.now()
    submit(world.store, flex("x", vm_count=1, hours=1, submitted_at=admitted))
    world.run()
    spans = QueryService(world.store, world.store, world.config).timeline(admitted)[POOL]
    (queued,) = [span for span in spans if span.request_id == "x"]
    assert queued.kind is SpanKind.PROVISIONING
    assert (queued.start, queued.end) == (admitted + GOOGLE, admitted + GOOGLE + HOUR)


class _CountingReads:
    """A store whose ready-sample reads are counted."""

    def __init__(self, store: RequestStore) -> None:
        self.store = store
        self.reads = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def ready_samples(self) -> object:
        self.reads += 1
        return self.store.ready_samples()


def test_an_instance_reads_the_samples_once_per_period_and_keeps_what_it_records() -> None:
    """Every pass plans with the pools' serve waits, but the samples are read on the
    instance's first pass and then every readiness_every; a sample this instance records is
    seen at once (the next pass's ETAs use it) without another read."""
    settings = ReconcileSettings(readiness_every=timedelta(minutes=30))
    world, cloud = memory_world(
        [pool(capacity=4)], tenants_for(H100), latency=GOOGLE, settings=settings
    )
    cloud.set_stock(ZONE, A3, 4)
    counting = _CountingReads(world.store)
    world.store = counting  # type: ignore[assignment]
    reconciler = world.reconciler()
    for name in ("a", "b", "c"):
        submit(counting.store, flex(name, vm_count=1, hours=1))
    reconciler.run_pass()
    assert counting.reads == 1
    world.clock.advance(GOOGLE)
    reconciler.run_pass()  # a, b and c served: three samples recorded
    assert counting.reads == 1
    submit(counting.store, flex("big", vm_count=4, hours=1, submitted_at=NOW + GOOGLE))
    reconciler.run_pass()
    assert counting.reads == 1
    told = [e for e in world.bus.published if e.request_id == "big"][-1]
    assert told.eta is not None
    assert told.ready_eta == told.eta + GOOGLE  # the three samples, kept by the instance
    world.clock.advance(timedelta(minutes=30))
    reconciler.run_pass()
    assert counting.reads == 2


def test_a_serve_wait_that_grows_moves_what_waits_later_and_says_so() -> None:
    """Google served a pool's last orders more slowly: its serve wait (the p90 of the
    samples) grows from 10 to 40 minutes, so the run still in its queue is held longer and
    the promise behind it moves later; the event names the growth."""
    settings = ReconcileSettings(readiness_every=timedelta(0))  # read the samples every pass
    world, cloud = memory_world(
        [pool(capacity=4)], tenants_for(H100), latency=2 * HOUR, settings=settings
    )
    cloud.set_stock(ZONE, A3, 4)
    for index in range(3):
        world.store.record_ready(POOL, ReadySample(request_id=f"s{index}", at=NOW, took=GOOGLE))
    submit(world.store, flex("x", vm_count=1, hours=1))
    submit(world.store, flex("big", vm_count=4, hours=1))
    reconciler = world.reconciler()
    reconciler.run_pass()
    assert world.state("x") is S.PROVISIONING
    assert world.record("big").eta == NOW + GOOGLE + HOUR
    slower = 4 * GOOGLE
    for index in range(3):
        sample = ReadySample(request_id=f"t{index}", at=NOW + MINUTE, took=slower)
        world.store.record_ready(POOL, sample)
    world.clock.advance(2 * MINUTE)
    reconciler.run_pass()
    assert world.record("big").eta == NOW + slower + HOUR
    moved = [e.message for e in world.bus.published if e.request_id == "big"][-1]
    assert moved.endswith(
        f"; {GOOGLE_LATE} in {POOL}: the wait planned there grew from 0:10:00 to 0:40:00"
    )
