"""Crash safety on the real adapters: a reconcile pass dies right after any write (Firestore)
or any provider call (the Compute Engine client over the emulator), a fresh reconciler takes
over, and the run converges to the uninterrupted end — no resize request created twice, no
request lost, no pool over capacity, every event published."""

from __future__ import annotations

from datetime import timedelta

import pytest

from opendws.domain.states import RequestState
from opendws.ports import Providers
from tests.builders import A3, MINUTE, NOW, flex
from tests.crashing import PROVIDER_CALLS, STORE_WRITES, Crash, Crashing, Steps
from tests.integration.conftest import ZONE_A, ZONE_B, Stack
from tests.world import submit

TICK = 5 * MINUTE
HORIZON = timedelta(minutes=80)
NAMES = ("failover", "direct")


def drive(stack: Stack, steps: Steps) -> tuple[dict[str, RequestState], dict[str, int]]:
    """Two requests run for an hour — one waits at Google in zone A, which has no capacity,
    and races zone B, where it is served (its order in A is cancelled); a pass every TICK, a
    new reconciler after a crash."""
    world = stack.world
    stack.cloud.set_stock(ZONE_A, A3, 0)
    submit(world.store, flex("failover", vm_count=2, hours=1, locations=(ZONE_A, ZONE_B)))
    submit(world.store, flex("direct", vm_count=2, hours=1, locations=(ZONE_B,),
                             submitted_at=NOW + MINUTE))  # fmt: skip
    providers = world.providers
    wrapped = Providers(
        mig_flex=Crashing(providers.mig_flex, PROVIDER_CALLS, steps),
        tpu=providers.tpu,
        calendar=providers.calendar,
    )
    world.providers = wrapped
    world.store = Crashing(world.store, STORE_WRITES, steps)
    generation = 0
    while world.clock.now() < NOW + HORIZON:
        try:
            world.run(f"reconciler-{generation}")
        except Crash:
            generation += 1
        for zone in (ZONE_A, ZONE_B):
            assert stack.cloud.stock(zone, A3) >= 0
        stack.advance(TICK)
    states = {name: world.state(name) for name in NAMES}
    return states, stack.cloud.created("resizeRequests")


@pytest.fixture
def counted(stack: Stack) -> int:
    """How many side effects the uninterrupted run makes (its end state is checked here)."""
    steps = Steps()
    states, created = drive(stack, steps)
    assert states == dict.fromkeys(NAMES, RequestState.EXPIRED)
    assert sorted(created.values()) == [1, 1, 1]  # failover's two lanes and direct's one
    return steps.count


CRASH_POINTS = 26  # side effects of the uninterrupted run (checked below)


def test_every_step_of_the_uninterrupted_run_is_a_crash_point_below(counted: int) -> None:
    assert counted == CRASH_POINTS


@pytest.mark.parametrize("crash_at", range(1, CRASH_POINTS + 1))
def test_a_crash_after_any_step_converges(stack: Stack, crash_at: int) -> None:
    steps = Steps(crash_at)
    states, created = drive(stack, steps)
    assert steps.crashed
    assert states == dict.fromkeys(NAMES, RequestState.EXPIRED)
    assert sorted(created.values()) == [1, 1, 1], f"created more than once: {created}"
    assert (stack.cloud.stock(ZONE_A, A3), stack.cloud.stock(ZONE_B, A3)) == (0, 4)
    assert stack.left_running() == [], "left running with no live request to own it"
    for name in NAMES:
        record = stack.world.record(name)
        assert record.announced == record.events, f"{name}: events left unpublished"
