"""The reconciler's cloud calls in parallel: a pass that has more to carry out than fits in its
time does what fits and asks for the next pass at once; nothing is provisioned twice, lost or
leaked when the calls take random times, fail, or the process dies among them.

Google's operations finish seconds after the call that started them, and the port's calls
never wait for them (DESIGN.md: "Cloud calls never run inside a transaction and never block on
completion"), so a slow call here is a slow API round trip, not a wait for capacity."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from opendws.adapters.memory import MemoryCapacityProvider
from opendws.domain.states import RequestState
from opendws.ports import CloudRateLimited, Providers
from opendws.service.reconcile import ReconcileSettings
from tests.builders import A3, H100, MINUTE, NOW, flex, pool
from tests.crashing import PROVIDER_CALLS, STORE_WRITES, Crash, Crashing, Steps
from tests.world import World, memory_world, submit, tenants_for

pytestmark = pytest.mark.unit

S = RequestState
ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"


class Slow:
    """A provider whose calls each take ``seconds`` (an API round trip), counting how many
    run at once."""

    def __init__(self, inner: MemoryCapacityProvider, seconds: float) -> None:
        self._inner = inner
        self._seconds = seconds
        self._lock = threading.Lock()
        self.running = 0
        self.most = 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name not in PROVIDER_CALLS:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                self.running += 1
                self.most = max(self.most, self.running)
            try:
                time.sleep(self._seconds)
                return attribute(*args, **kwargs)
            finally:
                with self._lock:
                    self.running -= 1

        return call


class SlowWrites:
    """A store whose writes of a request take ``seconds`` each (Firestore's round trip)."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self._inner = inner
        self._seconds = seconds

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name != "change":
            return attribute

        def change(*args: Any, **kwargs: Any) -> Any:
            time.sleep(self._seconds)
            return attribute(*args, **kwargs)

        return change


def test_a_pass_with_more_than_its_budget_ends_on_time_and_the_next_ones_finish() -> None:
    budget = timedelta(seconds=0.6)
    settings = ReconcileSettings(pass_budget=budget, cloud_calls_in_flight=4)
    world, cloud = memory_world(
        [pool(zone=ZONE_A, capacity=400)], tenants_for(H100), settings=settings,
        latency=timedelta(0),
    )  # fmt: skip
    cloud.set_stock(ZONE_A, A3, 400)
    names = [f"job-{n:03d}" for n in range(300)]
    for index, name in enumerate(names):
        at = NOW + index * timedelta(milliseconds=10)
        submit(world.store, flex(name, vm_count=1, hours=1, locations=(ZONE_A,), submitted_at=at))
    slow = Slow(cloud, 0.01)  # 300 calls, 4 at a time: ~0.75 s, more than the pass has
    world.providers = Providers(mig_flex=slow, tpu=slow, calendar=slow)
    world.store = SlowWrites(world.store, 0.002)  # 300 writes: ~0.6 s, more than it has too
    service = world.reconciler()
    took: list[float] = []
    reports = []
    for _ in range(20):
        started = time.monotonic()
        report = service.run_pass()
        took.append(time.monotonic() - started)
        reports.append(report)
        if not report.again:
            break
        world.clock.advance(timedelta(seconds=5))
    first = reports[0]
    assert first.cut_short
    assert first.again
    assert 0 < first.transitions[S.PENDING, S.PROVISIONING] < len(names)
    # The lease is held from before the cycle starts: a little planning and writing besides.
    assert max(took) < budget.total_seconds() + 0.5, took
    assert slow.most == 4
    assert not reports[-1].again
    world.clock.advance(MINUTE)
    world.run()
    assert {world.state(name) for name in names} == {S.ACTIVE}
    assert {name: n for name, n in cloud.created().items() if n > 1} == {}
    assert len(cloud.created()) == len(names)


class Jittery:
    """A provider whose calls take random times, and fail at random — before the call (the
    cloud refused it) or after it (the call took effect, its answer was lost)."""

    def __init__(self, inner: Any, rng: random.Random, failures: float) -> None:
        self._inner = inner
        self._rng = rng
        self._failures = failures
        self._lock = threading.Lock()

    def _draw(self) -> tuple[float, float, float]:
        with self._lock:
            return self._rng.uniform(0, 0.003), self._rng.random(), self._rng.random()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._inner, name)
        if name not in PROVIDER_CALLS:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            pause, before, after = self._draw()
            time.sleep(pause)
            if before < self._failures:
                raise RuntimeError(f"503 {name} refused")
            result = attribute(*args, **kwargs)
            time.sleep(pause)
            if after < self._failures:
                raise RuntimeError(f"504 {name}: the answer was lost")
            return result

        return call


