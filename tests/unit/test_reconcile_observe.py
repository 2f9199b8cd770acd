"""Which pools a reconcile pass observes: those where something may have changed, and every
pool on an instance's first pass and every ``observe_all_every`` after.

Each provider call lists one pool's (or zone's) resources: Google lists resize requests per
managed instance group (compute/docs/reference/rest/v1/instanceGroupManagerResizeRequests/list,
``.../zones/{zone}/instanceGroupManagers/{instanceGroupManager}/resizeRequests``) and queued
resources per zone (tpu/docs/reference/rest/v2/projects.locations.queuedResources/list,
``{parent=projects/*/locations/*}``), so a pass that lists every configured pool costs what is
configured, not what changed. These tests
pin that a narrowed pass still sees every live order (the sweep never takes an order it did
not look for as one Google lost) and still finds what a release left behind."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from opendws.adapters.memory import (
    MemoryCapacityProvider,
    MemoryConfigStore,
    MemoryEventBus,
    MemoryRequestStore,
    MemoryTimerQueue,
)
from opendws.clock import ManualClock
from opendws.domain.model import Pool
from opendws.domain.states import RequestState
from opendws.ports import Clock, Configuration, Observed, Order, Providers, order_name
from opendws.service.mirror import RequestMirror
from opendws.service.reconcile import ReconcileService, ReconcileSettings
from tests.builders import A3, DAY, H100, HOUR, MINUTE, NOW, flex, pool
from tests.world import World, submit, tenants_for

S = RequestState
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c")
POOLS = tuple(f"{zone}/{A3}" for zone in ZONES)
LATENCY = timedelta(seconds=20)


class WatchedCloud(MemoryCapacityProvider):
    """The memory cloud, noting the pools of every observation and refusing releases on
    demand (a transient 503 of Google's)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock, latency=LATENCY)
        self.looked: list[list[str]] = []
        self.refuse_releases = 0

    def observe(self, pools: Sequence[Pool]) -> dict[str, Observed]:
        self.looked.append(sorted(pool.pool_id for pool in pools))
        return super().observe(pools)

    def release(self, name: str, pool: Pool) -> None:
        if self.refuse_releases:
            self.refuse_releases -= 1
            raise RuntimeError("503 Service Unavailable: backendError")
        super().release(name, pool)


def three_zones(settings: ReconcileSettings | None = None) -> tuple[World, WatchedCloud]:
    clock = ManualClock(NOW)
    cloud = WatchedCloud(clock)
    for zone in ZONES:
        cloud.set_stock(zone, A3, 4)
    world = World(
        clock=clock,
        store=MemoryRequestStore(),
        config=MemoryConfigStore(
            Configuration(
                pools=tuple(pool(zone=zone, capacity=4) for zone in ZONES),
                tenants=tenants_for(H100),
            )
        ),
        providers=Providers(mig_flex=cloud, tpu=cloud, calendar=cloud),
        bus=MemoryEventBus(),
        # A day: no full observation in the middle of a test, unless it asks for one.
        settings=settings or ReconcileSettings(observe_all_every=DAY),
        timers=MemoryTimerQueue(),
    )
    return world, cloud


def passes(world: World, reconciler: ReconcileService, cloud: WatchedCloud) -> list[str]:
    """One pass a little later; the pools it observed."""
    world.clock.advance(LATENCY)
    before = len(cloud.looked)
    report = reconciler.run_pass()
    assert report.ran
    seen = cloud.looked[before:]
    # One provider serves every kind here: one observation per pass, none with no pools.
    assert len(seen) == (1 if report.observed_pools else 0)
    return seen[0] if seen else []


def test_a_quiet_pass_observes_only_the_pools_of_live_orders() -> None:
    world, cloud = three_zones()
    reconciler = world.reconciler()
    submit(world.store, flex("train", vm_count=2, hours=6, locations=(ZONES[0],)))
    first = reconciler.run_pass()
    assert first.observed_all
    assert cloud.looked == [list(POOLS)]
    assert passes(world, reconciler, cloud) == [POOLS[0]]
    assert world.state("train") is S.ACTIVE
    assert passes(world, reconciler, cloud) == [POOLS[0]]  # steady: still only its pool


def test_every_pool_is_observed_again_after_observe_all_every_and_a_stray_found() -> None:
    """A resource where no record points (a release Google accepted and then failed) is only
    found by looking at every pool: a narrowed pass does not see it, the next full one
    releases it."""
    world, cloud = three_zones(ReconcileSettings(observe_all_every=10 * MINUTE))
    reconciler = world.reconciler()
    reconciler.run_pass()
    stray = flex("gone", vm_count=2, locations=(ZONES[2],))
    cloud.provision(Order(request=stray, pool=pool(zone=ZONES[2], capacity=4), attempt=1))
    narrowed = reconciler.run_pass()
    assert (narrowed.observed_pools, narrowed.observed_all, narrowed.leaks) == (0, False, [])
    world.clock.advance(10 * MINUTE)
    full = reconciler.run_pass()
    assert full.observed_all
    assert full.observed_pools == len(POOLS)
    assert full.leaks == [order_name("gone", 1)]
    assert cloud.stock(ZONES[2], A3) == 4


def test_a_release_by_another_function_that_failed_is_found_on_the_next_pass() -> None:
    """The end service (release, cancel, timers) runs apart from the reconciler; when its
    release call fails, the record is final and the resource stays. The mirror sees the
    request end and the next pass looks in its pool, though no live order is there."""
    world, cloud = three_zones()
    reconciler = world.reconciler()
    submit(world.store, flex("train", vm_count=2, hours=6, locations=(ZONES[1],)))
    reconciler.run_pass()
    passes(world, reconciler, cloud)
    assert world.state("train") is S.ACTIVE
    cloud.refuse_releases = 1
    assert world.ending().release("train", "t").state is S.RELEASED
    assert cloud.stock(ZONES[1], A3) == 2  # still held at Google
    world.clock.advance(LATENCY)
    report = reconciler.run_pass()
    assert not report.observed_all
    assert cloud.looked[-1] == [POOLS[1]]
    assert report.leaks == [order_name("train", 1)]
    assert cloud.stock(ZONES[1], A3) == 4
    # Seen clean once after the release: the pool leaves the watch.
    assert passes(world, reconciler, cloud) == [POOLS[1]]
    assert passes(world, reconciler, cloud) == []


def test_a_pool_where_a_release_keeps_failing_stays_observed_until_it_is_clean() -> None:
    world, cloud = three_zones()
    reconciler = world.reconciler()
    submit(world.store, flex("train", vm_count=2, hours=6, locations=(ZONES[0],)))
    reconciler.run_pass()
    passes(world, reconciler, cloud)
    cloud.refuse_releases = 4  # the end service's call, then three leak releases
    world.ending().release("train", "t")
    for _ in range(3):
        world.clock.advance(LATENCY)
        report = reconciler.run_pass()
        assert cloud.looked[-1] == [POOLS[0]]
        assert report.leaks == []
        assert report.errors  # the release was refused again: the next pass retries
    assert passes(world, reconciler, cloud) == [POOLS[0]]
    assert cloud.stock(ZONES[0], A3) == 4
    assert passes(world, reconciler, cloud) == [POOLS[0]]  # seen clean after the release
    assert passes(world, reconciler, cloud) == []


def test_a_run_the_sweep_ends_is_released_and_its_pool_watched_until_clean() -> None:
    """Without timers the sweep ends a run past its end: the reconciler's own release. The
    pool is looked at again until Google has deleted what was released."""
    world, cloud = three_zones()
    world.timers = None
    reconciler = world.reconciler()
    submit(world.store, flex("short", vm_count=1, hours=1, locations=(ZONES[2],)))
    reconciler.run_pass()
    passes(world, reconciler, cloud)
    assert world.state("short") is S.ACTIVE
    world.clock.advance(HOUR + 2 * MINUTE)
    assert passes(world, reconciler, cloud) == [POOLS[2]]
    assert world.state("short") is S.EXPIRED
    assert passes(world, reconciler, cloud) == [POOLS[2]]  # released last pass: look again
    assert passes(world, reconciler, cloud) == []
    assert cloud.stock(ZONES[2], A3) == 4


@pytest.mark.parametrize("every", [timedelta(0), -MINUTE])
def test_observe_all_every_zero_observes_every_pool_on_every_pass(every: timedelta) -> None:
    world, _ = three_zones(ReconcileSettings(observe_all_every=every))
    reconciler = world.reconciler()
    for _ in range(3):
        report = reconciler.run_pass()
        assert report.observed_all
        assert report.observed_pools == len(POOLS)


def test_a_new_instance_observes_every_pool_on_its_first_pass() -> None:
    """Another instance's releases are not in this one's memory: its first look is whole."""
    world, _ = three_zones()
    world.reconciler().run_pass()
    world.clock.advance(LATENCY)
    assert world.reconciler("reconciler-2").run_pass().observed_all


def test_the_mirror_notes_the_pools_of_a_request_that_ended_once() -> None:
    store = MemoryRequestStore()
    world, cloud = three_zones()
    world.store = store
    submit(store, flex("train", vm_count=2, hours=6, locations=(ZONES[1],)))
    reconciler = world.reconciler()
    reconciler.run_pass()
    passes(world, reconciler, cloud)
    mirror = RequestMirror()
    mirror.refresh(store)
    assert mirror.take_ended_pools() == set()
    world.ending().release("train", "t")
    mirror.refresh(store)
    assert mirror.take_ended_pools() == {POOLS[1]}
    mirror.refresh(store)  # the final record read again at the watermark: nothing more
    assert mirror.take_ended_pools() == set()
