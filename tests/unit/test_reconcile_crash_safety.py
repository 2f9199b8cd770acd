"""Crash safety of the reconciler: a pass interrupted after any write or any provider call — a
process that dies there — and then picked up by a fresh reconciler converges to what an
uninterrupted run reaches: no order created twice, no request lost, no pool over capacity,
every event published."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from opendws.adapters.memory import MemoryCapacityProvider
from opendws.domain.states import RequestState
from opendws.ports import Providers, submitted
from tests.builders import A3, H100, MINUTE, NOW, calendar, flex, pool
from tests.crashing import PROVIDER_CALLS, STORE_WRITES, Crash, Crashing, Steps
from tests.world import World, memory_world, submit, tenants_for

ZONE_A, ZONE_B = "us-central1-a", "us-central1-b"
HORIZON = timedelta(hours=25)  # long enough for every run and the calendar block to end
TICK = 5 * MINUTE  # a pass every TICK (longer than the lease, so a successor can take over)


def scenario(steps: Steps) -> tuple[World, MemoryCapacityProvider]:
    """Two zones; a stockout in the first; a request that fits, one that waits for it, one
    that fails over, and a calendar block."""
    world, cloud = memory_world(
        [pool(zone=ZONE_A, capacity=4), pool(zone=ZONE_B, capacity=4)], tenants_for(H100)
    )
    cloud.set_stock(ZONE_A, A3, 4)
    cloud.set_stock(ZONE_B, A3, 4)
    cloud.inject(ZONE_A, A3, "stockout")
    submit(world.store, flex("first", vm_count=3, hours=2, locations=(ZONE_A, ZONE_B)))
    submit(world.store, flex("second", vm_count=2, hours=1, locations=(ZONE_A, ZONE_B),
                             submitted_at=NOW + MINUTE))  # fmt: skip
    submit(world.store, flex("third", vm_count=4, hours=1, locations=(ZONE_B,),
                             submitted_at=NOW + 2 * MINUTE))  # fmt: skip
    submit(world.store, calendar("block", vm_count=1, days=1, start_at=NOW + 30 * MINUTE))
    provider = Crashing(cloud, PROVIDER_CALLS, steps)
    world.store = Crashing(world.store, STORE_WRITES, steps)
    world.providers = Providers(mig_flex=provider, tpu=provider, calendar=provider)
    return world, cloud


def drive(world: World, cloud: MemoryCapacityProvider, steps: Steps) -> list[str]:
    """Run a pass every TICK until the horizon, restarting under a new name after a crash.
    Returns a list of capacity violations seen along the way (none expected)."""
    violations: list[str] = []
    generation = 0
    while world.clock.now() < NOW + HORIZON:
        try:
            world.run(holder=f"reconciler-{generation}")
        except Crash:
            generation += 1  # the process died; another one starts (and waits for the lease)
        violations += over_capacity(world, cloud)
        world.clock.advance(TICK)
    return violations


def over_capacity(world: World, cloud: MemoryCapacityProvider) -> list[str]:
    problems = []
    for zone in (ZONE_A, ZONE_B):
        if cloud.stock(zone, A3) < 0:
            problems.append(f"{world.clock.now()}: {zone} stock below zero")
    held: Counter[str] = Counter()
    holding = [
        *world.store.in_states(RequestState.PROVISIONING, RequestState.ACTIVE, RequestState.BOOKED),
        *filter(submitted, world.store.in_states(RequestState.PENDING)),  # a block in review
    ]
    for record in holding:
        assert record.pool is not None
        held[record.pool] += record.request.units
    problems += [f"{world.clock.now()}: {p} holds {n} > 4" for p, n in held.items() if n > 4]
    return problems


def outcome(world: World, cloud: MemoryCapacityProvider) -> dict[str, object]:
    return {
        "states": {r: world.state(r) for r in ("first", "second", "third", "block")},
        "orders_left": cloud.observe([pool(zone=ZONE_A), pool(zone=ZONE_B)]),
        "stock": (cloud.stock(ZONE_A, A3), cloud.stock(ZONE_B, A3)),
    }


def baseline() -> tuple[dict[str, object], int]:
    steps = Steps()
    world, cloud = scenario(steps)
    assert drive(world, cloud, steps) == []
    return outcome(world, cloud), steps.count


BASELINE, TOTAL_STEPS = baseline()


def test_the_uninterrupted_run_ends_every_request_and_frees_every_unit() -> None:
    assert {
        "states": dict.fromkeys(("first", "second", "third", "block"), RequestState.EXPIRED),
        "orders_left": {},
        "stock": (4, 4),
    } == BASELINE
    assert TOTAL_STEPS > 30


@pytest.mark.parametrize("crash_at", range(1, TOTAL_STEPS + 1))
def test_a_crash_after_any_step_converges_to_the_same_end(crash_at: int) -> None:
    steps = Steps(crash_at)
    world, cloud = scenario(steps)
    violations = drive(world, cloud, steps)
    assert steps.crashed
    assert violations == []
    assert outcome(world, cloud) == BASELINE
    twice = {name: n for name, n in cloud.created().items() if n > 1}
    assert twice == {}, f"created more than once: {twice}"
    for name in ("first", "second", "third", "block"):
        record = world.record(name)
        assert record.announced == record.events, f"{name}: events left unpublished"