def over_capacity(world: World, cloud: MemoryCapacityProvider, capacity: int) -> list[str]:
    problems = [
        f"{zone} stock below zero" for zone in (ZONE_A, ZONE_B) if cloud.stock(zone, A3) < 0
    ]
    held: Counter[str] = Counter()
    for record in world.store.in_states(S.PROVISIONING, S.ACTIVE):
        assert record.pool is not None
        held[record.pool] += record.request.units
    return problems + [f"{p} holds {n} > {capacity}" for p, n in held.items() if n > capacity]


@pytest.mark.parametrize("seed", range(12))
def test_random_call_times_failures_and_a_crash_provision_nothing_twice_and_leak_nothing(
    seed: int,
) -> None:
    rng = random.Random(seed)
    capacity = 6
    world, cloud = memory_world(
        [pool(zone=ZONE_A, capacity=capacity), pool(zone=ZONE_B, capacity=capacity)],
        tenants_for(H100),
        settings=ReconcileSettings(cloud_calls_in_flight=rng.choice((2, 4, 8))),
    )
    cloud.set_stock(ZONE_A, A3, capacity)
    cloud.set_stock(ZONE_B, A3, capacity)
    names = [f"job-{n:02d}" for n in range(20)]
    for index, name in enumerate(names):
        submit(world.store, flex(name, vm_count=rng.choice((1, 2)), hours=rng.choice((1, 2)),
                                 locations=(ZONE_A, ZONE_B),
                                 submitted_at=NOW + index * timedelta(seconds=1)))  # fmt: skip
    steps = Steps(crash_at=rng.randint(1, 60))
    jittery = Jittery(Crashing(cloud, PROVIDER_CALLS, steps), rng, failures=0.15)
    world.providers = Providers(mig_flex=jittery, tpu=jittery, calendar=jittery)
    world.store = Crashing(world.store, STORE_WRITES, steps)
    violations: list[str] = []
    generation = 0
    while world.clock.now() < NOW + timedelta(hours=12):
        try:
            world.run(holder=f"reconciler-{generation}")
        except Crash:
            generation += 1  # the process died; another one takes over once the lease expires
        violations += over_capacity(world, cloud, capacity)
        world.clock.advance(5 * MINUTE)
    assert steps.crashed
    assert violations == []
    assert {world.state(name) for name in names} == {S.EXPIRED}
    assert {name: n for name, n in cloud.created().items() if n > 1} == {}
    assert cloud.observe([pool(zone=ZONE_A), pool(zone=ZONE_B)]) == {}
    assert (cloud.stock(ZONE_A, A3), cloud.stock(ZONE_B, A3)) == (capacity, capacity)


class ReleasesSeen:
    """A store that records what each pass's release of the lease said (``served``)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.served: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def release_lease(self, fence: Any, *, served: bool = False) -> bool:
        self.served.append(served)
        again: bool = self._inner.release_lease(fence, served=served)
        return again


def test_only_a_pass_that_carried_out_its_whole_plan_says_it_served_the_nudges_before_it() -> None:
    """The reconcile function drops a nudge published before a pass that served it
    (functions/main.py): a pass that left part of its plan to the next one has not."""
    settings = ReconcileSettings(pass_budget=timedelta(seconds=0.3), cloud_calls_in_flight=2)
    world, cloud = memory_world(
        [pool(zone=ZONE_A, capacity=100)], tenants_for(H100), settings=settings,
        latency=timedelta(0),
    )  # fmt: skip
    cloud.set_stock(ZONE_A, A3, 100)
    for index in range(100):
        submit(world.store, flex(f"job-{index:03d}", vm_count=1, hours=1, locations=(ZONE_A,),
                                 submitted_at=NOW + index * timedelta(seconds=1)))  # fmt: skip
    slow = Slow(cloud, 0.01)
    world.providers = Providers(mig_flex=slow, tpu=slow, calendar=slow)
    seen = ReleasesSeen(SlowWrites(world.store, 0.005))
    world.store = seen
    service = world.reconciler()
    reports = [service.run_pass()]
    while reports[-1].again and len(reports) < 30:
        reports.append(service.run_pass())
    assert reports[0].cut_short
    assert seen.served[0] is False
    assert seen.served[-1] is True
    assert seen.served == [not (r.cut_short or r.deferred) for r in reports]


class RefusesLooks:
    """A provider whose first ``refusals`` looks the cloud refuses for its rate quota."""

    def __init__(self, inner: Any, refusals: int, wait: timedelta) -> None:
        self._inner = inner
        self.refusals = refusals
        self._wait = wait

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def observe(self, pools: Any) -> Any:
        if self.refusals > 0:
            self.refusals -= 1
            raise CloudRateLimited("403 rateLimitExceeded", retry_after=self._wait)
        return self._inner.observe(pools)


def test_a_look_refused_for_the_rate_quota_ends_the_pass_and_the_next_waits_for_the_quota() -> None:
    """Compute answers a call over a per-minute quota with 403 rateLimitExceeded
    (https://cloud.google.com/compute/api-quota). A pass cannot sweep or plan without its look:
    it ends there, asking for the next pass, which waits until the quota refills."""
    world, cloud = memory_world([pool(zone=ZONE_A, capacity=4)], tenants_for(H100))
    cloud.set_stock(ZONE_A, A3, 4)
    submit(world.store, flex("job", vm_count=1, hours=1, locations=(ZONE_A,)))
    refusing = RefusesLooks(cloud, refusals=1, wait=timedelta(seconds=0.3))
    world.providers = Providers(mig_flex=refusing, tpu=refusing, calendar=refusing)
    service = world.reconciler()
    first = service.run_pass()
    assert first.again
    assert first.deferred == ["observe: the cloud's rate quota is spent"]
    assert world.state("job") is S.PENDING  # nothing planned without a look
    started = time.monotonic()
    second = service.run_pass()
    assert time.monotonic() - started >= 0.25  # it waited for the quota to refill
    assert not second.deferred
    assert world.state("job") is S.PROVISIONING


def test_a_sweep_with_more_than_its_share_of_the_pass_leaves_the_rest_to_the_next() -> None:
    """Hundreds of orders served at once: a pass sweeps for half its budget, so the requests
    it did not reach go ACTIVE in the passes it asks for at once, and the pass still has time
    left to admit."""
    world, cloud = memory_world(
        [pool(zone=ZONE_A, capacity=300)], tenants_for(H100), latency=MINUTE
    )
    cloud.set_stock(ZONE_A, A3, 300)
    names = [f"job-{n:03d}" for n in range(200)]
    for index, name in enumerate(names):
        at = NOW + index * timedelta(milliseconds=10)
        submit(world.store, flex(name, vm_count=1, hours=1, locations=(ZONE_A,), submitted_at=at))
    world.run()
    assert {world.state(name) for name in names} == {S.PROVISIONING}
    world.clock.advance(2 * MINUTE)  # every order served
    world.settings = ReconcileSettings(pass_budget=timedelta(seconds=0.4))
    world.store = SlowWrites(world.store, 0.005)  # 200 writes: 1 s, more than 0.2 s
    service = world.reconciler("reconciler-2")
    reports = [service.run_pass()]
    first = reports[0]
    assert first.cut_short
    assert first.again
    assert 0 < first.transitions[S.PROVISIONING, S.ACTIVE] < len(names)
    while reports[-1].again and len(reports) < 40:
        reports.append(service.run_pass())
    assert {world.state(name) for name in names} == {S.ACTIVE}
